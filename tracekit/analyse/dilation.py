"""The profiler's own cost (docs/METHOD.md section Dilation): dilation = profiled / unprofiled per-token time.

A capture times every token in alternating passes, from the host's wall clock: K unprofiled and K
profiled rounds in the order U P U P ... (manifest `unprofiled.rounds` / `profiled.rounds`, each
round {rank: [ns, ...]}; a manifest from before rounds has one round, its `per_token_ns`). A
token's time is the slowest rank's (max over ranks per token, the same rule as the step time);
the first `skip_first` tokens of every round are warm-up and left out; the rounds' tokens are then
pooled. One definition, the one the shortfall states and applies (`dilation_statistic`):

    K >= 2 rounds of each:  dilation = median over k of mean(P_k) / mean(U_k)
    one round of each:      dilation = mean(profiled per-token) / mean(unprofiled per-token)

Each P_k ran right after U_k, so a host that drifts between rounds (the H200 host switched between
~5 and ~10 ms per token within one capture) cancels inside each pair's ratio, and the median keeps
the one pair caught across a switch from moving the figure (reports/dilation-repeat). The shortfall
removes exactly this factor from the traced per-token time. `interval` is a 95% bootstrap
interval of that statistic (`bootstrap_interval`: rounds drawn with replacement, as
U/P pairs when the counts match, then tokens with replacement within each drawn round; 2000
resamples, seed 0, so the same manifest always gives the same interval). Drawing rounds is what
lets drift between rounds widen the interval; resampling tokens only within fixed rounds would
see only the within-round noise. `inflated` is `dilation > 1 + threshold` (default 10%): above
it, the coordination share of a traced attribution is inflated by the profiler's host time.

`unprofiled.mean_ns` is what the shortfall reconciles the traced parts to (docs/METHOD-NOTES.md),
`*_median_ns` is what the report quotes as the per-token time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from tracekit.model.documents import dilation as dd
from tracekit.model.documents.base import Documented, given
from tracekit.model.documents.manifest import Manifest, ManifestProfiled, ManifestUnprofiled
from tracekit.model.fields import copy_fields
from tracekit.read import json_type

#: Default threshold: dilation above 1 + 10% is reported as inflating the coordination share.
DEFAULT_THRESHOLD = 0.10
#: The bootstrap of `interval`: resamples, seed, coverage.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95


@dataclass(frozen=True)
class TokenTimes:
    """Per-token host wall times of one kind of pass: per token, the slowest rank (ns), warm-up
    removed. `rounds` holds each round's tokens (in run order); `per_token_ns` is them pooled.
    `skipped` is the warm-up tokens left out of each round."""

    per_token_ns: tuple[int, ...]
    skipped: int
    rounds: tuple[tuple[int, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.rounds:  # built from one list: one round
            object.__setattr__(self, "rounds", (tuple(self.per_token_ns),))

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

    def round_means_ns(self) -> list[float]:
        return [float(np.mean(r)) for r in self.rounds if r]


@dataclass(frozen=True)
class Dilation(Documented):
    """Dilation of one run. `dilation` is None when the run has no manifest / no timings."""

    dilation: float | None
    threshold: float
    unprofiled: TokenTimes | None
    profiled: TokenTimes | None
    manifest_dilation: float | None  # what the capture itself wrote, for comparison
    source: str  # "manifest" | "none"
    notes: tuple[str, ...] = ()  # malformed manifest fields that were treated as missing
    #: 95% bootstrap interval of `dilation` (bootstrap_interval); None without both passes' times
    interval: tuple[float, float] | None = None

    @property
    def inflated(self) -> bool | None:
        if self.dilation is None:
            return None
        return self.dilation > 1.0 + self.threshold

    @property
    def method(self) -> str:
        """How `dilation` was computed from the rounds (`dilation_method`)."""
        if self.unprofiled is None or self.profiled is None:
            return "the capture's own figure" if self.dilation is not None else ""
        return dilation_method(self.unprofiled.rounds, self.profiled.rounds)

    @property
    def rounds(self) -> dict[str, int]:
        """Rounds of each pass kind the figure pools (0 where the times are missing)."""
        return {
            "unprofiled": len(self.unprofiled.rounds) if self.unprofiled else 0,
            "profiled": len(self.profiled.rounds) if self.profiled else 0,
        }

    def sentence(self) -> str:
        if self.dilation is None:
            return (
                "profiler dilation unknown (no unprofiled timing: capture with `tracekit capture` to get it)"
            )
        s = f"profiler dilation {self.dilation:.2f}x"
        if self.interval is not None:
            s += f" (95% interval {self.interval[0]:.2f}-{self.interval[1]:.2f})"
        if self.inflated:
            s += f" (above the {self.threshold:.0%} threshold: the traced coordination share is inflated by the profiler)"
        else:
            s += f" (within the {self.threshold:.0%} threshold)"
        return s

    def document(self) -> dd.Dilation:
        def tt(t: TokenTimes | None) -> dd.TokenTimes | None:
            if t is None:
                return None
            return dd.TokenTimes(
                n=t.n,
                skipped=t.skipped,
                rounds=len(t.rounds),
                median_ns=int(round(t.median_ns)),
                mean_ns=int(round(t.mean_ns)),
                p10_ns=int(round(t.quantile_ns(0.1))),
                p90_ns=int(round(t.quantile_ns(0.9))),
                round_mean_ns=[int(round(m)) for m in t.round_means_ns()],
            )

        # dilation, rounds, threshold, inflated, manifest_dilation, source: the figure's own
        return copy_fields(
            dd.Dilation,
            self,
            definition="mean profiled / mean unprofiled per-token time (slowest rank per token, "
            "rounds pooled, warm-up skipped per round)",
            interval=list(self.interval) if self.interval is not None else None,
            unprofiled=tt(self.unprofiled),
            profiled=tt(self.profiled),
            notes=list(self.notes),
        )


class MalformedTimes(ValueError):
    """A manifest's per-token times block is not `{"per_token_ns": {rank: [ns, ...]}, "rounds": [...]}`."""


#: a per-token time beyond this (2**62 ns, 146 years) is no time: it would overflow int64 below
MAX_TOKEN_NS = float(1 << 62)
#: a dilation (profiled / unprofiled time) outside these bounds is no measurement
DILATION_BOUNDS = (1e-3, 1e3)


def _is_ns(x: Any) -> bool:
    return (
        isinstance(x, (int, float))
        and not isinstance(x, bool)
        and math.isfinite(x)
        and 0 <= x <= MAX_TOKEN_NS
    )


def plausible_dilation(x: Any) -> float | None:
    """`x` as a dilation factor when it is a finite number within DILATION_BOUNDS, else None."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        lo, hi = DILATION_BOUNDS
        if lo <= x <= hi:
            return float(x)
    return None


def _slowest(inner: Any, where: str) -> list[int] | None:
    """Per token, the largest time over ranks, from one {rank: [ns, ...]} mapping (tokens missing
    on some rank dropped). None when it holds no times; MalformedTimes when it is not that shape."""
    if inner is None:
        return None
    if not isinstance(inner, Mapping):
        raise MalformedTimes(f"{where} is a JSON {json_type(inner)}, not an object of rank -> list of ns")
    lists: list[list[int]] = []
    for rank, v in inner.items():
        if v is None or (isinstance(v, list) and not v):
            continue
        if not isinstance(v, list):
            raise MalformedTimes(f"{where}[{rank!r}] is a JSON {json_type(v)}, not a list of ns")
        bad = [x for x in v if not _is_ns(x)]
        if bad:
            raise MalformedTimes(
                f"{where}[{rank!r}] holds {len(bad)} value(s) that are not numbers of ns from 0 to 2**62 "
                f"(first: {bad[0]!r})"
            )
        lists.append([int(round(x)) for x in v])
    if not lists:
        return None
    n = min(len(v) for v in lists)
    return [int(x) for x in np.array([v[:n] for v in lists], dtype=np.int64).max(axis=0)]


def token_times(
    per_rank: ManifestUnprofiled | ManifestProfiled | Mapping[str, Any] | None, *, skip_first: int = 1
) -> TokenTimes | None:
    """Per token, the slowest rank's time, from a manifest `unprofiled` / `profiled` block (typed,
    or as JSON: `{"per_token_ns": {"0": [...], ...}, "rounds": [{"0": [...], ...}, ...]}`) or the
    inner `{rank: [ns, ...]}` mapping itself. With `rounds` (manifest 1.2), every round counts: per round
    the slowest rank per token, its first `skip_first` tokens dropped, then the rounds pooled in
    run order; without it, `per_token_ns` is the one round. Tokens missing on some rank are
    dropped (the shortest rank's count is used). None when there is nothing. MalformedTimes (a
    ValueError saying what is wrong) when the block is not that shape."""
    if per_rank is None:
        return None
    if isinstance(per_rank, (ManifestUnprofiled, ManifestProfiled)):
        typed_rounds = given(per_rank.rounds)
        if typed_rounds:
            return _pooled([_slowest(r, f"rounds[{i}]") for i, r in enumerate(typed_rounds)], skip_first)
        return _pooled([_slowest(given(per_rank.per_token_ns), "per_token_ns")], skip_first)
    if not isinstance(per_rank, Mapping):
        raise MalformedTimes(f"is a JSON {json_type(per_rank)}, not an object")
    if not per_rank:
        return None
    rounds_doc = per_rank.get("rounds")
    if rounds_doc is not None and not isinstance(rounds_doc, list):
        raise MalformedTimes(f"rounds is a JSON {json_type(rounds_doc)}, not a list of rank -> list of ns")
    if rounds_doc:
        raw = [_slowest(r, f"rounds[{i}]") for i, r in enumerate(rounds_doc)]
    elif "per_token_ns" in per_rank or rounds_doc is not None:
        raw = [_slowest(per_rank.get("per_token_ns"), "per_token_ns")]
    else:  # the inner mapping itself
        raw = [_slowest(per_rank, "per_token_ns")]
    return _pooled(raw, skip_first)


def _pooled(raw: Sequence[list[int] | None], skip_first: int) -> TokenTimes | None:
    """The rounds' slowest-rank times, each round's first `skip_first` tokens dropped, pooled."""
    rounds: list[tuple[int, ...]] = []
    skip = 0
    for slowest in raw:
        if not slowest:
            continue
        skip = min(skip_first, max(len(slowest) - 1, 0))
        if slowest[skip:]:
            rounds.append(tuple(slowest[skip:]))
    if not rounds:
        return None
    pooled = tuple(x for r in rounds for x in r)
    return TokenTimes(pooled, skip, tuple(rounds))


def mean_ratio(unprofiled: Sequence[Sequence[int]], profiled: Sequence[Sequence[int]]) -> float | None:
    """mean(profiled pooled) / mean(unprofiled pooled); None when either is empty or the
    unprofiled mean is not positive."""
    u = [x for r in unprofiled for x in r]
    p = [x for r in profiled for x in r]
    if not u or not p or sum(u) <= 0:
        return None
    return (sum(p) / len(p)) / (sum(u) / len(u))


def pair_ratios(unprofiled: Sequence[Sequence[int]], profiled: Sequence[Sequence[int]]) -> list[float]:
    """Per round k, mean(P_k) / mean(U_k): the profiled pass over the unprofiled pass that ran
    right before it. Empty unless both kinds have the same number (>= 1) of non-empty rounds."""
    u = [r for r in unprofiled if len(r)]
    p = [r for r in profiled if len(r)]
    if len(u) != len(p) or not u:
        return []
    out = []
    for ur, pr in zip(u, p, strict=True):
        mu = sum(ur) / len(ur)
        if mu <= 0:
            return []
        out.append((sum(pr) / len(pr)) / mu)
    return out


def dilation_statistic(
    unprofiled: Sequence[Sequence[int]], profiled: Sequence[Sequence[int]]
) -> float | None:
    """THE dilation (one definition, stated and applied): with two or more U/P pairs, the median of
    the per-pair ratios (`pair_ratios`): each pair ran back to back, so host drift between pairs
    cancels in its ratio, and the median keeps one pair caught across a host-speed change from
    moving the figure (measured on the H200: the host switched between ~5 and ~10 ms per token
    within one capture). With one round of each (or unequal counts), the pooled mean ratio."""
    pr = pair_ratios(unprofiled, profiled)
    if len(pr) >= 2:
        return float(np.median(pr))
    return mean_ratio(unprofiled, profiled)


def dilation_method(unprofiled: Sequence[Sequence[int]], profiled: Sequence[Sequence[int]]) -> str:
    pr = pair_ratios(unprofiled, profiled)
    if len(pr) >= 2:
        return f"median of {len(pr)} per-round ratios (profiled pass / the unprofiled pass before it)"
    return "mean profiled / mean unprofiled per-token time (one round of each)"


def bootstrap_interval(
    unprofiled: Sequence[Sequence[int]],
    profiled: Sequence[Sequence[int]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = BOOTSTRAP_LEVEL,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `mean_ratio(unprofiled, profiled)`, each argument a list of
    rounds (per-token times of one round). Two levels: the rounds are drawn with replacement (as
    (U_k, P_k) pairs when both kinds have the same number of rounds: a pair ran back to back, so
    host drift that slows both cancels in the ratio; independently otherwise), then each drawn
    round's tokens with replacement, within that round. So drift between rounds widens the
    interval, and one round (K=1) gives the token-level interval. Deterministic (numpy's
    default_rng(seed)); None when either kind has no tokens."""
    u_rounds = [np.asarray(r, dtype=np.float64) for r in unprofiled if len(r)]
    p_rounds = [np.asarray(r, dtype=np.float64) for r in profiled if len(r)]
    if not u_rounds or not p_rounds or mean_ratio(unprofiled, profiled) is None:
        return None
    rng = np.random.default_rng(seed)
    b = int(resamples)

    def draws(rounds: list[np.ndarray], idx: np.ndarray) -> np.ndarray:
        """Per resample, the pooled mean over the drawn rounds (idx [b, slots]), each slot's
        tokens resampled on their own."""
        k = len(rounds)
        slots = idx.shape[1]
        n = np.array([len(r) for r in rounds], dtype=np.float64)
        # sums[s, j, i]: resample i's token-resampled sum of round j, drawn for slot s
        sums = np.empty((slots, k, b))
        for s in range(slots):
            for j, r in enumerate(rounds):
                sums[s, j] = r[rng.integers(0, len(r), size=(b, len(r)))].sum(axis=1)
        cols = np.arange(b)
        total = sum(sums[s, idx[:, s], cols] for s in range(slots))
        count = n[idx].sum(axis=1)
        return total / count

    ku, kp = len(u_rounds), len(p_rounds)
    if ku == kp:
        idx_u = idx_p = rng.integers(0, ku, size=(b, ku))
    else:
        idx_u = rng.integers(0, ku, size=(b, ku))
        idx_p = rng.integers(0, kp, size=(b, kp))
    if ku == kp and ku >= 2:
        # the statistic is the median of the pair ratios: per resample, the drawn pairs' ratios
        # (tokens resampled within each drawn round), then their median
        def round_means(rounds: list[np.ndarray], idx: np.ndarray) -> np.ndarray:
            out = np.empty(idx.shape)
            for j, r in enumerate(rounds):
                m = r[rng.integers(0, len(r), size=(b, len(r)))].mean(axis=1)
                out = np.where(idx == j, m[:, None], out)
            return out

        mu_k, mp_k = round_means(u_rounds, idx_u), round_means(p_rounds, idx_p)
        ratio = np.median(mp_k / np.where(mu_k > 0, mu_k, np.nan), axis=1)
        ratio = ratio[np.isfinite(ratio)]
        if not len(ratio):
            return None
        alpha = (1.0 - level) / 2.0
        lo, hi = np.quantile(ratio, [alpha, 1.0 - alpha])
        return round(float(lo), 4), round(float(hi), 4)
    mu, mp = draws(u_rounds, idx_u), draws(p_rounds, idx_p)
    ok = mu > 0
    if not ok.any():
        return None
    ratio = mp[ok] / mu[ok]
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratio, [alpha, 1.0 - alpha])
    return round(float(lo), 4), round(float(hi), 4)


def dilation_of(
    manifest: Manifest | None, *, skip_first: int = 1, threshold: float = DEFAULT_THRESHOLD
) -> Dilation:
    """Dilation of one run from its capture manifest (None figures when there is none).

    `dilation` = mean profiled / mean unprofiled per-token time, rounds pooled (module docstring),
    with its bootstrap `interval`. A malformed `unprofiled` / `profiled` block (not rank -> list of
    ns) is treated as missing, and `notes` says which field of manifest.json and what is wrong with
    it; then the capture's own `dilation` figure stands, without an interval. (A block or a figure
    that is not of its JSON type the reader left out, noting it: `tracekit.read.manifests`.)"""
    if manifest is None:
        return Dilation(None, threshold, None, None, None, "none")
    notes: list[str] = []

    def times(key: str, block: ManifestUnprofiled | ManifestProfiled | None) -> TokenTimes | None:
        try:
            return token_times(block, skip_first=skip_first)
        except MalformedTimes as exc:
            notes.append(
                f"manifest.json field {key!r} {exc}; the {key} per-token times are treated as missing"
            )
            return None

    unprof = times("unprofiled", given(manifest.unprofiled))
    prof = times("profiled", given(manifest.profiled))
    md = given(manifest.dilation)
    md_f = plausible_dilation(md)
    if md is not None and md_f is None:
        lo, hi = DILATION_BOUNDS
        notes.append(f"manifest.json field 'dilation' is {md!r}, not a number from {lo:g} to {hi:g}; ignored")
    ratio = None if unprof is None or prof is None else dilation_statistic(unprof.rounds, prof.rounds)
    if ratio is None:
        return Dilation(
            md_f, threshold, unprof, prof, md_f, "manifest" if md_f is not None else "none", tuple(notes)
        )
    assert unprof is not None and prof is not None
    return Dilation(
        ratio,
        threshold,
        unprof,
        prof,
        md_f,
        "manifest",
        tuple(notes),
        bootstrap_interval(unprof.rounds, prof.rounds),
    )
