"""The Dask engine gives the local engine's JSON, to the byte (issue 19).

A LocalCluster of two workers (threads of this process, `processes=False`, for speed; one test
uses a worker process that is killed mid-run) runs breakdown, shortfall and report on the committed
multi-rank runs and on a synthetic many-rank run made from traces/cpu-tp2 (conftest's
`synthetic_run`: jittered clocks, shuffled events, tests/engine_refs.py's `N_SYN` ranks); each
document must equal the local engine's byte for byte: the committed runs' documents are compared
with their pins (the sha256 of what the local engine writes, tests/engine_refs.py), the others with
the local engine's document made once per test process.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from engine_refs import (
    N_SYN,
    PINS,
    assert_local_json,
    breakdown_pin,
    local_breakdown,
    local_shortfall,
    pin_module,
    pinned_command,
    shortfall_pin,
    text,
)

from tracekit.engine import (
    Engine,
    EngineError,
    breakdown_paths,
    dask_engine,
    shortfall_paths,
)

#: Dask is imported by the tests that run (the cluster fixture), not at collection (0.75 CPU-s in
#: every xdist worker)
pytestmark = pytest.mark.skipif(
    find_spec("distributed") is None, reason="Dask (the dask extra) is not installed"
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"

#: each a kind of data of its own: two H200 Kineto ranks, the same in full profiler mode (CPU ops
#: with shapes), one Nsight file holding two ranks, two CPU (gloo) ranks, and a straggler on them.
#: h200-tp2-straggler (h200-tp2's kind of data) is on Dask in the identifiability test below
MULTI_RANK = ["h200-tp2", "h200-tp2-full", "h200-tp2-nsys", "cpu-tp2", "cpu-tp2-straggler"]
#: (baseline, sharded) on Dask against their pins: the CPU pair here; the GPU pair's attribution and
#: replay correction (h200-tp1 / h200-tp2-straggler) in `gpu_pair_on_dask`. Two workloads (the
#: pair's note): tests/test_engine_dask_per_rank.py's shortfall of the synthetic run against an H200
#: baseline; a CPU straggler's shortfall on Dask: the CLI test below
SHORTFALL_PAIRS = [("cpu-tp1", "cpu-tp2")]
GPU_PAIR = ("h200-tp1", "h200-tp2-straggler")


@pytest.fixture(scope="module")
def gpu_pair_on_dask(dask: Engine) -> tuple[str, Any]:
    """`GPU_PAIR` analysed on Dask once for the tests that read it: both runs' attribution plans
    (the replay correction applied, the graphs kept), run from the repository root as the pins are
    made; the shortfall's JSON (made at once: the tests then read the results, one pops the
    sharded run's correction) and the sharded run's JobResult."""
    from tracekit.analyse.attribution.pair import shortfall_of_pair
    from tracekit.analyse.attribution.plan import attribution_plan
    from tracekit.engine import pair_check
    from tracekit.engine.dask_engine import DaskExecutor
    from tracekit.engine.executor import Job

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        (b_res, s_res), notes = DaskExecutor(dask).run(
            [
                Job((f"traces/{GPU_PAIR[0]}",), (attribution_plan(label="baseline", correct="applied"),)),
                Job((f"traces/{GPU_PAIR[1]}",), (attribution_plan(label="sharded", correct="applied"),)),
            ],
            pair_check,
        )
        doc = text(shortfall_of_pair(b_res.results[0], s_res.results[0], notes).to_json())
    return doc, s_res


@pytest.fixture
def at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned documents name their inputs by path relative to the repository root: run there
    (the cluster's workers are threads of this process)."""
    monkeypatch.chdir(ROOT)


# ------------------------------------------------------------------------------------------
# byte-equal JSON on the committed runs


@pytest.mark.parametrize("run", MULTI_RANK)
def test_breakdown_on_dask_is_the_local_json_to_the_byte(run: str, dask: Engine, at_root: None) -> None:
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.read import read_run

    rel = f"traces/{run}"
    local = lambda: local_breakdown(rel)  # noqa: E731 - made only where the pin is out of date
    assert_local_json(text(breakdown_paths(rel, dask).to_json()), breakdown_pin(run), local)
    # the engines run the breakdown plan; the in-memory breakdown is its own code: the same JSON
    assert_local_json(text(breakdown(read_run([rel])).to_json()), breakdown_pin(run), local)


@pytest.mark.parametrize(("base", "sharded"), SHORTFALL_PAIRS)
def test_shortfall_on_dask_is_the_local_json_to_the_byte(
    base: str, sharded: str, dask: Engine, at_root: None
) -> None:
    b, s = f"traces/{base}", f"traces/{sharded}"
    distributed = text(shortfall_paths(b, s, dask).to_json())
    assert_local_json(distributed, shortfall_pin(sharded), lambda: local_shortfall(b, s))


def test_a_gpu_pairs_shortfall_on_dask_is_the_local_json_to_the_byte(
    gpu_pair_on_dask: tuple[str, Any], at_root: None
) -> None:
    """Two H200 Kineto runs, the sharded one's replay correction solved on both ranks (its
    identifiability check on Dask: the last test)."""
    b, s = (f"traces/{r}" for r in GPU_PAIR)
    assert_local_json(gpu_pair_on_dask[0], shortfall_pin(GPU_PAIR[1]), lambda: local_shortfall(b, s))


def test_the_documents_readings_of_each_run_are_made_before_the_commands_tail(
    dask: Engine, at_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shortfall document's readings of one run that need no correction (its collectives'
    table, its canonical kernel sequence) are made by the attribution plan while the correction's
    Reduce runs (`document.read_ahead`, a `plans.Later`): with both made to fail once the plans are
    over, the command's tail (`shortfall_of_pair`, `to_json`) still writes the pinned document."""
    from tracekit.analyse.attribution import document
    from tracekit.analyse.attribution.pair import shortfall_of_pair
    from tracekit.analyse.attribution.plan import attribution_plan
    from tracekit.engine import pair_check
    from tracekit.engine.dask_engine import DaskExecutor
    from tracekit.engine.executor import Job

    b, s = "traces/cpu-tp1", "traces/cpu-tp2"
    (b_res, s_res), notes = DaskExecutor(dask).run(
        [
            Job((b,), (attribution_plan(label="baseline", correct="applied"),)),
            Job((s,), (attribution_plan(label="sharded", correct="applied"),)),
        ],
        pair_check,
    )

    def late(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("made in the command's tail")

    monkeypatch.setattr(document, "collectives_json", late)
    monkeypatch.setattr(document, "canonical", late)
    got = text(shortfall_of_pair(b_res.results[0], s_res.results[0], notes).to_json())
    monkeypatch.undo()
    assert_local_json(got, shortfall_pin("cpu-tp2"), lambda: local_shortfall(b, s))


@pytest.mark.parametrize(("base", "sharded"), [("cpu-tp2", "cpu-tp2"), ("cpu-tp2-straggler", "cpu-tp2")])
def test_shortfall_refusals_on_dask_are_the_local_ones(base: str, sharded: str, dask: Engine) -> None:
    from tracekit.errors import RankError

    with pytest.raises(RankError) as local:
        shortfall_paths(TRACES / base, TRACES / sharded)
    with pytest.raises(RankError) as distributed:
        shortfall_paths(TRACES / base, TRACES / sharded, dask)
    assert str(distributed.value) == str(local.value)


def test_rank_options_and_progress_on_dask(dask: Engine) -> None:
    """One file read as another rank, one rank of several shown, and the progress display on."""
    one = TRACES / "cpu-tp2" / "rank-1.pt.trace.json.gz"
    assert text(breakdown_paths(one, dask, rank=5).to_json()) == local_breakdown(one, rank=5)
    with_bar = Engine(kind="dask", scheduler=dask.scheduler, progress=True)
    got = text(breakdown_paths(TRACES / "cpu-tp2", with_bar, rank=1, skip_first=2).to_json())
    assert got == local_breakdown(TRACES / "cpu-tp2", rank=1, skip_first=2)
    assert json.loads(got)["source"]["ranks"] == [1]  # one rank of the two shown


def test_cli_engine_dask_writes_the_local_json(dask: Engine, tmp_path: Path, at_root: None) -> None:
    """`--scheduler` on breakdown, shortfall and report: each writes the local engine's document
    (the pinned commands: a straggler's breakdown and shortfall, the CPU study's report)."""
    from tracekit.cli.main import main

    run, base = "traces/cpu-tp2-straggler", "traces/cpu-tp1"
    for name, args, pin in [
        ("breakdown", ["breakdown", run, "--format", "json"], breakdown_pin("cpu-tp2-straggler")),
        (
            "shortfall",
            ["shortfall", "--baseline", base, "--sharded", run, "--format", "json"],
            shortfall_pin("cpu-tp2-straggler"),
        ),
    ]:
        out = tmp_path / f"{name}-dask.json"
        assert main([*args, "--scheduler", str(dask.scheduler), "--out", str(out)]) == 0

        def local(args: list[str] = args, name: str = name) -> bytes:
            assert main([*args, "--out", str(tmp_path / f"{name}-local.json")]) == 0
            return (tmp_path / f"{name}-local.json").read_bytes()

        assert_local_json(out.read_bytes(), pin, local)
    # the report: the same document but for its creation time and version (the pin masks them)
    name = "reports/cpu-study/report.json"
    argv = pinned_command(name)
    assert argv[:2] == ["report", "traces/cpu-tp2"] and argv[argv.index("--baseline") + 1] == base
    moved = pin_module().json_only(argv, tmp_path / "dask")
    assert moved is not None and moved[1] == [name]
    assert main([*moved[0], "--scheduler", str(dask.scheduler)]) == 0
    got = (tmp_path / "dask" / name).read_bytes()
    if pin_module().masked_sha256(got) != PINS[name]:  # a pin out of date: the local report, made here
        local_moved = pin_module().json_only(argv, tmp_path / "local")
        assert local_moved is not None and main(local_moved[0]) == 0
        docs = [json.loads(p.read_text()) for p in (tmp_path / "dask" / name, tmp_path / "local" / name)]
        for d in docs:
            d.pop("created")
        assert docs[0] == docs[1]


# ------------------------------------------------------------------------------------------
# many ranks


def test_synthetic_many_ranks_on_dask_is_the_local_json(synthetic_run: Path, dask: Engine) -> None:
    """The breakdown of `N_SYN` ranks whose clocks disagree; their shortfall on Dask:
    tests/test_engine_dask_per_rank.py (test_a_shortfall_task_holds_one_rank_files_ranks)."""
    b_local = json.loads(local_breakdown(synthetic_run))
    assert b_local["source"]["ranks"] == list(range(N_SYN))
    assert len({s["start_ns"] for s in b_local["steps"] if s["step"] == b_local["steps"][0]["step"]}) > 1
    assert text(breakdown_paths(synthetic_run, dask).to_json()) == local_breakdown(synthetic_run)


def test_synthetic_run_keeps_collectives_consistent(synthetic_run: Path) -> None:
    """Every rank issues the same collectives in the same order, so all of them match."""
    from tracekit.analyse.collectives.matching import match_collectives
    from tracekit.classify import classify
    from tracekit.read import read_run

    run = read_run([synthetic_run])
    coll = match_collectives(
        classify(run.events), ranks=run.ranks, rank_info=run.rank_info, manifest=run.manifest
    )
    per_instance = coll.per_rank.groupby("instance")["rank"].nunique()
    assert len(per_instance) > 0 and (per_instance == N_SYN).all()


# ------------------------------------------------------------------------------------------
# failures: retried by the engine, the result unchanged


def test_a_task_that_fails_once_is_retried_and_the_result_is_unchanged(
    dask: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_root: None
) -> None:
    marker = tmp_path / "failed-once"
    real = dask_engine.read_rank_file

    def flaky(path: str, rank: int | None, cache: bool, env: Any = None) -> dask_engine.RankFile:
        if not marker.exists():
            marker.write_text(path)
            raise OSError("worker lost its disk for a moment")
        return real(path, rank, cache, env)

    monkeypatch.setattr(dask_engine, "read_rank_file", flaky)
    b, s = "traces/cpu-tp1", "traces/cpu-tp2"
    got = text(shortfall_paths(b, s, dask).to_json())
    assert marker.exists()
    assert_local_json(got, shortfall_pin("cpu-tp2"), lambda: local_shortfall(b, s))


def test_without_retries_the_failure_is_one_line(dask: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.errors import TraceFormatError

    def bad(path: str, rank: int | None, cache: bool, env: Any = None) -> dask_engine.RankFile:
        raise TraceFormatError(path, "not a trace", offset=12)

    monkeypatch.setattr(dask_engine, "read_rank_file", bad)
    with pytest.raises(TraceFormatError, match="at byte 12"):
        breakdown_paths(TRACES / "cpu-tp2", Engine(kind="dask", scheduler=dask.scheduler, retries=0))


#: the worker process of the test below kills itself as it starts reading its KILL_AT-th rank file
KILL_AT = 4


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_worker_killed_mid_run_is_replaced_and_the_result_is_unchanged(synthetic_run: Path) -> None:
    """One worker, a process of its own (a Nanny's), kills itself (SIGKILL) as it starts reading
    its `KILL_AT`-th rank file of the `N_SYN`: killed mid-run by construction, with rank files read
    (their results lost with it) and rank files still to read. Its nanny starts a new worker
    process (another pid), the only worker left to finish the run: the result is the local
    engine's."""
    from distributed import Client, LocalCluster

    def die_at_a_later_read(k: int) -> None:  # run in the worker process (cloudpickled by value)
        import os
        import signal

        from tracekit.engine import dask_tasks

        real, calls = dask_tasks.read_rank_file, [0]

        def read(path: str, rank: int | None, cache: bool, env: Any = None) -> Any:
            calls[0] += 1
            if calls[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(path, rank, cache, env)

        dask_tasks.read_rank_file = read  # the task's function, looked up by name in this process

    assert 1 < KILL_AT < N_SYN
    import dask

    with (
        # the worker processes forked from a forkserver that has distributed, numpy and pandas
        # imported (Dask preloads them there), not each a fresh interpreter importing them: the
        # test's CPU seconds 6.7 -> 3.6, the kill and the replacement are the same
        dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50
        ) as lc,
        Client(lc) as client,
    ):
        (victim,) = client.run(os.getpid).values()
        client.run(die_at_a_later_read, KILL_AT)
        doc = breakdown_paths(synthetic_run, Engine(kind="dask", scheduler=lc.scheduler_address)).to_json()
        (replacement,) = client.run(os.getpid).values()
    assert replacement != victim
    assert text(doc) == local_breakdown(synthetic_run)


# ------------------------------------------------------------------------------------------
# settings and a missing Dask


def test_two_analyses_at_once_on_one_cluster(dask: Engine, at_root: None) -> None:
    """Task keys are per call: two runs analysed at the same time on one cluster each get their
    own result."""
    from concurrent.futures import ThreadPoolExecutor

    runs = ["cpu-tp2", "cpu-tp2-straggler"]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda r: text(breakdown_paths(f"traces/{r}", dask).to_json()), runs))
    for run, doc in zip(runs, got, strict=True):
        assert_local_json(doc, breakdown_pin(run), lambda run=run: local_breakdown(f"traces/{run}"))


def test_reading_limits_reach_the_workers(
    dask: Engine, capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--max-events is the client's setting: the tasks carry it (a remote worker has its own
    environment), and the refusal is the local engine's one line."""
    from tracekit.cli.main import main
    from tracekit.errors import TracekitError

    run = str(TRACES / "cpu-tp2")
    assert main(["breakdown", run, "--no-cache", "--max-events", "100"]) == 2
    local = capsys.readouterr().err
    assert (
        main(["breakdown", run, "--no-cache", "--max-events", "100", "--scheduler", str(dask.scheduler)]) == 2
    )
    assert capsys.readouterr().err == local
    # a worker whose own environment says otherwise reads with the client's settings, and keeps its own
    one = str(TRACES / "cpu-tp2" / "rank-0.pt.trace.json.gz")
    monkeypatch.setenv("TRACEKIT_MAX_EVENTS", "100")
    assert dask_engine.read_rank_file(one, None, False, {}).meta.n_events > 100
    assert os.environ["TRACEKIT_MAX_EVENTS"] == "100"
    monkeypatch.delenv("TRACEKIT_MAX_EVENTS")
    with pytest.raises(TracekitError):
        dask_engine.read_rank_file(one, None, False, {"TRACEKIT_MAX_EVENTS": "100"})
    assert "TRACEKIT_MAX_EVENTS" not in os.environ


def test_engine_settings_are_checked() -> None:
    assert Engine.parse(None, None, None).kind == "local"
    assert Engine.parse(None, None, 4).kind == "dask"
    assert Engine.parse(None, "tcp://h:8786", None).kind == "dask"
    with pytest.raises(EngineError, match="apply to --engine dask"):
        Engine.parse("local", None, 2)
    with pytest.raises(EngineError, match="unknown engine"):
        Engine(kind="spark")


def test_tracekit_imports_no_dask() -> None:
    import subprocess

    code = (
        "import sys, tracekit.engine, tracekit.cli.breakdown, tracekit.cli.shortfall, tracekit.cli.report; "
        "sys.exit(1 if 'distributed' in sys.modules or 'dask' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_without_dask_the_error_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from tracekit.cli.main import main

    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["breakdown", str(TRACES / "cpu-tp2"), "--engine", "dask", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "tracekit: error: --engine dask needs Dask: pip install 'tracekit[dask]' (or pip install 'dask[distributed]')"
    ]


# ------------------------------------------------------------------------------------------
# the executor: each rank file read once, a task per file and stage, the path on a worker


def test_each_rank_file_is_read_once_for_every_plan_of_a_call(dask: Engine, synthetic_run: Path) -> None:
    """The report's two plans (breakdown, attribution) on one run: one read task per rank file,
    then one task per file for every rank stage of both plans, each holding that file's rank
    only; the critical path's Reduce in one task over all the ranks; the results are the local
    engine's."""
    from tracekit.analyse.attribution.plan import attribution_plan
    from tracekit.analyse.command_plans import breakdown_plan
    from tracekit.engine.dask_engine import DaskExecutor
    from tracekit.engine.executor import Job, LocalExecutor

    job = Job((synthetic_run,), (breakdown_plan(), attribution_plan(label="sharded")))
    (res,), _ = DaskExecutor(dask).run([job])
    (ref,), _ = LocalExecutor().run([job])
    by_stage: dict[str, list[Any]] = {}
    for t in res.tasks:
        by_stage.setdefault(t.stage, []).append(t)
    assert len(by_stage["read"]) == res.files == N_SYN
    assert sorted(Path(t.file).name for t in by_stage["read"]) == sorted(
        p.name for p in synthetic_run.glob("rank-*.pt.trace.json*")
    )
    for stage in ("breakdown.rule", "breakdown.ranks", "attribution.rule"):
        assert sorted(r for t in by_stage[stage] for r in t.ranks) == list(range(N_SYN)), stage
        assert all(len(t.ranks) == 1 for t in by_stage[stage]), stage
    # every rank's own step rule is the run's: its windows found in the rule stage, no windows task
    assert "attribution.windows" not in by_stage
    (path,) = by_stage["path"]
    assert path.ranks == list(range(N_SYN))
    assert text(res.results[0].breakdown.to_json()) == text(ref.results[0].breakdown.to_json())
    assert res.results[0].top_kernels == ref.results[0].top_kernels
    assert res.results[1].per_token == ref.results[1].per_token
    assert res.results[1].critical.per_step.equals(ref.results[1].critical.per_step)
    assert res.results[1].critical.segments.equals(ref.results[1].critical.segments)
    assert 0 < res.client_s


def test_a_plan_stage_error_is_the_local_one(dask: Engine) -> None:
    """A step pattern no rank matches: the attribution plan's combine refuses it, on Dask as locally."""
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.errors import StepError

    options = AttributionOptions(step_pattern="no-such-step")
    with pytest.raises(StepError) as local:
        shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2", options=options)
    with pytest.raises(StepError) as distributed:
        shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2", dask, options=options)
    assert str(distributed.value) == str(local.value)
    assert str(local.value).startswith("baseline: ")


def test_the_identifiability_check_runs_one_task_per_rank_and_equals_the_serial_one(
    gpu_pair_on_dask: tuple[str, Any],
) -> None:
    """h200-tp2-straggler's cost is solved (no calibration) and not identified: the plan's check
    runs as one `identify` task per rank, spread over the workers, then (the ends spread) ONE
    `identify_between` task, `refine_splits` over every rank's interval (its budget of midpoints is
    shared by the intervals); its Correction, and the cost intervals the what-if reads, are the
    ones `correct_run` computes rank after rank in this process on the same RunParts
    (docs/METHOD.md section Noise and the profiler correction). The sharded run of `GPU_PAIR`."""
    from tracekit.analyse.attribution.correction import correct_run
    from tracekit.analyse.attribution.correction_stages import correction_target

    res = gpu_pair_on_dask[1]
    parts = res.results[0]
    by_stage: dict[str, int] = {}
    for t in res.tasks:
        by_stage[t.stage] = by_stage.get(t.stage, 0) + 1
    assert by_stage["identify"] == len(parts.ranks) == 2
    assert by_stage["identify_between"] == 1
    target = correction_target(parts, "applied")
    fanned = parts.__dict__.pop("_corrections")[target]
    assert fanned.identified is False and fanned.ranges  # both rounds ran
    serial = correct_run(parts, target)  # recomputed here: the graph came back (keep_graph)
    assert serial is not fanned
    assert serial.to_json() == fanned.to_json()
    assert fanned.intervals and serial.intervals == fanned.intervals
    assert (
        serial.ranges == fanned.ranges and serial.per_rank == fanned.per_rank and serial.path == fanned.path
    )
    assert serial.rows is not None and fanned.rows is not None and (serial.rows == fanned.rows).all()
