"""The dependency graph (tracekit.analyse.path): exact re-timing, the path's causal property, the
replay against re-simulation, on generated runs whose truth is known by construction, and on the
committed traces."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tracekit.analyse.path.build import build_graph
from tracekit.analyse.path.forward import lexsort_packed
from tracekit.analyse.path.graph import Graph
from tracekit.analyse.path.roles import PARTS, ROLE_GAP, ROLE_XFER
from tracekit.analyse.path.walk import PATH_ROW_COLUMNS, binding_edges, walk_path

TRACES = Path(__file__).resolve().parent.parent / "traces"


# ------------------------------------------------------------------------------------------
# a small generator: ranks of host threads launching kernels and collectives on one stream


@dataclass
class Spec:
    """One generated run: `ranks` ranks, `tokens` steps of `layers` layers; each layer launches a
    compute kernel, and a collective after every layer in `coll_layers`; a device synchronize
    closes every token. Host time: a gap before each call (`gap`), each call's own time (`call`),
    `sleep[r]` more before each collective launch on rank r, `between` host time between tokens.
    Device: kernel times `kern[r][l]`, launch latency `rho`, transfer `xfer`, sync return `eps`."""

    ranks: int = 2
    tokens: int = 6
    layers: int = 8
    coll_layers: tuple[int, ...] = (1, 3, 5, 7)
    gap: int = 6_000
    call: int = 4_000
    sleep: tuple[int, ...] = (0, 0)
    between: int = 30_000
    kern: list[list[int]] = field(default_factory=list)
    rho: int = 5_000
    xfer: int = 9_000
    eps: int = 3_000
    offsets: tuple[int, ...] = (0, 0)
    seed: int = 0
    no_sync: bool = False
    no_transfer: bool = False


def simulate(spec: Spec) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Classified events, windows, matched collectives (each rank's own clock) and the true token
    ends (the latest window end per token, aligned clock)."""
    rng = random.Random(spec.seed)
    R = spec.ranks
    kern = spec.kern or [[40_000 + 997 * i + 311 * r for i in range(spec.layers)] for r in range(R)]
    rows: list[tuple[Any, ...]] = []
    wins: list[tuple[int, int, int, int, int]] = []
    matched: list[tuple[int, int, str, int, int, int]] = []
    host = [1_000_000_000_000 + 7 * r for r in range(R)]
    dev_free = [0] * R
    corr = [1] * R
    inst = 0
    ends = []

    def jit() -> int:
        return rng.randint(0, 900)

    for tok in range(spec.tokens):
        ws = list(host)
        for r in range(R):
            rows.append((r, 1, "annotation", f"decode_step#{tok}", host[r], -1, "host", -1))  # end patched
        tok_end_dev = [0] * R
        seg_start = 0
        for cl in [*spec.coll_layers, None]:
            last = spec.layers - 1 if cl is None else cl
            arrive = [0] * R
            for r in range(R):
                for layer in range(seg_start, last + 1):
                    host[r] += spec.gap + jit()
                    cs, ce = host[r], host[r] + spec.call + jit()
                    rows.append((r, 1, "runtime", "cudaLaunchKernel", cs, ce, "host", corr[r]))
                    ks = max(cs + spec.rho, dev_free[r])
                    ke = ks + kern[r][layer] + jit()
                    rows.append((r, 7, "kernel", f"gemm{layer}", ks, ke, "compute", corr[r]))
                    corr[r] += 1
                    host[r] = ce
                    dev_free[r] = ke
                if cl is not None:
                    host[r] += spec.gap + spec.sleep[r] + jit()
                    cs, ce = host[r], host[r] + spec.call + jit()
                    rows.append((r, 1, "runtime", "cudaLaunchKernel", cs, ce, "host", corr[r]))
                    arrive[r] = max(cs + spec.rho, dev_free[r])
                    host[r] = ce
            if cl is not None:
                a = max(arrive)
                for r in range(R):
                    j = jit()  # drawn either way: the re-simulation keeps every other draw
                    x = 0 if spec.no_transfer else spec.xfer + j
                    e = a + x
                    rows.append(
                        (r, 7, "kernel", "ncclDevKernel_AllReduce", arrive[r], e, "collective", corr[r])
                    )
                    matched.append((inst, r, "all_reduce", arrive[r], e, a))
                    corr[r] += 1
                    dev_free[r] = e
                inst += 1
            seg_start = last + 1
        for r in range(R):
            host[r] += spec.gap + jit()
            cs = host[r]
            if spec.no_sync:
                ce = cs + spec.call
            else:
                ce = max(cs + spec.call, dev_free[r] + spec.eps + jit())
            rows.append((r, 1, "runtime", "cudaDeviceSynchronize", cs, ce, "sync", corr[r]))
            corr[r] += 1
            host[r] = ce + 2_000
            tok_end_dev[r] = dev_free[r]
        for r in range(R):
            ae = host[r]
            we = max(ae, tok_end_dev[r])
            wins.append((r, tok, ws[r], we, ae))
            host[r] += spec.between + jit()
        ends.append(max(w[3] for w in wins[-R:]))
    # patch the annotation ends
    out = []
    w_end = {(w[0], w[1]): w[4] for w in wins}
    tok_of: dict[int, int] = {}
    for row in rows:
        r, stream, kind, name, s, e, cls, c = row
        if kind == "annotation":
            tok = int(name.split("#")[1])
            e = w_end[(r, tok)]
        out.append((r, stream, kind, name, s, e, cls, c))
    del tok_of
    off = spec.offsets
    ev = pd.DataFrame(
        out, columns=["rank", "stream", "kind", "name", "start_ns", "end_ns", "cls", "correlation"]
    )
    ev["start_ns"] = ev["start_ns"] + ev["rank"].map(lambda r: off[r])
    ev["end_ns"] = ev["end_ns"] + ev["rank"].map(lambda r: off[r])
    ev = ev.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    w = pd.DataFrame(wins, columns=["rank", "step", "start_ns", "end_ns", "annotation_end_ns"])
    for c in ("start_ns", "end_ns", "annotation_end_ns"):
        w[c] = w[c] + w["rank"].map(lambda r: off[r])
    m = pd.DataFrame(
        matched, columns=["instance", "rank", "op", "raw_start_ns", "raw_end_ns", "arrival_raw_ns"]
    )
    for c in ("raw_start_ns", "raw_end_ns", "arrival_raw_ns"):
        m[c] = m[c] + m["rank"].map(lambda r: off[r])
    return ev, w, m, np.asarray(ends, dtype=np.int64)


def graph_of(spec: Spec) -> tuple[Graph, np.ndarray]:
    ev, w, m, ends = simulate(spec)
    g = build_graph(ev, w, m, dict(enumerate(spec.offsets)), "gpu")
    return g, ends


def token_ends(g: Graph, t: np.ndarray) -> np.ndarray:
    return g.windows(t)[1].max(axis=0)


SPECS = {
    "gpu-bound": Spec(),
    "host-sleeps-before-collectives": Spec(sleep=(0, 100_000)),
    "launch-bound": Spec(kern=[[3_000] * 8, [3_100] * 8], gap=15_000),
    "four-ranks-skewed-clocks": Spec(
        ranks=4, sleep=(0, 0, 50_000, 0), offsets=(0, 5_000_000, -3_000_000, 17)
    ),
    "no-sync": Spec(no_sync=True, tokens=4),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_unchanged_graph_gives_back_every_measured_time(name: str) -> None:
    g, ends = graph_of(SPECS[name])
    t = g.times()
    assert np.array_equal(t, g.t)
    assert np.array_equal(token_ends(g, t), ends)


def _binding_chain(g: Graph, t: np.ndarray, lat: np.ndarray, n: int) -> list[int]:
    """The edges of the full backward binding chain from node n (to the origin)."""
    chain = []
    while g.indptr[n] < g.indptr[n + 1]:
        a, b = int(g.indptr[n]), int(g.indptr[n + 1])
        e = next(k for k in range(a, b) if t[g.src[k]] + lat[k] == t[n])
        chain.append(e)
        n = int(g.src[e])
    return chain


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_nodes_binding_edge_is_its_first_in_edge_reaching_its_time(name: str) -> None:
    """`binding_edges` (one pass over the edges, what `walk_path` follows) against the definition
    node by node, on the measured times, on a re-timing with every third edge 40% shorter (other
    edges bind then) and on one with no latency at all (many in-edges tie: the first binds); a node
    whose time no in-edge reaches is marked, not given an edge."""
    g, _ends = graph_of(SPECS[name])
    lat = g.lat.copy()
    lat[::3] = lat[::3] * 6 // 10
    for lt in (g.lat, lat, np.zeros_like(lat)):
        t = g.times(lt)
        got = binding_edges(g, t, lt)
        ptr, src = g.indptr.tolist(), g.src.tolist()
        want = [
            next((k for k in range(ptr[n], ptr[n + 1]) if t[src[k]] + lt[k] == t[n]), -1)
            for n in range(g.n_nodes)
        ]
        assert got.tolist() == want
        assert (got >= 0).sum() == (np.diff(g.indptr) > 0).sum() > 0
    t = g.times(lat)
    late = t.copy()
    n = int(g.order[-1])
    late[n] += 1  # no in-edge reaches it now
    assert binding_edges(g, late, lat)[n] == -2


@pytest.mark.parametrize("name", sorted(SPECS))
def test_shortening_on_path_work_shortens_the_token_and_off_path_work_does_not(name: str) -> None:
    """The path's causal check: 1 ns less on any edge of the binding chain into a token's end ends
    that token 1 ns earlier; removing an edge off it entirely moves that end by nothing."""
    g, _ends = graph_of(SPECS[name])
    t = g.times()
    k = len(g.steps) - 2
    ws, we = g.windows(t)
    i_end = int(np.argmax(we[:, k]))
    nodes = g.end_nodes[i_end][k]
    end_node = int(nodes[np.argmax(t[nodes])])
    chain = _binding_chain(g, t, g.lat, end_node)
    rng = random.Random(1)
    on = [e for e in chain if g.lat[e] > 0]
    for e in rng.sample(on, min(12, len(on))):
        lat = g.lat.copy()
        lat[e] -= 1
        assert g.times(lat)[end_node] == t[end_node] - 1, (int(g.role[e]), int(g.kind[e]))
    in_chain = set(chain)
    # off the chain: an edge whose destination is before the token's end
    off = [e for e in range(len(g.src)) if e not in in_chain and g.lat[e] > 0 and t[g.dst[e]] <= t[end_node]]
    for e in rng.sample(off, min(12, len(off))):
        lat = g.lat.copy()
        lat[e] = 0
        assert g.times(lat)[end_node] == t[end_node], (int(g.role[e]), int(g.kind[e]))


def _path_by(g: Graph, steps: slice = slice(1, None)) -> dict[tuple[int, str], float]:
    walk = walk_path(g, g.t)
    df = pd.DataFrame([r.values() for r in walk.rows], columns=list(PATH_ROW_COLUMNS))
    df = df[df["step"].isin(g.steps[steps])]
    n = df["step"].nunique()
    return {(int(r), p): float(df[df["rank"] == r][f"{p}_ns"].sum()) / n for r in g.ranks for p in PARTS}


def test_a_host_that_sleeps_before_collectives_holds_the_path_not_the_other_ranks_compute() -> None:
    """Issue 23 item 1: rank 1's host sleeps 100 us before each of 4 collectives, the GPU being the
    bottleneck otherwise. Truth by re-simulation: rank 0's compute costs the token nothing, rank
    1's sleeps cost it all of their 400 us; the path says the same."""
    spec = SPECS["host-sleeps-before-collectives"]
    g, ends = graph_of(spec)
    path = _path_by(g)
    assert path[(1, "host")] >= 400_000
    # rank 0's compute: its removal by re-simulation changes nothing
    kern0 = [[40_000 + 997 * i + 311 * r for i in range(spec.layers)] for r in range(2)]
    _, _, _, ends_fast0 = simulate(replace(spec, kern=[[1] * spec.layers, kern0[1]]))
    assert np.array_equal(np.diff(ends_fast0)[1:], np.diff(ends)[1:])
    assert path[(0, "compute")] <= 1_000
    # the sleeps taken out of the graph's host gaps: the re-simulation without them, token by token
    _, _, _, ends_nosleep = simulate(replace(spec, sleep=(0, 0)))
    lat = g.lat.copy()
    sleeps = (g.role == ROLE_GAP) & (g.erank == 1) & (lat >= 100_000)
    assert int(sleeps.sum()) == 4 * len(g.steps)
    lat[sleeps] -= 100_000
    got, want = np.diff(token_ends(g, g.times(lat))), np.diff(ends_nosleep)
    assert np.abs(got - want).max() <= max(1_000, int(0.01 * want.mean()))
    assert float(np.mean(np.diff(ends) - want)) > 100_000  # the sleeps cost the token time


def test_a_launch_bound_run_puts_no_transfer_on_the_path_when_removing_it_saves_nothing() -> None:
    """Issue 23 item 1: in a symmetric launch-bound run the transfer hides behind the host; the
    path carries as much transfer as `transfer=0` saves by re-simulation (nothing)."""
    spec = SPECS["launch-bound"]
    g, ends = graph_of(spec)
    path = _path_by(g)
    _, _, _, ends0 = simulate(replace(spec, no_transfer=True))
    saved = float(np.mean(np.diff(ends)[1:] - np.diff(ends0)[1:]))
    on_path = sum(v for (r, p), v in path.items() if p == "transfer")
    assert abs(on_path - saved) <= max(1_000, 0.01 * float(np.mean(np.diff(ends)[1:])))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_transfer_zero_on_the_graph_is_the_re_simulation_without_transfer(name: str) -> None:
    spec = SPECS[name]
    g, _ends = graph_of(spec)
    lat = g.lat.copy()
    lat[g.role == ROLE_XFER] = 0
    got = np.diff(token_ends(g, g.times(lat)))
    _, _, _, ends0 = simulate(replace(spec, no_transfer=True))
    want = np.diff(ends0)
    assert np.abs(got - want).max() <= max(1_000, int(0.01 * want.mean()))


def test_moving_one_ranks_clock_changes_no_path_figure() -> None:
    a, _ = graph_of(Spec(ranks=4, sleep=(0, 0, 50_000, 0), offsets=(0, 0, 0, 0)))
    b, _ = graph_of(Spec(ranks=4, sleep=(0, 0, 50_000, 0), offsets=(0, 5_000_000, -3_000_000, 17)))
    assert _path_by(a) == _path_by(b)


@pytest.mark.parametrize("trace", ["h200-tp1", "h200-tp2", "h200-tp2-straggler", "cpu-tp2-straggler"])
def test_the_committed_traces_re_time_exactly_and_the_path_sums_to_the_step(trace: str) -> None:
    from committed_pairs import committed_analysed, committed_parts

    from tracekit.analyse.path.critical_path import path_of_graph

    # the process's one classification and attribution of the run (tests/committed_pairs.py; the
    # label, its role in the pairs of other files, only names it in notes)
    ar = committed_analysed(trace)
    parts = committed_parts(trace, "baseline" if trace.endswith("tp1") else "sharded")
    w = ar.steps(parts.step_pattern).steps
    w = w.drop(columns=["end_ns"]).merge(parts.steps[["rank", "step", "end_ns"]], on=["rank", "step"])
    g = build_graph(ar.events, w, parts.collectives.per_rank, parts.collectives.clock.offsets_ns, None)
    t = g.times()
    assert np.array_equal(t, g.t)
    ws, we = g.windows(t)
    meas = parts.steps.pivot(index="rank", columns="step", values="window_ns").to_numpy()
    assert np.array_equal(we - ws, meas)
    cp = path_of_graph(g)
    tok = cp.per_token([int(s) for s in parts.steady["step"]])
    assert tok["offset"] >= 0


@pytest.mark.parametrize("with_calibration", [True, False])
def test_the_manifests_profiler_calibration_is_removed_call_by_call(
    tmp_path: Path, with_calibration: bool
) -> None:
    """Issue 23 item 6, consumer side: a manifest `profiler_calibration` of the simulated run's true
    per-call cost (15 us per runtime call) is removed call by call, and the corrected unchanged
    replay is then the simulator's unprofiled run (its own simulation without the profiler); without
    the key the cost is solved as before, and the JSON says which."""
    import json

    from tests.groundtruth.cases import CASES
    from tests.groundtruth.kineto import write_run
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.analyse.retime.calibrate import calibrate
    from tracekit.analyse.retime.setting import Setting
    from tracekit.analyse.whatif.build import build_model
    from tracekit.read import read_run

    case = CASES["profiler_cost_15us"]
    assert case.sharded is not None
    _prof, unprof = write_run(case.sharded, tmp_path)
    if with_calibration:
        man = json.loads((tmp_path / "manifest.json").read_text())
        man["profiler_calibration"] = {
            "per_call_ns": {"runtime": 15_000},
            "method": "test: the simulator's cost",
            "calls": 1,
        }
        (tmp_path / "manifest.json").write_text(json.dumps(man))
    ar = AnalysedRun.of(read_run([tmp_path]))
    parts = attribute_run(ar)
    u = parts.dilation.unprofiled
    assert u is not None
    from fractions import Fraction

    model = build_model(parts, ar, Fraction(u.mean_ns), "sharded")
    calibrate(model)
    got = float(
        model.replay(
            Setting(
                host_deduct=model.host_deduct,
                deduct_collective=model.deduct_collective,
                device_scale=model.device_scale,
            )
        ).mean()
    )
    assert model.correction == ("manifest calibration" if with_calibration else "solved")
    traced = float(model.measured_ns.mean())
    if with_calibration:
        assert model.host_deduct == 15_000
        # most of the profiler's cost is gone, call by call (not one number fitted to the target)
        assert abs(got - u.mean_ns) < 0.25 * (traced - u.mean_ns)
    else:
        assert abs(got - u.mean_ns) <= max(1_000, 0.01 * u.mean_ns)
    del unprof


def test_the_calibrated_replay_is_the_unprofiled_run(tmp_path: Path) -> None:
    import json
    from fractions import Fraction

    from tests.groundtruth.cases import CASES
    from tests.groundtruth.kineto import write_run
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.analyse.retime.calibrate import calibrate
    from tracekit.analyse.retime.setting import Setting
    from tracekit.analyse.whatif.build import build_model
    from tracekit.read import read_run

    case = CASES["profiler_cost_15us"]
    assert case.sharded is not None
    write_run(case.sharded, tmp_path)
    man = json.loads((tmp_path / "manifest.json").read_text())
    man["profiler_calibration"] = {"per_call_ns": {"runtime": 15_000}, "method": "test", "calls": 1}
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    ar = AnalysedRun.of(read_run([tmp_path]))
    parts = attribute_run(ar)
    u = parts.dilation.unprofiled
    assert u is not None
    model = build_model(parts, ar, Fraction(u.mean_ns), "sharded")
    calibrate(model)
    got = float(model.replay(Setting(host_deduct=model.host_deduct)).mean())
    assert abs(got - u.mean_ns) <= max(1_000, 0.01 * u.mean_ns)


def test_device_paced_windows_give_the_partitions_step_time() -> None:
    """One rank, three 10 us decode_step annotations at 0, 10, 20 us, each launching (at +1 us)
    one 25 us kernel that runs after the annotation ends: [5, 30), [30, 55), [55, 80) us. The GPU
    runs behind the host in every step, so the windows come from the device side: 25 us each; the
    critical path must walk exactly those 25 us per step."""
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.model.events import Run, make_events

    rows: dict[str, list[Any]] = {
        k: [] for k in ("rank", "kind", "name", "start_ns", "end_ns", "correlation", "stream")
    }
    for i, k_start in enumerate((5_000, 30_000, 55_000)):
        for kind, name, s, e, corr, stream in (
            ("annotation", f"decode_step#{i}", 10_000 * i, 10_000 * i + 10_000, -1, 1),
            ("runtime", "cudaLaunchKernel", 10_000 * i + 1_000, 10_000 * i + 2_000, 100 + i, 1),
            ("kernel", "ampere_sgemm_128x64_nn", k_start, k_start + 25_000, 100 + i, 7),
        ):
            for k, v in zip(rows, (0, kind, name, s, e, corr, stream), strict=True):
                rows[k].append(v)
    parts = attribute_run(
        Run(events=make_events(rows), sources={0: "rank-0.json"}), AttributionOptions(skip_first=0)
    )
    assert parts.per_token["window"] == 25_000
    assert parts.path_token["step"] == 25_000
    # the kernels run back to back: the device sets every step, so its 25 us are the path's compute
    assert parts.path_token["by_rank"][0]["compute"] == 25_000


@pytest.mark.parametrize("trace", ["h200-tp2", "cpu-tp2"])
def test_the_string_columns_read_once_per_value_are_pandas_own_conversion(trace: str) -> None:
    """The graph build and the fused-norm mask read string columns through `str_values`,
    `str_isin` and `str_flags` (one conversion per distinct value): on a committed run's
    classified events, each gives what pandas' own per-row `astype(str)` (and `isin`,
    `str.match`, `str.contains`) gives, for every string column, a plain object column and one
    with missing values."""
    import re

    from committed_pairs import committed_analysed

    from tracekit.classify.rules import GPU_KINDS
    from tracekit.model.strings import str_flags, str_isin, str_values

    ev = committed_analysed(trace).events  # `classify` of the read run, once per process
    cols = {c: ev[c] for c in ("kind", "cls", "subclass", "name", "coll_op", "coll_pg_ranks")}
    cols["name (object)"] = ev["name"].astype(object)
    cols["with missing"] = ev["coll_op"].astype(object).where(ev["coll_op"].astype(str) != "", None)
    assert cols["with missing"].isna().any()
    pattern = re.compile(r"(?i)^cu(?:da)?Memcpy(?!.*Async)|all_?reduce|Launch")
    for label, col in cols.items():
        want = col.astype(str).to_numpy()
        got = str_values(col)
        assert got.dtype == want.dtype and len(got) == len(want), label
        assert pd.Series(got).equals(pd.Series(want)), label  # NaN where pandas keeps it missing
        assert np.array_equal(str_isin(col, GPU_KINDS), col.astype(str).isin(list(GPU_KINDS)).to_numpy()), (
            label
        )
        text = col.astype(str)
        for search, ref in ((False, text.str.match(pattern)), (True, text.str.contains(pattern))):
            assert np.array_equal(str_flags(col, pattern, search), ref.fillna(False).to_numpy(bool)), label


def test_the_packed_sort_is_lexsorts_order() -> None:
    """`path.forward.lexsort_packed` (the forward pass's and the assembly's sorts, packed into one int64 key)
    gives `np.lexsort`'s order: with ties (stable, by position), with a unique key (unstable sort),
    with negative and boolean keys, and where the ranges do not fit 62 bits (lexsort itself)."""
    rng = np.random.default_rng(7)
    n = 5_000
    a, b = rng.integers(-3, 4, n), rng.integers(0, 50, n)
    perm = rng.permutation(n)
    flag = rng.random(n) < 0.5
    assert np.array_equal(lexsort_packed((b, a)), np.lexsort((b, a)))  # ties
    assert np.array_equal(lexsort_packed((perm, ~flag, a), unique=True), np.lexsort((perm, ~flag, a)))
    big = rng.integers(0, 1 << 40, n)
    assert np.array_equal(lexsort_packed((big, big[::-1], a)), np.lexsort((big, big[::-1], a)))
    assert len(lexsort_packed((np.zeros(0, dtype=np.int64),))) == 0


def _walk_node_by_node(g: Graph, t: np.ndarray, lat: np.ndarray) -> tuple[list[tuple[int, ...]], list[tuple]]:
    """The walk `walk_path`'s docstring states, one node at a time (what it did before it read the
    binding chain a block of nodes at a time): its rows' values and its merged segments."""
    ws, we = g.windows(t)
    step_ns = g.path_spans(t)
    bind = binding_edges(g, t, lat)

    def binding(n: int) -> int:
        assert bind[n] != -2, "a node's time is reached by none of its in-edges"
        return int(bind[n])

    rows_rev: list[list[tuple[int, ...]]] = []
    segs_rev: list[list[tuple]] = []
    cursor = None
    for k in range(len(g.steps) - 1, -1, -1):
        st = int(g.steps[k])
        i_end = int(np.argmax(we[:, k]))
        t_end = int(we[i_end, k])
        limit = t_end - int(step_ns[k])
        n, hi = -1, t_end
        if cursor is not None and cursor[1] >= t_end:
            n, hi = cursor
            while hi > t_end:
                e = binding(n)
                if e < 0:
                    n = -1
                    break
                ts = int(t[g.src[e]])
                if ts < t_end:
                    hi = t_end
                    break
                n, hi = int(g.src[e]), ts
        last_rank = g.ranks[i_end]
        if n < 0:
            nodes = g.end_nodes[i_end][k]
            n = int(nodes[np.argmax(t[nodes])])
            hi = int(t[n])
        elif g.node_rank[n] >= 0:
            last_rank = int(g.node_rank[n])
        acc = {r: [0] * len(PARTS) for r in g.ranks}
        hops, segs, ended = 0, [], False
        while hi > limit:
            e = binding(n)
            if e < 0:
                ended = True
                break
            ts = int(t[g.src[e]])
            piece = hi - max(ts, limit)
            r = int(g.erank[e])
            if piece > 0:
                acc[r][int(g.kind[e])] += piece
                if r != last_rank:
                    hops, last_rank = hops + 1, r
                off = g.offsets.get(r, 0)
                x = "transfer" if int(g.role[e]) == ROLE_XFER else "work"
                segs.append((st, r, max(ts, limit) + off, hi + off, x, -1))
            if ts < limit:
                hi = limit
                break
            n, hi = int(g.src[e]), ts
        cursor = None if ended else (n, hi)
        path_len = t_end - max(hi, limit)
        span = int(step_ns[k])
        rows_rev.append([(st, r, *acc[r], span, span - path_len, hops) for r in g.ranks])
        segs_rev.append(segs)
    merged: list[tuple] = []
    for s in [sg for per in reversed(segs_rev) for sg in per]:
        p = merged[-1] if merged else None
        if p and p[:2] == s[:2] and p[4] == s[4] == "work" and p[2] == s[3]:
            merged[-1] = (p[0], p[1], s[2], p[3], p[4], p[5])
        else:
            merged.append(s)
    return [row for per in reversed(rows_rev) for row in per], merged


def _latency_variants(g: Graph) -> list[np.ndarray]:
    """The measured latencies, every third edge 40% shorter (other edges bind, the path changes
    rank elsewhere) and no latency at all (every in-edge ties: the first binds; the walk reaches
    the origin)."""
    short = g.lat.copy()
    short[::3] = short[::3] * 6 // 10
    return [g.lat, short, np.zeros_like(g.lat)]


def _walks_match(g: Any) -> list[tuple[np.ndarray, list[Any], list[Any]]]:
    """For each latency set of `_latency_variants`: `walk_path` gives the node-by-node walk's
    rows and segments exactly; returns (latencies, rows, segments) per set."""
    out = []
    for lat in _latency_variants(g):
        t = g.times(lat)
        walk = walk_path(g, t, lat)
        rows, segs = _walk_node_by_node(g, t, lat)
        assert [r.values() for r in walk.rows] == rows
        assert walk.segments == segs
        out.append((lat, rows, segs))
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_walk_is_the_node_by_node_walk_on_generated_runs(name: str) -> None:
    """`walk_path` (the binding chain read a block of nodes at a time) gives the node-by-node
    walk's rows and segments exactly, at the measured times and at two re-timings; a time that no
    in-edge reaches on the path stops both."""
    g, _ends = graph_of(SPECS[name])
    for lat, _rows, segs in _walks_match(g):
        assert len(segs) >= len(g.steps) or not lat.any()  # a piece per step at least
    t = g.times()
    ws, we = g.windows(t)
    k = len(g.steps) - 1
    nodes = g.end_nodes[int(np.argmax(we[:, k]))][k]
    late = t.copy()
    late[int(nodes[np.argmax(t[nodes])])] += 1  # the walk's first node: no in-edge reaches it now
    for walk_of in (walk_path, _walk_node_by_node):
        with pytest.raises(AssertionError, match="reached by none of its in-edges"):
            walk_of(g, late, g.lat)


@pytest.mark.parametrize("trace", ["h200-tp2", "cpu-tp2-straggler"])
def test_the_walk_is_the_node_by_node_walk_on_the_committed_traces(trace: str) -> None:
    """The same on the committed runs' graphs (a GPU and a host timeline, two ranks each)."""
    from committed_pairs import committed_parts

    g = committed_parts(trace, "sharded").graph
    assert g is not None
    for lat, rows, _segs in _walks_match(g):
        visited = {r[1] for r in rows if sum(r[2 : 2 + len(PARTS)])}
        assert len(visited) == (2 if lat.any() else 0)  # the path visits both ranks


def _deduct_every_edge(m: Any, lat: np.ndarray, s: Any) -> np.ndarray:
    """`RunModel._deduct`'s deduction over every edge's arrays (as it was before it touched only the
    edges a cost can be on): the cost per call from the call's own time first, the rest from the
    gap before it; the launch released earlier; a sync call's cost off its wait edge."""
    from tracekit.analyse.retime.model import _DEDUCT_ROLES

    g = m.graph
    is_call = g.role == 3
    lat = lat.copy()
    hd, dc = s.host_deduct, s.deduct_collective
    by_rank = {int(r): (float(c), 0.0) for r, c in s.rank_costs} if s.rank_costs is not None else None
    if by_rank is None and m.rank_deduct is not None and s.host_deduct == m.host_deduct:
        by_rank = m.rank_deduct
    if by_rank is not None:
        costs = np.asarray([by_rank.get(int(r), (s.host_deduct, s.deduct_collective)) for r in m.ranks])
        at = np.minimum(np.searchsorted(np.asarray(m.ranks), g.erank), len(m.ranks) - 1)
        hd, dc = costs[at, 0], costs[at, 1]
    per = hd * g.calls.astype(np.float64) + dc * np.where(is_call, g.ops, 0)
    if m.timeline == "host":
        per = hd * g.ops.astype(np.float64)
    calls = np.flatnonzero(g.role == 3)
    gaps = np.flatnonzero((g.role == 1) | (g.role == 2))
    first_gap = {}
    for e, n in zip(gaps.tolist(), g.dst[gaps].tolist(), strict=True):
        first_gap.setdefault(n, e)
    pairs = [
        (c, first_gap[n])
        for c, n in zip(calls.tolist(), g.src[calls].tolist(), strict=True)
        if n in first_gap
    ]
    call_e = np.asarray([c for c, _ in pairs], dtype=np.int64)
    gap_e = np.asarray([e for _, e in pairs], dtype=np.int64)
    need = per.copy()
    own = np.minimum(need[call_e], np.maximum(lat[call_e], 0.0))
    lat[call_e] -= own
    need[call_e] = 0.0
    np.add.at(need, gap_e, per[call_e] - own)
    by_node = np.zeros(len(g.t))
    by_node[g.src[call_e]] = own
    lm = np.flatnonzero(g.role == 6)
    lat[lm] -= np.minimum(by_node[g.src[lm]], np.maximum(lat[lm], 0.0))
    lat -= np.where(np.isin(g.role, _DEDUCT_ROLES), np.minimum(need, np.maximum(lat, 0.0)), 0.0)
    waits, syncs = np.flatnonzero(g.role == 5), np.flatnonzero(g.role == 4)
    sync_at = {}
    for e, n in zip(syncs.tolist(), g.dst[syncs].tolist(), strict=True):
        sync_at.setdefault(n, e)
    sw = [w for w, n in zip(waits.tolist(), g.dst[waits].tolist(), strict=True) if n in sync_at]
    se = [sync_at[int(g.dst[w])] for w in sw]
    if sw:
        cut = np.maximum(per[se] - np.maximum(g.t[g.src[sw]] - g.t[g.src[se]], 0), 0.0)
        lat[sw] = np.maximum(lat[sw] - cut, np.minimum(lat[sw], 0.0))
    return lat


@pytest.mark.parametrize("timeline", ["gpu", "host"])
def test_the_profilers_cost_comes_off_the_edges_as_over_every_edge(timeline: str) -> None:
    """`RunModel._deduct` (computed on the edges a cost can be on) is the deduction over every
    edge's arrays (`_deduct_every_edge`), bit for bit, on the committed h200-tp2 graph: one cost, one
    per collective too, a cost larger than the calls (the gaps pay), each rank's own and a split
    between ranks, on the measured latencies and on host time scaled by 0.8."""
    from committed_pairs import committed_parts

    from tracekit.analyse.retime.model import RunModel
    from tracekit.analyse.retime.setting import Setting

    g = committed_parts("h200-tp2", "sharded").graph
    assert g is not None
    ranks = list(g.ranks)
    for rank_deduct in (None, {r: (900.0 * (i + 1), 13.0 * i) for i, r in enumerate(ranks)}):
        m = RunModel(
            "run", len(ranks), ranks, timeline, list(g.steps), g, np.zeros(0, dtype=np.int64), {}, None
        )
        m.rank_deduct, m.host_deduct = rank_deduct, 5134.0
        for s in (
            Setting(host_deduct=5134.0),
            Setting(host_deduct=5134.0, deduct_collective=2929.0),
            Setting(host_deduct=2e6),
            Setting(rank_costs=tuple((r, 300.0 + 4000.0 * i) for i, r in enumerate(ranks))),
        ):
            for lat in (g.lat.astype(np.float64), g.lat * 0.8):
                got = m._deduct(lat, s)
                assert np.array_equal(got, _deduct_every_edge(m, lat, s)), s
                assert (got <= lat).all() and (got < lat).any()


def _parts_by_layers(g: Graph, t: np.ndarray) -> dict[str, np.ndarray]:
    """`graph_parts` by its definition: per rank, each layer (compute, memory, collective, unknown,
    sync) covers the union of its pieces and every higher layer's, made afresh from all of them; a
    collective's time after the rendezvous (its arrival's begin to its end) is transfer where no
    compute or memory covers it."""
    from tracekit.analyse.intervals import covered, union
    from tracekit.analyse.path.roles import (
        K_COMPUTE,
        K_MEMORY,
        K_TRANSFER,
        K_UNKNOWN,
        ROLE_ARRIVE,
        ROLE_OP,
        ROLE_SYNC,
        ROLE_WORK,
    )
    from tracekit.model.parts import LEAF_PARTS

    ws, we = g.windows(t)
    step = (we - ws).max(axis=0)
    out = {p: np.zeros(ws.shape, dtype=np.int64) for p in LEAF_PARTS}
    for i, r in enumerate(g.ranks):
        a, b = ws[i], we[i]
        mine = g.erank == r
        work = mine & ((g.role == ROLE_OP) | (g.role == ROLE_WORK))
        arrival = {
            int(d): int(s)
            for s, d in zip(
                g.src[mine & (g.role == ROLE_ARRIVE)], g.dst[mine & (g.role == ROLE_ARRIVE)], strict=True
            )
        }
        xf = np.flatnonzero(mine & (g.role == ROLE_XFER))
        c_s = t[[arrival.get(int(v), int(v)) for v in g.src[xf]]].astype(np.int64)
        c_e, rv = t[g.dst[xf]], t[g.src[xf]]

        def iv(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return t[g.src[mask]], t[g.dst[mask]]

        un = iv(work & (g.kind == K_TRANSFER))
        pieces = [
            iv(work & (g.kind == K_COMPUTE)),
            iv(work & (g.kind == K_MEMORY)),
            (np.concatenate((c_s, un[0])), np.concatenate((c_e, un[1]))),
            iv(work & (g.kind == K_UNKNOWN)),
            iv(mine & (g.role == ROLE_SYNC)),
        ]
        cov = [
            covered(
                *union(
                    np.concatenate([p[0] for p in pieces[: j + 1]]),
                    np.concatenate([p[1] for p in pieces[: j + 1]]),
                ),
                a,
                b,
            )
            for j in range(len(pieces))
        ]
        hd = (np.concatenate((pieces[0][0], pieces[1][0])), np.concatenate((pieces[0][1], pieces[1][1])))
        x = covered(*union(np.concatenate((hd[0], np.maximum(c_s, rv))), np.concatenate((hd[1], c_e))), a, b)
        transfer = x - covered(*union(*hd), a, b)
        out["compute"][i], out["memory"][i], out["transfer"][i] = cov[0], cov[1] - cov[0], transfer
        out["wait"][i], out["unknown"][i], out["sync"][i] = (
            cov[2] - cov[1] - transfer,
            cov[3] - cov[2],
            cov[4] - cov[3],
        )
        out["idle"][i] = (b - a) - cov[4] + (step - (b - a))
    return out


@pytest.mark.parametrize("trace", ["h200-tp2", "cpu-tp2-straggler"])
def test_the_graphs_parts_of_each_window_are_its_layers_read_afresh(trace: str) -> None:
    """`correction_replay.graph_parts` (each layer's union made from the one above it and its own
    pieces) is the layers' definition (`_parts_by_layers`) on the committed runs' graphs, at the
    measured times and at a re-timing with every third edge 40% shorter."""
    from committed_pairs import committed_parts

    from tracekit.analyse.attribution.correction_replay import graph_parts

    g = committed_parts(trace, "sharded").graph
    assert g is not None
    for lat in _latency_variants(g)[:2]:
        t = g.times(lat)
        got, want = graph_parts(g, t), _parts_by_layers(g, t)
        assert got.keys() == want.keys()
        for p in got:
            assert np.array_equal(got[p], want[p]), p
        assert (sum(got.values()) == (g.windows(t)[1] - g.windows(t)[0]).max(axis=0)).all()


def test_the_corrected_timeline_read_ahead_is_the_one_the_correction_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a committed run with a manifest calibration (h200-shard2-graphs), the corrected
    timeline read ahead (`read_corrected`, the plan's graph Reduce) is made of the latencies the
    correction's own model gives, so `correct_first` takes it without making them again, and
    corrects the run to the same figures as without it."""
    from committed_pairs import committed_parts

    from tracekit.analyse.attribution import correction_replay as cr
    from tracekit.analyse.retime.calibrate import calibrate
    from tracekit.analyse.retime.model import RunModel

    parts = committed_parts("h200-shard2-graphs", "sharded")
    g, cal = parts.graph, parts.profiler_calibration
    assert g is not None and cal is not None
    target = sum(next(iter(parts.per_rank.values())).values()) * 9 / 10
    assert "_corrected" not in g.__dict__
    try:
        fresh, _ = cr.correct_first(parts, target)
        cr.read_corrected(g, cal, list(g.ranks), len(parts.ranks))
        model = cr.run_model(parts, target)
        calibrate(model)
        assert model.correction == "manifest calibration"
        assert np.array_equal(g.__dict__["_corrected"].lat, model.latencies(model.corrected()))
        made = []
        own = RunModel.latencies
        monkeypatch.setattr(RunModel, "latencies", lambda m, s: made.append(s) or own(m, s))
        ahead, _ = cr.correct_first(parts, target)
        assert made == []  # the read-ahead latencies taken
        assert ahead.to_json() == fresh.to_json() and ahead.sentence == fresh.sentence
        assert ahead.per_rank == fresh.per_rank and ahead.path == fresh.path
        assert ahead.rows is not None and fresh.rows is not None and np.array_equal(ahead.rows, fresh.rows)
    finally:
        g.__dict__.pop("_corrected", None)  # the committed run's graph is shared: left as found
