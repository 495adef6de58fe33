"""The dilation a shortfall states and applies, and the proportional reconciliation of traced parts to
the unprofiled per-token time (docs/METHOD.md section Dilation; `tracekit.analyse.attribution.correction` calls
`reconcile` / `reconcile_path` where the replay's correction is not identified)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.exact import round_half_up
from tracekit.model.parts import COORDINATION, LEAF_PARTS, PATH_PARTS


def reconcile(
    parts: Mapping[str, Fraction], target: Fraction, timeline: str
) -> tuple[dict[str, Fraction], str]:
    """Scale the traced per-token parts to sum to the unprofiled per-token time `target`, exactly.

    - device timeline ("gpu"): the profiler's cost is host time, which shows up between device
      work: as idle on the rank whose host it slowed and, at TP>1, as wait on the ranks that meet
      it at the next collective. Device-side parts (compute, memory, transfer, unknown) are kept as
      measured; the excess (traced - unprofiled) is taken out of wait, sync and idle in proportion
      to their traced sizes (one factor for the three). If it exceeds all three, they are emptied
      and the rest is taken from every part in proportion. A traced time *shorter* than the
      unprofiled one (no excess) scales every part in proportion.
    - host timeline ("host"/"mixed": CPU-only runs): the compute on the timeline is itself host
      time the profiler dilates (op callbacks land inside parent ops and between ops alike), so
      every host-executed part (all but transfer, whose gloo exchange records no ops) is scaled
      by one factor; transfer is kept.
    Returns the new parts and one sentence saying what was done.
    """
    traced = sum(parts[p] for p in LEAF_PARTS)
    out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
    if traced == target:
        return out, "the traced per-token time equals the unprofiled one; nothing to reconcile"
    excess = traced - target
    pct = float(excess / target) if target else float("nan")

    def proportional(keys: tuple[str, ...]) -> None:
        base = sum(out[k] for k in keys)
        rest = sum(out[k] for k in LEAF_PARTS if k not in keys)
        if base <= 0:
            keys_all = LEAF_PARTS
            base, rest = sum(out[k] for k in keys_all), Fraction(0)
            keys = keys_all
        factor = (target - rest) / base
        for k in keys:
            out[k] = out[k] * factor

    if timeline == "gpu":
        if excess < 0:
            proportional(LEAF_PARTS)
            return out, (
                f"the traced per-token time is {-pct:.1%} below the unprofiled one; every part was scaled up "
                "in proportion to match it"
            )
        coord = sum(out[k] for k in COORDINATION)
        if excess > coord:
            for k in COORDINATION:
                out[k] = Fraction(0)
            proportional(tuple(k for k in LEAF_PARTS if k not in COORDINATION))
            return out, (
                f"profiler excess of {pct:.1%} over the unprofiled per-token time exceeds wait + sync + idle; "
                "those were emptied and the rest scaled every part in proportion"
            )
        keep = 1 - excess / coord
        for k in COORDINATION:
            out[k] = out[k] * keep
        return out, (
            f"the profiler's excess ({pct:+.1%} over the unprofiled per-token time) is host time: it was taken "
            f"out of wait, sync and idle in proportion to their traced sizes (each kept at {float(keep):.1%}), "
            "on every rank: at TP>1 a rank's added host time also shows up as the other ranks' wait; compute, "
            "memory and transfer are kept as measured"
        )
    keys = tuple(k for k in LEAF_PARTS if k != "transfer")
    proportional(keys)
    return out, (
        f"CPU-only timeline: every host-executed part (all but transfer) was scaled by one factor to "
        f"remove the profiler's {pct:+.1%} on the per-token time (host ops are dilated as much as the gaps)"
    )


def reconcile_path(path: Mapping[str, Any], target: Fraction, timeline: str) -> dict[str, Any]:
    """The critical path's per-token components scaled to the unprofiled per-token time, exactly.

    The path's host time is where the profiler's cost lies on the path (the late rank's host was
    slower under the profiler). GPU timeline: the excess is taken out of every rank's host and
    sync time on the path in proportion to their sizes; if it exceeds them, every component (and
    the offset) is scaled in proportion. Host timeline: every component but transfer (and the
    offset) is scaled by one factor, as `reconcile` does."""
    by_rank = {r: dict(d) for r, d in path["by_rank"].items()}
    offset = Fraction(path["offset"])
    traced = Fraction(path["step"])
    excess = traced - target

    def scale_all(keys: tuple[str, ...], with_offset: bool) -> None:
        nonlocal offset
        base = sum(d[k] for d in by_rank.values() for k in keys) + (offset if with_offset else 0)
        rest = traced - base
        if base == 0:
            return
        f = (target - rest) / base
        for d in by_rank.values():
            for k in keys:
                d[k] *= f
        if with_offset:
            offset *= f

    if excess != 0:
        if timeline == "gpu":
            hostish = sum(d[k] for d in by_rank.values() for k in ("host", "sync"))
            if 0 < excess <= hostish:
                keep = 1 - excess / hostish
                for d in by_rank.values():
                    d["host"] *= keep
                    d["sync"] *= keep
            else:
                scale_all(PATH_PARTS, True)
        else:
            scale_all(tuple(k for k in PATH_PARTS if k != "transfer"), True)
    out = {"by_rank": by_rank, "offset": offset, "step": target}
    total = sum(sum(d.values()) for d in by_rank.values()) + offset
    if total != target:  # a degenerate case (nothing to scale): say so rather than hide it
        out["offset"] = offset + (target - total)
    return out


@dataclass(frozen=True)
class AppliedDilation:
    """The dilation a shortfall states and applies (docs/METHOD.md section Dilation: the factor stated is the factor
    applied): D measured by the capture's alternating rounds (`tracekit.analyse.dilation`), and the
    corrected per-token time `target_ns` = traced per-token time (mean step time of the trace's
    steady steps) / D, exactly. `unprofiled_mean_ns` (the unprofiled passes' own mean) is a
    cross-check: it differs from `target_ns` where the host's speed moved between rounds (the
    traced pass ran at one speed; the corrected time is that pass's, not the rounds' average)."""

    factor: float | None
    interval: tuple[float, float] | None
    traced_mean_ns: Fraction
    unprofiled_mean_ns: Fraction | None
    rounds: int
    method: str = ""

    @property
    def target_ns(self) -> Fraction | None:
        if self.factor is None:
            return None
        return self.traced_mean_ns / Fraction(self.factor).limit_denominator(10**9)

    @property
    def drift(self) -> float | None:
        """target / unprofiled mean - 1: how far the traced pass's host speed was from the rounds'."""
        t = self.target_ns
        if t is None or not self.unprofiled_mean_ns:
            return None
        return float(t / self.unprofiled_mean_ns) - 1.0

    def to_json(self) -> dict[str, Any]:
        t = self.target_ns
        return {
            "factor": self.factor,
            "interval": list(self.interval) if self.interval else None,
            "method": self.method,
            "traced_mean_ns": round_half_up(self.traced_mean_ns),
            "corrected_mean_ns": round_half_up(t) if t is not None else None,
            "unprofiled_mean_ns": round_half_up(self.unprofiled_mean_ns)
            if self.unprofiled_mean_ns is not None
            else None,
            "drift": self.drift,
            "unprofiled_rounds": self.rounds,
        }


def applied_dilation(run: RunParts) -> AppliedDilation:
    """The dilation the correction of `run` states and applies (see AppliedDilation): the run's
    measured dilation D (`tracekit.analyse.dilation.dilation_statistic`: the median of per-round
    profiled/unprofiled ratios, or the pooled mean ratio with one round) with its interval. The
    corrected per-token time is the traced one divided by exactly D (`target_ns`)."""
    traced = run.per_token["window"]
    d = run.dilation
    u = d.unprofiled
    if d.dilation is None or u is None or u.n == 0 or d.dilation <= 0:
        return AppliedDilation(None, None, traced, u.mean_ns if u is not None and u.n else None, 0)
    return AppliedDilation(d.dilation, d.interval, traced, u.mean_ns, len(u.rounds), d.method)
