"""The Dask engine's tasks, run on the workers (`tracekit.engine.dask_engine` submits them): a
rank file read, classified and hashed and its table held there (`read_rank_file`), put in the
run's frame (`prepare_file`), a plan's rank stage on a file's ranks (`rank_stage`), a Reduce over
the ranks' kept values or what an earlier Reduce kept (`reduce_task`), a Fan's call
(`fan_task`), and the small parts the client gathers; on the client, the run and each file's
place in it from the read tasks' metadata alone (`metadata_of`)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.plans import (
    Fan,
    RankInput,
    RankStage,
    Reduce,
    kept,
    run_rank_stage,
    run_reduce,
    split_ranks,
)
from tracekit.classify import classify
from tracekit.engine.jobs import TaskRecord
from tracekit.model.digest import sha256_of
from tracekit.model.events import DataQuality, Run, empty_events
from tracekit.read import assemble_run, gpu_stream_counts, read_file
from tracekit.read.manifests import ManifestRead

__all__ = [
    "FileMeta",
    "FileState",
    "FileView",
    "RankFile",
    "client_settings",
    "fan_task",
    "file_meta",
    "kept_values",
    "metadata_of",
    "prepare_file",
    "rank_stage",
    "read_rank_file",
    "reduce_results",
    "reduce_task",
    "stage_results",
]


@dataclass
class FileMeta:
    """What the client learns of one rank file (no events)."""

    path: str
    sources: dict[int, str]
    rank_info: dict[int, dict[str, object]]
    data_quality: DataQuality
    n_events: int
    file_bytes: int
    sha256: str
    stream_counts: tuple[int, int, int, int] = (0, 0, 0, 0)
    seconds: float = 0.0
    peak_rss_bytes: int = 0


@dataclass
class RankFile:
    """A read task's result, held on its worker: the file's classified events and metadata."""

    events: pd.DataFrame
    meta: FileMeta


@dataclass
class FileView:
    """How the run sees one file: ranks renumbered, Nsight clock shift, the run-table label of its
    first row."""

    rank_map: dict[int, int]
    shift_ns: int
    event_offset: int


@dataclass
class FileState:
    """A file's ranks on its worker, after a stage: their inputs (with what stages kept) and the
    stage's small per-rank results."""

    ranks: dict[int, RankInput]
    results: dict[int, Any] = field(default_factory=dict)
    record: TaskRecord | None = None


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


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def _worker() -> str:
    """The address of the Dask worker running this task ("" outside one)."""
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:
        return ""


def read_rank_file(path: str, rank: int | None, cache: bool, env: dict[str, str] | None = None) -> RankFile:
    """Read one trace file, classify its events and hash it; `env`: the client's TRACEKIT_*
    settings (`client_settings`), in force while the file is read."""
    t0 = time.perf_counter()
    with _settings(env if env is not None else client_settings()):
        run = read_file(path, rank=rank, cache=cache)
    events = classify(run.events)
    meta = FileMeta(
        path=path,
        sources=dict(run.sources),
        rank_info=dict(run.rank_info),
        data_quality=run.data_quality,
        n_events=len(events),
        file_bytes=os.path.getsize(path),
        sha256=sha256_of(path),
        stream_counts=tuple(gpu_stream_counts(events)),  # type: ignore[arg-type]
    )
    meta.seconds = time.perf_counter() - t0
    meta.peak_rss_bytes = _peak_rss()
    return RankFile(events, meta)


def file_meta(rf: RankFile) -> FileMeta:
    return rf.meta


def prepare_file(rf: RankFile, view: FileView) -> FileState:
    """The file's events as the run's table has them (ranks renumbered, clock shifted, row labels
    from `view.event_offset`), split per rank."""
    ev = rf.events.copy(deep=False)
    if view.rank_map and any(k != v for k, v in view.rank_map.items()):
        ev["rank"] = ev["rank"].map(view.rank_map).astype(ev["rank"].dtype)
    if view.shift_ns:
        ev["start_ns"] = ev["start_ns"].to_numpy(np.int64) + view.shift_ns
        ev["end_ns"] = ev["end_ns"].to_numpy(np.int64) + view.shift_ns
    ev.index = pd.RangeIndex(view.event_offset, view.event_offset + len(ev))
    return FileState(split_ranks(Run(events=ev)))


def rank_stage(state: FileState, stage: RankStage, arg: Any, only: int | None, name: str) -> FileState:
    """One rank stage of a plan on the file's ranks (those the plan reads)."""
    t0 = time.perf_counter()
    ranks = state.ranks if only is None else {r: v for r, v in state.ranks.items() if r == only}
    results = run_rank_stage(stage, ranks, arg)
    rec = TaskRecord(name, "", sorted(results), time.perf_counter() - t0, _peak_rss(), _worker())
    return FileState(state.ranks, results, rec)


def stage_results(state: FileState) -> tuple[dict[int, Any], TaskRecord | None]:
    """The small part of a stage (what the client gathers)."""
    return state.results, state.record


def kept_values(state: FileState, key: str, only: int | None) -> dict[int, Any]:
    ranks = state.ranks if only is None else {r: v for r, v in state.ranks.items() if r == only}
    return kept(ranks, key)


def reduce_task(stage: Reduce, arg: Any, *parts: Any) -> tuple[Any, TaskRecord, Any]:
    """A plan's Reduce on one worker, over every file's kept values (rank order), or, with
    `stage.on_kept`, over what an earlier Reduce kept (its task's result, the one part):
    (the result for the client, the task's record, what the Reduce keeps or None)."""
    t0 = time.perf_counter()
    reduced: dict[str, Any] = {}
    values: dict[int, Any] = {}
    if stage.on_kept:
        reduced[stage.key] = parts[0][2]
    else:
        for p in parts:
            values.update(p)
    out = run_reduce(stage, reduced, None if stage.on_kept else values, arg)
    rec = TaskRecord(stage.name, "", sorted(values), time.perf_counter() - t0, _peak_rss(), _worker())
    return out, rec, reduced.get(stage.keeps) if stage.keeps else None


def fan_task(stage: Fan, arg: Any, full: tuple[Any, TaskRecord, Any]) -> tuple[Any, TaskRecord]:
    """One call of a plan's Fan on what an earlier Reduce kept (`full`: that Reduce's task
    result, copied to this worker by Dask): (its result, the task's record)."""
    t0 = time.perf_counter()
    out = stage.fn(full[2], arg)
    return out, TaskRecord(stage.name, "", [], time.perf_counter() - t0, _peak_rss())


def reduce_results(full: tuple[Any, TaskRecord, Any]) -> tuple[Any, TaskRecord]:
    """The small part of a Reduce (what the client gathers; what it keeps stays on the worker)."""
    return full[0], full[1]


def metadata_of(
    metas: Sequence[FileMeta], manifest: ManifestRead | None, paths: Sequence[str | os.PathLike[str]]
) -> tuple[Run, list[FileView]]:
    """On the client, from the read tasks' metadata alone: the run without events but with the
    run-level notes (`assemble_run` with the files' counts and digests) and, per file, how the
    run sees it (ranks renumbered, Nsight shift, label of its first row in the run's table)."""
    tables = [
        Run(
            events=empty_events(),
            sources=dict(m.sources),
            rank_info=dict(m.rank_info),
            data_quality=DataQuality().merge(m.data_quality),
        )
        for m in metas
    ]
    counts = (
        sum(m.n_events for m in metas),
        sum(m.stream_counts[0] for m in metas),
        sum(m.stream_counts[1] for m in metas),
        sum(m.stream_counts[2] for m in metas),
    )
    run = assemble_run(tables, manifest, paths, counts=counts, digests={m.path: m.sha256 for m in metas})
    by_src: dict[str, list[int]] = {}
    for r, src in run.sources.items():
        by_src.setdefault(str(src), []).append(r)
    order: list[tuple[int, int, FileView]] = []
    for i, m in enumerate(metas):
        old = sorted(m.sources)
        new = sorted(by_src.get(str(m.sources[old[0]]), old)) if old else []
        rank_map = dict(zip(old, new, strict=True)) if len(old) == len(new) else {r: r for r in old}
        shift = next((_int(run.rank_info.get(r, {}).get("session_shift_ns")) for r in new), 0)
        order.append((min(new) if new else 0, i, FileView(rank_map, shift, 0)))
    views: list[FileView | None] = [None] * len(metas)
    offset = 0
    for _, i, view in sorted(order, key=lambda v: (v[0], v[1])):  # concat_runs' order
        view.event_offset = offset
        offset += metas[i].n_events
        views[i] = view
    return run, [v for v in views if v is not None]


def _int(x: object) -> int:
    """A reader's integer in rank_info (0 when it is not one)."""
    return x if isinstance(x, int) else 0
