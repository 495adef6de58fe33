"""Every rank stage of a plan on the Dask engine is one task per rank file, holding that file's
ranks only (issues 19, 27); the run's table is never put together: no task and not the client
calls `read_run`, and the critical path's Reduce is one task on a worker, given every rank's
graph piece.

On a LocalCluster of threads (conftest's `dask`: `processes=False`, so the tasks run in this
process). The JSON is the local engine's, to the byte (tests/engine_refs.py: made once per process,
or a committed pair's pin), on the synthetic many-rank run (conftest's `synthetic_run`) and on
Nsight runs (two ranks in one file: ranks renumbered and clocks shifted per file).
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import Any

import msgspec
import pytest
from engine_refs import N_SYN, assert_local_json, local_breakdown, local_shortfall, shortfall_pin, text

from tracekit.analyse.attribution.plan import attribution_plan
from tracekit.analyse.command_plans import breakdown_plan
from tracekit.engine import Engine, dask_engine
from tracekit.engine.dask_engine import DaskExecutor
from tracekit.engine.executor import Job, JobResult, LocalExecutor, TaskRecord

#: Dask is imported by the tests that run (the cluster fixture), not at collection (0.75 CPU-s in
#: every xdist worker)
pytestmark = pytest.mark.skipif(
    find_spec("distributed") is None, reason="Dask (the dask extra) is not installed"
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


def _no_run_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """`read_run` (the run's table in one process) fails, wherever it is called from: the package's
    name and every loaded module's own binding of it (those that import it at their top)."""
    import sys

    import tracekit.read

    real = tracekit.read.read_run

    def no_run(*a: Any, **k: Any) -> Any:
        raise AssertionError("the run's table was put together")

    for name, mod in list(sys.modules.items()):
        if name.startswith("tracekit") and getattr(mod, "read_run", None) is real:
            monkeypatch.setattr(mod, "read_run", no_run)
    assert tracekit.read.read_run is no_run


def _stages(res: JobResult) -> dict[str, list[TaskRecord]]:
    out: dict[str, list[TaskRecord]] = {}
    for t in res.tasks:
        out.setdefault(t.stage, []).append(t)
    return out


def _one_task_per_file(res: JobResult, stages: tuple[str, ...], ranks: list[int] | None = None) -> None:
    """Every rank file read once; per file one task of each of `stages`, holding that file's ranks
    (of `ranks`, all the run's by default) only."""
    st = _stages(res)
    files = {t.file: t.ranks for t in st["read"]}
    assert len(st["read"]) == len(files) == res.files
    want = sorted(res.meta.ranks) if ranks is None else ranks
    for name in stages:
        held = [t.ranks for t in st[name]]
        assert sorted(r for rs in held for r in rs) == want, name
        assert all(any(set(rs) <= set(v) for v in files.values()) for rs in held), name
        n_files = sum(1 for v in files.values() if set(v) & set(want))
        assert len(held) == n_files, name


@pytest.mark.parametrize("kw", [{}, {"rank": 5}])
def test_a_breakdown_task_holds_one_rank_files_ranks(
    dask: Engine, synthetic_run: Path, monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]
) -> None:
    """`N_SYN` files of one rank each; with `rank`, only the file holding it runs the stages."""
    local = local_breakdown(synthetic_run, **kw)
    _no_run_table(monkeypatch)
    (res,), _ = DaskExecutor(dask).run([Job((synthetic_run,), (breakdown_plan(**kw),))])
    assert text(res.results[0].breakdown.to_json()) == local
    assert res.files == N_SYN
    _one_task_per_file(res, ("breakdown.rule", "breakdown.ranks"), [5] if "rank" in kw else None)
    assert all(len(t.ranks) == 1 for t in res.tasks if t.stage.startswith("breakdown."))


@pytest.mark.parametrize(
    ("run", "kw"), [("h200-tp2-nsys", {"skip_first": 2}), ("h200-tp2", {"step_pattern": "whole"})]
)
def test_per_rank_breakdown_on_committed_runs(
    dask: Engine, run: str, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps chosen otherwise than by default (each option on one of the two), on GPU runs (one
    Nsight file of two ranks; two Kineto files): the breakdown and its top kernels are the local
    engine's, per file one task per stage. The default options on these runs:
    tests/test_engine_dask.py."""
    job = Job((TRACES / run,), (breakdown_plan(**kw),))
    (ref,), _ = LocalExecutor().run([job])
    _no_run_table(monkeypatch)
    (res,), _ = DaskExecutor(dask).run([job])
    assert text(res.results[0].breakdown.to_json()) == text(ref.results[0].breakdown.to_json())
    assert res.results[0].top_kernels == ref.results[0].top_kernels
    assert ref.results[0].top_kernels.classes  # GPU kernels ranked
    _one_task_per_file(res, ("breakdown.rule", "breakdown.ranks"))


@pytest.mark.parametrize(
    ("base", "sharded"), [("h200-tp1-graphs-fused", None), ("h200-tp1-nsys", "h200-tp2-nsys")]
)
def test_a_shortfall_task_holds_one_rank_files_ranks(
    dask: Engine,
    synthetic_run: Path,
    monkeypatch: pytest.MonkeyPatch,
    base: str,
    sharded: str | None,
) -> None:
    """The synthetic run against a one-H200 baseline (CUDA graphs; two workloads: the pair's note,
    made on the client from the files' metadata), and an Nsight pair (its pin; the sharded file
    holds two ranks)."""
    from tracekit.analyse.attribution.pair import shortfall_of_pair
    from tracekit.engine import pair_check

    if sharded is None:
        b, shard = TRACES / base, synthetic_run
        local = lambda: local_shortfall(b, shard)  # noqa: E731
        assert '"baseline_workload_differs": 1' in local()
    else:
        monkeypatch.chdir(ROOT)  # the pin's document names its inputs by relative path
        b, shard = Path("traces", base), Path("traces", sharded)
        local = lambda: local_shortfall(str(b), str(shard))  # noqa: E731
    _no_run_table(monkeypatch)
    (b_res, s_res), notes = DaskExecutor(dask).run(
        [
            Job((b,), (attribution_plan(label="baseline"),)),
            Job((shard,), (attribution_plan(label="sharded"),)),
        ],
        pair_check,
    )
    got = text(shortfall_of_pair(b_res.results[0], s_res.results[0], notes).to_json())
    if sharded is None:
        assert got == local()
    else:
        assert_local_json(got, shortfall_pin(sharded), local)
    for res in (b_res, s_res):
        # per rank file one task per stage, holding that file's ranks (two in the Nsight file)
        _one_task_per_file(res, ("attribution.rule", "attribution.attribute"))
        # each rank's own step rule is the run's: its windows found in the rule stage
        assert "attribution.windows" not in _stages(res)
        # the critical path: one task, given every rank's graph piece
        (path,) = _stages(res)["path"]
        assert path.ranks == sorted(res.meta.ranks)
        # the graph's Reduce (assembled and prepared for the correction) beside the path's
        (graph,) = _stages(res)["graph"]
        assert graph.ranks == path.ranks
    assert max(len(t.ranks) for t in s_res.tasks if t.stage == "read") == (2 if sharded else 1)


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
    """The report's analyses of a pair (the CPU pair: what is proved holds for any pair; an H200
    pair's shortfall on Dask, its replay correction made in the Reduce as here:
    tests/test_engine_dask.py)."""
    from tracekit.engine import analyse_dirs
    from tracekit.report.build import analyse_dirs as in_memory

    local = analyse_dirs(TRACES / "cpu-tp2", TRACES / "cpu-tp1")
    ref = in_memory(TRACES / "cpu-tp2", TRACES / "cpu-tp1")  # the report layer's own, in memory
    _no_run_table(monkeypatch)
    got = analyse_dirs(TRACES / "cpu-tp2", TRACES / "cpu-tp1", dask)
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

    monkeypatch.chdir(ROOT)  # the pin's document names its inputs by relative path
    b, s = "traces/cpu-tp1", "traces/cpu-tp2"
    for name in ("rank_stage", "reduce_task"):
        marker = tmp_path / f"failed-{name}"
        real = getattr(dask_engine, name)

        def flaky(*a: Any, _real: Any = real, _marker: Path = marker, **k: Any) -> Any:
            if not _marker.exists():
                _marker.write_text("x")
                raise OSError("worker lost its disk for a moment")
            return _real(*a, **k)

        monkeypatch.setattr(dask_engine, name, flaky)
    got = text(shortfall_paths(b, s, dask).to_json())
    assert_local_json(got, shortfall_pin("cpu-tp2"), lambda: local_shortfall(b, s))
    assert (tmp_path / "failed-rank_stage").exists() and (tmp_path / "failed-reduce_task").exists()
