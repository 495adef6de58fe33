"""Shared test fixtures.

`shared_traces` is the path of the third-party traces in ../shared/traces (relative to the repo
root): only the tests of other projects' formats and files use it, and they are skipped with a
reason when that folder is absent (a clone). A test that needs "some real trace" uses the
project's own committed traces/ instead: `real_kineto_doc()` (one step of a real two-H200 rank
file) and `real_nsys_sqlite` (a real nsys export).
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

#: one intra-op thread for torch in the test processes and what they start (CLI subprocesses, probe
#: ranks; a capture's ranks set their own, tracekit.capture.config.CPU_THREADS_PER_RANK): the tests'
#: tensors are tiny, and on the 2-core VM a second thread only spins (tests/test_decoder_impl.py's
#: CPU seconds about halve). Set before anything imports torch; a value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
#: $TRACEKIT_SHARED_TRACES moves it (a folder that does not exist: the suite as a clone without ../shared runs it)
SHARED_TRACES = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or REPO.parent / "shared" / "traces")
#: a real Kineto rank file of the project's own (traces/README.md): rank 0 of TP=2 on two H200s,
#: profiler mode full (CPU ops with shapes, kernels, NCCL, cuda_sync, distributedInfo, flows)
REAL_KINETO = REPO / "traces" / "h200-tp2-full" / "rank-0.pt.trace.json.gz"
#: a real Nsight Systems export of the project's own (TP=1 on one H200, gzipped SQLite)
REAL_NSYS_GZ = REPO / "traces" / "h200-tp1-nsys" / "nsys.sqlite.gz"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """Path of ../shared/traces; skips the test when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"{NO_SHARED}: {SHARED_TRACES} is absent")
    return SHARED_TRACES


#: the start of the skip reason of every test that needs ../shared/traces
NO_SHARED = "third-party traces (../shared/traces) not here"


def _skip_kind(reason: str) -> str:
    """A skip reason folded into its kind for the one summary line."""
    if reason.startswith(NO_SHARED) or str(SHARED_TRACES) in reason:
        return "third-party traces not here (../shared)"
    if "gpu" in reason.lower():  # "needs a CUDA GPU", "needs 2 CUDA GPUs", "... GPUs visible"
        return "no CUDA GPU"
    return reason


#: the test files that take longest, heaviest first: the seconds each took (setup, call and teardown
#: of its tests, from the junit XML) in one run of the README's pytest command (-n auto: 2 workers)
#: in a fresh clone without ../shared on the 2-core VM with nothing else running, 2026-12-03 10:21
#: UTC (main 991f406: 2186 passed, 54 skipped in 3 min 57 s); files under 2.5 s left out
#: (`scripts/xdist_tail.py` replays a junit XML to show the idle tail of an order). A file that first
#: asks for a session capture (tests/session_captures.py) carries its cost.
#: Only the order of the files comes from it (no test depends on it): `--dist loadfile` sends whole
#: files to the workers in the order of the collection, so the long files go first and the many short
#: ones fill in behind them (longest processing time first: the last file to end is a short one). A
#: file not listed comes after these, in the order pytest collects it.
HEAVY_FILES: dict[str, float] = {
    "test_reliability.py": 35,
    "test_capture.py": 24,
    "test_reliability_faults.py": 23,
    "test_whatif.py": 19,
    "test_engine_dask.py": 19,
    "test_coordination_truth.py": 19,
    "test_multi_gpu_h200x2.py": 15,
    "test_engine_commands.py": 14,
    "test_documents_writers.py": 13,
    "test_groundtruth.py": 13,
    "test_study.py": 13,
    "test_clocks_steps.py": 12,
    "test_rank_forward.py": 11,
    "test_report.py": 10,
    "test_engine_dask_per_rank.py": 10,
    "test_capture_teardown.py": 10,
    "test_noise.py": 10,
    "test_export.py": 10,
    "test_probe_sweep.py": 9,
    "test_any_trace.py": 9,
    "test_capture_starter.py": 8,
    "test_fuzz.py": 8,
    "test_read_run.py": 8,
    "test_diff.py": 7,
    "test_serving.py": 7,
    "test_forward.py": 6,
    "test_kernel_scaling.py": 6,
    "test_first_hour.py": 5,
    "test_browser.py": 5,
    "test_shortfall.py": 5,
    "test_notebook.py": 5,
    "test_pins.py": 5,
    "test_graph.py": 5,
    "test_collective_checks.py": 4,
    "test_decoder_impl.py": 4,
    "test_groundtruth_sim.py": 3,
    "test_link_verdict.py": 3,
    "test_api.py": 3,
    "test_decompose.py": 3,
    "test_whatif_knobs_issue26.py": 3,
    "test_read_nsys.py": 3,
}


def pytest_configure(config: Any) -> None:
    # pytest-xdist puts the files with the most tests first (--loadscope-reorder, its default), which
    # leaves a long file of few tests (a capture fixture) for the end: keep the order set below
    if getattr(config.option, "loadscopereorder", None) is not None:
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    """The heaviest files first (HEAVY_FILES), every file's tests in their own order (a stable
    sort); the same order in every xdist worker, as xdist requires."""
    rank = {name: i for i, name in enumerate(sorted(HEAVY_FILES, key=lambda n: -HEAVY_FILES[n]))}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::", 1)[0], i)

    def key(item: Any) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        return (rank.get(path.removeprefix("tests/"), len(rank)), first[path])

    items.sort(key=key)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """One line: how many tests skipped, and why, by kind (a clone without ../shared skips only the
    tests of third-party formats; a machine without GPUs the GPU tests)."""
    from collections import Counter

    kinds: Counter[str] = Counter()
    for rep in terminalreporter.stats.get("skipped", []):
        lr = rep.longrepr
        reason = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
        kinds[_skip_kind(str(reason).removeprefix("Skipped: "))] += 1
    if kinds:
        parts = "; ".join(f"{n} {k}" for k, n in kinds.most_common())
        terminalreporter.write_line(f"skipped {sum(kinds.values())}: {parts}")


def shared_params(values: list[Any], ids: list[str] | None = None, *, tuples: bool = False) -> list[Any]:
    """Parameters of a test over files under ../shared/traces: every value when the folder is here;
    in a clone without it, one skipped placeholder (one skip for the test, not one per file).
    `tuples`: each value is the tuple of several arguments."""
    if SHARED_TRACES.is_dir():
        return [
            pytest.param(*(v if tuples else (v,)), id=None if ids is None else ids[i])
            for i, v in enumerate(values)
        ]
    first = values[0]
    return [
        pytest.param(
            *(first if tuples else (first,)),
            id="no-shared",
            marks=pytest.mark.skip(reason=f"{NO_SHARED}: {SHARED_TRACES} is absent ({len(values)} files)"),
        )
    ]


def shared_trace(shared_traces: Path, rel: str) -> Path:
    """One file under ../shared/traces; skips when it is absent."""
    p = shared_traces / rel
    if not p.exists():
        pytest.skip(f"real trace {rel} not found under {shared_traces}")
    return p


@pytest.fixture(scope="session")
def gloo_truth():  # -> tests.gloo_truth.TruthRuns
    """The committed CPU ground-truth captures (tp1, a, b, inj: tests/gloo_truth.py) shared by the
    ground-truth, diff and noise tests."""
    from gloo_truth import truth_runs

    return truth_runs()


@pytest.fixture(scope="session")
def session_captures(tmp_path_factory: pytest.TempPathFactory):  # -> tests.session_captures.SessionCaptures
    """CPU captures taken once per session, whichever files and workers ask (tests/session_captures.py)."""
    pytest.importorskip("torch")
    from session_captures import SessionCaptures

    base = tmp_path_factory.getbasetemp()
    # -n auto: a folder of the session's that every worker sees, beside the workers' own
    return SessionCaptures(
        (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "session-captures"
    )


@functools.lru_cache(maxsize=2)
def _real_kineto_text(rank: int = 0) -> str:
    """Rank `rank` of REAL_KINETO's run cut to its second profiler step (the first is the warm-up):
    the metadata, and every event that starts between ProfilerStep#2's start and ProfilerStep#3's
    (the GPU work the step launched runs up to there), as JSON text. About 5,000 events: small
    enough to damage and re-read in every reliability case."""
    with gzip.open(REAL_KINETO.with_name(f"rank-{rank}.pt.trace.json.gz"), "rt") as f:
        doc = json.load(f)
    starts = sorted(
        float(e["ts"]) for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    t0, t1 = starts[1], starts[2]
    doc["traceEvents"] = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "M" or (isinstance(e.get("ts"), (int, float)) and t0 <= float(e["ts"]) < t1)
    ]
    return json.dumps(doc)


@functools.lru_cache(maxsize=2)
def _real_kineto_gz(rank: int) -> bytes:
    """`_real_kineto_text(rank)` gzipped, once per test process (gzip -9 of its 1.5 MB took ~0.3 s
    a rank, and test_read_run alone writes the run ten times)."""
    return gzip.compress(_real_kineto_text(rank).encode())


def write_real_tp2_run(folder: Path, name: str = "rank-{r}.json.gz") -> Path:
    """Both ranks of REAL_KINETO's TP=2 run, one step each (`_real_kineto_text`), gzipped into
    `folder` (created) as `name` with {r} the rank; no manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        (folder / name.format(r=r)).write_bytes(_real_kineto_gz(r))
    return folder


def real_kineto_doc() -> dict[str, Any]:
    """A fresh copy of one real step of REAL_KINETO (`_real_kineto_text`), to damage in a test."""
    doc: dict[str, Any] = json.loads(_real_kineto_text())
    return doc


@pytest.fixture(scope="session")
def real_kineto_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`real_kineto_doc()` written as `rank-0.pt.trace.json.gz` (a session-wide file: do not edit)."""
    p = tmp_path_factory.mktemp("real-kineto") / "rank-0.pt.trace.json.gz"
    with gzip.open(p, "wt") as f:
        f.write(_real_kineto_text())
    return p


@functools.lru_cache(maxsize=2)
def real_nsys_path(kernels: int = 1000) -> Path:
    """REAL_NSYS_GZ inflated to a plain `.sqlite` and cut to its first `kernels` kernels (1,000: about
    a tenth of the export): every row of a timed table (one with a `start` column) that starts
    after that kernel is deleted, then the file is vacuumed. One file per test process and cut, in
    a temporary folder removed at exit: copy it before editing."""
    import atexit
    import shutil
    import sqlite3
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="tracekit-real-nsys-"))
    atexit.register(shutil.rmtree, folder, True)
    p = folder / "nsys.sqlite"
    with gzip.open(REAL_NSYS_GZ, "rb") as f:
        p.write_bytes(f.read())
    con = sqlite3.connect(p)
    try:
        (cut,) = con.execute(
            "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1 OFFSET ?", (kernels - 1,)
        ).fetchone()
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for t in tables:
            if "start" in {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}:
                con.execute(f'DELETE FROM "{t}" WHERE start > ?', (cut,))
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()
    return p


@pytest.fixture(scope="session")
def real_nsys_sqlite() -> Path:
    """`real_nsys_path()`, a session-wide file: copy it before editing."""
    return real_nsys_path()


@functools.lru_cache(maxsize=1)
def real_kineto_excerpt_text(n_events: int = 1200) -> str:
    """`_real_kineto_text()` cut further, for the fuzzer's thousands of cases: the metadata and the
    first `n_events` other events by start time (a real excerpt: kernels, runtime calls, flows,
    CPU ops and the step range all begin inside it)."""
    doc = json.loads(_real_kineto_text())
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    rest = sorted((e for e in doc["traceEvents"] if e.get("ph") != "M"), key=lambda e: float(e["ts"]))
    doc["traceEvents"] = meta + rest[:n_events]
    return json.dumps(doc)


@pytest.fixture(scope="session")
def cluster() -> Any:
    """A two-worker in-process Dask LocalCluster, one per test process (each xdist worker), shared
    by the Dask engine's test files and tests/test_serving.py: a cluster's start and stop cost
    ~0.5 CPU-s; no test depends on a fresh one (task keys are per call, the workers hold no data
    between calls, and what a test patches in tracekit.engine it undoes before the next)."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0", silence_logs=40
    ) as c:
        yield c


@pytest.fixture(scope="session")
def dask(cluster: Any) -> Any:  # -> tracekit.engine.Engine
    """The dask engine on the session's LocalCluster."""
    from tracekit.engine import Engine

    return Engine(kind="dask", scheduler=cluster.scheduler_address)


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic many-rank run of the Dask engine's tests (tests/engine_refs.py: `N_SYN` ranks
    of traces/cpu-tp2, clocks jittered, events shuffled), made once per test process."""
    from engine_refs import make_synthetic

    return make_synthetic(tmp_path_factory.mktemp("syn"))
