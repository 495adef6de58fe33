"""The ground-truth simulator's own invariants (tests/groundtruth/): its truth must be right before
tracekit is held to it. Every figure here comes from the simulation alone."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from tests.groundtruth import sim
from tests.groundtruth.cases import CASES, random_run
from tests.groundtruth.kineto import write_run

SHARDED = [n for n, c in CASES.items() if c.sharded is not None]


def _runs(name: str) -> list[sim.RunSpec]:
    c = CASES[name]
    return [x for x in (c.baseline, c.sharded, c.after) if x is not None]


@pytest.mark.parametrize("name", list(CASES))
def test_parts_and_path_cover_each_token_exactly(name: str) -> None:
    for spec in _runs(name):
        res = sim.simulate(spec)
        t = res.per_token_ns()
        for r, parts in sim.parts_truth(res).items():
            assert sum(parts.values()) >= t, (spec.name, r, parts)
        # the path covers the steady tokens' periods exactly, without an offset
        path = sim.critical_path(res)
        assert sum(sum(d.values()) for d in path.values()) == t, (spec.name, path)
        assert all(v >= 0 for d in path.values() for v in d.values())


def _scaled_program(spec: sim.RunSpec, what: str, minus: int) -> sim.RunSpec:
    """Every collective's transfer, or every compute kernel's duration per 250 ns, shortened by
    `minus` ns."""

    def wrap(program):  # type: ignore[no-untyped-def]
        def p(k: int) -> list[sim.Op]:
            out: list[sim.Op] = []
            for op in program(k):
                if what == "transfer" and isinstance(op, sim.Coll):
                    op = replace(op, transfer=op.transfer - minus)
                if what == "compute" and isinstance(op, sim.Kernel) and op.kind == "compute":
                    assert op.dur % 250 == 0
                    op = replace(op, dur=op.dur - minus * op.dur // 250)
                out.append(op)
            return out

        return p

    return replace(spec, ranks=tuple(replace(r, program=wrap(r.program)) for r in spec.ranks))


@pytest.mark.parametrize("name", ["gpu_bound_tp2", "host_sleep_rank1", "straggler_2ms", "gpu_bound_tp4"])
def test_path_is_causal_shortening_on_path_work_shortens_the_token_by_as_much(name: str) -> None:
    """Shorten every transfer by 1 ns: the token shrinks by the number of transfers on the path;
    every compute kernel by 1/250: by the path's compute / 250. Off-path work: nothing."""
    spec = CASES[name].sharded
    assert spec is not None
    res = sim.simulate(spec)
    t = res.per_token_ns()
    path = sim.critical_path(res)
    transfer = sum(d["transfer"] for d in path.values())
    compute = sum(d["compute"] for d in path.values())
    per_coll = {op.transfer for op in spec.ranks[0].program(2) if isinstance(op, sim.Coll)}
    assert len(per_coll) == 1
    x = per_coll.pop()
    t_tr = sim.simulate(_scaled_program(spec, "transfer", 1)).per_token_ns()
    assert t - t_tr == transfer / x
    t_cp = sim.simulate(_scaled_program(spec, "compute", 1)).per_token_ns()
    assert t - t_cp == Fraction(compute, 250)


def test_host_bound_rank_path_is_its_host() -> None:
    """Issue 23 item 1's case: rank 1's host sleeps 4 x 100 us per token; removing rank 0's compute
    changes nothing (it is off the path), removing rank 1's sleeps saves about their length."""
    spec = CASES["host_sleep_rank1"].sharded
    assert spec is not None
    res = sim.simulate(spec)
    path = sim.critical_path(res)
    assert path[1]["host"] > 400_000 and path[0]["compute"] == 0
    no_sleep = CASES["gpu_bound_tp2"].sharded
    assert no_sleep is not None
    saved = res.per_token_ns() - sim.simulate(no_sleep).per_token_ns()
    assert 0 < saved <= 400_000


def test_knobs_never_slow_a_run_down() -> None:
    for name in SHARDED:
        spec = CASES[name].sharded
        assert spec is not None
        t = sim.simulate(spec).per_token_ns()
        for k in sim.KNOBS:
            assert sim.simulate(spec, knobs=[k]).per_token_ns() <= t, (name, k)


def test_shapley_values_sum_to_the_shortfall_no_knob_removes_exactly() -> None:
    c = CASES["host_sleep_rank1"]
    assert c.sharded is not None
    values, times = sim.shapley(c.baseline, c.sharded)
    f = Fraction(c.baseline.tp, c.sharded.tp)
    v_none = times[frozenset()][1] - f * times[frozenset()][0]
    v_all = times[frozenset(sim.KNOBS)][1] - f * times[frozenset(sim.KNOBS)][0]
    assert sum(values.values()) == v_none - v_all


def test_profiler_cost_is_host_time_per_call() -> None:
    """The profiled run differs from the unprofiled one only by the calls' host cost: at TP=1
    launch-bound every launch's cost is on the path (the last two calls, the `.item()` copy and
    its sync, overlap the device's tail), so the token grows by 13 to 15 calls' cost."""
    spec = CASES["profiler_cost_15us"].baseline
    u = sim.simulate(spec)
    p = sim.simulate(spec, profiled=True)
    calls = sum(1 for c in u.ranks[0].calls if c.step == 2)
    assert calls == 15
    assert (calls - 2) * 15_000 <= p.per_token_ns() - u.per_token_ns() <= calls * 15_000


def test_clock_offset_and_step_numbers_change_only_the_written_trace() -> None:
    skew = CASES["clock_skew_5ms"]
    assert skew.sharded is not None and skew.after is not None
    a, b = sim.simulate(skew.sharded), sim.simulate(skew.after)
    assert a.per_token_ns() == b.per_token_ns()
    assert sim.parts_truth(a) == sim.parts_truth(b)


@pytest.mark.parametrize("seed", range(12))
def test_path_is_causal_on_generated_runs(seed: int) -> None:
    """The same check on generated asymmetric runs (host-bound and GPU-bound ranks, sleeps, time
    between steps): the path's transfer and compute are what shortening them saves. (With noise
    the tokens differ, and the first token's end moves too: the check holds for periodic runs.)"""
    spec = random_run(seed, tp=2 + seed % 3)
    res = sim.simulate(spec)
    t = res.per_token_ns()
    path = sim.critical_path(res)
    assert sum(sum(d.values()) for d in path.values()) == t
    x = next(op.transfer for op in spec.ranks[0].program(2) if isinstance(op, sim.Coll))
    transfer = sum(d["transfer"] for d in path.values())
    assert t - sim.simulate(_scaled_program(spec, "transfer", 1)).per_token_ns() == transfer / x
    compute = sum(d["compute"] for d in path.values())
    assert t - sim.simulate(_scaled_program(spec, "compute", 1)).per_token_ns() == Fraction(compute, 250)


def _structure(doc: dict[str, object]) -> tuple[set[str], dict[tuple[object, object], set[str]]]:
    events = doc["traceEvents"]
    assert isinstance(events, list)
    keys: dict[tuple[object, object], set[str]] = {}
    for e in events:
        keys.setdefault((e.get("ph"), e.get("cat")), set()).update((e.get("args") or {}).keys())
    return set(doc) - {"traceEvents"}, keys


def test_written_trace_has_the_structure_of_a_real_kineto_trace(tmp_path: Path) -> None:
    """Every top-level field, (phase, category) and args key the simulator writes is one the
    committed real H200 capture has (full mode: traces/h200-tp2-full; copies: the graph capture),
    except `Seq` (newer torch adds it to record_param_comms; the reader takes it when present)."""
    repo = Path(__file__).resolve().parent.parent
    top, real = _structure(json.load(gzip.open(repo / "traces/h200-tp2-full/rank-1.pt.trace.json.gz")))
    _, copies = _structure(json.load(gzip.open(repo / "traces/h200x2-tp2-b1-graphs/rank-1.pt.trace.json.gz")))
    real[("X", "gpu_memcpy")] = copies[("X", "gpu_memcpy")] | {"External id"}  # full mode links it to its op
    spec = CASES["gpu_bound_tp2"].sharded
    assert spec is not None
    write_run(spec, tmp_path)
    mine_top, mine = _structure(json.load(gzip.open(tmp_path / "rank-1.pt.trace.json.gz")))
    assert mine_top <= top
    assert set(mine) <= set(real), set(mine) - set(real)
    for key, args in mine.items():
        assert args - real[key] <= {"Seq"}, (key, args - real[key])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    committed = json.loads((repo / "traces/h200-tp2/manifest.json").read_text())
    assert set(manifest) <= set(committed) | {"dilation_interval"}
    assert set(manifest["workload"]["collectives"][0]) == set(committed["workload"]["collectives"][0])
