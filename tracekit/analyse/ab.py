"""A/B of two programs timed in alternating rounds (`scripts/decoder_ab.py`: the reference decoder's
`legacy` and `fused` implementations in one process; docs/METHOD.md section Roofline of a decode).

Input: per arm, per round, the per-token times (ns) of that round; the rounds of the arms alternate
(round k of A and round k of B ran back to back), so a drift of the host or the clocks falls on both
arms of a round alike. Per arm the point figure is the mean per-token time over all its tokens; the
interval is the bootstrap of `tracekit.analyse.noise` (its RESAMPLES, SEED and LEVEL): rounds drawn
with replacement, the same round indices for both arms (the pairing), then each drawn round's tokens
with replacement within it. The ratio B / A and the difference B - A are formed per resample, so
their intervals carry the pairing. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tracekit.analyse.noise import LEVEL, RESAMPLES, SEED
from tracekit.analyse.resample import drawn_means
from tracekit.errors import TracekitError
from tracekit.model.documents.ab import AB, ABArm, ABBootstrap


class ABError(TracekitError):
    """Rounds that cannot be compared."""


def _interval(x: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.percentile(x, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def ab_document(
    arms: Mapping[str, Sequence[Sequence[int]]],
    *,
    baseline: str,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> AB:
    """Per arm: the mean per-token time (ns), its interval, the p10-p90 of its tokens; per arm other
    than `baseline`: the ratio to it and the difference, each with its paired interval."""
    if baseline not in arms:
        raise ABError(f"no arm {baseline!r} among {', '.join(arms)}")
    counts = {name: len(r) for name, r in arms.items()}
    if len(set(counts.values())) != 1 or not next(iter(counts.values())):
        raise ABError(f"the arms must have the same number (> 0) of alternating rounds, got {counts}")
    for name, rounds in arms.items():
        if any(len(r) == 0 for r in rounds):
            raise ABError(f"arm {name!r} has a round without tokens")
    k = next(iter(counts.values()))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, k, size=(resamples, k))  # the same rounds for every arm: the pairing
    draws = {name: drawn_means(rounds, picks, rng) for name, rounds in arms.items()}
    out = AB(
        kind="tracekit.ab",
        baseline=baseline,
        rounds=k,
        bootstrap=ABBootstrap(resamples=resamples, seed=seed, level=level, paired_by_round=True),
        arms={},
    )
    base = draws[baseline]
    for name, rounds in arms.items():
        flat = np.concatenate([np.asarray(r, dtype=np.float64) for r in rounds])
        mean = float(flat.mean())
        lo, hi = _interval(draws[name], level)
        arm = ABArm(
            tokens=int(flat.size),
            mean_ns=round(mean),
            interval_ns=[round(lo), round(hi)],
            p10_p90_ns=[round(float(np.percentile(flat, 10))), round(float(np.percentile(flat, 90)))],
            round_means_ns=[round(float(np.mean(r))) for r in rounds],
        )
        if name != baseline:
            base_mean = float(
                np.concatenate([np.asarray(r, dtype=np.float64) for r in arms[baseline]]).mean()
            )
            arm.ratio_to_baseline = mean / base_mean
            arm.ratio_interval = list(_interval(draws[name] / base, level))
            arm.diff_ns = round(mean - base_mean)
            arm.diff_interval_ns = [round(v) for v in _interval(draws[name] - base, level)]
        out.arms[name] = arm
    return out


__all__ = ["ABError", "ab_document"]
