"""A discrete-event simulator of tensor-parallel decode ranks, with the truth of every figure.

Model (integer nanoseconds throughout; see README.md in this folder):

* Each rank has one host thread running a program of ops per token (`Kernel`, `Memcpy`, `Coll`,
  `Host`, `DeviceSync`, `StreamSync`, `Item`, `Record`, `Wait`). Runtime calls cost host time
  (`launch_cost`, `sync_cost`, plus `profiler_cost` per call in the profiled run); `Host` is host
  work or a sleep between calls (no event in the trace: a gap).
* A launch takes effect after the profiler's cost; the GPU operation is released `launch_latency`
  later and starts `device_gap` after its stream is free and every event it waits for has been
  recorded. Streams run concurrently.
* The launch queue holds `queue_depth` operations that have not started: a launch beyond it waits
  for a slot (back-pressure, a long launch call).
* A collective kernel starts on its stream like any kernel (its arrival); it ends on every rank
  `transfer` after the last rank's arrival (a rendezvous).
* A blocking sync (device / stream synchronize, `.item()`) returns `sync_cost` after the device
  work it waits for is done.
* Each token is wrapped in `ProfilerStep#N` / `decode_step#N` host ranges; `between_ns` of host
  time follows each step outside `decode_step`.

Every node of the simulation records the predecessor that bound its start, so the critical path is
walked back on the real causal graph, and every what-if knob is a change of the model followed by
a re-simulation. Nothing here imports tracekit.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
from typing import Any

# ----------------------------------------------------------------------------------- the ops


@dataclass(frozen=True)
class Kernel:
    """Launch a kernel (`cudaLaunchKernel`): `dur` ns of GPU work on `stream`. `kind` is
    "compute" or "memory" (a device copy kernel). `ideal`: its duration under `compute=/N` (the
    TP=1 kernel's time / N), None = unchanged. `pre`: host time inside the aten op before the
    launch (written as a cpu_op around the launch in full mode)."""

    name: str
    dur: int
    stream: int = 7
    kind: str = "compute"
    ideal: int | None = None
    pre: int = 0
    #: a vector (CUDA-core) kernel, not a matrix product: the residual adds and norms the knob
    #: `allreduce_norm=fused` zeroes after an all-reduce (False: a matrix kernel, which ends that run)
    vector: bool = False


@dataclass(frozen=True)
class Memcpy:
    """`cudaMemcpyAsync` device to device (`gpu_memcpy`, memory part) of `dur` ns on `stream`."""

    dur: int
    stream: int = 7
    nbytes: int = 4096


@dataclass(frozen=True)
class Coll:
    """An NCCL collective launched on `stream`: `transfer` ns after the last rank arrives."""

    op: str  # "all_reduce" | "all_gather"
    nbytes: int
    transfer: int
    stream: int = 7
    dtype: str = "BFloat16"


@dataclass(frozen=True)
class Host:
    """Host work or a sleep of `dur` ns (no trace event: a gap between runtime calls)."""

    dur: int


@dataclass(frozen=True)
class DeviceSync:
    """`cudaDeviceSynchronize`: blocks until every stream of the rank is done."""


@dataclass(frozen=True)
class StreamSync:
    """`cudaStreamSynchronize(stream)`."""

    stream: int = 7


@dataclass(frozen=True)
class Item:
    """`.item()`: a small device-to-host copy on `stream` then `cudaStreamSynchronize`."""

    stream: int = 7
    dur: int = 2000


@dataclass(frozen=True)
class Record:
    """`cudaEventRecord(event, stream)`."""

    event: int
    stream: int


@dataclass(frozen=True)
class Wait:
    """`cudaStreamWaitEvent(stream, event)`: later ops on `stream` wait for the event."""

    event: int
    stream: int


@dataclass(frozen=True)
class Between(Host):
    """Host time after a step, outside its `decode_step` range (inside `ProfilerStep`)."""


Op = Kernel | Memcpy | Coll | Host | DeviceSync | StreamSync | Item | Record | Wait


@dataclass(frozen=True)
class RankSpec:
    """One rank: its program per token (`program(token) -> ops`, tokens 1..n) and its costs."""

    program: Callable[[int], Sequence[Op]]
    launch_cost: int = 5000
    launch_latency: int = 6000
    sync_cost: int = 2000
    record_cost: int = 1500
    device_gap: int = 1000  # between back-to-back operations on a stream (queued gap)
    queue_depth: int = 1024
    between_ns: int = 0
    clock_offset_ns: int = 0
    step_number_offset: int = 0
    profiler_cost: int = 0  # host ns added to every runtime call of the profiled run
    profiler_cost_by_call: tuple[tuple[str, int], ...] = ()  # per call name, overrides profiler_cost
    host_scale: float = 1.0  # every host duration times this (a host running slower or faster)


@dataclass(frozen=True)
class RunSpec:
    """A run: its ranks, the number of tokens, and how its trace is written."""

    name: str
    ranks: tuple[RankSpec, ...]
    tokens: int = 5
    base_time_ns: int = 0  # baseTimeNanoseconds of the written trace
    epoch_ns: int = 0  # added to every true time when written (absolute clock origin)
    t0_ns: int = 1_000_000_000  # host time at which every rank starts its first step (true clock)
    mode: str = "full"  # "full": cpu_op + record_param_comms; "cuda": runtime + kernels only
    hostname: str = "sim"
    device: str = "NVIDIA H200"

    @property
    def tp(self) -> int:
        return len(self.ranks)


KNOBS = ("transfer=0", "launch=0", "sync=0", "straggler=off", "compute=/N")
#: Program knobs outside the Shapley players (issue 26), each re-simulated by its own meaning:
#: `collective_latency=US@GBPS`: every collective's transfer the lesser of its own and US us +
#: size x bus factor / GBPS (nccl-tests: all_reduce size = its bytes, factor 2(n-1)/n; all_gather
#: size = the gathered output, factor (n-1)/n); `allreduce_norm=fused`: every vector kernel after
#: an all-reduce, up to the next matrix kernel or collective on the rank, takes 0 ns (launch kept).
EXTRA_KNOBS = ("collective_latency=", "allreduce_norm=fused")


def _extra(knob: str) -> bool:
    return knob == "allreduce_norm=fused" or knob.startswith("collective_latency=")


def _coll_latency_transfer(op: Coll, tp: int, knob: str) -> int:
    us, _, gbps = knob.partition("=")[2].partition("@")
    size = op.nbytes * tp if op.op == "all_gather" else op.nbytes
    factor = Fraction(2 * (tp - 1), tp) if op.op == "all_reduce" else Fraction(tp - 1, tp)
    t = Fraction(us) * 1000 + size * factor / Fraction(gbps)  # bytes / (GB/s) = ns
    return min(op.transfer, round(t))


# ----------------------------------------------------------------------------------- nodes


@dataclass
class Node:
    """One timed piece of the simulation: [begin, end) on `rank`, of `kind` (host, compute,
    memory, collective, sync, wait_device). `preds`: (node index, lag, lag kind, at) where `at` is
    "end" (the default) or "begin"; `begin = max(pred time + lag)`, or `floor` when later."""

    rank: int
    kind: str
    dur: int
    preds: list[tuple[int, int, str, str]] = field(default_factory=list)
    floor: int | None = None
    begin: int | None = None
    end: int | None = None
    bind: int = -1  # index into preds of the binding predecessor (-1: floor)
    # collective extras
    coll: int = -1  # collective instance (rank-independent index), -1 otherwise
    arrival: int | None = None


@dataclass
class DeviceOp:
    rank: int
    node: int  # the Node of the GPU operation
    kind: str  # compute | memory | collective | memcpy_dtoh
    name: str
    stream: int
    step: int  # token (1-based) whose step launched it
    corr: int
    call: int  # index into RankRecord.calls
    op: Any = None


@dataclass
class Call:
    """A runtime call on the host: [begin, end)."""

    name: str
    cat: str  # cuda_runtime
    node_first: int
    node_last: int
    corr: int
    step: int
    device_op: int = -1  # index into SimResult.device_ops
    op: Any = None
    sync: bool = False
    pre_node: int = -1  # the cpu_op's host work before the call (full mode)


@dataclass
class StepMark:
    token: int
    begin_node: int  # first host node of the step
    end_node: int  # last host node of the step (the decode_step range ends at its end)
    between_node: int  # host node of the time after the step (outside decode_step), or -1


@dataclass
class RankRecord:
    calls: list[Call] = field(default_factory=list)
    steps: list[StepMark] = field(default_factory=list)
    host_nodes: list[int] = field(default_factory=list)


@dataclass
class SimResult:
    spec: RunSpec
    profiled: bool
    knobs: frozenset[str]
    nodes: list[Node]
    device_ops: list[DeviceOp]
    ranks: list[RankRecord]
    coll_instances: list[list[int]]  # per instance, the device op index per rank

    # ---- step times on the true clock
    def node_begin(self, i: int) -> int:
        b = self.nodes[i].begin
        assert b is not None
        return b

    def node_end(self, i: int) -> int:
        e = self.nodes[i].end
        assert e is not None
        return e

    def step_start(self, r: int, k: int) -> int:
        return self.node_begin(self.ranks[r].steps[k - 1].begin_node)

    def step_marker_end(self, r: int, k: int) -> int:
        return self.node_end(self.ranks[r].steps[k - 1].end_node)

    def step_gpu_end(self, r: int, k: int) -> int:
        if not hasattr(self, "_gpu_end"):
            g: dict[tuple[int, int], int] = {}
            for d in self.device_ops:
                e = self.node_end(d.node)
                g[(d.rank, d.step)] = max(g.get((d.rank, d.step), e), e)
            self._gpu_end = g
        return self._gpu_end.get((r, k), self.step_marker_end(r, k))

    def window(self, r: int, k: int) -> tuple[int, int]:
        """The step window as defined for the parts: marker start to the later of the marker's
        end and the end of the GPU work launched inside, clipped at the next step's start."""
        a = self.step_start(r, k)
        b = max(self.step_marker_end(r, k), self.step_gpu_end(r, k))
        if k < self.spec.tokens:
            b = min(b, self.step_start(r, k + 1))
        return a, b

    def token_end(self, k: int) -> int:
        """When token k is done on every rank (the latest end of its step)."""
        return max(max(self.step_marker_end(r, k), self.step_gpu_end(r, k)) for r in range(self.spec.tp))

    def per_token_ns(self, skip_first: int = 1) -> Fraction:
        """Mean time per steady token: (end of the last token - end of the first skipped one) / n."""
        n = self.spec.tokens
        return Fraction(self.token_end(n) - self.token_end(skip_first), n - skip_first)

    def rank_token_times(self, r: int) -> list[int]:
        """Per token, the host time rank r's loop saw (step end to step end; the first from its
        start): what `capture` records per rank."""
        out = []
        prev = self.step_start(r, 1)
        for k in range(1, self.spec.tokens + 1):
            st = self.ranks[r].steps[k - 1]
            end_node = st.between_node if st.between_node >= 0 else st.end_node
            e = self.node_end(end_node)
            out.append(e - prev)
            prev = e
        return out


# ----------------------------------------------------------------------------------- simulate


def _scaled(values: list[int], target: int) -> list[int]:
    """Integers proportional to `values` summing to `target` (largest remainder)."""
    total = sum(values)
    if total == 0 or total == target:
        return list(values)
    raw = [Fraction(v * target, total) for v in values]
    out = [int(x) for x in raw]
    rest = target - sum(out)
    order = sorted(range(len(values)), key=lambda i: raw[i] - out[i], reverse=True)
    for i in order[:rest]:
        out[i] += 1
    return out


def _programs(spec: RunSpec, knobs: frozenset[str]) -> list[list[tuple[int, Op | str]]]:
    """Per rank, the flat op list [(token, op | marker)] with the knobs that change programs
    (straggler=off, compute=/N, transfer=0) applied."""
    flat: list[list[tuple[int, Op | str]]] = []
    for rs in spec.ranks:
        ops: list[tuple[int, Op | str]] = []
        for k in range(1, spec.tokens + 1):
            ops.append((k, "step_begin"))
            for op in rs.program(k):
                if (
                    "compute=/N" in knobs
                    and isinstance(op, Kernel)
                    and op.kind == "compute"
                    and op.ideal is not None
                ):
                    op = replace(op, dur=op.ideal)
                if "transfer=0" in knobs and isinstance(op, Coll):
                    op = replace(op, transfer=0)
                for kn in knobs:
                    if kn.startswith("collective_latency=") and isinstance(op, Coll):
                        op = replace(op, transfer=_coll_latency_transfer(op, spec.tp, kn))
                ops.append((k, op))
            ops.append((k, "step_end"))
            ops.append((k, Between(rs.between_ns)) if rs.between_ns else (k, "nop"))
        if "allreduce_norm=fused" in knobs and spec.tp > 1:
            armed = False
            for i, (k, item) in enumerate(ops):
                if isinstance(item, Coll):
                    armed = item.op == "all_reduce"
                elif isinstance(item, Kernel) and item.kind == "compute":
                    if not item.vector:
                        armed = False
                    elif armed:
                        ops[i] = (k, replace(item, dur=0))
        flat.append(ops)
    if "straggler=off" in knobs and spec.tp > 1:
        # segments: host ops up to and including the k-th collective launch, the same k on every
        # rank; the between-step time belongs to the segment it lies in (after the step's last
        # collective). Each rank's host gaps (Host ops) scaled so their sum is the fastest rank's.
        segs: list[list[list[int]]] = []
        for ops in flat:
            cur: list[int] = []
            rank_segs: list[list[int]] = []
            for i, (_, item) in enumerate(ops):
                if isinstance(item, Host):
                    cur.append(i)
                if isinstance(item, Coll):
                    rank_segs.append(cur)
                    cur = []
            rank_segs.append(cur)
            segs.append(rank_segs)
        n_seg = {len(s) for s in segs}
        assert len(n_seg) == 1, "straggler=off needs the same number of collectives on every rank"

        def host_dur(r: int, i: int) -> int:
            op = flat[r][i][1]
            assert isinstance(op, Host)
            return op.dur

        for j in range(n_seg.pop()):
            target = min(sum(host_dur(r, i) for i in segs[r][j]) for r in range(spec.tp))
            for r in range(spec.tp):
                idx = segs[r][j]
                new = _scaled([host_dur(r, i) for i in idx], target)
                for i, d in zip(idx, new, strict=True):
                    k, old = flat[r][i]
                    flat[r][i] = (k, Between(d) if isinstance(old, Between) else Host(d))
    return flat


def simulate(spec: RunSpec, *, profiled: bool = False, knobs: Iterable[str] = ()) -> SimResult:
    """Run the model; `profiled` adds each rank's profiler cost to every runtime call. Results are
    memoised per (spec, profiled, knobs): the model is deterministic (do not mutate a result)."""
    kn = frozenset(knobs)
    return _simulate(spec, profiled, kn - _noop_knobs(spec))


@lru_cache(maxsize=256)
def _noop_knobs(spec: RunSpec) -> frozenset[str]:
    """The program knobs that change nothing in this run (e.g. compute=/N where every kernel
    already takes its ideal time): dropped before simulating, so equal runs are simulated once.
    Exact: these knobs act on the programs only, each on its own ops."""
    plain = _programs(spec, frozenset())
    return frozenset(
        k for k in ("transfer=0", "straggler=off", "compute=/N") if _programs(spec, frozenset([k])) == plain
    )


@lru_cache(maxsize=512)
def _simulate(spec: RunSpec, profiled: bool, kn: frozenset[str]) -> SimResult:
    unknown = {k for k in kn - set(KNOBS) if not _extra(k)}
    assert not unknown, unknown
    launch0 = "launch=0" in kn
    sync0 = "sync=0" in kn
    nodes: list[Node] = []
    device_ops: list[DeviceOp] = []
    records = [RankRecord() for _ in spec.ranks]
    programs = _programs(spec, kn)
    n_coll = None
    coll_of_rank: list[list[int]] = [[] for _ in spec.ranks]

    def add(node: Node) -> int:
        nodes.append(node)
        return len(nodes) - 1

    # --- build the graph rank by rank (host program order, streams, events); the collective
    # rendezvous joins ranks; times are resolved afterwards in one pass over a topological order.
    corr = 100

    def build_rank(r: int, rs: RankSpec) -> None:
        nonlocal corr, n_coll
        rec = records[r]
        prev_host = -1
        stream_last: dict[int, int] = {}
        events: dict[int, int] = {}
        pending_waits: dict[int, list[int]] = {}
        launched: list[int] = []  # device op nodes in launch order (the queue)
        step_begin = -1
        lat = rs.launch_latency  # a graph launch still has its launch latency

        def host_node(kind: str, dur: int, extra: list[tuple[int, int, str, str]] | None = None) -> int:
            nonlocal prev_host
            if rs.host_scale != 1.0:
                dur = int(round(dur * rs.host_scale))
            preds = [(prev_host, 0, "host", "end")] if prev_host >= 0 else []
            if extra:
                preds.extend(extra)
            n = add(Node(r, kind, dur, preds, floor=spec.t0_ns if prev_host < 0 else None))
            prev_host = n
            rec.host_nodes.append(n)
            return n

        def prof(name: str) -> int:
            if not profiled:
                return 0
            for nm, c in rs.profiler_cost_by_call:
                if nm == name:
                    return c
            return rs.profiler_cost

        def launch(
            op: Op, name: str, dev_kind: str, dev_name: str, dur: int, stream: int, k: int, pre: int
        ) -> None:
            nonlocal corr
            corr += 1
            pre_node = host_node("host", 0 if launch0 else pre) if pre else -1
            pc = prof(name)
            extra: list[tuple[int, int, str, str]] = []
            if not launch0 and len(launched) >= rs.queue_depth:
                extra.append((launched[-rs.queue_depth], 0, "host", "begin"))
            # the profiler's callback, the call's effect (a queue slot), then its remaining cost
            first = host_node("host", pc) if pc or extra else -1
            eff = host_node("host", 0, extra) if extra else first
            last = host_node("host", 0 if launch0 else rs.launch_cost)
            if first < 0:
                first = eff = last
                lat_from = (last, "begin")
            else:
                lat_from = (eff, "end")
            preds = [(lat_from[0], lat, "host", lat_from[1])]
            if stream in stream_last:
                preds.append((stream_last[stream], rs.device_gap, "host", "end"))
            for ev_node in pending_waits.pop(stream, []):  # the device reacts to the event like to its stream
                preds.append((ev_node, rs.device_gap, "host", "end"))
            dn = add(Node(r, dev_kind, dur, preds))
            stream_last[stream] = dn
            launched.append(dn)
            d = DeviceOp(r, dn, dev_kind, dev_name, stream, k, corr, len(rec.calls), op)
            device_ops.append(d)
            rec.calls.append(
                Call(name, "cuda_runtime", first, last, corr, k, len(device_ops) - 1, op, pre_node=pre_node)
            )
            if isinstance(op, Coll):
                coll_of_rank[r].append(len(device_ops) - 1)

        def sync_call(name: str, waits: list[int], k: int, op: Op) -> None:
            nonlocal corr
            corr += 1
            first = host_node("host", prof(name))
            if sync0:
                last = host_node("sync", 0)
            else:
                last = host_node("sync", rs.sync_cost, [(w, 0, "host", "end") for w in waits])
            rec.calls.append(Call(name, "cuda_runtime", first, last, corr, k, -1, op, sync=True))

        for k, op in programs[r]:
            if op == "nop":
                continue
            if op == "step_begin":
                step_begin = host_node("host", 0)
                continue
            if op == "step_end":
                end = host_node("host", 0)
                rec.steps.append(StepMark(k, step_begin, end, -1))
                continue
            if isinstance(op, Host):
                n = host_node("host", 0 if launch0 else op.dur)
                if isinstance(op, Between):
                    rec.steps[-1].between_node = n
                continue
            if isinstance(op, Kernel):
                launch(op, "cudaLaunchKernel", op.kind, op.name, op.dur, op.stream, k, op.pre)
            elif isinstance(op, Memcpy):
                launch(
                    op, "cudaMemcpyAsync", "memory", "Memcpy DtoD (Device -> Device)", op.dur, op.stream, k, 0
                )
            elif isinstance(op, Coll):
                launch(op, "cudaLaunchKernel", "collective", _nccl_kernel_name(op), 0, op.stream, k, 0)
            elif isinstance(op, Item):
                launch(
                    op,
                    "cudaMemcpyAsync",
                    "memory",
                    "Memcpy DtoH (Device -> Pageable)",
                    op.dur,
                    op.stream,
                    k,
                    0,
                )
                sync_call("cudaStreamSynchronize", [stream_last[op.stream]], k, StreamSync(op.stream))
            elif isinstance(op, DeviceSync):
                sync_call("cudaDeviceSynchronize", list(stream_last.values()), k, op)
            elif isinstance(op, StreamSync):
                sync_call(
                    "cudaStreamSynchronize",
                    [stream_last[op.stream]] if op.stream in stream_last else [],
                    k,
                    op,
                )
            elif isinstance(op, Record):
                corr += 1
                first = host_node("host", prof("cudaEventRecord"))
                last = host_node("host", 0 if launch0 else rs.record_cost)
                if op.stream in stream_last:
                    events[op.event] = stream_last[op.stream]
                else:
                    events.pop(op.event, None)
                rec.calls.append(Call("cudaEventRecord", "cuda_runtime", first, last, corr, k, -1, op))
            elif isinstance(op, Wait):
                corr += 1
                first = host_node("host", prof("cudaStreamWaitEvent"))
                last = host_node("host", 0 if launch0 else rs.record_cost)
                if op.event in events:
                    pending_waits.setdefault(op.stream, []).append(events[op.event])
                rec.calls.append(Call("cudaStreamWaitEvent", "cuda_runtime", first, last, corr, k, -1, op))
            else:  # pragma: no cover
                raise TypeError(op)
        if n_coll is None:
            n_coll = len(coll_of_rank[r])
        assert n_coll == len(coll_of_rank[r]), "every rank must launch the same collectives"

    for r, rs in enumerate(spec.ranks):
        build_rank(r, rs)

    instances = [[coll_of_rank[r][i] for r in range(spec.tp)] for i in range(n_coll or 0)]
    for i, inst in enumerate(instances):
        ops = [device_ops[d].op for d in inst]
        assert len({(o.op, o.nbytes) for o in ops}) == 1, f"collective {i} differs across ranks: {ops}"
        for d in inst:
            nodes[device_ops[d].node].coll = i
    _resolve(nodes, instances, device_ops)
    return SimResult(spec, profiled, kn, nodes, device_ops, records, instances)


def _resolve(nodes: list[Node], instances: list[list[int]], device_ops: list[DeviceOp]) -> None:
    """Resolve every node's begin / end. Each rank's nodes are resolved in creation order (every
    predecessor of a node was created before it, on its rank) until one needs a collective's end
    that waits for another rank's arrival; then the next rank runs. A collective's end is set on
    every rank once all its arrivals are known."""
    coll_nodes = {i: [device_ops[d].node for d in inst] for i, inst in enumerate(instances)}
    transfer = {i: device_ops[inst[0]].op.transfer for i, inst in enumerate(instances)}
    arrived = dict.fromkeys(coll_nodes, 0)
    ranges: dict[int, list[int]] = {}
    for idx, n in enumerate(nodes):
        ranges.setdefault(n.rank, []).append(idx)
    cursor = dict.fromkeys(ranges, 0)
    remaining = len(nodes)
    while remaining:
        progress = False
        for r, idxs in ranges.items():
            c = cursor[r]
            while c < len(idxs):
                i = idxs[c]
                n = nodes[i]
                best, t0 = -1, n.floor
                blocked = False
                for j, (p, lag, _kind, at) in enumerate(n.preds):
                    t = nodes[p].begin if at == "begin" else nodes[p].end
                    if t is None:
                        blocked = True
                        break
                    if t0 is None or t + lag > t0:
                        t0, best = t + lag, j
                if blocked:
                    break
                assert t0 is not None, f"node {i} has no predecessor and no floor"
                n.begin, n.bind = t0, best
                if n.coll >= 0:
                    arrived[n.coll] += 1
                    if arrived[n.coll] == len(coll_nodes[n.coll]):
                        a = max(nodes[x].begin for x in coll_nodes[n.coll])  # type: ignore[type-var]
                        for x in coll_nodes[n.coll]:
                            nodes[x].arrival = a
                            nodes[x].end = a + transfer[n.coll]
                else:
                    n.end = n.begin + n.dur
                c += 1
                remaining -= 1
                progress = True
            cursor[r] = c
        assert progress, f"deadlock: {remaining} nodes unresolved"


def _nccl_kernel_name(op: Coll) -> str:
    if op.op == "all_reduce":
        return "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    if op.op == "all_gather":
        return "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    raise ValueError(op.op)


# ----------------------------------------------------------------------------------- the truth

PARTS = ("compute", "memory", "transfer", "wait", "sync", "idle")
PATH_KINDS = ("host", "compute", "memory", "transfer", "sync")


def _union_measure(intervals: list[tuple[int, int]], a: int, b: int) -> int:
    iv = sorted((max(s, a), min(e, b)) for s, e in intervals if e > a and s < b and e > s)
    total, cur_s, cur_e = 0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s  # type: ignore[operator]
    return total


def rank_parts(res: SimResult, r: int, k: int, step_ns: int) -> dict[str, int]:
    """Rank r's parts of token k: its window split by priority compute > memory > collective
    (wait before the last arrival, transfer after) > sync > idle, padded with idle to `step_ns`."""
    a, b = res.window(r, k)
    layers: dict[str, list[tuple[int, int]]] = {
        "compute": [],
        "memory": [],
        "transfer": [],
        "wait": [],
        "sync": [],
    }
    for d in res.device_ops:
        if d.rank != r:
            continue
        n = res.nodes[d.node]
        assert n.begin is not None and n.end is not None
        if d.kind == "collective":
            assert n.arrival is not None
            layers["wait"].append((n.begin, min(n.end, n.arrival)))
            layers["transfer"].append((max(n.begin, n.arrival), n.end))
        else:
            layers[d.kind].append((n.begin, n.end))
    for c in res.ranks[r].calls:
        if c.sync:
            layers["sync"].append((res.node_begin(c.node_first), res.node_end(c.node_last)))
    out: dict[str, int] = {}
    acc: list[tuple[int, int]] = []
    prev = 0
    # a transfer piece on one stream outranks a wait piece on another
    for part in ("compute", "memory", "transfer", "wait", "sync"):
        acc = acc + layers[part]
        cov = _union_measure(acc, a, b)
        out[part] = cov - prev
        prev = cov
    out["idle"] = (b - a) - prev + (step_ns - (b - a))
    return out


def step_time(res: SimResult, k: int) -> int:
    """The step time of token k as the accounting defines it: the longest window over ranks."""
    return max(res.window(r, k)[1] - res.window(r, k)[0] for r in range(res.spec.tp))


def parts_truth(res: SimResult, skip_first: int = 1) -> dict[int, dict[str, Fraction]]:
    """Per rank, mean per steady token of each part (windows padded to the token's period)."""
    n = res.spec.tokens
    out: dict[int, dict[str, Fraction]] = {}
    for r in range(res.spec.tp):
        acc = dict.fromkeys(PARTS, Fraction(0))
        for k in range(skip_first + 1, n + 1):
            period = res.token_end(k) - res.token_end(k - 1)
            p = rank_parts(res, r, k, max(period, res.window(r, k)[1] - res.window(r, k)[0]))
            for key in PARTS:
                acc[key] += p[key]
        out[r] = {key: v / (n - skip_first) for key, v in acc.items()}
    return out


def critical_path(res: SimResult, skip_first: int = 1) -> dict[int, dict[str, Fraction]]:
    """Per rank and kind, the mean per steady token of the causal critical path: walked back from
    the end of the last token through the predecessor that bound each node's start; each piece
    of the walk is booked to the token period it lies in. Host: calls, host work, sleeps, launch
    latency; compute / memory: GPU work; transfer: a collective after its last arrival; sync: a
    sync call's own time after the device finished."""
    n = res.spec.tokens
    lo, hi = res.token_end(skip_first), res.token_end(n)
    acc = {r: dict.fromkeys(PATH_KINDS, 0) for r in range(res.spec.tp)}

    def book(r: int, kind: str, a: int, b: int) -> None:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            acc[r][kind] += b - a

    # start: the node that ends the last token (its marker end or the end of GPU work it
    # launched; ties: lowest rank), not a later node (time after the step, outside its marker)
    best = None
    for r in range(res.spec.tp):
        st = res.ranks[r].steps[n - 1]
        cands = [st.end_node] + [d.node for d in res.device_ops if d.rank == r and d.step == n]
        for c in cands:
            key = (res.node_end(c), -r)
            if best is None or key > best[0]:
                best = (key, c)
    assert best is not None and best[0][0] == hi
    i = best[1]
    t = res.node_end(i)
    guard = 0
    while t > lo:
        guard += 1
        assert guard < 10_000_000
        nd = res.nodes[i]
        assert nd.begin is not None
        if nd.coll >= 0:
            assert nd.arrival is not None
            book(nd.rank, "transfer", nd.arrival, t)
            # jump to the last arriver's collective at its arrival (ties: lowest rank)
            inst = res.coll_instances[nd.coll]
            cands = [res.device_ops[d].node for d in inst]
            last = max(cands, key=lambda c: (res.nodes[c].begin, -res.nodes[c].rank))
            i, nd = last, res.nodes[last]
            t = nd.begin  # type: ignore[assignment]
        else:
            assert nd.begin is not None
            book(nd.rank, nd.kind, nd.begin, t)
            t = nd.begin
        if nd.bind < 0:
            break
        p, lag, lag_kind, at = nd.preds[nd.bind]
        if lag:
            book(nd.rank, lag_kind, t - lag, t)
            t -= lag
        i = p
        pt = res.nodes[p].begin if at == "begin" else res.nodes[p].end
        assert pt == t, (pt, t)
    m = n - skip_first
    return {r: {k: Fraction(v, m) for k, v in d.items()} for r, d in acc.items()}


def knob_times(spec: RunSpec, knob_sets: Iterable[frozenset[str]]) -> dict[frozenset[str], Fraction]:
    """The unprofiled per-token time under each set of knobs, by re-simulation."""
    return {ks: simulate(spec, knobs=ks).per_token_ns() for ks in knob_sets}


def applicable(spec: RunSpec, knobs: frozenset[str]) -> frozenset[str]:
    """At TP=1 only launch=0 and sync=0 mean anything (compute=/N is relative to TP=1 itself)."""
    if spec.tp == 1:
        return frozenset(k for k in knobs if k in ("launch=0", "sync=0"))
    return knobs


def shapley(
    base: RunSpec, sharded: RunSpec, players: Sequence[str] = KNOBS
) -> tuple[dict[str, Fraction], dict[frozenset[str], tuple[Fraction, Fraction]]]:
    """Shapley values of S = TN - (N1/N) T1 over the knobs (each applied to both runs), and the
    re-simulated (T1, TN) of every coalition."""
    f = Fraction(base.tp, sharded.tp)
    times: dict[frozenset[str], tuple[Fraction, Fraction]] = {}
    t1_cache: dict[frozenset[str], Fraction] = {}
    for m in range(len(players) + 1):
        for combo in itertools.combinations(players, m):
            ks = frozenset(combo)
            bk = applicable(base, ks)
            if bk not in t1_cache:
                t1_cache[bk] = simulate(base, knobs=bk).per_token_ns()
            t1 = t1_cache[bk]
            tn = simulate(sharded, knobs=ks).per_token_ns()
            times[ks] = (t1, tn)
    v = {ks: tn - f * t1 for ks, (t1, tn) in times.items()}
    k = len(players)
    out: dict[str, Fraction] = {}
    from math import factorial

    for p in players:
        total = Fraction(0)
        others = [q for q in players if q != p]
        for m in range(k):
            w = Fraction(factorial(m) * factorial(k - m - 1), factorial(k))
            for combo in itertools.combinations(others, m):
                ks = frozenset(combo)
                total += w * (v[ks] - v[ks | {p}])
        out[p] = total
    return out, times
