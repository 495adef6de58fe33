"""The probe's curves read at the sizes a decode used: busbw and per-call time per (op, mode) at a
message size (interpolated in log2 size), whether a size is latency- or bandwidth-bound, the
side-by-side table of two modes, how each mode's rows were timed, and what each mode's transport
really was (from the transports a compare-links result records).

Pure functions over probe rows (docs/JSON.md#probe): no sweep, no GPU, no torch. The probe that
produces the rows is `tracekit.probe` (`tracekit compare-links`); the verdict that uses these
curves is `tracekit.analyse.links.verdict`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from msgspec import UNSET

from tracekit.model.documents.links import LinksSideBySideItem, LinksTransportsValue, ProbeRow

#: a size is latency-bound when the probe's per-call time there is under this many times its floor
#: (the least time at any size): t = t0 + bytes / bw, so below 2 t0 the fixed cost dominates
LATENCY_TIME_FACTOR = 2.0


def curve(
    rows: Sequence[ProbeRow], op: str, mode: str, field: Literal["busbw_gbps", "time_us"] = "busbw_gbps"
) -> list[tuple[int, float]]:
    """(bytes, value of `field`) for one op and mode: out-of-place where it exists, else in-place."""
    sel = [r for r in rows if r.op == op and r.mode == mode]
    forms = {r.in_place for r in sel}
    want = False not in forms
    pts = [(r.bytes, r.busbw_gbps if field == "busbw_gbps" else r.time_us) for r in sel if r.in_place == want]
    return sorted(pts)


def _interp(pts: Sequence[tuple[int, float]], size: int) -> tuple[float, str]:
    """Linear in log2(size) between the two nearest points; the nearest end outside them."""
    pts = [(b, v) for b, v in pts if b > 0 and math.isfinite(v)]
    if not pts:
        return float("nan"), "no probe rows"
    if size <= pts[0][0]:
        return pts[0][1], "exact" if size == pts[0][0] else f"below the sweep: value at {pts[0][0]} B"
    if size >= pts[-1][0]:
        return pts[-1][1], "exact" if size == pts[-1][0] else f"above the sweep: value at {pts[-1][0]} B"
    for (b0, v0), (b1, v1) in zip(pts, pts[1:], strict=False):
        if b0 <= size <= b1:
            if size == b0:
                return v0, "exact"
            if size == b1:
                return v1, "exact"
            t = (math.log2(size) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return v0 + t * (v1 - v0), f"interpolated between {b0} and {b1} B"
    return pts[-1][1], "nearest"  # pragma: no cover


def busbw_at(rows: Sequence[ProbeRow], op: str, mode: str, size: int) -> tuple[float, str]:
    """The probe's busbw for `op` in `mode` at `size` bytes: interpolated linearly in log2(size)
    between the two nearest probe sizes; the nearest end outside the sweep (said in the second value)."""
    return _interp(curve(rows, op, mode), size)


def time_at(rows: Sequence[ProbeRow], op: str, mode: str, size: int) -> float:
    """The probe's per-call time (us) for `op` in `mode` at `size` bytes (interpolated as busbw)."""
    return _interp(curve(rows, op, mode, "time_us"), size)[0]


def latency_floor_us(rows: Sequence[ProbeRow], op: str, mode: str) -> float:
    """The least per-call time the probe saw for `op` in `mode` at any size: its fixed cost."""
    times = [t for _, t in curve(rows, op, mode, "time_us") if math.isfinite(t) and t > 0]
    return min(times) if times else float("nan")


def regime_at(rows: Sequence[ProbeRow], op: str, modes: Sequence[str], size: int) -> str:
    """ "latency" when, in every mode, the probe's time at `size` is under LATENCY_TIME_FACTOR x its
    floor (the fixed per-call cost dominates, so bandwidth barely matters); "bandwidth" when it is
    not in some mode; "unknown" without probe times or above the sweep (the curve beyond it is not
    known)."""
    verdicts = []
    for m in modes:
        sizes = [b for b, _ in curve(rows, op, m, "time_us")]
        if sizes and size > max(sizes):
            return "unknown"
        t, floor = time_at(rows, op, m, size), latency_floor_us(rows, op, m)
        if not (math.isfinite(t) and math.isfinite(floor) and floor > 0):
            continue
        verdicts.append(t < LATENCY_TIME_FACTOR * floor)
    if not verdicts:
        return "unknown"
    return "latency" if all(verdicts) else "bandwidth"


def side_by_side(
    rows: Sequence[ProbeRow], modes: Sequence[str], decode_sizes: Mapping[str, set[int]]
) -> list[LinksSideBySideItem]:
    """One entry per (op, bytes, in_place): busbw and time per mode, ratio first/second mode."""
    keyed: dict[tuple[str, int, bool], dict[str, ProbeRow]] = {}
    for r in rows:
        keyed.setdefault((r.op, r.bytes, r.in_place), {})[r.mode] = r
    out = []
    for (op, size, in_place), per in sorted(keyed.items()):
        busbw = {m: per[m].busbw_gbps if m in per else None for m in modes}
        ratio = None
        if len(modes) >= 2:
            a, b = busbw.get(modes[0]), busbw.get(modes[1])
            if a is not None and b is not None and b > 0 and math.isfinite(a) and math.isfinite(b):
                ratio = a / b
        out.append(
            LinksSideBySideItem(
                op=op,
                bytes=size,
                in_place=in_place,
                busbw_gbps=busbw,
                time_us={m: per[m].time_us if m in per else None for m in modes},
                correct={m: per[m].correct if m in per else None for m in modes},
                ratio=ratio,
                decode=size in decode_sizes.get(op, set()),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# what each mode was, and how it was timed


def mode_labels(
    modes: Sequence[str], transports: Mapping[str, LinksTransportsValue] | None
) -> dict[str, str]:
    """What each mode really was, in words, from NCCL's log: "NVLink", "the PCIe/SHM path",
    "PCIe P2P"; the mode's own name when its transport is unknown (CPU, no logs)."""
    out = {}
    for m in modes:
        t = (transports or {}).get(m)
        if t is not None and t.uses_nvlink is True:
            out[m] = "NVLink"
        elif t is not None and t.wire == "host_memory":
            out[m] = "the PCIe/SHM path"
        elif t is not None and t.p2p is True:
            out[m] = "PCIe P2P"
        else:
            out[m] = m
    return out


def tuning_in_timed_loop(transports: Mapping[str, LinksTransportsValue] | None) -> list[str]:
    """Modes whose timed sweep logged NCCL TUNING (a host log line per call, which inflates small
    sizes): said by `nccl_debug_subsys`, or, in results written before it existed, by tuning
    choices in the (then only) timed log."""
    out = []
    for m, t in (transports or {}).items():
        subsys = t.nccl_debug_subsys
        if subsys not in (UNSET, None):
            if "TUNING" in str(subsys):
                out.append(m)
        elif t.algo_source is UNSET and t.algos is not UNSET and any(t.algos.values()):
            out.append(m)
    return out


def probe_timing(rows: Sequence[ProbeRow], modes: Sequence[str]) -> dict[str, str]:
    """How each mode's probe rows were timed: "graph" (CUDA-graph replay, no host launch per call),
    "eager" (one host call per iteration; rows without a `graph` field, written before it existed,
    count as eager), "host" (the CPU/gloo host clock), "mixed", or "none" (no rows)."""
    out = {}
    for m in modes:
        kinds = set()
        for r in rows:
            if r.mode != m:
                continue
            if r.graph is True:
                kinds.add("graph")
            elif r.device == "cpu" or r.timer == "host":
                kinds.add("host")
            else:
                kinds.add("eager")
        out[m] = kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "none")
    return out


def timing_sentence(timing: Mapping[str, str], iters: int | None = None) -> str:
    """One sentence on how the probe was timed; for eager timing, the host-launch caveat."""
    kinds = set(timing.values()) - {"none"}
    if not kinds:
        return ""
    if kinds == {"graph"}:
        per = f" of {iters} collectives" if iters else ""
        return f" Probe timing: CUDA-graph replay{per} (--graph): no host launch per call."
    if kinds == {"host"}:
        return " Probe timing: host clock around the gloo calls."
    if kinds == {"eager"}:
        return (
            " Probe timing: eager, one host launch per call: small-size times include host launch "
            "overhead (--graph removes it)."
        )
    parts = ", ".join(f"{m} {k}" for m, k in timing.items())
    return f" Probe timing differs between modes ({parts}): compare small sizes with care."
