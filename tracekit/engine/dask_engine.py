"""The Dask engine: per rank file a task, per run a task, summaries back to the client (issue 19).

Two stages, both as Dask tasks (`retries`: a task that fails, or whose worker is lost, runs again;
every task is a pure function of its inputs and writes only its own file, so a retry changes
nothing):

1. `read_rank_file`, one per trace file of every run: read it (through the Parquet cache), classify
   its events (`tracekit.classify.classify`, row by row) and write the classified table to
   `<work_dir>/<run>-<file>.parquet`. A worker holds one rank file at a time; the task returns
   only a `RankPart` (the file's ranks, reader metadata, data quality, row count).
2. `analyse_run`, one per run: load that run's Parquet files, put them together exactly as
   `tracekit.read.read_run` does (ranks numbered for files that name none, Nsight sessions aligned,
   ranks in order, categories unioned in order of first appearance) and run the unchanged
   analyses: `breakdown` and/or `attribute_run` (step windows, the partition, collective matching
   across ranks, the critical path). Only their results come back: the per-(rank, step)
   partition, per-collective rows, per-token parts, data quality. The client then runs the same
   downstream code as the local engine (`shortfall_from_parts`, `to_json`), so the JSON is the same
   to the byte.

Stage 2 holds one run's classified table (columnar, categorical names: a fraction of the rank
files' size) on one worker; the client holds summaries only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tracekit.engine import Engine, EngineError
from tracekit.model.events import DataQuality, Run

if TYPE_CHECKING:
    from tracekit.analyse.breakdown import Breakdown
    from tracekit.analyse.shortfall import RunParts

__all__ = ["RankPart", "RunJob", "RunResult", "analyse", "analyse_run", "read_rank_file"]


@dataclass
class RankPart:
    """What stage 1 returns for one trace file (its events stay in `parquet`)."""

    path: str  # the trace file
    parquet: str  # its classified events
    sources: dict[int, str]
    rank_info: dict[int, dict[str, Any]]
    data_quality: DataQuality
    n_events: int
    file_bytes: int
    seconds: float = 0.0  # wall time of the task (read + classify + write)
    peak_rss_bytes: int = 0  # the worker process's peak resident memory so far


@dataclass
class RunJob:
    """One run to analyse: its paths, and which analyses with which keyword arguments."""

    paths: Sequence[str | os.PathLike[str]]
    rank: int | None = None  # read a single trace file as this rank
    cache: bool = True
    breakdown: dict[str, Any] | None = None  # kwargs of tracekit.analyse.breakdown.breakdown
    attribute: dict[str, Any] | None = None  # kwargs of tracekit.analyse.shortfall.attribute_run


@dataclass
class RunResult:
    """What stage 2 returns for one run."""

    manifest: dict[str, Any] | None
    breakdown: Breakdown | None = None
    parts: RunParts | None = None
    n_events: int = 0
    ranks: list[int] = field(default_factory=list)
    sources: dict[int, str] = field(default_factory=dict)  # rank -> its file, as the run has it
    seconds: float = 0.0  # wall time of the task (load + analyses)
    peak_rss_bytes: int = 0  # the worker process's peak resident memory so far
    files: list[RankPart] = field(default_factory=list)  # stage 1's returns (no events)


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise EngineError(
            "--engine dask needs Dask: pip install 'tracekit[dask]' (or pip install 'dask[distributed]')"
        ) from None
    return distributed


# ------------------------------------------------------------------------------------------
# the tasks (run on workers)


def client_settings() -> dict[str, str]:
    """The client's TRACEKIT_* environment (reading limits --max-bytes / --max-events, the cache
    folder, TRACEKIT_NO_CACHE): the CLI sets them there, and a remote worker would not see them."""
    return {k: v for k, v in os.environ.items() if k.startswith("TRACEKIT_")}


@contextlib.contextmanager
def _settings(env: dict[str, str]) -> Iterator[None]:
    """The client's TRACEKIT_* settings in this worker for the task's duration (the worker's own
    TRACEKIT_* variables are set aside meanwhile)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("TRACEKIT_")}
    for k in before:
        del os.environ[k]
    os.environ.update(env)
    try:
        yield
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(before)


def read_rank_file(
    path: str, parquet: str, rank: int | None, cache: bool, env: dict[str, str] | None = None
) -> RankPart:
    """Stage 1: read one trace file, classify its events, write them to `parquet`. `env`: the
    client's TRACEKIT_* settings (`client_settings`), in force while the file is read."""
    from tracekit.classify import classify
    from tracekit.read import read_file

    t0 = time.perf_counter()
    with _settings(env if env is not None else client_settings()):
        run = read_file(path, rank=rank, cache=cache)
    events = classify(run.events)
    tmp = parquet + ".tmp"
    Path(parquet).parent.mkdir(parents=True, exist_ok=True)
    events.to_parquet(tmp, index=False)
    os.replace(tmp, parquet)  # a retried task never leaves half a file behind
    return RankPart(
        path=path,
        parquet=parquet,
        sources=dict(run.sources),
        rank_info=dict(run.rank_info),
        data_quality=run.data_quality,
        n_events=len(events),
        file_bytes=os.path.getsize(path),
        seconds=time.perf_counter() - t0,
        peak_rss_bytes=_peak_rss(),
    )


def _concat_classified(runs: Sequence[Run]) -> pd.DataFrame:
    """The classified tables of several files as one, in `concat_runs`' order (by lowest rank),
    every column kept (categoricals unioned in order of first appearance)."""
    from tracekit.read import _union_categoricals

    if len(runs) == 1:
        return runs[0].events
    order = sorted(range(len(runs)), key=lambda i: min(runs[i].sources) if runs[i].sources else 0)
    frames = [runs[i].events for i in order]
    cols: dict[str, Any] = {}
    for col in frames[0].columns:
        if isinstance(frames[0][col].dtype, pd.CategoricalDtype):
            cols[col] = pd.Series(_union_categoricals([f[col] for f in frames]), copy=False)
        else:
            cols[col] = np.concatenate([f[col].to_numpy() for f in frames])
    return pd.DataFrame(cols, columns=list(frames[0].columns), copy=False)


def load_run(
    parts: Sequence[RankPart], manifest: dict[str, Any] | None, paths: Sequence[str | os.PathLike[str]]
) -> Run:
    """The run of stage 1's files, as `read_run(paths)` + `classify` would give it: the same steps
    after the files are read (`read_run`'s tail, mirrored here; tests/test_engine_dask.py fails
    when the two drift apart)."""
    from tracekit.read import _align_nsys_sessions, _note_run_problems, _number_default_ranks, concat_runs

    missing = [p.parquet for p in parts if not os.path.isfile(p.parquet)]
    if missing:
        raise EngineError(
            f"{missing[0]}: a rank file's Parquet output is not visible on this worker "
            f"({len(missing)} of {len(parts)} missing): give --work-dir a folder every Dask worker sees"
        )
    runs = [
        Run(
            events=pd.read_parquet(p.parquet),
            sources=dict(p.sources),
            rank_info=dict(p.rank_info),
            data_quality=DataQuality().merge(p.data_quality),
        )
        for p in parts
    ]
    runs = _number_default_ranks(runs)
    runs = _align_nsys_sessions(runs)
    # sources, rank info, data quality and the duplicate-rank check from concat_runs itself, on
    # empty tables; the events (with their class columns) concatenated in the same order
    from tracekit.model.events import COLUMNS

    meta = concat_runs(
        [Run(events=r.events.iloc[:0][list(COLUMNS)], sources=r.sources, rank_info=r.rank_info,
             data_quality=r.data_quality) for r in runs]
    )  # fmt: skip
    run = Run(
        events=_concat_classified(runs),
        sources=meta.sources,
        rank_info=meta.rank_info,
        data_quality=meta.data_quality,
        manifest=manifest,
    )
    _note_run_problems(run, paths)
    return run


def analyse_run(parts: list[RankPart], job: RunJob, manifest: dict[str, Any] | None) -> RunResult:
    """Stage 2: one run's analyses on its classified Parquet files."""
    t0 = time.perf_counter()
    run = load_run(parts, manifest, job.paths)
    out = RunResult(
        manifest=manifest,
        n_events=len(run.events),
        ranks=list(run.ranks),
        sources=dict(run.sources),
        files=list(parts),
    )
    if job.breakdown is not None:
        from tracekit.analyse.breakdown import breakdown

        out.breakdown = breakdown(run, **job.breakdown)
    if job.attribute is not None:
        from tracekit.analyse.shortfall import attribute_run

        out.parts = attribute_run(run, **job.attribute)
    out.seconds = time.perf_counter() - t0
    out.peak_rss_bytes = _peak_rss()
    return out


def metadata_run(result: RunResult) -> Run:
    """A Run without events (its sources, ranks and manifest), for checks on run metadata such
    as `tracekit.analyse.shortfall.check_pair`."""
    from tracekit.model.events import empty_events

    return Run(events=empty_events(), sources=dict(result.sources), manifest=result.manifest)


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


# ------------------------------------------------------------------------------------------
# the client side


@contextlib.contextmanager
def open_client(engine: Engine) -> Iterator[Any]:
    """A dask.distributed Client: on `engine.scheduler`, else on a new LocalCluster."""
    distributed = _import_distributed()
    if engine.scheduler:
        try:
            client = distributed.Client(engine.scheduler, timeout="30s")
        except (OSError, TimeoutError) as exc:
            raise EngineError(f"cannot reach the Dask scheduler at {engine.scheduler}: {exc}") from None
        with client:
            yield client
        return
    n = engine.workers or os.cpu_count() or 1
    cluster = distributed.LocalCluster(
        n_workers=n,
        threads_per_worker=engine.threads_per_worker,
        processes=engine.processes,
        dashboard_address=":0",
        silence_logs=40,  # logging.ERROR: no worker chatter on the terminal
    )
    with cluster, distributed.Client(cluster) as client:
        yield client


def _file_key(job_index: int, path: Path) -> str:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return f"run{job_index}-{path.name.replace('.', '_')}-{digest}"


def analyse(engine: Engine, jobs: Sequence[RunJob], client: Any = None) -> list[RunResult]:
    """Run `jobs` on the Dask engine; one RunResult per job, in order. `client`: an open
    dask.distributed Client to use (else one is opened from `engine`)."""
    from tracekit.errors import RankError
    from tracekit.read import find_trace_files

    _import_distributed()
    expanded = []
    for job in jobs:
        files, manifest = find_trace_files(job.paths)  # on the client: paths are checked before any task
        if job.rank is not None and len(files) > 1:
            raise RankError(f"--rank applies to one trace file, but {len(files)} were given")
        expanded.append((files, manifest))

    # task keys are global to the scheduler and --work-dir may be shared: one token per call keeps
    # two analyses on one cluster (two users, two runs) from taking each other's tasks or files
    token = uuid.uuid4().hex[:12]
    root = Path(engine.work_dir) if engine.work_dir else Path(tempfile.mkdtemp(prefix="tracekit-dask-"))
    work = root / f"tracekit-{token}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        if client is not None:
            return _run(client, engine, jobs, expanded, work, token)
        with open_client(engine) as own:
            return _run(own, engine, jobs, expanded, work, token)
    finally:
        shutil.rmtree(work if engine.work_dir else root, ignore_errors=True)


def _run(
    client: Any,
    engine: Engine,
    jobs: Sequence[RunJob],
    expanded: list[tuple[list[Path], dict[str, Any] | None]],
    work: Path,
    token: str,
) -> list[RunResult]:
    distributed = _import_distributed()
    settings = client_settings()
    read_futures: list[list[Any]] = []
    sizes: dict[Any, int] = {}
    for j, (job, (files, _manifest)) in enumerate(zip(jobs, expanded, strict=True)):
        futs = []
        for f in files:
            fut = client.submit(
                read_rank_file,
                str(f),
                str(work / (_file_key(j, f) + ".parquet")),
                job.rank,
                job.cache,
                settings,
                key=f"tracekit-read-{_file_key(j, f)}-{token}",
                retries=engine.retries,
                pure=False,
            )
            sizes[fut.key] = f.stat().st_size
            futs.append(fut)
        read_futures.append(futs)
    run_futures = [
        client.submit(
            analyse_run,
            futs,
            job,
            manifest,
            key=f"tracekit-analyse-run{j}-{token}",
            retries=engine.retries,
            pure=False,
        )
        for j, (job, futs, (_files, manifest)) in enumerate(zip(jobs, read_futures, expanded, strict=True))
    ]
    if engine.progress:
        _show_progress(distributed, [f for futs in read_futures for f in futs], sizes, run_futures)
    try:
        # a bad rank file is reported as the local engine reports it: the first failing file in
        # file order, not whichever worker failed first
        all_reads = [f for futs in read_futures for f in futs]
        distributed.wait(all_reads)
        for fut in all_reads:
            if fut.status == "error":
                raise fut.exception()
        results: list[RunResult] = client.gather(run_futures)
    finally:
        for fut in [*run_futures, *(f for futs in read_futures for f in futs)]:
            fut.release()
    return results


def _show_progress(distributed: Any, reads: list[Any], sizes: dict[Any, int], runs: list[Any]) -> None:
    """A rich bar on stderr: bytes of rank files read and classified on all workers, then the
    runs' analyses. Errors are left for `gather` to raise."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn, TransferSpeedColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=not sys.stderr.isatty(),
    )
    with bar:
        task = bar.add_task(f"dask: reading {len(reads)} rank file(s)", total=sum(sizes.values()))
        for fut in distributed.as_completed(reads):
            bar.advance(task, sizes.get(fut.key, 0))
        task2 = bar.add_task(f"dask: analysing {len(runs)} run(s)", total=len(runs))
        for _fut in distributed.as_completed(runs):
            bar.advance(task2, 1)
