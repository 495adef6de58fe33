"""The `Dilation` figures of one run (tracekit.analyse.dilation.Dilation.to_json): inside the
shortfall (`dilation.runs.baseline` / `.sharded`) and, one row per run, `tracekit dilation
--format json` (docs/JSON.md#dilation)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class TokenTimes(Doc, kw_only=True):
    """One pass kind's per-token times (the slowest rank per token, rounds pooled, the warm-up of
    each round skipped)."""

    n: int
    skipped: int
    rounds: int | UnsetType = UNSET
    median_ns: int
    mean_ns: int
    p10_ns: int
    p90_ns: int
    round_mean_ns: list[int] | UnsetType = UNSET


class Dilation(Doc, kw_only=True):
    """The capture's own dilation figures of one run (`tracekit.analyse.dilation.Dilation`); null
    where the manifest has no unprofiled / profiled timing."""

    dilation: float | None
    definition: str | UnsetType = UNSET
    interval: list[float] | None | UnsetType = UNSET
    rounds: dict[str, int] | UnsetType = UNSET
    threshold: float
    inflated: bool | None
    unprofiled: TokenTimes | None
    profiled: TokenTimes | None
    manifest_dilation: float | None
    source: str
    notes: list[str] | UnsetType = UNSET


class DilationRow(Dilation, kw_only=True):
    r"""`tracekit dilation --format json`: a JSON array, one object per run folder given, in the
    order given (docs/METHOD.md section Dilation).
    ```
    [ {"run": "traces/h200-tp2",                       # the folder as given on the command line (written first)
       "dilation": 1.465 | null,                       # mean profiled / mean unprofiled per-token time
       "definition": "...", "interval": [lo, hi] | null,   # 95% bootstrap over rounds
       "rounds": {"unprofiled": 7, "profiled": 7}, "threshold": 0.1, "inflated": true | null,
       "unprofiled": {"n", "skipped", "rounds", "median_ns", "mean_ns", "p10_ns", "p90_ns", "round_mean_ns"} | null,
       "profiled": {...} | null, "manifest_dilation": ... | null, "source": "manifest" | ..., "notes": [...]} ]
    ```
    """

    run: str
