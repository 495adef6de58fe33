"""Every rank stage of a plan on the Dask engine is one task per rank file, holding that file's
ranks only (issues 19, 27); the run's table is never put together: no task and not the client
calls `read_run`, and the critical path's Reduce is one task on a worker, given every rank's
graph piece.

On a LocalCluster of threads (`processes=False`, so the tasks run in this process). The JSON is
the local engine's, to the byte, on a synthetic 16-rank run and on an Nsight pair (ranks
renumbered and clocks shifted per file).
"""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tracekit.analyse.plans import attribution_plan, breakdown_plan
from tracekit.engine import Engine, breakdown_paths, dask_engine
from tracekit.engine.dask_engine import DaskExecutor
from tracekit.engine.executor import Job, JobResult, TaskRecord
from tracekit.engine.synthetic import make_synthetic_run

#: Dask is imported by the tests that run (the cluster fixture), not at collection (0.75 CPU-s in
#: every xdist worker)
pytestmark = pytest.mark.skipif(
    find_spec("distributed") is None, reason="Dask (the dask extra) is not installed"
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


@pytest.fixture(scope="module")
def dask() -> Any:
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0", silence_logs=40
    ) as c:
        yield Engine(kind="dask", scheduler=c.scheduler_address)


@pytest.fixture(scope="module")
def synthetic16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_run(TRACES / "cpu-tp2", tmp_path_factory.mktemp("syn") / "tp16", 16, max_steps=3)


def _text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


def _no_run_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """`read_run` (the run's table in one process) fails, wherever it is called from."""
    import tracekit.read

    def no_run(*a: Any, **k: Any) -> Any:
        raise AssertionError("the run's table was put together")

    monkeypatch.setattr(tracekit.read, "read_run", no_run)


def _stages(res: JobResult) -> dict[str, list[TaskRecord]]:
    out: dict[str, list[TaskRecord]] = {}
    for t in res.tasks:
        out.setdefault(t.stage, []).append(t)
    return out


@pytest.mark.parametrize("kw", [{}, {"skip_first": 1}, {"step_pattern": "whole"}, {"rank": 5}])
def test_a_breakdown_task_holds_one_rank_files_ranks(
    dask: Engine, synthetic16: Path, monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]
) -> None:
    local = _text(breakdown_paths(synthetic16, **kw).to_json())
    _no_run_table(monkeypatch)
    (res,), _ = DaskExecutor(dask).run([Job((synthetic16,), (breakdown_plan(**kw),))])
    assert _text(res.results[0].breakdown.to_json()) == local
    st = _stages(res)
    assert len(st["read"]) == 16  # every file read once
    n_files = 1 if "rank" in kw else 16  # with --rank, only the file holding it runs the stages
    for name in ("breakdown.rule", "breakdown.ranks"):
        assert len(st[name]) == n_files
        assert all(len(t.ranks) == 1 for t in st[name])
        assert sorted(r for t in st[name] for r in t.ranks) == ([5] if "rank" in kw else list(range(16)))


@pytest.mark.parametrize("run", ["h200-tp2-nsys", "h200-tp2"])
def test_per_rank_breakdown_on_committed_runs(dask: Engine, run: str) -> None:
    for kw in ({}, {"skip_first": 2}, {"step_pattern": "whole"}):
        local = _text(breakdown_paths(TRACES / run, **kw).to_json())
        assert _text(breakdown_paths(TRACES / run, dask, **kw).to_json()) == local


@pytest.mark.parametrize(("base", "sharded"), [("cpu-tp1", None), ("h200-tp1", "h200-tp2-nsys")])
def test_a_shortfall_task_holds_one_rank_files_ranks(
    dask: Engine, synthetic16: Path, monkeypatch: pytest.MonkeyPatch, base: str, sharded: str | None
) -> None:
    from tracekit.analyse.attribution.pair import shortfall_of_pair
    from tracekit.engine import pair_check, shortfall_paths

    shard = synthetic16 if sharded is None else TRACES / sharded
    local = _text(shortfall_paths(TRACES / base, shard).to_json())
    _no_run_table(monkeypatch)
    (b_res, s_res), notes = DaskExecutor(dask).run(
        [
            Job((TRACES / base,), (attribution_plan(label="baseline"),)),
            Job((shard,), (attribution_plan(label="sharded"),)),
        ],
        pair_check,
    )
    assert _text(shortfall_of_pair(b_res.results[0], s_res.results[0], notes).to_json()) == local
    for res in (b_res, s_res):
        st = _stages(res)
        files = {t.file: t.ranks for t in st["read"]}
        assert len(files) == res.files
        # per rank file one task per stage, holding that file's ranks (two in the Nsight file)
        for name in ("attribution.rule", "attribution.windows", "attribution.attribute"):
            assert len(st[name]) == res.files
            assert all(len(t.ranks) <= max(len(v) for v in files.values()) for t in st[name])
            assert sorted(r for t in st[name] for r in t.ranks) == sorted(res.meta.ranks)
        # the critical path: one task, given every rank's graph piece
        (path,) = st["path"]
        assert path.ranks == sorted(res.meta.ranks)
        # the graph's Reduce (assembled and prepared for the correction) beside the path's
        (graph,) = st["graph"]
        assert graph.ranks == path.ranks


def test_the_graph_reduce_runs_beside_the_path_reduce_on_another_worker(dask: Engine) -> None:
    """The run's graph is assembled and its forward pass built for the correction on one worker
    while another walks the path (`Reduce(wait=False)`): left to itself the scheduler puts both
    next to the graph pieces they share and runs them one after the other, the serial part of the
    wall growing by the shorter one (benchmarks/README.md, bench_scale)."""
    job = Job((TRACES / "cpu-tp2",), (attribution_plan(label="sharded", correct="applied"),))
    (res,), _ = DaskExecutor(dask).run([job])
    st = _stages(res)
    (graph,), (path,) = st["graph"], st["path"]
    assert graph.ranks == path.ranks == [0, 1]
    assert graph.worker and path.worker and graph.worker != path.worker


def test_report_on_dask_puts_no_run_together(dask: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.engine import analyse_dirs
    from tracekit.report.build import analyse_dirs as in_memory

    local = analyse_dirs(TRACES / "h200-tp2", TRACES / "h200-tp1")
    ref = in_memory(TRACES / "h200-tp2", TRACES / "h200-tp1")  # the report layer's own, in memory
    _no_run_table(monkeypatch)
    got = analyse_dirs(TRACES / "h200-tp2", TRACES / "h200-tp1", dask)
    for name in ("breakdown", "baseline_breakdown", "shortfall", "top_kernels", "baseline_top_kernels"):
        assert msgspec.json.encode(getattr(got, name)) == msgspec.json.encode(getattr(local, name)), name
        assert msgspec.json.encode(getattr(ref, name)) == msgspec.json.encode(getattr(local, name)), name


def test_clipped_unions_measure_what_the_whole_ones_do() -> None:
    from tracekit.analyse.timeline.partition import rank_layer_unions
    from tracekit.read import read_run

    run = read_run([TRACES / "cpu-tp2"])
    from tracekit.classify import classify

    ev = classify(run.events)
    lay = rank_layer_unions(ev, [0])[0]
    lo0, hi0 = int(ev["start_ns"].min()), int(ev["end_ns"].max())
    rng = __import__("random").Random(0)
    for _ in range(200):
        lo, hi = sorted(rng.randint(lo0 - 10, hi0 + 10) for _ in range(2))
        cut = lay.clipped(lo, hi)
        a, b = sorted(rng.randint(lo, hi) for _ in range(2))
        assert cut.measure(a, b) == lay.measure(a, b)
        assert cut.measure(b, a) == lay.measure(b, a)  # empty: zeros anywhere
        if lo > lo0:
            with pytest.raises(AssertionError, match="outside the clipped"):
                cut.measure(lo - 1, hi)


def test_per_rank_and_path_tasks_that_fail_once_are_retried(
    dask: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank stage and a Reduce that each fail once: retried, the JSON unchanged. The retry is the
    engine's, whatever the data: the committed CPU pair (per-rank stages on both ranks' files, the
    path and correction Reduces) costs a fraction of an H200 pair's replay correction."""
    from tracekit.engine import shortfall_paths

    local = _text(shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2").to_json())
    for name in ("rank_stage", "reduce_task"):
        marker = tmp_path / f"failed-{name}"
        real = getattr(dask_engine, name)

        def flaky(*a: Any, _real: Any = real, _marker: Path = marker, **k: Any) -> Any:
            if not _marker.exists():
                _marker.write_text("x")
                raise OSError("worker lost its disk for a moment")
            return _real(*a, **k)

        monkeypatch.setattr(dask_engine, name, flaky)
    assert _text(shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2", dask).to_json()) == local
    assert (tmp_path / "failed-rank_stage").exists() and (tmp_path / "failed-reduce_task").exists()
