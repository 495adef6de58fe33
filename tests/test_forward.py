"""The replay's forward pass (`path.forward.Forward`, `Graph.times_many`, `Graph.periods_of`,
`RunModel.replay_many`) against its definition, the node-by-node pass in topological order
(`graph.times_reference`): the same integers for every node, on generated runs (tests/test_graph.py's
generator) and on committed traces, under the knobs' latencies and under arbitrary ones, with blocks
small enough that every binding path crosses block boundaries. And the graph the replay re-times is
the one attribute_run walked the path on, equal to one built again from the events."""

from __future__ import annotations

import functools
import itertools
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

from tests.test_graph import SPECS, graph_of
from tracekit.analyse.path.forward import FORWARD_BLOCK, FORWARD_BLOCK_NARROW, Forward, times_reference
from tracekit.analyse.path.graph import Graph
from tracekit.analyse.path.roles import (
    NEVER,
    ROLE_BACKPRESSURE,
    ROLE_GAP,
    ROLE_GRAPH,
    ROLE_QUEUE,
    ROLE_SYNC_WAIT,
    ROLE_XFER,
)
from tracekit.analyse.retime.model import RunModel
from tracekit.analyse.retime.setting import Setting
from tracekit.analyse.whatif.build import build_model
from tracekit.analyse.whatif.knobs import DEFAULT_KNOBS, parse_knob, setting_for

TRACES = Path(__file__).resolve().parent.parent / "traces"


def _random_latencies(g: Graph, seed: int) -> list[np.ndarray]:
    """Arbitrary latencies (negative ones too), and the measured ones with the edges the knobs
    can disable (NEVER) disabled."""
    rng = np.random.default_rng(seed)
    out = [rng.integers(-20_000, 200_000, len(g.lat)), rng.integers(0, 3, len(g.lat)) * g.lat]
    never = g.lat.copy()
    never[np.isin(g.role, (ROLE_SYNC_WAIT, ROLE_BACKPRESSURE))] = NEVER
    out.append(never)
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("block", [1, 5, 64, FORWARD_BLOCK, FORWARD_BLOCK_NARROW])
def test_the_forward_pass_is_the_node_by_node_pass_on_generated_runs(name: str, block: int) -> None:
    """Every block's running maximum by doubling steps (0), by slices where its pieces are at most
    4 long (the others doubled), and by slices everywhere."""
    g, _ends = graph_of(SPECS[name])
    lats = [g.lat, *_random_latencies(g, seed=block)]
    want = [times_reference(g, lat) for lat in lats]
    for slices_up_to in (0, 4, 1 << 30):
        got = Forward(g, block, slices_up_to).run(lats, g.t)
        for i in range(len(lats)):
            assert np.array_equal(got[:, i], want[i]), (name, block, slices_up_to, i)


@functools.cache
def _model(trace: str) -> RunModel:
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.read import read_run

    ar = AnalysedRun.of(read_run([TRACES / trace]))
    parts = attribute_run(ar, label=trace)
    return build_model(parts, ar, None, trace)


@pytest.mark.parametrize("trace", ["h200-tp2-straggler", "h200x2-tp2-b1-graphs", "cpu-tp2"])
def test_every_knob_coalition_replayed_at_once_is_each_replayed_node_by_node(trace: str) -> None:
    """The 2^5 coalitions of the default knobs in one batched pass give, step by step, the periods
    of the node-by-node pass under each coalition's latencies (CUDA-graph replays, a straggler,
    a host timeline)."""
    m = _model(trace)
    g = m.graph
    knobs = [parse_knob(k) for k in DEFAULT_KNOBS]
    c1 = float(np.mean(list(m.compute_per_token.values()))) * 0.8  # compute=/N does something
    subs = [sub for size in range(len(knobs) + 1) for sub in itertools.combinations(knobs, size)]
    settings = [setting_for(m, sub, c1, m.n_ranks) for sub in subs]
    settings.append(Setting(host_deduct=700.0, deduct_collective=300.0))
    got = m.replay_many(settings)
    steady = m._steady_pos
    checked = set()
    # the node-by-node pass for no knob, each knob alone, all of them and the deduction
    picks = [i for i, sub in enumerate(subs) if len(sub) in (0, 1, len(knobs))] + [len(settings) - 1]
    for s, per in ((settings[i], got[i]) for i in picks):
        lat = m.latencies(s)
        key = lat.tobytes()
        if key in checked:  # knobs that do not apply give the same latencies
            continue
        checked.add(key)
        want = g.periods(times_reference(g, lat))[steady]
        assert np.array_equal(per, want), s
    assert len(checked) >= 3
    # and one at a time (chunks of one column)
    assert np.array_equal(m.replay(settings[-2]), got[-2])


def test_a_cuda_graph_replay_is_one_chain_of_the_forward_pass() -> None:
    """A replay's operations all queue after the operation before the replay; one chains there and
    each other one to its in-graph predecessor (the chain parents' later rounds). When each began a
    chain piece of its own (one per two nodes), the pass took one fixpoint iteration per operation."""
    g = _model("h200x2-tp2-b1-graphs").graph
    fw = Forward(g)
    n_pieces = int((fw.pc_edge < 0).sum())
    n_graph_ops = int((g.role == ROLE_GRAPH).sum())
    assert n_graph_ops > 10_000
    assert n_pieces < n_graph_ops / 20, (n_pieces, n_graph_ops)


@pytest.mark.parametrize("trace", ["cpu-tp2", "h200-tp1"])
def test_the_replay_re_times_the_graph_the_path_was_walked_on(trace: str) -> None:
    """build_model takes attribute_run's graph (one build per run), equal in every array to the
    graph built again from the events; the probe knob's collective sizes are filled in."""
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.read import read_run

    ar = AnalysedRun.of(read_run([TRACES / trace]))
    parts = attribute_run(ar, label=trace)
    kept = parts.graph
    assert kept is not None
    m1 = build_model(parts, ar, Fraction(1), trace)
    assert m1.graph is kept
    parts.graph = None
    m2 = build_model(parts, ar, Fraction(1), trace)
    assert m2.graph is not kept
    a, b = m1.graph, m2.graph
    for f in ("t", "src", "dst", "lat", "role", "kind", "erank", "seg", "calls", "ops", "cidx"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    for f in ("order", "indptr", "ws_node", "xfer_bytes", "xfer_inst"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.xfer_op == b.xfer_op and a.steps == b.steps and a.notes == b.notes
    if len(a.xfer_bytes):
        assert (a.xfer_bytes > 0).all()
    assert np.array_equal(m1.measured_ns, m2.measured_ns)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# chain roles of every priority, and ones that never chain
_ROLES = np.asarray([ROLE_GAP, ROLE_QUEUE, ROLE_XFER, ROLE_GRAPH, ROLE_SYNC_WAIT, ROLE_BACKPRESSURE])


def _random_dag(seed: int, n_streams: int, length: int, extra: float, broken: float) -> SimpleNamespace:
    """A DAG of `n_streams` streams of consecutive node numbers (each node's edge from the one
    before, of a chain role, except where `broken`), interleaved in a random topological order
    (each node a random time, increasing along its stream), with about `extra` more in-edges per
    node from random earlier nodes of random roles (fan-outs: sources with several chain
    candidates; nodes whose best edge loses); edges grouped by destination (CSR)."""
    rng = np.random.default_rng(seed)
    n = n_streams * length
    when = np.cumsum(rng.integers(1, 50, (n_streams, length)), axis=1).reshape(-1)
    topo = np.lexsort((np.arange(n), when))
    tpos = np.empty(n, dtype=np.int64)
    tpos[topo] = np.arange(n)
    v = np.arange(n)
    keep = (v % length > 0) & (rng.random(n) >= broken)
    srcs, dsts = [v[keep] - 1], [v[keep]]
    m = int(extra * n)
    d = rng.integers(0, n, m)
    ok = tpos[d] > 0
    d = d[ok]
    srcs.append(topo[(rng.random(len(d)) * tpos[d]).astype(np.int64)])  # a random earlier node
    dsts.append(d)
    src, dst = np.concatenate(srcs), np.concatenate(dsts)
    by = np.lexsort((rng.random(len(dst)), dst))
    src, dst = src[by].astype(np.int64), dst[by].astype(np.int64)
    role = _ROLES[rng.integers(0, len(_ROLES), len(src))]
    role[: len(srcs[0])][rng.random(len(srcs[0])) < 0.7] = ROLE_GAP  # (reordered: any edges)
    has_in = np.zeros(n, dtype=bool)
    has_in[dst] = True
    order = topo[has_in[topo]]
    indptr = np.concatenate(([0], np.cumsum(np.bincount(dst, minlength=n))))
    lat = rng.integers(-5_000, 100_000, len(src))
    # the knobs' disabled edges (NEVER): some of the edges that never chain, each node keeping
    # an edge that is not (its time stays a path's, the pass's floor far below it)
    never = np.isin(role, (ROLE_SYNC_WAIT, ROLE_BACKPRESSURE)) & (rng.random(len(src)) < 0.5)
    kept = np.zeros(n, dtype=bool)
    kept[dst[~never]] = True
    first = indptr[:-1][np.diff(indptr) > 0]
    never[first[~kept[dst[first]]]] = False
    lat[never] = NEVER
    t = rng.integers(0, 1_000_000, n)
    return SimpleNamespace(n_nodes=n, src=src, dst=dst, role=role, order=order, indptr=indptr, lat=lat, t=t)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_streams=st.integers(1, 6),
    length=st.integers(1, 60),
    extra=st.sampled_from([0.0, 0.3, 1.5]),
    broken=st.sampled_from([0.0, 0.1, 0.6]),
    block=st.sampled_from([1, 3, 16, 97]),
    slices_up_to=st.sampled_from([0, 3, 1 << 30]),
    shuffled=st.booleans(),
)
def test_the_forward_pass_is_the_node_by_node_pass_on_random_dags_with_chains(
    seed: int,
    n_streams: int,
    length: int,
    extra: float,
    broken: float,
    block: int,
    slices_up_to: int,
    shuffled: bool,
) -> None:
    """On random DAGs of interleaved chains and random edges, the forward pass (its chains found
    over runs of consecutive node numbers, its pieces padded into groups or sliced or doubled,
    its edges in order or shuffled: no longer grouped by destination) gives the node-by-node
    pass's times, and every piece is a path along the graph's edges."""
    g = _random_dag(seed, n_streams, length, extra, broken)
    lats = [g.lat, np.random.default_rng(seed + 1).integers(-20_000, 200_000, len(g.lat))]
    want = [times_reference(cast(Graph, g), lat) for lat in lats]
    h, hl = g, lats
    if shuffled:
        perm = np.random.default_rng(seed + 2).permutation(len(g.src))
        h = SimpleNamespace(**{**vars(g), "src": g.src[perm], "dst": g.dst[perm], "role": g.role[perm]})
        hl = [lat[perm] for lat in lats]
    fw = Forward(cast(Graph, h), block, slices_up_to)
    got = fw.run(hl, g.t)
    for i in range(len(lats)):
        assert np.array_equal(got[:, i], want[i]), i
    node = fw.nodes[fw.pc_pos]  # in piece order
    e = fw.pc_edge
    assert (e[fw.pc_start == np.arange(len(e))] < 0).all()  # a piece's first node: no chain edge
    on = e >= 0
    assert np.array_equal(h.dst[e[on]], node[on])
    assert np.array_equal(h.src[e[on]], node[np.flatnonzero(on) - 1])
    assert sorted(node.tolist()) == list(range(g.n_nodes))
