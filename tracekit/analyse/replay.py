"""What-if: replay a decode trace per token across ranks under counterfactuals (docs/METHOD.md section Critical path and what-if).

The replay model is the critical path's rendezvous model (`tracekit.analyse.critical_path`) run
forward in time, with each rank's host and device kept apart where the trace has both:

**GPU timeline** (kernels with CUDA runtime calls joined by `correlation`). Per rank and step, a
*host chain*: the runtime calls opened inside the step's annotation, in order, each with the host
gap before it (Python, dispatch, the profiler: everything between two calls) and its own duration;
and a *device chain*: the GPU operations those calls launched, in device order. An operation j
launched by call i starts at

    s_j = max(h_i + rho_j, F_{j-1} + q_j)        (and, for a collective, then waits for the others)

with h_i the call's start, rho_j the launch-to-start latency, F the device frontier (latest end so
far) and q_j the device's own gap between operations. Both terms equal the measured start by
construction; which one bound is read from the trace: an operation that started on an idle device
(q_j >= 2 us) within a launch latency of its call (at most max(3 rho_typ, rho_typ + 20 us)) was
bound by its launch and keeps its measured rho_j while its q becomes the rank's typical queued gap
(never more than measured); any other operation was queued (behind busy device work or another
stream) and keeps its measured q_j while its rho becomes the rank's typical launch latency rho_typ
(never more than measured). So the unchanged replay is exact. A blocking
synchronisation call returns its measured return latency after the device frontier; a
non-blocking one takes its measured time. A collective starts on every rank when its last rank
arrives (`a = max s_r`) and ends on rank r at `a + (e_r - a_measured)`: its transfer. The window
ends at the later of the annotation's end (the host chain plus its trailing gap) and the device
frontier, as `tracekit.analyse.steps` measures it.

**Host timeline** (CPU / gloo runs): per rank and step, the segments between collectives measured
with the partition's priority (compute, memory, unknown, sync, host gaps = idle and the enqueueing
`c10d::` op), then the collective as a rendezvous, then its transfer.

Each step is replayed jointly over ranks, every rank starting at its measured window start on the
aligned clock; the step time is the longest window, as everywhere else. Replaying the unchanged
trace gives back the measured step times (`replay_error`).

**Knobs** (`KNOB_DEFINITIONS`), each a transformation of the model, combinable:
- `transfer=0`: every collective ends at its last arrival (an infinitely fast link).
- `transfer=probe:FILE[@MODE]`: every collective's transfer is the time a `tracekit probe` /
  `compare-links` JSON measured for its op and size (log-log interpolation between rows; in-place
  rows first; MODE picks the rows' `mode`, e.g. nvlink or pcie; default the first).
- `launch=0`: no host launch overhead (what CUDA graphs remove): every host gap and launch call
  takes no time, so each rank's device runs back to back, every operation separated only by the
  rank's typical queued device gap and released at the typical launch latency. Synchronisations
  and rendezvous stay. Not applicable on a host timeline.
- `sync=0`: synchronisation calls return at once (no blocking, no time).
- `straggler=off`: per segment between collective launches (k-th segment on every rank), each
  rank's host gaps are scaled so their sum is the fastest rank's (on a host timeline: the idle and
  enqueue time of the segment).
- `compute=/N`: perfect scaling of the TP=1 kernels: on every rank each compute operation is
  scaled by (C1 / N) / C_r, with C1 the baseline's and C_r the rank's mean compute per token (sum
  of compute operation durations; on a host timeline: compute op time).

**Correction to the unprofiled times** (docs/METHOD.md section Dilation): the profiler's cost is host time. On a GPU
timeline a fixed cost per CUDA runtime call is taken from every call's host time (the gap before
it first); on a host timeline every part but transfer is multiplied by one factor (the rule
`shortfall.reconcile` uses there); either is solved for (`calibrate`) so that the unchanged
replay's mean per-token time equals the unprofiled one the accounting uses. Knobs then apply to the
corrected model. A host sleep (an injected straggler) is one gap: it loses one call's cost, not a
share of its length.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.shortfall import RunParts
from tracekit.errors import TracekitError

SCHEMA_VERSION = "1.0"

#: The knob names, in report order.
KNOB_NAMES: tuple[str, ...] = ("transfer", "launch", "sync", "straggler", "compute")
#: The knobs whose Shapley values split S when none are given.
DEFAULT_KNOBS: tuple[str, ...] = ("transfer=0", "launch=0", "sync=0", "straggler=off", "compute=/N")
#: One line per knob: the transformation it applies (JSON `knobs[].definition`).
KNOB_DEFINITIONS: dict[str, str] = {
    "transfer=0": "every collective ends when its last rank arrives (infinitely fast link)",
    "transfer=probe": "every collective's transfer takes the probe's measured time for its op and size",
    "launch=0": "no host launch overhead (CUDA graphs): host gaps and launch calls take no time; the device "
    "runs back to back with its typical queued gap",
    "sync=0": "synchronisation calls return at once",
    "straggler=off": "per segment between collectives, every rank's host gaps scaled to the fastest rank's",
    "compute=/N": "every compute operation scaled so each rank's compute per token is the baseline's / N",
}
#: A device gap of at least this much before an operation means the device was idle: the launch bound it.
IDLE_GAP_NS = 2000
#: Launch latencies above this are queueing, not latency, when estimating the typical latency.
LAUNCH_LATENCY_CAP_NS = 100_000
#: Replays at most 2^MAX_SHAPLEY_KNOBS combinations.
MAX_SHAPLEY_KNOBS = 6


class ReplayError(TracekitError):
    """A knob or probe file that cannot be applied."""


# ------------------------------------------------------------------------------------------
# knobs


@dataclass(frozen=True)
class ProbeTimes:
    """Per op, the probe's (bytes, time ns) rows, sorted by bytes."""

    path: str
    mode: str | None
    rows: Mapping[str, tuple[tuple[int, float], ...]]

    def time_ns(self, op: str, size: int) -> float | None:
        pts = self.rows.get(op)
        if not pts or size <= 0:
            return None
        xs = np.log([max(b, 1) for b, _ in pts])
        ys = np.log([max(t, 1e-3) for _, t in pts])
        return float(np.exp(np.interp(math.log(size), xs, ys)))


def load_probe(text: str) -> ProbeTimes:
    """`FILE[@MODE]`: the rows of a `tracekit probe` / `compare-links` JSON (`rows[]`: op, bytes,
    time_us, mode, in_place)."""
    path, _, mode = text.partition("@")
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{path}: cannot read the probe JSON ({exc})") from None
    rows = doc.get("rows") if isinstance(doc, Mapping) else None
    if not isinstance(rows, list) or not rows:
        raise ReplayError(f"{path}: no probe rows (expected the JSON of `tracekit probe` or `compare-links`)")
    modes = [r.get("mode") for r in rows if isinstance(r, Mapping)]
    chosen = mode or next((m for m in modes if m), None)
    if mode and mode not in modes:
        raise ReplayError(
            f"{path}: no rows of mode {mode!r} (modes: {', '.join(sorted({str(m) for m in modes}))})"
        )
    table: dict[str, dict[int, list[tuple[bool, float]]]] = {}
    for r in rows:
        if not isinstance(r, Mapping) or (chosen and r.get("mode") not in (chosen, None)):
            continue
        op, b, t = r.get("op"), r.get("bytes"), r.get("time_us")
        if not isinstance(op, str) or not isinstance(b, int) or not isinstance(t, int | float):
            continue
        table.setdefault(op, {}).setdefault(b, []).append((bool(r.get("in_place")), float(t) * 1000.0))
    out: dict[str, tuple[tuple[int, float], ...]] = {}
    for op, by_size in table.items():
        pts = []
        for b, vals in sorted(by_size.items()):
            inplace = [t for ip, t in vals if ip]
            pts.append((b, min(inplace or [t for _, t in vals])))
        out[op] = tuple(pts)
    if not out:
        raise ReplayError(f"{path}: no usable rows (op, bytes, time_us)")
    return ProbeTimes(path, chosen, out)


@dataclass(frozen=True)
class Knob:
    """One knob: `name` in KNOB_NAMES, `value` as written (`0`, `probe:FILE`, `off`, `/N`)."""

    name: str
    value: str
    probe: ProbeTimes | None = None

    @property
    def spec(self) -> str:
        return f"{self.name}={self.value}"

    @property
    def definition(self) -> str:
        key = "transfer=probe" if self.probe is not None else self.spec
        return KNOB_DEFINITIONS[key]


def parse_knob(text: str, probe: str | None = None) -> Knob:
    """One knob from its spec (see the module doc); `probe` is --probe's FILE for `transfer=probe`."""
    name, eq, value = text.strip().partition("=")
    name, value = name.strip(), value.strip()
    if not eq or name not in KNOB_NAMES:
        raise ReplayError(
            f"unknown knob {text!r}; knobs: transfer=0, transfer=probe:FILE, launch=0, sync=0, straggler=off, "
            "compute=/N"
        )
    if name == "transfer" and value.startswith("probe"):
        src = value[len("probe") :].lstrip(":") or (probe or "")
        if not src:
            raise ReplayError("transfer=probe needs a file: transfer=probe:FILE or --probe FILE")
        return Knob("transfer", f"probe:{src}", load_probe(src))
    allowed = {"transfer": "0", "launch": "0", "sync": "0", "straggler": "off", "compute": "/N"}
    if value != allowed[name]:
        raise ReplayError(f"knob {name} takes {name}={allowed[name]}, got {text!r}")
    return Knob(name, value)


def parse_combination(text: str, probe: str | None = None) -> tuple[Knob, ...]:
    """A combination `k1,k2,...` (each knob once)."""
    knobs = tuple(parse_knob(t, probe) for t in text.split(",") if t.strip())
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        raise ReplayError(f"a combination names a knob twice: {text!r}")
    return tuple(sorted(knobs, key=lambda k: KNOB_NAMES.index(k.name)))


def combination_spec(knobs: Iterable[Knob]) -> str:
    ks = sorted(knobs, key=lambda k: KNOB_NAMES.index(k.name))
    return ",".join(k.spec for k in ks) or "none"


@dataclass(frozen=True)
class _Setting:
    transfer: str | ProbeTimes | None = None  # None, "zero" or the probe
    launch0: bool = False
    sync0: bool = False
    straggler_off: bool = False
    compute_scale: Mapping[int, float] | None = None
    host_scale: float = 1.0
    host_deduct: float = 0.0  # ns taken from every host call's time (gap first), the calibration
    device_scale: float = 1.0  # factor on device op times and gaps (calibration of a device-bound run)


# ------------------------------------------------------------------------------------------
# one run's model


@dataclass
class _GpuProgram:
    """One rank's host and device chains of one step (module doc); times relative to its window start."""

    rank: int
    h_gap: np.ndarray  # host gap before each call
    h_dur: np.ndarray  # the call's own time (0 for a blocking sync: see h_eps)
    h_sync: np.ndarray  # bool: a synchronisation call
    h_block: np.ndarray  # bool: it blocked on the device
    h_eps: np.ndarray  # blocking sync: return latency after the device frontier
    h_seg: np.ndarray  # straggler segment (collective launches before it)
    tail_gap: float
    d_launch: np.ndarray  # the launching call's index, -1: none (released from the window start)
    d_dur: np.ndarray
    d_compute: np.ndarray  # bool
    d_rho: np.ndarray
    d_rho_k: np.ndarray
    d_q: np.ndarray
    d_q_k: np.ndarray
    d_inst: np.ndarray  # matched collective instance, -1 none
    d_x: np.ndarray  # transfer (e - a) of a collective
    d_op: list[str]
    d_bytes: np.ndarray
    q_typ: float = 0.0  # the rank's typical queued device gap (launch=0 separates operations by it)


@dataclass
class _HostProgram:
    """One rank's segments of one step on a host timeline: `seg` [K+1, 6] (compute, memory, unknown,
    sync, idle, enqueue) before each of the K collectives and after the last."""

    rank: int
    seg: np.ndarray
    c_inst: np.ndarray
    c_x: np.ndarray
    c_op: list[str]
    c_bytes: np.ndarray
    n_ops: np.ndarray  # per segment: top-level op intervals (the calibration's per-op deduction)


_HOST_COLS = ("compute", "memory", "unknown", "sync", "idle", "enqueue", "lead")


def _lead_gap(busy_s: np.ndarray, busy_e: np.ndarray, a: int, b: int) -> int:
    """The idle time from `a` to the first op in [a, b) (all of it when there is none)."""
    k = int(np.searchsorted(busy_e, a, side="right"))
    if k < len(busy_s) and busy_s[k] < b:
        return max(int(busy_s[k]) - a, 0)
    return b - a


@dataclass
class RunModel:
    """The replay model of one run: per steady step, every rank's program and its start offset."""

    label: str
    n_ranks: int
    ranks: list[int]
    timeline: str  # "gpu" | "host"
    steps: list[int]
    programs: dict[int, dict[int, _GpuProgram | _HostProgram]]  # step -> rank -> program
    offsets: dict[int, dict[int, float]]  # step -> rank -> window start - earliest, aligned clock
    members: dict[int, dict[int, frozenset[int]]]  # step -> instance -> ranks holding it in this step
    measured_ns: np.ndarray  # per steady step, the measured step time (longest window)
    compute_per_token: dict[int, float]  # rank -> mean compute per token
    target_ns: Fraction | None  # the unprofiled per-token time (None: not corrected)
    notes: list[str] = field(default_factory=list)
    host_scale: float = 1.0
    host_deduct: float = 0.0
    device_scale: float = 1.0

    def replay(self, setting: _Setting) -> np.ndarray:
        """Per steady step, the replayed step time (ns, float)."""
        out = np.empty(len(self.steps))
        for i, st in enumerate(self.steps):
            out[i] = _replay_step(self, st, setting)
        return out

    def applicable(self, knob: Knob) -> bool:
        if knob.name in ("transfer", "straggler", "compute"):
            return self.n_ranks > 1
        if knob.name == "launch":
            return self.timeline == "gpu"
        return True


def _replay_step(model: RunModel, st: int, setting: _Setting) -> float:
    progs = model.programs[st]
    members = model.members[st]
    procs: dict[int, Generator[tuple[int, float, float, str, int], float, float]] = {}
    for r, prog in progs.items():
        off = model.offsets[st][r]
        if isinstance(prog, _GpuProgram):
            procs[r] = _run_gpu(prog, setting, off, members, _straggler_scale(model, st, r, setting))
        else:
            procs[r] = _run_host(prog, setting, off, _host_idle_target(model, st, r, setting))
    ends: dict[int, float] = {}
    waiting: dict[int, dict[int, tuple[float, float, str, int]]] = {}
    requests: dict[int, tuple[int, float, float, str, int]] = {}

    def advance(r: int, value: float | None) -> None:
        try:
            req = next(procs[r]) if value is None else procs[r].send(value)
        except StopIteration as stop:
            ends[r] = float(stop.value)
            return
        requests[r] = req
        inst, s, x, op, size = req
        waiting.setdefault(inst, {})[r] = (s, x, op, size)

    for r in procs:
        advance(r, None)
    while len(ends) < len(procs):
        ready = [i for i, w in waiting.items() if set(w) >= members.get(i, frozenset(w))]
        if not ready:
            raise AssertionError(
                f"{model.label}: replay of step {st} deadlocked at collectives {sorted(waiting)}"
            )
        for inst in ready:
            w = waiting.pop(inst)
            a = max(s for s, _, _, _ in w.values())
            for r, (_s, x, op, size) in w.items():
                requests.pop(r, None)
                advance(r, a + _transfer(x, op, size, setting))
    return max(ends[r] - model.offsets[st][r] for r in ends)


def _transfer(x: float, op: str, size: int, setting: _Setting) -> float:
    if setting.transfer is None:
        return x
    if setting.transfer == "zero":
        return 0.0
    assert isinstance(setting.transfer, ProbeTimes)
    t = setting.transfer.time_ns(op, size)
    return x if t is None else t


def _segments(p: _GpuProgram | _HostProgram) -> int:
    if isinstance(p, _HostProgram):
        return len(p.seg)
    return int(p.h_seg.max()) + 1 if len(p.h_seg) else 1


def _straggler_scale(model: RunModel, st: int, r: int, setting: _Setting) -> np.ndarray | None:
    """GPU: per segment, the factor that scales rank r's host gaps to the fastest rank's sum."""
    if not setting.straggler_off or model.n_ranks < 2:
        return None
    progs = model.programs[st]
    nseg = {p.h_seg.max() + 1 if len(p.h_seg) else 1 for p in progs.values() if isinstance(p, _GpuProgram)}
    if len(nseg) != 1:
        return None
    k = int(nseg.pop())
    sums = {}
    for rr, p in progs.items():
        assert isinstance(p, _GpuProgram)
        g = np.bincount(p.h_seg, weights=p.h_gap, minlength=k).astype(float)
        g[k - 1] += p.tail_gap
        sums[rr] = g
    fastest = np.min(np.stack(list(sums.values())), axis=0)
    own = sums[r]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(own > 0, fastest / own, 1.0)


def _host_idle_target(model: RunModel, st: int, r: int, setting: _Setting) -> np.ndarray | None:
    """Host timeline: per segment, the fastest rank's host gaps (idle + enqueue)."""
    if not setting.straggler_off or model.n_ranks < 2:
        return None
    progs = [p for p in model.programs[st].values() if isinstance(p, _HostProgram)]
    shapes = {p.seg.shape for p in progs}
    if len(shapes) != 1:
        return None
    gaps = np.stack([p.seg[:, 4] + p.seg[:, 5] for p in progs])
    leads = np.stack([p.seg[:, 6] for p in progs])
    return np.stack([gaps.min(axis=0), leads.min(axis=0)], axis=1)


def _run_gpu(
    p: _GpuProgram,
    setting: _Setting,
    off: float,
    members: Mapping[int, frozenset[int]],
    seg_scale: np.ndarray | None,
) -> Generator[tuple[int, float, float, str, int], float, float]:
    alpha = setting.host_scale
    launch0 = setting.launch0
    kind = setting.compute_scale.get(p.rank, 1.0) if setting.compute_scale else 1.0
    n_h, n_d = len(p.h_gap), len(p.d_dur)
    gaps = np.zeros(n_h) if launch0 else p.h_gap * alpha
    if seg_scale is not None and not launch0:
        gaps = gaps * seg_scale[p.h_seg]
    durs = np.where(p.h_sync, p.h_dur * alpha, 0.0 if launch0 else p.h_dur * alpha)
    delta = setting.host_deduct
    if delta and not launch0:  # the profiler's cost per call: from the gap before it, then the call
        rest = np.maximum(delta - gaps, 0.0)
        gaps = np.maximum(gaps - delta, 0.0)
        durs = np.where(p.h_sync, durs, np.maximum(durs - rest, 0.0))
    beta = setting.device_scale
    dur_d = (np.where(p.d_compute, p.d_dur * kind, p.d_dur) * beta).tolist()
    # launch=0: back to back, each operation at most the typical queued gap after the frontier; a
    # longer measured gap of a queued operation (a cross-stream event wait after a collective, the
    # profiler's per-launch cost) is a launch-time artifact a graph's edges do not keep
    q = ((np.minimum(p.d_q_k, p.q_typ) if launch0 else p.d_q_k) * beta).tolist()
    launch = p.d_launch.tolist()
    coll = [int(i) >= 0 and len(members.get(int(i), ())) > 1 for i in p.d_inst]
    no_launch_release = off + (0.0 if launch0 else 1.0) * alpha * p.d_rho_k
    blocking = not setting.sync0 and bool(p.h_sync.any())
    F = off
    if not blocking:
        # the host never waits for the device: its chain is a cumulative sum
        inc = gaps + np.where(p.h_sync, 0.0, durs)
        h_end = off + np.cumsum(inc)
        h_start = h_end - np.where(p.h_sync, 0.0, durs)
        H = float(h_end[-1]) if n_h else off
        if n_d:
            from_call = h_start[np.maximum(p.d_launch, 0)] + p.d_rho_k if n_h else no_launch_release
            release = np.where(p.d_launch < 0, no_launch_release, from_call).tolist()
        else:
            release = []
        for j in range(n_d):
            st = release[j] if release[j] > F + q[j] else F + q[j]
            if coll[j]:
                e = yield (int(p.d_inst[j]), st, float(p.d_x[j]), p.d_op[j], int(p.d_bytes[j]))
            else:
                e = st + dur_d[j]
            if e > F:
                F = e
    else:
        hs = [0.0] * n_h
        gap_l, dur_l = gaps.tolist(), durs.tolist()
        sync_l, block_l, eps_l = p.h_sync.tolist(), p.h_block.tolist(), p.h_eps.tolist()
        rho_l, nlr = p.d_rho_k.tolist(), no_launch_release.tolist()
        H = off
        j = 0
        for i in range(n_h + 1):
            while j < n_d and launch[j] < i:  # device operations launched by calls before i
                rel = nlr[j] if launch[j] < 0 else hs[launch[j]] + rho_l[j]
                st = max(rel, F + q[j])
                if coll[j]:
                    e = yield (int(p.d_inst[j]), st, float(p.d_x[j]), p.d_op[j], int(p.d_bytes[j]))
                else:
                    e = st + dur_d[j]
                F = max(F, e)
                j += 1
            if i == n_h:
                break
            H += gap_l[i]
            hs[i] = H
            if sync_l[i]:
                H = max(H, F + eps_l[i]) if block_l[i] else max(H + dur_l[i], F)
            else:
                H += dur_l[i]
    tail = 0.0 if launch0 else p.tail_gap * alpha * (float(seg_scale[-1]) if seg_scale is not None else 1.0)
    return max(H + tail, F)


def _run_host(
    p: _HostProgram, setting: _Setting, off: float, idle_target: np.ndarray | None
) -> Generator[tuple[int, float, float, str, int], float, float]:
    alpha = setting.host_scale
    kind = setting.compute_scale.get(p.rank, 1.0) if setting.compute_scale else 1.0
    t = off
    for k in range(len(p.seg)):
        c, m, u, y, idle, enq, lead = p.seg[k]
        if idle_target is not None:
            # the fastest rank's host gaps: its wake-up after the last collective (lead) and its
            # gaps and enqueue before the next, each the minimum over ranks
            if idle + enq > 0:
                f = idle_target[k, 0] / (idle + enq)
                idle, enq = idle * f, enq * f
            lead = idle_target[k, 1]
        if setting.sync0:
            y = 0.0
        total = (c * kind + m + u + y + idle + enq + lead) * alpha
        if setting.host_deduct and total > 0:  # the profiler's cost per op, from every host part
            total = max(total - setting.host_deduct * p.n_ops[k], 0.0)
        t += total
        if k < len(p.c_inst):
            t = yield (int(p.c_inst[k]), t, float(p.c_x[k]), p.c_op[k], int(p.c_bytes[k]))
    return t


# ------------------------------------------------------------------------------------------
# building the model from a trace


def build_model(
    parts: RunParts, classified: pd.DataFrame | AnalysedRun, target_ns: Fraction | None, label: str
) -> RunModel:
    """The replay model of one attributed run (`shortfall.attribute_run`) over its steady steps."""
    from tracekit.analyse.align import as_tokens
    from tracekit.analyse.steps import find_steps_detailed

    steady = parts.steady
    steps = [int(s) for s in steady["step"]]
    measured = steady["window_ns"].to_numpy(np.float64)
    if isinstance(classified, AnalysedRun):  # its step windows were found once, for attribute_run
        wins = classified.steps(parts.step_pattern).steps
        classified = classified.events
    else:
        wins = find_steps_detailed(classified, parts.step_pattern).steps
    wins = as_tokens(wins, parts.collectives.per_rank)  # the steps as attribute_run joined them (align.py)
    wins = wins[wins["step"].isin(steps)]
    part_w = parts.steps[["rank", "step", "start_ns", "end_ns"]]
    wins = wins.drop(columns=["end_ns"]).merge(part_w[["rank", "step", "end_ns"]], on=["rank", "step"])
    offsets_clock = parts.collectives.clock.offsets_ns
    pr = parts.collectives.per_rank
    inst_bytes: dict[int, int] = {}
    if len(parts.collectives.instances):
        ins = parts.collectives.instances
        inst_bytes = {
            int(i): int(b) for i, b in zip(ins["instance"], ins["size_bytes"].fillna(-1), strict=True)
        }
    ev_rank = classified["rank"].to_numpy(np.int64)
    programs: dict[int, dict[int, Any]] = {st: {} for st in steps}
    offsets: dict[int, dict[int, float]] = {st: {} for st in steps}
    members: dict[int, dict[int, set[int]]] = {st: {} for st in steps}
    compute_tok: dict[int, float] = {}
    notes: list[str] = []
    timeline = parts.timeline if parts.timeline in ("gpu", "host") else "gpu"
    for r in parts.ranks:
        ev = classified[ev_rank == r]
        w = wins[wins["rank"] == r]
        prs = pr[pr["rank"] == r] if len(pr) else pr
        built: Mapping[int, tuple[_GpuProgram | _HostProgram, set[int]]]
        if timeline == "gpu":
            built, comp = _gpu_programs(ev, w, prs, inst_bytes, r)
        else:
            built, comp = _host_programs(ev, w, prs, inst_bytes, r)
        compute_tok[r] = comp
        for st, (prog, insts) in built.items():
            programs[st][r] = prog
            for inst in insts:
                members[st].setdefault(inst, set()).add(r)
    for st in steps:
        w = wins[wins["step"] == st]
        al = {
            int(r): int(s) - offsets_clock.get(int(r), 0)
            for r, s in zip(w["rank"], w["start_ns"], strict=True)
        }
        first = min(al.values())
        offsets[st] = {r: float(a - first) for r, a in al.items()}
    frozen = {st: {i: frozenset(m) for i, m in d.items()} for st, d in members.items()}
    if len(parts.ranks) > 1:
        uneven = sum(
            1
            for st in steps
            if len({_segments(p) for p in programs[st].values()})
            > 1  # ranks launched different collective counts
        )
        if uneven:
            notes.append(
                f"{label}: {uneven} step(s) have different collective counts on the ranks; straggler=off leaves them as "
                "they are"
            )
    return RunModel(
        label=label,
        n_ranks=len(parts.ranks),
        ranks=list(parts.ranks),
        timeline=timeline,
        steps=steps,
        programs=programs,
        offsets=offsets,
        members=frozen,
        measured_ns=measured,
        compute_per_token=compute_tok,
        target_ns=target_ns,
        notes=notes,
    )


def _gpu_programs(
    ev: pd.DataFrame, wins: pd.DataFrame, pr: pd.DataFrame, inst_bytes: Mapping[int, int], rank: int
) -> tuple[dict[int, tuple[_GpuProgram, set[int]]], float]:
    from tracekit.classify.rules import GPU_KINDS

    kind = ev["kind"].astype(str).to_numpy()
    cls = ev["cls"].astype(str).to_numpy()
    start = ev["start_ns"].to_numpy(np.int64)
    end = ev["end_ns"].to_numpy(np.int64)
    corr = ev["correlation"].to_numpy(np.int64)
    is_rt = kind == "runtime"
    is_dev = np.isin(kind, list(GPU_KINDS))
    rt_idx = np.flatnonzero(is_rt)
    rt_idx = rt_idx[np.argsort(start[rt_idx], kind="stable")]
    dev_idx = np.flatnonzero(is_dev)
    dev_idx = dev_idx[np.argsort(start[dev_idx], kind="stable")]
    # collective of each device op (by its raw start/end on this rank)
    coll_of: dict[tuple[int, int], tuple[int, int, str]] = {}
    if len(pr):
        for inst, s, e, a, op in zip(
            pr["instance"], pr["raw_start_ns"], pr["raw_end_ns"], pr["arrival_raw_ns"], pr["op"], strict=True
        ):
            coll_of[(int(s), int(e))] = (int(inst), int(e) - max(int(a), int(s)), str(op))
    rt_start_sorted = start[rt_idx]
    # the device operations of each correlation id (a launch call's work), in device order
    devs_of: dict[int, list[int]] = {}
    for d in dev_idx:
        c = int(corr[d])
        if c >= 0:
            devs_of.setdefault(c, []).append(int(d))
    programs: dict[int, tuple[_GpuProgram, set[int]]] = {}
    comp_total, n_steps = 0.0, 0
    rhos, qs = [], []
    per_step: list[Any] = []
    for st, ws, ann_end, we in zip(
        wins["step"], wins["start_ns"], wins["annotation_end_ns"], wins["end_ns"], strict=True
    ):
        ws, ann_end, we = int(ws), int(ann_end), int(we)
        lo, hi = np.searchsorted(rt_start_sorted, [ws, ann_end], side="left")
        calls = rt_idx[lo:hi]
        if len(calls):
            pairs = [(d, k) for k, c in enumerate(corr[calls]) if c >= 0 for d in devs_of.get(int(c), ())]
            pairs.sort(key=lambda dk: (start[dk[0]], dk[0]))
            d_sel = np.asarray([d for d, _ in pairs], dtype=np.int64)
            launch = np.asarray([k for _, k in pairs], dtype=np.int64)
        else:  # no runtime calls (kernels-only trace): released from the window start
            d_sel = dev_idx[(start[dev_idx] >= ws) & (start[dev_idx] < we)]
            launch = np.full(len(d_sel), -1, dtype=np.int64)
        ds, de = start[d_sel].astype(np.float64), end[d_sel].astype(np.float64)
        frontier = np.maximum.accumulate(np.concatenate(([float(ws)], de)))[:-1]
        cs = start[calls].astype(np.float64)
        hstart = np.where(launch >= 0, cs[np.maximum(launch, 0)] if len(calls) else float(ws), float(ws))
        rho = ds - hstart
        q = ds - frontier
        rhos.append(rho[(q >= IDLE_GAP_NS) & (launch >= 0) & (rho < LAUNCH_LATENCY_CAP_NS)])
        per_step.append((int(st), calls, d_sel, launch, ws, ann_end, we, ds, de, frontier, rho, q))
    rho_all = np.concatenate(rhos) if rhos else np.zeros(0)
    rho_typ = float(np.median(rho_all)) if len(rho_all) else 5000.0
    # launch-bound: the device sat idle before it and it started a launch latency after its call;
    # otherwise it was queued (launched while the device was busy, or held by another stream)
    rho_bound = max(3 * rho_typ, rho_typ + 20_000)
    qs = [q[~((q >= IDLE_GAP_NS) & (rho <= rho_bound))] for *_, rho, q in per_step]
    q_all = np.concatenate(qs) if qs else np.zeros(0)
    q_typ = float(max(np.median(q_all), 0.0)) if len(q_all) else 1000.0
    for st, calls, d_sel, launch, ws, ann_end, _we, ds, de, _frontier, rho, q in per_step:
        idle = (q >= IDLE_GAP_NS) & (rho <= rho_bound)
        dur = de - ds
        compute = cls[d_sel] == "compute"
        comp_total += float(dur[compute].sum())
        n_steps += 1
        inst = np.full(len(d_sel), -1, dtype=np.int64)
        x = np.zeros(len(d_sel))
        ops: list[str] = [""] * len(d_sel)
        nbytes = np.full(len(d_sel), -1, dtype=np.int64)
        insts: set[int] = set()
        for k, d in enumerate(d_sel):
            hit = coll_of.get((int(start[d]), int(end[d])))
            if hit is not None:
                inst[k], x[k], ops[k] = hit[0], max(hit[1], 0), hit[2]
                nbytes[k] = inst_bytes.get(hit[0], -1)
                insts.add(hit[0])
        rho_k = np.where(idle, rho, np.minimum(rho, rho_typ))
        q_k = np.where(idle, np.minimum(q, q_typ), q)
        # host chain
        cs, ce = start[calls].astype(np.float64), end[calls].astype(np.float64)
        prev_end = (
            np.concatenate(([float(ws)], np.maximum.accumulate(ce)[:-1])) if len(calls) else np.zeros(0)
        )
        gap = np.maximum(cs - prev_end, 0.0)
        own = np.maximum(ce - np.maximum(cs, prev_end), 0.0)
        sync = cls[calls] == "sync"
        # the device frontier when each sync was called: ops launched before it
        block = np.zeros(len(calls), dtype=bool)
        eps = np.zeros(len(calls))
        for i in np.flatnonzero(sync):
            before = launch < i
            f = float(de[before].max()) if before.any() else float(ws)
            if f > cs[i]:
                block[i] = True
                eps[i] = max(ce[i] - f, 0.0)
        h_dur = np.where(block, 0.0, own)
        coll_launch = np.zeros(len(calls), dtype=np.int64)
        for k in range(len(d_sel)):
            if inst[k] >= 0 and launch[k] >= 0:
                coll_launch[launch[k]] = 1
        seg = (
            np.concatenate(([0], np.cumsum(coll_launch)[:-1])) if len(calls) else np.zeros(0, dtype=np.int64)
        )
        last_end = float(np.max(ce)) if len(calls) else float(ws)
        tail = max(float(ann_end) - last_end, 0.0)
        prog = _GpuProgram(
            rank=rank,
            h_gap=gap,
            h_dur=h_dur,
            h_sync=sync,
            h_block=block,
            h_eps=eps,
            h_seg=seg.astype(np.int64),
            tail_gap=tail,
            d_launch=launch,
            d_dur=dur,
            d_compute=compute,
            d_rho=rho,
            d_rho_k=rho_k,
            d_q=q,
            d_q_k=q_k,
            d_inst=inst,
            d_x=x,
            d_op=ops,
            d_bytes=nbytes,
            q_typ=q_typ,
        )
        # relative to the window start
        programs[st] = (prog, insts)
    return programs, comp_total / max(n_steps, 1)


def _host_programs(
    ev: pd.DataFrame, wins: pd.DataFrame, pr: pd.DataFrame, inst_bytes: Mapping[int, int], rank: int
) -> tuple[dict[int, tuple[_HostProgram, set[int]]], float]:
    from tracekit.analyse.collectives import assign_steps
    from tracekit.analyse.critical_path import _layers_of

    lay = _layers_of(ev[["kind", "cls", "start_ns", "end_ns", "stream"]])
    busy_s, busy_e = lay.cum[-1][0], lay.cum[-1][1]  # every op of the rank's timeline, merged
    w = wins[["rank", "step", "start_ns", "end_ns"]]
    colls = pr.assign(start_ns=pr["raw_start_ns"]) if len(pr) else pr
    if len(colls):
        colls = colls.assign(step=assign_steps(colls, w).to_numpy())
    programs: dict[int, tuple[_HostProgram, set[int]]] = {}
    comp_total, n = 0.0, 0
    for st, ws, we in zip(w["step"], w["start_ns"], w["end_ns"], strict=True):
        st, ws, we = int(st), int(ws), int(we)
        c = colls[colls["step"] == st].sort_values("raw_start_ns") if len(colls) else colls
        bounds = [ws]
        insts, xs, ops, sizes = [], [], [], []
        for inst, s, e, a, op in zip(
            c["instance"], c["raw_start_ns"], c["raw_end_ns"], c["arrival_raw_ns"], c["op"], strict=True
        ):
            bounds += [int(s), int(e)]
            insts.append(int(inst))
            xs.append(max(int(e) - max(int(a), int(s)), 0))
            ops.append(str(op))
            sizes.append(inst_bytes.get(int(inst), -1))
        bounds.append(we)
        seg = np.zeros((len(insts) + 1, len(_HOST_COLS)))
        n_ops = np.zeros(len(insts) + 1)
        for k in range(len(insts) + 1):
            a, b = bounds[2 * k], max(bounds[2 * k + 1], bounds[2 * k])
            lo, hi = np.searchsorted(busy_s, [a, b], side="left")
            n_ops[k] = max(int(hi) - int(lo), 0)
            m = lay.measure(a, b)
            lead = _lead_gap(busy_s, busy_e, a, b)
            seg[k] = [
                m["compute"],
                m["memory"],
                m["unknown"],
                m["sync"],
                m["idle"] - lead,
                m["collective"],
                lead,
            ]
        comp_total += float(seg[:, 0].sum())
        n += 1
        prog = _HostProgram(
            rank=rank,
            seg=seg,
            c_inst=np.asarray(insts, dtype=np.int64),
            c_x=np.asarray(xs, dtype=np.float64),
            c_op=ops,
            c_bytes=np.asarray(sizes, dtype=np.int64),
            n_ops=n_ops,
        )
        programs[st] = (prog, set(insts))
    return programs, comp_total / max(n, 1)


# ------------------------------------------------------------------------------------------
# calibration, predictions, Shapley


def _solve_decreasing(err: Any, x0: float, step: float, tol: float, limit: float) -> float | None:
    """The x >= x0 (or below, when err(x0) < 0) where the non-increasing, piecewise-linear err crosses
    0: a bracket by doubling steps, then regula falsi (Illinois). None when no bracket within `limit`."""
    f0 = err(x0)
    if abs(f0) <= tol:
        return x0
    sign = 1.0 if f0 > 0 else -1.0
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
    """Correct the replay to the unprofiled per-token time `target_ns` (nothing without one), so the
    unchanged replay's mean equals it within `rel_tol`:

    - GPU timeline: the profiler's cost is a cost per CUDA runtime call (its callbacks), so a fixed
      `host_deduct` ns is taken from every call's host time (the gap before it first, then the call);
      a host sleep is one gap, not a thousand, and loses one deduction (a factor on all host time
      would keep most of the profiler's cost when an injected sleep dominates the host time);
    - host timeline: op callbacks land inside and between ops, so one factor `host_scale` on every
      part but transfer, the rule `shortfall.reconcile` uses there.

    Returns the deduction (GPU) or the factor (host)."""
    model.host_scale, model.host_deduct, model.device_scale = 1.0, 0.0, 1.0
    if model.target_ns is None:
        return 0.0
    target = float(model.target_ns)
    tol = max(rel_tol * target, 1.0)
    if model.timeline == "gpu":

        def err_gpu(delta: float) -> float:
            return float(model.replay(_Setting(host_deduct=delta)).mean()) - target

        value = _solve_decreasing(err_gpu, 0.0, 1000.0, tol, 1e9)
        if value is None:  # device-bound (a CUDA-graph replay launches nothing per kernel)
            beta = _device_scale(model, target, tol)
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
            return target - float(model.replay(_Setting(host_scale=alpha)).mean())

        value = _solve_decreasing(err_host, 1.0, 0.25, tol, 63.0)
        if value is not None and value < 0:
            value = None
    if value is None:
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


def _device_scale(model: RunModel, target: float, tol: float) -> float | None:
    """The factor in (0.1, 1] on every device op time and gap (collective transfers excepted: they
    are the link's) that brings the unchanged replay's mean to `target`; None if none does."""

    def err_dev(y: float) -> float:
        return float(model.replay(_Setting(device_scale=1.0 - y)).mean()) - target

    y = _solve_decreasing(err_dev, 0.0, 0.01, tol, 0.9)
    return None if y is None or not 0.0 <= y < 0.9 else 1.0 - y


def setting_for(
    model: RunModel, knobs: Iterable[Knob], baseline_compute: float | None, n_ranks: int
) -> _Setting:
    transfer: str | ProbeTimes | None = None
    kw: dict[str, Any] = {}
    for k in knobs:
        if not model.applicable(k):
            continue
        if k.name == "transfer":
            transfer = k.probe if k.probe is not None else "zero"
        elif k.name == "launch":
            kw["launch0"] = True
        elif k.name == "sync":
            kw["sync0"] = True
        elif k.name == "straggler":
            kw["straggler_off"] = True
        elif k.name == "compute" and baseline_compute is not None:
            kw["compute_scale"] = {
                r: (baseline_compute / n_ranks) / c if c > 0 else 1.0
                for r, c in model.compute_per_token.items()
            }
    return _Setting(
        transfer=transfer,
        host_scale=model.host_scale,
        host_deduct=model.host_deduct,
        device_scale=model.device_scale,
        **kw,
    )


def shapley(values: Mapping[frozenset[int], Fraction], k: int) -> list[Fraction]:
    """Shapley value of each of k players for the *reduction* v(empty) - v(all): phi_i is the mean over
    orders of v(S) - v(S + i). Exact; sums to v(empty) - v(all)."""
    out = []
    fact = math.factorial
    for i in range(k):
        phi = Fraction(0)
        others = [j for j in range(k) if j != i]
        for size in range(k):
            w = Fraction(fact(size) * fact(k - size - 1), fact(k))
            for sub in itertools.combinations(others, size):
                s = frozenset(sub)
                phi += w * (values[s] - values[s | {i}])
        out.append(phi)
    assert sum(out) == values[frozenset()] - values[frozenset(range(k))]
    return out


def round_to_sum(values: Mapping[str, Fraction], total: int) -> dict[str, int]:
    """Integers that sum exactly to `total`: floors, then the largest remainders get the rest."""
    floors = {k: math.floor(v) for k, v in values.items()}
    rest = total - sum(floors.values())
    order = sorted(values, key=lambda k: (-(values[k] - floors[k]), k))
    if rest >= 0:
        for k in order[:rest]:
            floors[k] += 1
    else:
        for k in order[::-1][:-rest]:
            floors[k] -= 1
    assert sum(floors.values()) == total
    return floors


def _mean_int(values: np.ndarray) -> Fraction:
    return Fraction(int(np.rint(values).astype(np.int64).sum()), len(values))


@dataclass
class WhatIf:
    """Predictions of the baseline (TP=1) and the sharded run (TP=N) under knobs, with the Shapley
    split of S. Build with `whatif`."""

    baseline: RunModel
    sharded: RunModel | None
    knobs: tuple[Knob, ...]
    combinations: list[tuple[Knob, ...]]
    predicted: dict[str, dict[int, Fraction]]  # combination spec -> ranks -> mean ns
    replayed: dict[str, np.ndarray]  # "baseline"/"sharded": traced replay per step
    shapley: dict[str, Fraction] | None
    residual_parts: dict[str, Fraction] | None
    ideal_ns: Fraction | None
    shortfall_ns: Fraction | None
    measured: dict[int, Fraction]  # ranks -> per-token time (unprofiled when corrected)
    accounting: dict[str, Any] | None
    check: dict[str, Any] | None = None

    def runs(self) -> list[RunModel]:
        return [m for m in (self.baseline, self.sharded) if m is not None]

    def replay_error(self, model: RunModel) -> dict[str, Any]:
        key = "baseline" if model is self.baseline else "sharded"
        rep = self.replayed[key]
        meas = model.measured_ns
        per_step = (rep - meas) / meas
        return {
            "traced_ns": int(round(float(meas.mean()))),
            "replayed_ns": int(round(float(rep.mean()))),
            "mean": float((rep.mean() - meas.mean()) / meas.mean()),
            "max_step": float(np.max(np.abs(per_step))) if len(per_step) else 0.0,
            "steps": len(meas),
        }

    def to_json(self) -> dict[str, Any]:
        def run_doc(m: RunModel) -> dict[str, Any]:
            return {
                "label": m.label,
                "ranks": m.n_ranks,
                "timeline": m.timeline,
                "per_token_ns": int(round(self.measured[m.n_ranks])),
                "per_token_source": "unprofiled" if m.target_ns is not None else "trace",
                "host_cost_per_call_ns": round(m.host_deduct, 1),
                "host_scale": m.host_scale,
                "device_scale": m.device_scale,
                "replay_error": self.replay_error(m),
            }

        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "tracekit.whatif",
            "runs": {"baseline": run_doc(self.baseline)},
            "knobs": [
                {
                    "spec": k.spec,
                    "definition": k.definition,
                    "applies": {str(m.n_ranks): m.applicable(k) for m in self.runs()},
                }
                for k in self.knobs
            ],
            "predicted_ns": {
                spec: {str(n): int(round(v)) for n, v in by_n.items()}
                for spec, by_n in self.predicted.items()
            },
            "speedup_vs_tp1": {
                spec: {
                    str(n): float(self.measured[self.baseline.n_ranks] / v) if v else None
                    for n, v in by_n.items()
                }
                for spec, by_n in self.predicted.items()
            },
        }
        if self.sharded is not None:
            doc["runs"]["sharded"] = run_doc(self.sharded)
        if self.shapley is not None and self.shortfall_ns is not None and self.ideal_ns is not None:
            n = self.sharded.n_ranks if self.sharded else 1
            s_int = int(round(self.measured[n])) - int(round(self.ideal_ns))
            doc["ideal_ns"] = int(round(self.ideal_ns))
            doc["shortfall_ns"] = s_int
            doc["shapley_ns"] = round_to_sum(self.shapley, s_int)
            doc["residual_parts_ns"] = {k: int(round(v)) for k, v in (self.residual_parts or {}).items()}
            doc["shapley_shares"] = {k: (v / s_int if s_int else None) for k, v in doc["shapley_ns"].items()}
        if self.accounting is not None:
            doc["accounting"] = self.accounting
        if self.check is not None:
            doc["check"] = self.check
        notes = [n for m in self.runs() for n in m.notes]
        doc["notes"] = notes
        return doc


def whatif(
    base_parts: RunParts,
    base_classified: pd.DataFrame | AnalysedRun,
    shard_parts: RunParts | None,
    shard_classified: pd.DataFrame | AnalysedRun | None,
    knobs: Sequence[Knob],
    combinations: Sequence[tuple[Knob, ...]] = (),
    check: tuple[RunParts, tuple[Knob, ...], str] | None = None,
) -> WhatIf:
    """Replay both runs, calibrate them to their unprofiled per-token times (as `shortfall` does),
    predict every knob and combination at both rank counts, and split S by Shapley values."""
    from tracekit.analyse.shortfall import shortfall_from_parts

    if len(knobs) > MAX_SHAPLEY_KNOBS:
        raise ReplayError(f"at most {MAX_SHAPLEY_KNOBS} knobs (2^k replays), got {len(knobs)}")
    sf = shortfall_from_parts(base_parts, shard_parts) if shard_parts is not None else None
    corrected = sf is not None and sf.per_token_source == "unprofiled"
    if sf is None:
        u = base_parts.dilation.unprofiled
        corrected = u is not None and u.n > 0 and u.mean_ns > 0
    # the per-token times the accounting states (T1, TN), so both splits share one S
    tgt_b: Fraction | None = None
    tgt_s: Fraction | None = None
    if corrected and sf is not None:
        tgt_b, tgt_s = Fraction(sf.corrected.baseline_ns), Fraction(sf.corrected.sharded_ns)
    elif corrected and base_parts.dilation.unprofiled is not None:
        tgt_b = Fraction(base_parts.dilation.unprofiled.mean_ns)
    base = build_model(base_parts, base_classified, tgt_b, "baseline")
    shard = None
    if shard_parts is not None and shard_classified is not None:
        shard = build_model(shard_parts, shard_classified, tgt_s, "sharded")
    replayed = {"baseline": base.replay(_Setting())}
    if shard is not None:
        replayed["sharded"] = shard.replay(_Setting())
    for m in (base, shard):
        if m is not None:
            calibrate(m)
    measured = {
        base.n_ranks: base.target_ns
        if base.target_ns is not None
        else Fraction(base_parts.per_token["window"])
    }
    if shard is not None and shard_parts is not None:
        measured[shard.n_ranks] = (
            shard.target_ns if shard.target_ns is not None else Fraction(shard_parts.per_token["window"])
        )
    base_compute = base.compute_per_token
    c1 = float(np.mean(list(base_compute.values()))) if base_compute else None
    n_shard = shard.n_ranks if shard is not None else base.n_ranks
    f = Fraction(base.n_ranks, n_shard)

    def predict(m: RunModel, ks: Iterable[Knob]) -> Fraction:
        # compute=/N scales to the baseline's compute x (baseline ranks / N)
        s = setting_for(m, ks, c1 * base.n_ranks if c1 is not None else None, m.n_ranks)
        if m is base:
            s = _Setting(
                transfer=s.transfer,
                launch0=s.launch0,
                sync0=s.sync0,
                straggler_off=s.straggler_off,
                host_scale=s.host_scale,
                host_deduct=s.host_deduct,
                device_scale=s.device_scale,
            )
        return _mean_int(m.replay(s))

    memo: dict[tuple[int, str], Fraction] = {}

    def cached(m: RunModel, ks: Sequence[Knob]) -> Fraction:
        key = (id(m), combination_spec(k for k in ks if m.applicable(k)))
        if key not in memo:
            memo[key] = predict(m, ks)
        return memo[key]

    combos: list[tuple[Knob, ...]] = [()] + [(k,) for k in knobs] + list(combinations)
    if check is not None:
        combos.append(check[1])
    if len(knobs) > 1:
        combos.append(tuple(knobs))
    predicted: dict[str, dict[int, Fraction]] = {}
    for ks in combos:
        spec = combination_spec(ks)
        if spec in predicted:
            continue
        predicted[spec] = {base.n_ranks: cached(base, ks)}
        if shard is not None:
            predicted[spec][shard.n_ranks] = cached(shard, ks)
    shap: dict[str, Fraction] | None = None
    resid: dict[str, Fraction] | None = None
    ideal = s_ns = None
    if shard is not None:
        ideal = measured[base.n_ranks] * f
        s_ns = measured[shard.n_ranks] - ideal
        values: dict[frozenset[int], Fraction] = {}
        for size in range(len(knobs) + 1):
            for sub in itertools.combinations(range(len(knobs)), size):
                sub_knobs = [knobs[i] for i in sub]
                # the game: the shortfall under the knobs, TN(K) - f T1(K) (both runs replayed)
                values[frozenset(sub)] = cached(shard, sub_knobs) - f * cached(base, sub_knobs)
        phis = shapley(values, len(knobs))
        shap = {k.spec: phi for k, phi in zip(knobs, phis, strict=True)}
        after_all = values[frozenset(range(len(knobs)))]
        gap = s_ns - values[frozenset()]
        shap["residual"] = after_all + gap
        resid = {"after_all_knobs": after_all, "replay_gap": gap}
        assert sum(shap.values()) == s_ns
    check_doc = None
    if check is not None:
        check_doc = _check(check, predicted, corrected)
    accounting = None
    if sf is not None:
        j = sf.to_json()
        accounting = {"shortfall_ns": j["shortfall_ns"], "terms_ns": j["terms_ns"], "shares": j["shares"]}
    return WhatIf(
        baseline=base,
        sharded=shard,
        knobs=tuple(knobs),
        combinations=list(combinations),
        predicted=predicted,
        replayed=replayed,
        shapley=shap,
        residual_parts=resid,
        ideal_ns=ideal,
        shortfall_ns=s_ns,
        measured=measured,
        accounting=accounting,
        check=check_doc,
    )


def _check(
    check: tuple[RunParts, tuple[Knob, ...], str],
    predicted: Mapping[str, Mapping[int, Fraction]],
    corrected: bool,
) -> dict[str, Any]:
    """A prediction set against a real run that was not used to make it (docs/METHOD.md section Critical path and what-if)."""
    parts, combo, label = check
    spec = combination_spec(combo)
    n = len(parts.ranks)
    by_n = predicted[spec]
    if n not in by_n:
        raise ReplayError(
            f"--check {label} has {n} rank(s) but the predictions are for {', '.join(map(str, by_n))} rank(s)"
        )
    pred = by_n[n]
    traced = Fraction(parts.per_token["window"])
    u = parts.dilation.unprofiled
    unprof = Fraction(u.mean_ns) if u is not None and u.n > 0 and u.mean_ns > 0 else None
    measured, source = (unprof, "unprofiled") if corrected and unprof is not None else (traced, "trace")
    return {
        "run": label,
        "knobs": spec,
        "ranks": n,
        "predicted_ns": int(round(pred)),
        "measured_ns": int(round(measured)),
        "measured_source": source,
        "measured_traced_ns": int(round(traced)),
        "measured_unprofiled_ns": int(round(unprof)) if unprof is not None else None,
        "error": float((pred - measured) / measured),
    }
