"""The Dask engine gives the local engine's JSON, to the byte (issue 19).

A LocalCluster of two workers (threads of this process, `processes=False`, for speed; one test
uses worker processes and kills one mid-run) runs breakdown, shortfall and report on every
committed multi-rank run and on a synthetic 24-rank run made from traces/cpu-tp2 (jittered clocks,
shuffled events; `N_SYN` ranks: what is proved holds at any count above a few, and the run's cost
grows with it); each document must equal the local engine's byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from tracekit.engine import (
    Engine,
    EngineError,
    breakdown_paths,
    dask_engine,
    shortfall_paths,
)
from tracekit.engine.synthetic import make_synthetic_run

#: Dask is imported by the tests that run (the cluster fixture), not at collection (0.75 CPU-s in
#: every xdist worker)
pytestmark = pytest.mark.skipif(
    find_spec("distributed") is None, reason="Dask (the dask extra) is not installed"
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"

MULTI_RANK = [
    "h200-tp2",
    "h200-tp2-straggler",
    "h200-tp2-full",
    "h200-tp2-nsys",
    "cpu-tp2",
    "cpu-tp2-straggler",
]
SHORTFALL_PAIRS = [
    ("h200-tp1", "h200-tp2"),
    ("cpu-tp1", "cpu-tp2"),
    ("h200-tp1", "cpu-tp2"),  # two workloads: the pair's note
]  # cpu-tp2-straggler: through the CLI below. h200-tp2-straggler is h200-tp2's kind of data (two
# H200 Kineto ranks, the replay correction solved on both) through the same plan and Reduce: its
# breakdown is checked on Dask above, a straggler's shortfall on Dask by the CLI test (~7 CPU-s)


def _text(doc: dict[str, Any]) -> str:
    """The document as the CLI writes it (json.dumps, indent=1)."""
    return json.dumps(doc, indent=1) + "\n"


#: ranks of the synthetic run: more than the 2 workers by far (the worker killed mid-run has rank
#: files done and rank files still to read); the cost of the tests that use it grows with it
N_SYN = 24


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`N_SYN` ranks, each a rank of traces/cpu-tp2 (first 3 steps) with its clock jittered by up
    to 200 us and its events shuffled; one process group of all of them."""
    return make_synthetic_run(
        TRACES / "cpu-tp2", tmp_path_factory.mktemp("syn") / f"tp{N_SYN}", N_SYN, max_steps=3
    )


@pytest.fixture(scope="module")
def synthetic_run_breakdown(synthetic_run: Path) -> str:
    """The local engine's breakdown JSON of the synthetic run."""
    return _text(breakdown_paths(synthetic_run).to_json())


# ------------------------------------------------------------------------------------------
# byte-equal JSON on the committed runs


@pytest.mark.parametrize("run", MULTI_RANK)
def test_breakdown_on_dask_is_the_local_json_to_the_byte(run: str, dask: Engine) -> None:
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.read import read_run

    local = _text(breakdown_paths(TRACES / run).to_json())
    distributed = _text(breakdown_paths(TRACES / run, dask).to_json())
    assert distributed == local
    # the engines run the breakdown plan; the in-memory breakdown is its own code: the same JSON
    assert _text(breakdown(read_run([TRACES / run])).to_json()) == local


@pytest.mark.parametrize(("base", "sharded"), SHORTFALL_PAIRS)
def test_shortfall_on_dask_is_the_local_json_to_the_byte(base: str, sharded: str, dask: Engine) -> None:
    local = _text(shortfall_paths(TRACES / base, TRACES / sharded).to_json())
    distributed = _text(shortfall_paths(TRACES / base, TRACES / sharded, dask).to_json())
    assert distributed == local


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
    assert _text(breakdown_paths(one, dask, rank=5).to_json()) == _text(
        breakdown_paths(one, rank=5).to_json()
    )
    with_bar = Engine(kind="dask", scheduler=dask.scheduler, progress=True)
    local = breakdown_paths(TRACES / "h200-tp2", rank=1, skip_first=2).to_json()
    assert _text(breakdown_paths(TRACES / "h200-tp2", with_bar, rank=1, skip_first=2).to_json()) == _text(
        local
    )


def test_cli_engine_dask_writes_the_local_json(dask: Engine, tmp_path: Path) -> None:
    from tracekit.cli.main import main

    run, base = str(TRACES / "cpu-tp2-straggler"), str(TRACES / "cpu-tp1")
    for name, args in {
        "breakdown": ["breakdown", run, "--format", "json"],
        "shortfall": ["shortfall", "--baseline", base, "--sharded", run, "--format", "json"],
    }.items():
        assert main([*args, "--out", str(tmp_path / f"{name}-local.json")]) == 0
        assert (
            main([*args, "--scheduler", str(dask.scheduler), "--out", str(tmp_path / f"{name}-dask.json")])
            == 0
        )
        assert (tmp_path / f"{name}-dask.json").read_bytes() == (tmp_path / f"{name}-local.json").read_bytes()
    # the report: the same document but for its creation time
    assert main(["report", run, "--baseline", base, "-o", str(tmp_path / "local.json")]) == 0
    assert (
        main(
            [
                "report",
                run,
                "--baseline",
                base,
                "--scheduler",
                str(dask.scheduler),
                "-o",
                str(tmp_path / "dask.json"),
            ]
        )
        == 0
    )
    docs = [json.loads((tmp_path / f"{n}.json").read_text()) for n in ("local", "dask")]
    for d in docs:
        d.pop("created")
    assert docs[0] == docs[1]


# ------------------------------------------------------------------------------------------
# many ranks


def test_synthetic_many_ranks_on_dask_is_the_local_json(
    synthetic_run: Path, synthetic_run_breakdown: str, dask: Engine
) -> None:
    b_local = json.loads(synthetic_run_breakdown)
    assert b_local["source"]["ranks"] == list(range(N_SYN))
    assert len({s["start_ns"] for s in b_local["steps"] if s["step"] == b_local["steps"][0]["step"]}) > 1
    assert _text(breakdown_paths(synthetic_run, dask).to_json()) == synthetic_run_breakdown

    s_local = shortfall_paths(TRACES / "cpu-tp1", synthetic_run).to_json()
    s_dask = shortfall_paths(TRACES / "cpu-tp1", synthetic_run, dask).to_json()
    assert _text(s_dask) == _text(s_local)


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
    dask: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "failed-once"
    real = dask_engine.read_rank_file

    def flaky(path: str, rank: int | None, cache: bool, env: Any = None) -> dask_engine.RankFile:
        if not marker.exists():
            marker.write_text(path)
            raise OSError("worker lost its disk for a moment")
        return real(path, rank, cache, env)

    monkeypatch.setattr(dask_engine, "read_rank_file", flaky)
    local = _text(shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2").to_json())
    assert _text(shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2", dask).to_json()) == local
    assert marker.exists()


def test_without_retries_the_failure_is_one_line(dask: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.errors import TraceFormatError

    def bad(path: str, rank: int | None, cache: bool, env: Any = None) -> dask_engine.RankFile:
        raise TraceFormatError(path, "not a trace", offset=12)

    monkeypatch.setattr(dask_engine, "read_rank_file", bad)
    with pytest.raises(TraceFormatError, match="at byte 12"):
        breakdown_paths(TRACES / "cpu-tp2", Engine(kind="dask", scheduler=dask.scheduler, retries=0))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_worker_killed_mid_run_is_replaced_and_the_result_is_unchanged(
    synthetic_run: Path, synthetic_run_breakdown: str
) -> None:
    from distributed import Client, LocalCluster

    local = synthetic_run_breakdown
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50
        ) as lc,
        Client(lc) as client,
    ):
        pids = client.run(os.getpid)
        victim = sorted(pids.values())[0]
        engine = Engine(kind="dask", scheduler=lc.scheduler_address)
        out: dict[str, Any] = {}

        def go() -> None:
            try:
                out["doc"] = breakdown_paths(synthetic_run, engine, cache=False).to_json()
            except BaseException as exc:  # noqa: BLE001 - reported below
                out["error"] = exc

        t = threading.Thread(target=go)
        t.start()
        # kill one worker once it has read some rank files and others are still to come
        deadline = time.monotonic() + 60
        done: list[str] = []
        while time.monotonic() < deadline:
            done = [k for k, v in client.run_on_scheduler(_task_states).items() if v == "memory"]
            if len(done) >= 4:
                break
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        assert 4 <= len(done) < N_SYN  # killed mid-run: rank files done and rank files still to read
        t.join(timeout=300)
        assert "error" not in out, out.get("error")
        assert _text(out["doc"]) == local


def _task_states(dask_scheduler: Any) -> dict[str, str]:
    return {str(k): ts.state for k, ts in dask_scheduler.tasks.items() if "tracekit-read" in str(k)}


# ------------------------------------------------------------------------------------------
# settings and a missing Dask


def test_two_analyses_at_once_on_one_cluster(dask: Engine) -> None:
    """Task keys are per call: two runs analysed at the same time on one cluster each get their
    own result."""
    from concurrent.futures import ThreadPoolExecutor

    runs = [TRACES / "cpu-tp2", TRACES / "cpu-tp2-straggler"]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda r: _text(breakdown_paths(r, dask).to_json()), runs))
    assert got == [_text(breakdown_paths(r).to_json()) for r in runs]


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
    from tracekit.analyse.plans import attribution_plan, breakdown_plan
    from tracekit.engine.dask_engine import DaskExecutor
    from tracekit.engine.executor import Job, LocalExecutor

    job = Job((synthetic_run,), (breakdown_plan(), attribution_plan(label="sharded")), cache=False)
    (res,), _ = DaskExecutor(dask).run([job])
    (ref,), _ = LocalExecutor().run([job])
    by_stage: dict[str, list[Any]] = {}
    for t in res.tasks:
        by_stage.setdefault(t.stage, []).append(t)
    assert len(by_stage["read"]) == res.files == N_SYN
    assert sorted(Path(t.file).name for t in by_stage["read"]) == sorted(
        p.name for p in synthetic_run.glob("rank-*.pt.trace.json*")
    )
    for stage in ("breakdown.rule", "breakdown.ranks", "attribution.rule", "attribution.windows"):
        assert sorted(r for t in by_stage[stage] for r in t.ranks) == list(range(N_SYN)), stage
        assert all(len(t.ranks) == 1 for t in by_stage[stage]), stage
    (path,) = by_stage["path"]
    assert path.ranks == list(range(N_SYN))
    assert _text(res.results[0].breakdown.to_json()) == _text(ref.results[0].breakdown.to_json())
    assert res.results[0].top_kernels == ref.results[0].top_kernels
    assert res.results[1].per_token == ref.results[1].per_token
    assert res.results[1].critical.per_step.equals(ref.results[1].critical.per_step)
    assert res.results[1].critical.segments.equals(ref.results[1].critical.segments)
    assert 0 < res.client_s


def test_a_plan_stage_error_is_the_local_one(dask: Engine) -> None:
    """A step pattern no rank matches: the attribution plan's combine refuses it, on Dask as locally."""
    from tracekit.errors import StepError

    with pytest.raises(StepError) as local:
        shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2", step_pattern="no-such-step")
    with pytest.raises(StepError) as distributed:
        shortfall_paths(TRACES / "cpu-tp1", TRACES / "cpu-tp2", dask, step_pattern="no-such-step")
    assert str(distributed.value) == str(local.value)
    assert str(local.value).startswith("baseline: ")


def test_the_identifiability_check_runs_one_task_per_rank_and_equals_the_serial_one(dask: Engine) -> None:
    """h200-tp2-straggler's cost is solved (no calibration) and not identified: the plan's check
    runs as one `identify` task per rank, spread over the workers, then (the ends spread) ONE
    `identify_between` task, `refine_splits` over every rank's interval (its budget of midpoints is
    shared by the intervals); its Correction, and the cost intervals the what-if reads, are the
    ones `correct_run` computes rank after rank in this process on the same RunParts
    (docs/METHOD.md section Noise and the profiler correction)."""
    from tracekit.analyse.attribution.correction import correct_run
    from tracekit.analyse.plans import attribution_plan, correction_target
    from tracekit.engine.dask_engine import DaskExecutor
    from tracekit.engine.executor import Job

    job = Job((TRACES / "h200-tp2-straggler",), (attribution_plan(label="sharded", correct="applied"),))
    (res,), _ = DaskExecutor(dask).run([job])
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
