"""Every analysis command on every engine, and the profiler correction where the graph is (issue 27).

One LocalCluster for the session (conftest: two worker threads of this process). The profiler correction
is computed in the attribution plan's Reduce, next to the run's dependency graph: the RunParts
that reaches the client has no graph, yet its correction is the one the in-process analysis
gives (whose `correction.correct_run` re-times the graph on the client). whatif, decompose and
diff take `--engine`: on Dask each writes the document the local engine (or the in-process
analysis) writes. Small runs: the CPU runs, and the 1- and 2-rank H200 traces where the replay
correction or the device events are the point.
"""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit.cli.main import main
from tracekit.engine import Engine

#: Dask is imported by the tests that run (the cluster fixture), not at collection (0.75 CPU-s in
#: every xdist worker)
pytestmark = pytest.mark.skipif(
    find_spec("distributed") is None, reason="Dask (the dask extra) is not installed"
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


def _text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


def _cli(args: list[str], out: Path) -> str:
    assert main([*args, "--format", "json", "-o", str(out)]) == 0
    return out.read_text()


def test_the_correction_is_computed_where_the_graph_is(dask: Engine) -> None:
    """On Dask the run's replay correction is made in the plan's Reduce: the client's RunParts
    holds no graph (`correct_run` could not re-time one there: it falls back to the proportional
    rule), yet its correction is the one the in-process attribution's `correct_run` computes on
    the graph it keeps."""
    from tracekit.analyse.attribution.correction import correct_run
    from tracekit.analyse.attribution.plan import attribute_run, attribution_plan
    from tracekit.analyse.attribution.reconcile import applied_dilation
    from tracekit.engine import run_plans
    from tracekit.engine.executor import Job
    from tracekit.read import read_run

    path = TRACES / "h200-tp1"
    ref_parts = attribute_run(read_run([path]), label="baseline")
    assert ref_parts.graph is not None
    target = applied_dilation(ref_parts).target_ns
    assert target is not None  # the manifest's unprofiled rounds
    ref = correct_run(ref_parts, target)
    assert ref.method == "replay"
    plan = attribution_plan(label="baseline", correct="applied", keep_graph=False)
    (res,), _ = run_plans(dask, [Job((path,), (plan,))])
    parts = res.results[0]
    assert parts.graph is None  # the graph stayed on the worker
    assert [t.stage for t in res.tasks].count("correction") == 1
    got = correct_run(parts, target)  # the plan's, cached on the RunParts
    assert (got.method, got.sentence, got.per_call_ns, got.replayed_ns) == (
        ref.method,
        ref.sentence,
        ref.per_call_ns,
        ref.replayed_ns,
    )
    assert got.per_rank == ref.per_rank and got.path == ref.path
    assert got.rows is not None and ref.rows is not None and (got.rows == ref.rows).all()
    parts.__dict__["_corrections"].clear()  # without the plan's correction the client has no graph
    assert correct_run(parts, target).method == "proportional"


def _pinned_on_dask(
    name: str, dask: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> str:
    """The pinned command that writes `name` (scripts/pin_outputs.py), run on Dask from the
    repository root (the document names its inputs by relative path); its document is the local
    engine's: its pin, else the local engine's document made here (a pin out of date)."""
    from engine_refs import assert_local_json, pin_module, pinned_command

    monkeypatch.chdir(ROOT)
    argv = pinned_command(name)
    moved = pin_module().json_only(argv, tmp_path / "dask")
    assert moved is not None and moved[1] == [name]
    assert main([*moved[0], *extra, "--scheduler", dask.scheduler or ""]) == 0
    got = (tmp_path / "dask" / name).read_text()

    def local() -> str:
        local_moved = pin_module().json_only(argv, tmp_path / "local")
        assert local_moved is not None and main(local_moved[0]) == 0
        return (tmp_path / "local" / name).read_text()

    assert_local_json(got, name, local)
    return got


def test_whatif_on_dask_writes_the_local_json(
    dask: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU straggler's what-if (its default knobs, their Shapley terms, and a check run)."""
    doc = json.loads(_pinned_on_dask("reports/whatif/cpu-straggler.json", dask, tmp_path, monkeypatch))
    assert doc["shapley_ns"]["straggler=off"] > 0 and doc["check"]


def test_the_replay_reads_the_same_device_events_on_dask(dask: Engine) -> None:
    """`allreduce_norm=fused` finds its kernels in the device rows the replay plan brings from
    the workers exactly as in the whole classified run."""
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.analyse.retime.norm import norm_after_all_reduce
    from tracekit.engine import whatif_runs
    from tracekit.read import read_run

    path = str(TRACES / "h200-tp2")
    got = whatif_runs({"sharded": path}, dask)["sharded"]
    g = got.parts.graph
    run = read_run([path])
    assert got.classified.manifest == run.manifest
    whole = norm_after_all_reduce(g, AnalysedRun.of(run).events)
    assert whole is not None and whole.sum() > 0
    mine = norm_after_all_reduce(g, got.classified.events)
    assert mine is not None and np.array_equal(mine, whole)


def test_decompose_on_dask_writes_the_local_json(
    dask: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed decomposition of eager -> CUDA graphs -> torch.compile on one H200."""
    name = "reports/decompose/h200-graphs-compile.json"
    _pinned_on_dask(name, dask, tmp_path, monkeypatch, "--engine", "dask")


def test_decompose_figures_on_dask_are_the_in_process_ones(dask: Engine) -> None:
    """A GPU run corrected to its unprofiled mean by the replay (decompose's target), per-rank
    compute split on the workers: the same figures as `run_figures` in process."""
    from tracekit.analyse.command_plans import figures_plan
    from tracekit.analyse.compare.decompose import run_figures
    from tracekit.engine import run_plans
    from tracekit.engine.executor import Job
    from tracekit.read import read_run

    path = TRACES / "h200-tp1-graphs-fused"
    ref = run_figures(read_run([path]), "full")
    (res,), _ = run_plans(dask, [Job((path,), (figures_plan("full"),))])
    assert res.results[0].source == ref.source == "unprofiled"
    assert res.results[0].document() == ref.document()


def test_diff_on_dask_writes_the_in_process_json(dask: Engine, tmp_path: Path) -> None:
    """`tracekit diff --engine dask`: the document of `diff.diff` on the runs read in process
    (a solved and a calibrated replay correction, each made where its graph is)."""
    from tracekit.analyse.compare.diff import diff
    from tracekit.read import read_run

    before, after = TRACES / "h200-tp1", TRACES / "h200-tp1-calibrated"
    ref = diff(read_run([before]), read_run([after]), before_path=str(before), after_path=str(after))
    got = _cli(["diff", str(before), str(after), "--scheduler", dask.scheduler or ""], tmp_path / "d.json")
    assert json.loads(got) == json.loads(_text(ref.to_json()))


def test_every_analysis_command_takes_the_engine_options() -> None:
    import click

    from tracekit.cli.main import cli

    ctx = click.Context(cli)
    for name in ("breakdown", "shortfall", "report", "whatif", "decompose", "diff"):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None, name
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {"--engine", "--scheduler", "--workers"} <= opts, name


def test_the_whatif_on_the_plans_refuses_a_run_without_its_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay.build_model` would build the graph again from every event, which the replay plan
    does not bring back (only the device rows): a run whose attribution kept no graph is refused
    in one line, naming the local engine, instead of being replayed on a partial table."""
    from tracekit.analyse.attribution import plan as plans
    from tracekit.engine import EngineError, whatif_runs

    real = plans.att_correct

    def no_graph(graph: Any, arg: Any) -> Any:
        (target, corr, _graph, job), kept = real(graph, arg)
        return (target, corr, None, job), kept

    monkeypatch.setattr(plans, "att_correct", no_graph)
    with pytest.raises(EngineError, match="--engine local"):
        whatif_runs({"baseline": str(TRACES / "cpu-tp1")})
