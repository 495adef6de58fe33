"""The `AB` document: a paired A/B comparison of decode arms by round
(`tracekit.analyse.ab.ab_document(...).to_json()`, scripts/decoder_ab.py) (docs/JSON.md#ab)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class ABBootstrap(Doc, kw_only=True):
    resamples: int
    seed: int
    level: float
    paired_by_round: bool


class ABArm(Doc, kw_only=True):
    tokens: int
    mean_ns: int
    interval_ns: list[int]
    p10_p90_ns: list[int]
    round_means_ns: list[int]
    #: arms other than the baseline: mean / the baseline's mean, with its paired interval
    ratio_to_baseline: float | UnsetType = UNSET
    ratio_interval: list[float] | UnsetType = UNSET
    diff_ns: int | UnsetType = UNSET
    diff_interval_ns: list[int] | UnsetType = UNSET


class AB(Doc, kw_only=True):
    r"""`python scripts/decoder_ab.py` (tracekit.analyse.ab.ab_document(...).to_json()): arms that ran in
    alternating rounds, compared by a bootstrap that resamples the same rounds for every arm.
    ```
    {"kind": "tracekit.ab", "baseline": "legacy", "rounds": 7,
     "bootstrap": {"resamples": 2000, "seed": 0, "level": 0.95, "paired_by_round": true},
     "arms": {"legacy": {"tokens", "mean_ns", "interval_ns": [lo, hi], "p10_p90_ns": [p10, p90], "round_means_ns": [...]},
              "fused": {..., "ratio_to_baseline", "ratio_interval", "diff_ns", "diff_interval_ns"}}}
    ```
    """

    kind: str
    baseline: str
    rounds: int
    bootstrap: ABBootstrap
    arms: dict[str, ABArm]
