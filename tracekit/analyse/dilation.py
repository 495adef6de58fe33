"""The profiler's own cost (METHOD.md section 9): dilation = profiled / unprofiled per-token time.

A capture times every token twice, from the host's wall clock: once unprofiled, once during the
traced pass (manifest `unprofiled.per_token_ns` / `profiled.per_token_ns`, per rank). A token's
time is the slowest rank's (max over ranks per token, the same rule as the step time); the first
`skip_first` tokens are warm-up and left out. Then

    dilation = median(profiled per-token) / median(unprofiled per-token)

and `inflated` is `dilation > 1 + threshold` (default 10%): above it, the coordination share of
a traced attribution is inflated by the profiler's host time (issue 9).

`unprofiled_mean_ns` is what the shortfall reconciles the traced parts to (means are additive; see
docs/METHOD-NOTES.md), `*_median_ns` is what the report quotes as the per-token time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from tracekit.read import json_type

#: Default threshold: dilation above 1 + 10% is reported as inflating the coordination share.
DEFAULT_THRESHOLD = 0.10


@dataclass(frozen=True)
class TokenTimes:
    """Per-token host wall times of one pass: per token, the slowest rank (ns), warm-up removed."""

    per_token_ns: tuple[int, ...]
    skipped: int

    @property
    def n(self) -> int:
        return len(self.per_token_ns)

    @property
    def median_ns(self) -> float:
        return float(np.median(self.per_token_ns)) if self.per_token_ns else float("nan")

    @property
    def mean_ns(self) -> Fraction:
        """Exact mean (a Fraction), for the additive reconciliation."""
        if not self.per_token_ns:
            raise ValueError("no tokens")
        return Fraction(sum(self.per_token_ns), len(self.per_token_ns))

    def quantile_ns(self, q: float) -> float:
        return float(np.quantile(self.per_token_ns, q)) if self.per_token_ns else float("nan")


@dataclass(frozen=True)
class Dilation:
    """Dilation of one run. `dilation` is None when the run has no manifest / no timings."""

    dilation: float | None
    threshold: float
    unprofiled: TokenTimes | None
    profiled: TokenTimes | None
    manifest_dilation: float | None  # what the capture itself wrote, for comparison
    source: str  # "manifest" | "none"
    notes: tuple[str, ...] = ()  # malformed manifest fields that were treated as missing

    @property
    def inflated(self) -> bool | None:
        if self.dilation is None:
            return None
        return self.dilation > 1.0 + self.threshold

    def sentence(self) -> str:
        if self.dilation is None:
            return (
                "profiler dilation unknown (no unprofiled timing: capture with `tracekit capture` to get it)"
            )
        s = f"profiler dilation {self.dilation:.2f}x"
        if self.inflated:
            s += f" (above the {self.threshold:.0%} threshold: the traced coordination share is inflated by the profiler)"
        else:
            s += f" (within the {self.threshold:.0%} threshold)"
        return s

    def to_json(self) -> dict[str, Any]:
        def tt(t: TokenTimes | None) -> dict[str, Any] | None:
            if t is None:
                return None
            return {
                "n": t.n,
                "skipped": t.skipped,
                "median_ns": int(round(t.median_ns)),
                "mean_ns": int(round(t.mean_ns)),
                "p10_ns": int(round(t.quantile_ns(0.1))),
                "p90_ns": int(round(t.quantile_ns(0.9))),
            }

        return {
            "dilation": self.dilation,
            "threshold": self.threshold,
            "inflated": self.inflated,
            "unprofiled": tt(self.unprofiled),
            "profiled": tt(self.profiled),
            "manifest_dilation": self.manifest_dilation,
            "source": self.source,
            "notes": list(self.notes),
        }


class MalformedTimes(ValueError):
    """A manifest's per-token times block is not `{"per_token_ns": {rank: [ns, ...]}}`."""


def _is_ns(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def token_times(per_rank: Mapping[str, Any] | None, *, skip_first: int = 1) -> TokenTimes | None:
    """Per token, the slowest rank's time, from a manifest `{"per_token_ns": {"0": [...], ...}}`
    block (or the inner mapping itself). Tokens missing on some rank are dropped (the shortest
    rank's count is used). None when there is nothing. MalformedTimes (a ValueError saying what
    is wrong) when the block is not an object of rank -> list of non-negative numbers."""
    if per_rank is None:
        return None
    if not isinstance(per_rank, Mapping):
        raise MalformedTimes(f"is a JSON {json_type(per_rank)}, not an object")
    if not per_rank:
        return None
    inner = per_rank.get("per_token_ns", per_rank)
    if inner is None:
        return None
    if not isinstance(inner, Mapping):
        raise MalformedTimes(
            f"per_token_ns is a JSON {json_type(inner)}, not an object of rank -> list of ns"
        )
    lists: list[list[int]] = []
    for rank, v in inner.items():
        if v is None or (isinstance(v, list) and not v):
            continue
        if not isinstance(v, list):
            raise MalformedTimes(f"per_token_ns[{rank!r}] is a JSON {json_type(v)}, not a list of ns")
        bad = [x for x in v if not _is_ns(x)]
        if bad:
            raise MalformedTimes(
                f"per_token_ns[{rank!r}] holds {len(bad)} value(s) that are not non-negative numbers "
                f"(first: {bad[0]!r})"
            )
        lists.append([int(round(x)) for x in v])
    if not lists:
        return None
    n = min(len(v) for v in lists)
    arr = np.array([v[:n] for v in lists], dtype=np.int64)
    slowest = arr.max(axis=0)
    skip = min(skip_first, max(n - 1, 0))
    kept = tuple(int(x) for x in slowest[skip:])
    return TokenTimes(kept, skip) if kept else None


def dilation_of(
    manifest: Mapping[str, Any] | None, *, skip_first: int = 1, threshold: float = DEFAULT_THRESHOLD
) -> Dilation:
    """Dilation of one run from its capture manifest (None figures when there is none).

    A malformed `unprofiled` / `profiled` block (not rank -> list of ns) is treated as missing, and
    `notes` says which field of manifest.json and what is wrong with it."""
    if not manifest or not isinstance(manifest, Mapping):
        return Dilation(None, threshold, None, None, None, "none")
    notes: list[str] = []

    def times(key: str) -> TokenTimes | None:
        try:
            return token_times(manifest.get(key), skip_first=skip_first)
        except MalformedTimes as exc:
            notes.append(
                f"manifest.json field {key!r} {exc}; the {key} per-token times are treated as missing"
            )
            return None

    unprof = times("unprofiled")
    prof = times("profiled")
    md = manifest.get("dilation")
    md_f = (
        float(md)
        if isinstance(md, (int, float)) and not isinstance(md, bool) and math.isfinite(md) and md > 0
        else None
    )
    if md is not None and md_f is None:
        notes.append(f"manifest.json field 'dilation' is {md!r}, not a positive number; ignored")
    if unprof is None or prof is None or unprof.median_ns <= 0:
        return Dilation(
            md_f, threshold, unprof, prof, md_f, "manifest" if md_f is not None else "none", tuple(notes)
        )
    return Dilation(
        prof.median_ns / unprof.median_ns, threshold, unprof, prof, md_f, "manifest", tuple(notes)
    )
