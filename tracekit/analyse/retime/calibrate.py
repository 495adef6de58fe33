"""The profiler's cost removed from a run's replay (`tracekit.analyse.retime`; docs/METHOD.md,
"The dependency graph"): with the manifest's `profiler_calibration` its cost per call of each kind
is removed call by call; without one, one cost per runtime call (GPU) or one factor on host time
(CPU) is solved so that the unchanged replay's mean equals the unprofiled per-token time the
accounting uses (`calibrate`). A host sleep is one gap: it loses one call's cost."""

from __future__ import annotations

from collections.abc import Callable
from typing import NotRequired, TypedDict

from tracekit.analyse.retime.model import RunModel
from tracekit.analyse.retime.setting import Setting
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import Manifest


class ProfilerCalibration(TypedDict):
    """The manifest's `profiler_calibration` as the replay reads it (`manifest_calibration`): the
    cost per call of each kind ("runtime", "op", "collective"), how it was measured, the calls
    timed, and each rank's own costs where the capture kept them."""

    per_call_ns: dict[str, int]
    method: str
    calls: int | None
    per_rank_ns: NotRequired[dict[int, dict[str, int]]]


def manifest_calibration(manifest: Manifest | None) -> ProfilerCalibration | None:
    """The manifest's `profiler_calibration` ({"per_call_ns": {kind: int}, "method", "calls"}) when
    it has a cost of a known kind, else None."""
    cal = given(manifest.profiler_calibration) if manifest is not None else None
    per = given(cal.per_call_ns) if cal is not None else None
    if cal is None or per is None:
        return None
    out = {k: v for k, v in per.items() if k in ("runtime", "op", "collective") and v >= 0}
    if not out:
        return None
    # each rank's own costs (`capture`'s per_rank_ns): the replay removes each rank's where it has all
    per_rank: dict[int, dict[str, int]] = {}
    for rk, costs in (given(cal.per_rank_ns) or {}).items():
        if not rk.lstrip("-").isdigit():
            continue
        got = {k: v for k, v in costs.items() if k in ("runtime", "op", "collective") and v >= 0}
        if got:
            per_rank[int(rk)] = got
    found = ProfilerCalibration(per_call_ns=out, method=given(cal.method) or "", calls=given(cal.calls))
    if per_rank:
        found["per_rank_ns"] = per_rank
    return found


def solve_decreasing(
    err: Callable[[float], float], x0: float, step: float, tol: float, limit: float
) -> float | None:
    """The x >= x0 (or below, when err(x0) < 0) where the non-increasing, piecewise-linear err crosses
    0: a bracket by doubling steps, then regula falsi (Illinois). None when no bracket within `limit`."""
    f0 = err(x0)
    if abs(f0) <= tol:
        return x0
    sign = 1.0 if f0 > 0 else -1.0
    # the farthest bracket end the doubling steps try: where err has not crossed 0 there, it crosses
    # nowhere before it (non-increasing), so one replay says None instead of one per step
    d_far = step
    while d_far * 2 <= limit:
        d_far *= 2
    f_far = err(x0 + sign * d_far)
    if (f_far > 0) if sign > 0 else (f_far < 0):
        return None
    lo, f_lo = x0, f0
    hi, d = x0, step
    while True:
        hi = x0 + sign * d
        f_hi = err(hi)
        if (f_hi <= 0) if sign > 0 else (f_hi >= 0):
            break
        lo, f_lo = hi, f_hi
        d *= 2
        if d > limit:
            return None
    side = 0
    best = hi
    for _ in range(60):
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else (lo + hi) / 2
        if not min(lo, hi) < mid < max(lo, hi):
            mid = (lo + hi) / 2
        f_mid = err(mid)
        best = mid
        if abs(f_mid) <= tol or abs(hi - lo) < 1e-9:
            break
        if (f_mid > 0) == (f_lo > 0):
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo /= 2
            side = 1
    return best


def calibrate(model: RunModel, rel_tol: float = 2e-5) -> float:
    """Correct the replay for the profiler's cost. With the manifest's `profiler_calibration` (the
    same calls timed with and without the profiler at capture time), its cost per call of each kind
    is removed call by call: per CUDA runtime call and per collective call on a GPU timeline, per
    op on a host timeline (`correction` "manifest calibration"). Without one, and with an
    unprofiled per-token time `target_ns`, one cost is solved for so that the unchanged replay's
    mean equals it within `rel_tol` (`correction` "solved"):

    - GPU timeline: a fixed `host_deduct` ns is taken from every runtime call's host time (the gap
      before it first, then the call); a host sleep is one gap and loses one deduction; a run the
      device sets (a CUDA-graph replay launches nothing per kernel) gets a factor on its device op
      times and gaps instead;
    - host timeline: one factor `host_scale` on every part but transfer, the rule
      `attribution.reconcile.reconcile` uses there.

    Returns the deduction (GPU) or the factor (host)."""
    model.host_scale, model.host_deduct, model.device_scale = 1.0, 0.0, 1.0
    model.deduct_collective, model.correction = 0.0, "none"
    model.rank_deduct = None
    cal = model.calibration
    if cal is not None:
        per = cal["per_call_ns"]
        call_key = "runtime" if model.timeline == "gpu" else "op"
        model.host_deduct = float(per.get(call_key, 0))
        if model.timeline == "gpu":
            model.deduct_collective = float(per.get("collective", 0))
        by_rank = cal.get("per_rank_ns") or {}
        if by_rank and all(r in by_rank and call_key in by_rank[r] for r in model.ranks):
            model.rank_deduct = {
                r: (
                    float(by_rank[r][call_key]),
                    float(by_rank[r].get("collective", 0)) if model.timeline == "gpu" else 0.0,
                )
                for r in model.ranks
            }
        model.correction = "manifest calibration"
        return model.host_deduct
    if model.target_ns is None:
        return 0.0
    target = float(model.target_ns)
    tol = max(rel_tol * target, 1.0)
    model.correction = "solved"
    if model.timeline == "gpu":

        def err_gpu(delta: float) -> float:
            return float(model.replay(Setting(host_deduct=delta)).mean()) - target

        value = solve_decreasing(err_gpu, 0.0, 1000.0, tol, 1e9)
        if value is not None and value < 0:
            # the replay is already short of the unprofiled time (a noisy host: the loop's own
            # per-token time differs from the token period): the profiler cannot have made it faster
            value = None
        elif value is None:  # device-bound (a CUDA-graph replay launches nothing per kernel)
            beta = device_scale(model, target, tol)
            if beta is not None:
                model.device_scale = beta
                model.notes.append(
                    f"{model.label}: removing host time cannot reach the unprofiled per-token time "
                    f"{target / 1e6:.3f} ms (the device sets it: the profiler's cost is on the device "
                    f"here); device op times and gaps scaled by {beta:.4f} instead"
                )
                return 0.0
    else:

        def err_host(alpha: float) -> float:
            return target - float(model.replay(Setting(host_scale=alpha)).mean())

        value = solve_decreasing(err_host, 1.0, 0.25, tol, 63.0)
        if value is not None and value < 0:
            value = None
    if value is None:
        model.correction = "none"
        model.notes.append(
            f"{model.label}: the replay cannot reach the unprofiled per-token time {target / 1e6:.3f} ms by "
            "removing host time; not corrected"
        )
        return 0.0
    if model.timeline == "gpu":
        model.host_deduct = value
    else:
        model.host_scale = value
    return value


def device_scale(model: RunModel, target: float, tol: float) -> float | None:
    """The factor in (0.1, 1] on every device op time and gap (collective transfers excepted: they
    are the link's) that brings the unchanged replay's mean to `target`; None if none does."""

    def err_dev(y: float) -> float:
        return float(model.replay(Setting(device_scale=1.0 - y)).mean()) - target

    y = solve_decreasing(err_dev, 0.0, 0.01, tol, 0.9)
    return None if y is None or not 0.0 <= y < 0.9 else 1.0 - y
