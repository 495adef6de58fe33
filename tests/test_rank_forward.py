"""The forward pass split per rank (`tracekit.analyse.path.rank_forward`, docs/SCALE.md): each
rank's share of the run's graph re-timed on its own, only the rendezvous times exchanged, gives
the whole graph's pass to the nanosecond (`Graph.times`, itself checked node by node against
`forward.times_reference` in tests/test_forward.py); on Dask the profiler correction of a
calibrated run takes it instead of re-timing the run's graph, and its JSON is the local engine's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracekit.analyse.attribution.plan as att_plan
import tracekit.analyse.plans as plans
from tracekit.analyse.attribution.correction_replay import calibrated_latencies
from tracekit.analyse.path.graph import Graph, assemble
from tracekit.analyse.path.rank_forward import is_fixpoint, retime_in_process
from tracekit.analyse.path.rank_graph import RankGraph
from tracekit.analyse.path.roles import ROLE_XFER
from tracekit.analyse.retime.calibrate import ProfilerCalibration
from tracekit.read import read_run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


def _calibration() -> ProfilerCalibration:
    cal = json.loads((TRACES / "h200-tp1-calibrated" / "manifest.json").read_text())["profiler_calibration"]
    return ProfilerCalibration(per_call_ns=cal["per_call_ns"], method=cal.get("method", ""), calls=None)


def _pieces(run: str, monkeypatch: pytest.MonkeyPatch) -> list[RankGraph]:
    """The run's per-rank graph pieces, as the attribution plan's rank stage keeps them."""
    got: dict[int, RankGraph] = {}
    rank_fn = att_plan._att_rank

    def keep(inp: plans.RankInput, arg: Any) -> Any:
        out = rank_fn(inp, arg)
        got[inp.rank] = inp.keep["graph"]
        return out

    monkeypatch.setattr(att_plan, "_att_rank", keep)
    plans.run_in_process(att_plan.attribution_plan(), read_run([str(TRACES / run)]))
    return [got[r] for r in sorted(got)]


def _skewed(g: Graph) -> np.ndarray:
    """Latencies far from the measured ones (some edges 3x, the others halved, by role): which
    rank arrives last changes at many rendezvous, so the rounds have to find it."""
    return np.where(g.role % 3 == 0, g.lat * 3, g.lat // 2)


@pytest.mark.parametrize("lat_name", ["measured", "calibrated", "skewed"])
def test_the_per_rank_retiming_is_the_whole_graphs_pass(
    monkeypatch: pytest.MonkeyPatch, lat_name: str
) -> None:
    """h200-tp2 (two H200 ranks, 17 collectives a step): every rank's node times and every
    rendezvous time equal the whole graph's pass at the same latencies; the measured latencies
    settle in the first round (their pass is the trace), the others take more."""
    pieces = _pieces("h200-tp2", monkeypatch)
    ranks = [p.rank for p in pieces]
    lat_of: Callable[[Graph], np.ndarray] = {
        "measured": lambda g: g.lat,
        "calibrated": lambda g: calibrated_latencies(_calibration(), ranks, len(ranks), g),
        "skewed": _skewed,
    }[lat_name]
    g = assemble(pieces, {})
    lat = lat_of(g)
    whole = g.times(lat)
    per, rendezvous, rounds = retime_in_process(pieces, lat_of)
    base = np.cumsum([0] + [len(p.t) for p in pieces])
    for i, p in enumerate(pieces):
        assert np.array_equal(per[p.rank], whole[base[i] : base[i + 1]])
    assert np.array_equal(np.asarray([rendezvous[i] for i in sorted(rendezvous)]), whole[base[-1] :])
    assert len(rendezvous) == g.n_nodes - base[-1] > 100
    if lat_name == "measured":
        assert rounds == 1
        assert np.array_equal(whole, g.t)
    else:
        assert rounds > 1
        assert not np.array_equal(whole, g.t)


def test_the_fixpoint_check_takes_the_pass_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """`is_fixpoint` holds for the pass and fails for a time one ns off at a node with in-edges,
    at a source node, or where a transfer's latency changed."""
    pieces = _pieces("h200-tp2", monkeypatch)
    g = assemble(pieces, {})
    lat = _skewed(g)
    t = g.times(lat)
    assert is_fixpoint(g, t, lat)
    inner = int(g.order[len(g.order) // 2])
    for node in (inner, int(np.flatnonzero(np.diff(g.indptr) == 0)[0])):
        off = t.copy()
        off[node] += 1
        assert not is_fixpoint(g, off, lat)
    lat2 = lat.copy()
    lat2[np.flatnonzero(g.role == ROLE_XFER)] += 1000
    assert not is_fixpoint(g, t, lat2)
    assert not is_fixpoint(g, t[:-1], lat)


def test_a_piece_on_the_wire_is_narrowed_and_assembles_into_the_same_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """h200-tp2's pieces through Dask's serialization (as they travel to the graph's Reduces) take
    under half their bytes in memory (node numbers, roles, kinds and counts in the narrowest type;
    times and latencies int64), and both readers of a piece build the same int64 graph from them
    as from the pieces as built: `assemble` (every column, the order, the CSR) and
    `rank_subgraph` (the per-rank re-timing's cut)."""
    pytest.importorskip("distributed")
    from distributed.protocol import deserialize, serialize

    from tracekit.analyse.path.rank_forward import rank_subgraph

    pieces = _pieces("h200-tp2", monkeypatch)
    header, frames = serialize(pieces, serializers=["pickle"])
    wire = sum(memoryview(f).nbytes for f in frames)
    held = sum(v.nbytes for p in pieces for v in vars(p).values() if isinstance(v, np.ndarray))
    assert wire < held / 2
    back = deserialize(header, frames)
    assert {str(back[0].role.dtype), str(back[0].src.dtype)} == {"int8", "int32"}
    assert back[0].lat.dtype == back[0].t.dtype == np.int64
    want, got = assemble(pieces, {}), assemble(back, {})
    for k, v in vars(want).items():
        if isinstance(v, np.ndarray):
            assert v.dtype == getattr(got, k).dtype == np.int64 or k == "xfer_bytes", k
            assert np.array_equal(v, getattr(got, k)), k
        elif k == "end_nodes":
            assert [[e.tolist() for e in r] for r in v] == [[e.tolist() for e in r] for r in got.end_nodes]
        else:
            assert v == getattr(got, k), k
    rv = {
        int(i): int(t) for i, t in zip(want.xfer_inst, want.t[want.src[want.role == ROLE_XFER]], strict=True)
    }
    for p, q in zip(pieces, back, strict=True):
        (a, ia), (b, ib) = rank_subgraph(p, rv), rank_subgraph(q, rv)
        assert np.array_equal(ia, ib) and np.array_equal(a.order, b.order)
        assert np.array_equal(a.times(a.lat), b.times(b.lat))


#: the rounds `_counted_retime` ran (a module-level function: the Dask tasks pickle it by reference)
_ROUNDS: list[str] = []
_RETIME = att_plan.att_retime


def _counted_retime(inp: plans.RankInput, arg: Any) -> Any:
    _ROUNDS.append(arg[0])
    return _RETIME(inp, arg)


@pytest.mark.skipif(find_spec("distributed") is None, reason="Dask (the dask extra) is not installed")
@pytest.mark.parametrize("per_rank", [True, False])
def test_dask_corrects_a_calibrated_run_from_the_ranks_retiming(
    dask: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_rank: bool
) -> None:
    """h200-tp2 with h200-tp1-calibrated's cost in its manifest: on Dask, asked for
    (`TRACEKIT_PER_RANK_RETIME=1`), the plan's `retime` stage runs (one task per rank file per
    round, several rounds) and the correction takes its times (its graph is never re-timed:
    `Graph.times` fails there); by default no round runs. Either way the shortfall's JSON is the
    local engine's."""
    from engine_refs import local_shortfall, text

    from tracekit.engine import shortfall_paths

    run = tmp_path / "h200-tp2-cal"
    run.mkdir()
    src = TRACES / "h200-tp2"
    for f in src.iterdir():
        if f.name != "manifest.json":
            (run / f.name).symlink_to(f.resolve())
    man = json.loads((src / "manifest.json").read_text())
    cal = json.loads((TRACES / "h200-tp1-calibrated" / "manifest.json").read_text())["profiler_calibration"]
    man["profiler_calibration"] = {k: v for k, v in cal.items() if k != "per_rank_ns"}
    (run / "manifest.json").write_text(json.dumps(man, indent=1))
    base = TRACES / "h200-tp1"
    local = local_shortfall(base, run)
    assert '"method": "replay"' in local and "manifest calibration" in local

    whole_pass = Graph.times

    def no_pass(g: Graph, lat: Any = None) -> Any:
        assert len(g.ranks) == 1, "the sharded run's graph was re-timed"  # the baseline's is
        return whole_pass(g, lat)

    _ROUNDS.clear()
    monkeypatch.setattr(att_plan, "att_retime", _counted_retime)  # the plan made below takes it
    if per_rank:
        monkeypatch.setenv("TRACEKIT_PER_RANK_RETIME", "1")
        monkeypatch.setattr(Graph, "times", no_pass)
    got = text(shortfall_paths(base, run, dask).to_json())
    assert got == local
    if not per_rank:
        assert _ROUNDS == []
        return
    # the measured arrivals, the cut and its first times, then rounds of times; each rank's
    assert _ROUNDS.count("measure") == _ROUNDS.count("cut") == 2
    assert _ROUNDS.count("at") >= 2
