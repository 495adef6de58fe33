"""The Dask engine: per rank file a task, per bucket of process groups a task, per run a task,
summaries back to the client (issue 19; docs/SCALE.md says what each stage needs).

Every task is a pure function of its inputs and writes only its own files (`retries`: a task that
fails, or whose worker is lost, runs again and changes nothing).

1. `read_rank_file`, one per trace file: read, classify, write the classified table and the
   file's collective rows (`select_collective_events` on the file alone), one Parquet file per
   bucket of process groups (`bucket_of`). Returns a `RankPart` (no events).
   On the client: `metadata_of` puts the runs' metadata together (`tracekit.read.assemble_run` on
   empty tables) and `check_pair` runs there, before any analysis, as in the local engine.
2a. `match_bucket`, one per bucket holding rows: reads that bucket's file of every rank file only
   and matches each of its groups (`tracekit.analyse.collectives.match_group`).
2 (breakdown). No run task: per rank file, `rank_step_summaries` (which step rules its ranks
   match), the client's `choose_step_rule`, then `rank_breakdowns` (its ranks' windows, partition,
   compute split, event figures); each reads that file's Parquet only (`load_rank_events`). The
   client assembles (`assemble_steps`, `assemble_breakdown`: the pieces the local `breakdown` runs).
2 (shortfall, report). No run task either: per rank file `rank_step_summaries` and `rank_windows`
   (client: `choose_step_rule`, `assemble_steps`), stage 2a's matched rows (client:
   `matched_collectives`: numbering, clocks, bytes, the instance table), per rank file
   `rank_attributions` (`shortfall.attribute_rank`: partition, host layers, exposed split with
   the rank's matched rows, kernels or not; and its layer unions clipped to each step's
   critical-path span, left on the worker), the client's `assemble_attribution`, then
   `walk_bucket` per range of steps (the critical path's walk, given every rank's clipped unions
   of those steps only) and the client's `finish_attribution`: the pieces the local
   `attribute_run` calls, in its order. The client runs the same tails (`shortfall_of_pair`,
   `to_json`): the JSON is the same. `analyse_run` / `load_run` (the whole run in one task) are
   kept for callers, not used by `analyse`.
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
import zlib
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
    level: str = "none"  # the file's own collective level (`select_collective_events`)
    buckets: dict[int, str] = field(default_factory=dict)  # bucket -> Parquet of its collective rows
    bucket_rows: dict[int, int] = field(default_factory=dict)  # bucket -> rows written
    groups: list[str] = field(default_factory=list)  # process groups of its collective rows
    stream_counts: tuple[int, int, int] = (0, 0, 0)  # `tracekit.read.gpu_stream_counts` of the file


@dataclass
class BucketInput:
    """One rank file's share of a bucket task: its rows' Parquet and how the run sees the file
    (ranks renumbered, Nsight clock shift, offset of its first row in the run's table)."""

    parquet: str
    rank_map: dict[int, int]
    shift_ns: int
    event_offset: int


@dataclass
class BucketResult:
    """What one bucket task returns: per process group of its bucket, the matched rows (or the
    MatchError), and what it received (for the tests: every row's group hashes to `bucket`)."""

    bucket: int
    groups: dict[str, tuple[pd.DataFrame | None, str, DataQuality, Exception | None]]
    received: list[tuple[str, int]]  # (Parquet file, rows) read by this task
    received_groups: list[str]
    seconds: float = 0.0
    peak_rss_bytes: int = 0


#: collective rows a bucket task needs (`match_group` and `matched_collectives`)
COLLECTIVE_COLUMNS = (
    "rank",
    "stream",
    "start_ns",
    "end_ns",
    "op",
    "group",
    "coll_pg_ranks",
    "coll_group_size",
    "coll_seq",
    "coll_in_bytes",
    "coll_out_bytes",
    "event_index",
)
#: collective levels, best first (`select_collective_events` takes the first the run has)
LEVELS = ("gpu_kernel", "gloo", "host_op", "none")


def bucket_of(group: str, n_buckets: int) -> int:
    """The bucket (hash partition) of a process group: stable across processes and hosts."""
    return zlib.crc32(group.encode()) % n_buckets


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
    buckets: list[BucketResult] = field(default_factory=list)  # stage 2a's returns
    pair_notes: list[tuple[str, str]] = field(default_factory=list)  # check_pair's, on the baseline
    rank_tasks: list[RankTask] = field(default_factory=list)  # stage 2's per-rank tasks (breakdown)
    attribute_tasks: list[RankTask] = field(default_factory=list)  # stage 2's per-rank tasks (shortfall)
    path_tasks: list[PathBucket] = field(default_factory=list)  # the critical path's step-bucket tasks
    top_kernels: dict[str, Any] | None = None  # tracekit.analyse.kernels.assemble_top_kernels (breakdown)


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


def _task(client: Any, engine: Engine, key: str, fn: Any, *args: Any) -> Any:
    """One engine task: named by `key` (stable, so a retry or a lost worker reruns the same task),
    retried `engine.retries` times, never shared with an equal call (`pure=False`: its output is a
    file on the work folder)."""
    return client.submit(fn, *args, key=key, retries=engine.retries, pure=False)


def _write_parquet(frame: pd.DataFrame, parquet: str) -> None:
    tmp = parquet + ".tmp"
    Path(parquet).parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, parquet)  # a retried task never leaves half a file behind


def read_rank_file(
    path: str,
    parquet: str,
    rank: int | None,
    cache: bool,
    env: dict[str, str] | None = None,
    n_buckets: int = 16,
) -> RankPart:
    """Stage 1: read one trace file, classify its events, write them to `parquet`, and its
    collective rows (`select_collective_events` on this file alone) to one Parquet file per
    bucket (`bucket_of` the row's process group), `<parquet stem>.coll-b<bucket>.parquet`.
    `env`: the client's TRACEKIT_* settings (`client_settings`), in force while the file is read."""
    from tracekit.analyse.collectives import _group_keys, select_collective_events
    from tracekit.classify import classify
    from tracekit.read import gpu_stream_counts, read_file

    t0 = time.perf_counter()
    with _settings(env if env is not None else client_settings()):
        run = read_file(path, rank=rank, cache=cache)
    events = classify(run.events)
    _write_parquet(events, parquet)
    stream_counts = gpu_stream_counts(events)
    sel, level = select_collective_events(events)
    sel["group"] = _group_keys(sel) if len(sel) else np.zeros(0, dtype=object)
    buckets: dict[int, str] = {}
    bucket_rows: dict[int, int] = {}
    if len(sel):
        sel = sel[list(COLLECTIVE_COLUMNS)]
        sel["group"] = sel["group"].astype(str)
        sel["op"] = sel["op"].astype(str)
        b_of = np.array([bucket_of(g, n_buckets) for g in sel["group"]], dtype=np.int64)
        for b in sorted(set(b_of.tolist())):
            out = parquet[: -len(".parquet")] + f".coll-b{b}.parquet"
            part = sel[b_of == b].reset_index(drop=True)
            _write_parquet(part, out)
            buckets[b], bucket_rows[b] = out, len(part)
    return RankPart(
        stream_counts=stream_counts,
        level=level,
        buckets=buckets,
        bucket_rows=bucket_rows,
        groups=sorted(set(sel["group"].tolist())) if len(sel) else [],
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


def _rank_tables(parts: Sequence[RankPart], events: bool = True) -> list[Run]:
    """Stage 1's files as per-file Runs: their classified tables (`events`), or empty tables."""
    from tracekit.model.events import empty_events

    if events:
        missing = [p.parquet for p in parts if not os.path.isfile(p.parquet)]
        if missing:
            raise EngineError(
                f"{missing[0]}: a rank file's Parquet output is not visible on this worker "
                f"({len(missing)} of {len(parts)} missing): give --work-dir a folder every Dask worker sees"
            )
    return [
        Run(
            events=pd.read_parquet(p.parquet) if events else empty_events(),
            sources=dict(p.sources),
            rank_info=dict(p.rank_info),
            data_quality=DataQuality().merge(p.data_quality),
        )
        for p in parts
    ]


def load_run(
    parts: Sequence[RankPart], manifest: dict[str, Any] | None, paths: Sequence[str | os.PathLike[str]]
) -> Run:
    """The run of stage 1's files, as `read_run(paths)` + `classify` would give it: the one
    assembler, `tracekit.read.assemble_run`."""
    from tracekit.read import assemble_run

    return assemble_run(_rank_tables(parts), manifest, paths)


def metadata_of(
    parts: Sequence[RankPart], manifest: dict[str, Any] | None, paths: Sequence[str | os.PathLike[str]]
) -> tuple[Run, list[BucketInput | None]]:
    """On the client, from stage 1's returns alone: the run without events (its ranks as
    assembled, sources, rank info, manifest) and, per file, how the run sees it (`BucketInput`
    without its Parquet path): ranks renumbered, Nsight shift, offset of its first row."""
    from tracekit.read import assemble_run

    meta = assemble_run(_rank_tables(parts, events=False), manifest, paths, notes=False)
    by_src: dict[str, list[int]] = {}
    for r, src in meta.sources.items():
        by_src.setdefault(str(src), []).append(r)
    views: list[tuple[int, int, BucketInput]] = []
    for i, p in enumerate(parts):
        old = sorted(p.sources)
        new = sorted(by_src.get(str(p.sources[old[0]]), old)) if old else []
        rank_map = dict(zip(old, new, strict=True)) if len(old) == len(new) else {r: r for r in old}
        shift = next((int(meta.rank_info.get(r, {}).get("session_shift_ns", 0)) for r in new), 0)
        views.append((min(new) if new else 0, i, BucketInput("", rank_map, shift, 0)))
    out: list[BucketInput | None] = [None] * len(parts)
    offset = 0
    for _, i, view in sorted(views, key=lambda v: (v[0], v[1])):  # concat_runs' order
        view.event_offset = offset
        offset += parts[i].n_events
        out[i] = view
    return meta, out


def match_bucket(
    bucket: int,
    inputs: Sequence[BucketInput],
    group_index: dict[str, int],
    run_ranks: list[int],
    world: int | None,
    level: str,
    allow_partial: bool,
    n_buckets: int,
) -> BucketResult:
    """Stage 2a: the process groups of one bucket matched across ranks. Reads only this bucket's
    Parquet file of every rank file (in the run's row order), puts each row in the run's frame
    (rank, clock, row index) and runs `match_group` per group; a group's MatchError is returned,
    for the run task to raise where the local engine would."""
    from tracekit.analyse.collectives import OrderCountError, match_group

    t0 = time.perf_counter()
    frames, received = [], []
    for inp in inputs:
        f = pd.read_parquet(inp.parquet)
        received.append((inp.parquet, len(f)))
        if inp.rank_map and any(k != v for k, v in inp.rank_map.items()):
            f["rank"] = f["rank"].map(inp.rank_map).astype(f["rank"].dtype)
        if inp.shift_ns:
            f["start_ns"] = f["start_ns"].to_numpy(np.int64) + inp.shift_ns
            f["end_ns"] = f["end_ns"].to_numpy(np.int64) + inp.shift_ns
        f["event_index"] = f["event_index"].to_numpy(np.int64) + inp.event_offset
        frames.append(f)
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLLECTIVE_COLUMNS))
    got = sorted(set(rows["group"].tolist()))
    stray = [g for g in got if bucket_of(g, n_buckets) != bucket]
    if stray:
        raise AssertionError(f"bucket {bucket} received rows of group(s) {stray} of other buckets")
    out: dict[str, tuple[pd.DataFrame | None, str, DataQuality, Exception | None]] = {}
    for group, g_rows in rows.groupby("group", sort=True):
        dq = DataQuality()
        try:
            matched, how = match_group(
                str(group), group_index[str(group)], g_rows, run_ranks, world, level, allow_partial, dq
            )
            out[str(group)] = (matched, how, dq, None)
        except OrderCountError as exc:  # the client re-matches it by step when it has the windows
            out[str(group)] = (g_rows.assign(group_index=group_index[str(group)]), "", dq, exc)
        except Exception as exc:  # noqa: BLE001 - raised by the run task, in the local engine's order
            out[str(group)] = (None, "", dq, exc)
    return BucketResult(
        bucket=bucket,
        groups=out,
        received=received,
        received_groups=got,
        seconds=time.perf_counter() - t0,
        peak_rss_bytes=_peak_rss(),
    )


def _matcher(buckets: Sequence[BucketResult], level: str) -> Any:
    """`attribute_run`'s matcher from stage 2a's results: the groups in order, the first
    MatchError raised, then `matched_collectives` (the run-wide tail) on the matched rows."""
    from tracekit.analyse.collectives import OrderCountError, matched_collectives, rematch_by_step

    def match(events: pd.DataFrame, *, ranks: list[int], **kw: Any) -> Any:
        kw.pop("allow_partial", None)
        dq = DataQuality()
        parts: list[pd.DataFrame] = []
        match_by: dict[str, str] = {}
        groups = {g: rec for b in buckets for g, rec in b.groups.items()}
        steps = kw.get("steps")
        for g in sorted(groups):
            matched, how, gdq, exc = groups[g]
            dq.merge(gdq)
            by_step = level == "gpu_kernel" and steps is not None and len(steps)
            if by_step and matched is not None and (how == "order" or isinstance(exc, OrderCountError)):
                # as match_collectives does with the windows: by order within each step
                # (the bucket tasks run before the windows exist)
                matched, how = rematch_by_step(g, matched.drop(columns=["seq"], errors="ignore"), steps)
                exc = None
            if exc is not None:
                raise exc
            assert matched is not None
            parts.append(matched)
            match_by[g] = how
        return matched_collectives(parts, match_by, level, dq, run_ranks=sorted(ranks), events=events, **kw)

    return match


@dataclass
class RankTask:
    """What a stage-2 per-rank task did (for the tests and the benchmark): the one Parquet file it
    read, the rows and ranks it held, its time and the worker's peak memory."""

    parquet: str
    rows: int
    ranks: list[int]
    seconds: float = 0.0
    peak_rss_bytes: int = 0


def load_rank_events(view: BucketInput, rank: int | None = None) -> pd.DataFrame:
    """One rank file's classified events as the run sees them (`view`: its Parquet file, ranks
    renumbered, Nsight clock shift), only `rank`'s rows when given. The only reader of a rank's
    events in stage 2's per-rank tasks."""
    if not os.path.isfile(view.parquet):
        raise EngineError(
            f"{view.parquet}: a rank file's Parquet output is not visible on this worker: give --work-dir a "
            "folder every Dask worker sees"
        )
    ev = pd.read_parquet(view.parquet)
    if view.rank_map and any(k != v for k, v in view.rank_map.items()):
        ev["rank"] = ev["rank"].map(view.rank_map).astype(ev["rank"].dtype)
    if view.shift_ns:
        ev["start_ns"] = ev["start_ns"].to_numpy(np.int64) + view.shift_ns
        ev["end_ns"] = ev["end_ns"].to_numpy(np.int64) + view.shift_ns
    if rank is not None:
        ev = ev[ev["rank"].to_numpy(np.int64) == rank].reset_index(drop=True)
    return ev


def _by_rank(ev: pd.DataFrame) -> list[tuple[int, pd.DataFrame]]:
    from tracekit.analyse.steps import rank_selectors

    return [(r, ev.iloc[sel]) for r, sel in sorted(rank_selectors(ev["rank"].to_numpy(np.int64)).items())]


def rank_step_summaries(
    view: BucketInput, pattern: str | None, rank: int | None = None
) -> tuple[dict[int, Any], RankTask]:
    """Stage 2, per rank file: each of its ranks' `rank_step_summary` (which step rules it matches;
    small), for the run's rule chosen on the client (`choose_step_rule`)."""
    from tracekit.analyse.steps import rank_step_summary

    t0 = time.perf_counter()
    ev = load_rank_events(view, rank)
    out = {r: rank_step_summary(e, pattern) for r, e in _by_rank(ev)}
    return out, RankTask(view.parquet, len(ev), sorted(out), time.perf_counter() - t0, _peak_rss())


@dataclass
class RankBreakdown:
    """What a stage-2 per-rank breakdown task returns for one rank (small): its step windows under
    the run's rule, its partition table (with the compute split; `step` is the window's order on
    the rank until the client numbers the run's steps) and its `RankEvents`."""

    windows: Any  # tracekit.analyse.steps.RankWindows
    table: pd.DataFrame
    dropped: int
    events: Any  # tracekit.analyse.breakdown.RankEvents
    kernels: Any = None  # tracekit.analyse.kernels.RankKernels (the report's top kernels)


def rank_breakdowns(
    view: BucketInput, choice: Any, skip_first: int, rank: int | None = None
) -> tuple[list[RankBreakdown], RankTask]:
    """Stage 2, per rank file: for each of its ranks, the step windows under the run's rule
    (`rank_step_windows`), the partition of those after the warm-up and the compute split
    (`rank_breakdown_table`), and its event figures (`rank_events`)."""
    from tracekit.analyse.breakdown import rank_breakdown_table, rank_events
    from tracekit.analyse.kernels import rank_kernel_sums
    from tracekit.analyse.steps import rank_step_windows

    t0 = time.perf_counter()
    ev = load_rank_events(view, rank)
    out = []
    for r, e in _by_rank(ev):
        win = rank_step_windows(e, choice)
        table, dropped = rank_breakdown_table(e, win.rows, skip_first)
        out.append(RankBreakdown(win, table, dropped, rank_events(e, r), rank_kernel_sums(e, win.rows, r)))
    task = RankTask(
        view.parquet, len(ev), [x.events.rank for x in out], time.perf_counter() - t0, _peak_rss()
    )
    return out, task


def run_metadata(
    parts: Sequence[RankPart], manifest: dict[str, Any] | None, paths: Sequence[str | os.PathLike[str]]
) -> Run:
    """The run without events but with the run-level notes `assemble_run` writes, from stage 1's
    counts (events, duplicated GPU operations, stream overlaps summed over the files)."""
    from tracekit.read import assemble_run

    counts = (
        sum(p.n_events for p in parts),
        sum(p.stream_counts[0] for p in parts),
        sum(p.stream_counts[1] for p in parts),
        sum(p.stream_counts[2] for p in parts),
    )
    return assemble_run(_rank_tables(parts, events=False), manifest, paths, counts=counts)


def _ordered_inputs(
    parts: list[RankPart], views: list[BucketInput | None], rank: int | None = None
) -> list[BucketInput]:
    """Each rank file's stage-2 input, in event order (only the files holding `rank`, if given)."""
    inputs = []
    for i in sorted(range(len(parts)), key=lambda i: views[i].event_offset):  # type: ignore[union-attr]
        v = views[i]
        assert v is not None
        if rank is not None and rank not in v.rank_map.values():
            continue
        inputs.append(BucketInput(parts[i].parquet, v.rank_map, v.shift_ns, v.event_offset))
    return inputs


def _gather_lists(client: Any, futs: list[Any], tasks: list[RankTask]) -> list[Any]:
    """Gather per-file tasks that return (a list of pieces, their RankTask): the pieces joined,
    each task's record appended to `tasks`."""
    out: list[Any] = []
    for got, task in client.gather(futs):
        out.extend(got)
        tasks.append(task)
    return out


def _gather_step_rule(client: Any, futs: list[Any], tasks: list[RankTask], pattern: str | None) -> Any:
    """The run's step rule from the per-file `rank_step_summaries` tasks (`choose_step_rule`)."""
    from tracekit.analyse.steps import choose_step_rule

    summaries: dict[int, Any] = {}
    for by_rank, task in client.gather(futs):
        summaries.update(by_rank)
        tasks.append(task)
    return choose_step_rule([summaries[r] for r in sorted(summaries)], pattern)


def _breakdown_per_rank(
    client: Any,
    engine: Engine,
    j: int,
    token: str,
    parts: list[RankPart],
    meta: Run,
    views: list[BucketInput | None],
    job: RunJob,
    futures: list[Any],
) -> RunResult:
    """Stage 2 of a breakdown: per-rank tasks (each reads one rank file's Parquet only), the run's
    step rule and the assembly on the client (`choose_step_rule`, `assemble_steps`,
    `assemble_breakdown`: the pieces the local engine's `breakdown` calls)."""
    from tracekit.analyse.breakdown import assemble_breakdown
    from tracekit.analyse.steps import assemble_steps
    from tracekit.errors import StepError

    t0 = time.perf_counter()
    kw = job.breakdown or {}
    pattern, skip_first, rank = kw.get("step_pattern"), int(kw.get("skip_first", 0) or 0), kw.get("rank")
    if skip_first < 0:
        raise StepError(f"skip_first must be >= 0, not {skip_first}")
    meta_full = run_metadata(parts, meta.manifest, job.paths)
    if rank is not None and rank not in meta_full.sources:
        have = ", ".join(str(r) for r in meta_full.ranks) or "none"
        raise StepError(f"rank {rank} is not in this run (ranks: {have})")
    inputs = _ordered_inputs(parts, views, rank)

    def submit(fn: Any, name: str, *args: Any) -> list[Any]:
        return [
            _task(
                client,
                engine,
                f"tracekit-{name}-run{j}-f{n}-{token}",
                fn,
                inp,
                *args,
                rank,
            )
            for n, inp in enumerate(inputs)
        ]

    sum_futs = submit(rank_step_summaries, "steprule", pattern)
    futures.extend(sum_futs)
    tasks: list[RankTask] = []
    choice = _gather_step_rule(client, sum_futs, tasks, pattern)
    bd_futs = submit(rank_breakdowns, "breakdown", choice, skip_first)
    futures.extend(bd_futs)
    pieces: list[RankBreakdown] = _gather_lists(client, bd_futs, tasks)
    pieces.sort(key=lambda x: x.events.rank)
    found = assemble_steps(choice, [x.windows for x in pieces])
    tables = []
    for x in pieces:  # the run's step numbers on each rank's kept windows
        final = found.steps.loc[found.steps["rank"] == x.events.rank, "step"].to_numpy(np.int64)
        tables.append(x.table.assign(step=final[len(final) - len(x.table) :]))
    table = (
        pd.concat(tables, ignore_index=True)
        if any(len(t) for t in tables)
        else pieces[0].table
        if pieces
        else None
    )
    if table is None:
        raise StepError("the trace holds no timed events: there is no window to break down")
    out = RunResult(
        manifest=meta.manifest,
        n_events=sum(p.n_events for p in parts),
        ranks=list(meta.ranks),
        sources=dict(meta.sources),
        files=list(parts),
        rank_tasks=tasks,
    )
    out.breakdown = assemble_breakdown(
        meta_full,
        found,
        table,
        [x.events for x in pieces],
        skip_first=skip_first,
        dropped=sum(x.dropped for x in pieces),
        rank=rank,
    )
    from tracekit.analyse.kernels import assemble_top_kernels

    out.top_kernels = assemble_top_kernels([x.kernels for x in pieces if x.kernels is not None], found.steps)
    out.seconds = time.perf_counter() - t0
    out.peak_rss_bytes = max((t.peak_rss_bytes for t in tasks), default=0)
    return out


def rank_windows(view: BucketInput, choice: Any) -> tuple[list[Any], RankTask]:
    """Stage 2 (shortfall), per rank file: each of its ranks' step windows under the run's rule
    (`rank_step_windows`; small), for the client's `assemble_steps`."""
    from tracekit.analyse.steps import rank_step_windows

    t0 = time.perf_counter()
    ev = load_rank_events(view)
    out = [rank_step_windows(e, choice) for _r, e in _by_rank(ev)]
    return out, RankTask(view.parquet, len(ev), [w.rank for w in out], time.perf_counter() - t0, _peak_rss())


def rank_attributions(
    view: BucketInput,
    windows: dict[int, pd.DataFrame],
    matched: dict[int, pd.DataFrame],
    offsets: dict[int, int],
) -> tuple[list[Any], RankTask, dict[int, Any]]:
    """Stage 2 (shortfall), per rank file, after the client's `matched_collectives`: for each of
    its ranks with windows, `shortfall.attribute_rank` (partition, host layers, exposed split with
    the rank's matched rows, kernels or not, and its share of the dependency graph). Returns the
    pieces (small, for the client), the task, and the ranks' graphs (left on the worker for the
    path task: `graphs_of`)."""
    from tracekit.analyse.shortfall import attribute_rank

    t0 = time.perf_counter()
    ev = load_rank_events(view)
    pieces = []
    graphs: dict[int, Any] = {}
    for r, e in _by_rank(ev):
        if r not in windows:
            continue
        piece = attribute_rank(
            e, r, windows[r], matched[r], graph_windows=windows[r], offset=int(offsets.get(r, 0))
        )
        if piece.graph is not None:
            graphs[r] = piece.graph
        piece.graph = None
        pieces.append(piece)
    task = RankTask(view.parquet, len(ev), [p.rank for p in pieces], time.perf_counter() - t0, _peak_rss())
    return pieces, task, graphs


def _pieces_of(result: tuple[Any, ...]) -> tuple[Any, ...]:
    """The small part of a `rank_attributions` result (what the client gathers)."""
    return result[0], result[1]


def graphs_of(result: tuple[Any, ...]) -> dict[int, Any]:
    """The ranks' graphs of a `rank_attributions` result (runs where it lies)."""
    return dict(result[2])


@dataclass
class PathBucket:
    """What the critical-path task returns: the walk's rows and segments of its steps, and what it
    received (for the tests and the benchmark)."""

    bucket: int
    steps: list[int]
    rows: list[dict[str, Any]]
    segments: list[tuple[int, int, int, int, str, int]]
    received: list[tuple[int, int]]  # (rank, step) of every rank graph's steps received
    received_bytes: int = 0  # the graphs' arrays
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    #: the assembled graph the walk ran on (the shortfall's profiler correction re-times it)
    graph: Any = None


def walk_bucket(bucket: int, offsets: dict[int, int], graphs: list[dict[int, Any]]) -> PathBucket:
    """Stage 2 (shortfall): the critical path's walk on the run's dependency graph, assembled from
    the ranks' graphs (`graph.assemble`, `graph.walk_path`). One task: the graph chains the steps
    (time between steps is host work on it), so the run's steps are walked together."""
    from tracekit.analyse.graph import assemble, walk_path

    t0 = time.perf_counter()
    ranks: dict[int, Any] = {}
    for gs in graphs:
        ranks.update(gs)
    nbytes = sum(sum(v.nbytes for v in vars(g).values() if isinstance(v, np.ndarray)) for g in ranks.values())
    g = assemble(list(ranks.values()), offsets)
    walk = walk_path(g, g.t)
    received = sorted((int(r), int(st)) for r, rg in ranks.items() for st in rg.steps)
    return PathBucket(
        bucket,
        list(g.steps),
        walk.rows,
        walk.segments,
        received,
        nbytes,
        time.perf_counter() - t0,
        _peak_rss(),
        g,
    )


def _attribute_per_rank(
    client: Any,
    engine: Engine,
    j: int,
    token: str,
    parts: list[RankPart],
    meta: Run,
    views: list[BucketInput | None],
    job: RunJob,
    futures: list[Any],
    bucket_futs: list[Any],
    level: str,
) -> RunResult:
    """Stage 2 of a shortfall's run, no task holding the run: per rank file the step-rule summary
    and the windows (client: `choose_step_rule`, `assemble_steps`), stage 2a's matched rows
    (client: `matched_collectives`), per rank file `attribute_rank` (+ clipped unions), the
    client's `assemble_attribution`, the critical path's walk in step-bucket tasks, and the
    client's `finish_attribution`: the pieces the local `attribute_run` calls, in its order."""
    from tracekit.analyse.critical_path import path_of, path_timeline
    from tracekit.analyse.dilation import DEFAULT_THRESHOLD
    from tracekit.analyse.shortfall import (
        assemble_attribution,
        attribute_setup,
        finish_attribution,
        join_steps,
    )
    from tracekit.analyse.steps import assemble_steps
    from tracekit.errors import StepError

    t0 = time.perf_counter()
    kw = job.attribute or {}
    label = str(kw.get("label", "run"))
    skip_first = int(kw.get("skip_first", 1))
    threshold = kw.get("dilation_threshold", DEFAULT_THRESHOLD)
    meta_full = run_metadata(parts, meta.manifest, job.paths)
    pattern, dq = attribute_setup(meta_full, label, kw.get("step_pattern"))
    inputs = _ordered_inputs(parts, views)

    def submit(fn: Any, name: str, args: list[tuple[Any, ...]]) -> list[Any]:
        return [
            _task(
                client,
                engine,
                f"tracekit-{name}-run{j}-f{n}-{token}",
                fn,
                inp,
                *a,
            )
            for n, (inp, a) in enumerate(zip(inputs, args, strict=True))
        ]

    tasks: list[RankTask] = []
    try:
        futs = submit(rank_step_summaries, "att-steprule", [(pattern,)] * len(inputs))
        futures.extend(futs)
        choice = _gather_step_rule(client, futs, tasks, pattern)
        futs = submit(rank_windows, "att-windows", [(choice,)] * len(inputs))
        futures.extend(futs)
        wins = _gather_lists(client, futs, tasks)
        found = assemble_steps(choice, sorted(wins, key=lambda w: w.rank))
    except StepError as exc:
        raise StepError(f"{label}: {exc}") from None
    dq.merge(found.data_quality)
    steps = found.steps
    buckets: list[BucketResult] = client.gather(bucket_futs)
    coll = _matcher(buckets, level)(
        None,
        ranks=meta_full.ranks,
        rank_info=meta_full.rank_info,
        manifest=meta_full.manifest,
        allow_partial=bool(kw.get("allow_partial", False)),
        steps=steps,
    )
    dq.merge(coll.data_quality)
    steps = join_steps(steps, coll, label, dq)
    offsets = {int(k): int(v) for k, v in coll.clock.offsets_ns.items()}
    s_rank = steps["rank"].to_numpy(np.int64)
    m_rank = coll.per_rank["rank"].to_numpy(np.int64)
    args = []
    for inp in inputs:
        rs = sorted(r for r in set(inp.rank_map.values()) if (s_rank == r).any())
        args.append(
            (
                {r: steps[s_rank == r] for r in rs},
                {r: coll.per_rank[m_rank == r] for r in rs},
                offsets,
            )
        )
    keep = [n for n, a in enumerate(args) if a[0]]
    inputs, args = [inputs[n] for n in keep], [args[n] for n in keep]
    att_futs = submit(rank_attributions, "attribute", args)
    futures.extend(att_futs)
    small = [
        _task(
            client,
            engine,
            f"tracekit-attribute-small-run{j}-f{n}-{token}",
            _pieces_of,
            f,
        )
        for n, f in enumerate(att_futs)
    ]
    futures.extend(small)
    pieces = _gather_lists(client, small, tasks)
    pieces.sort(key=lambda p: p.rank)
    att = assemble_attribution(pieces, label=label, skip_first=skip_first, dq=dq)

    # the critical path: one task walks the dependency graph assembled from the ranks' shares
    share = [
        _task(client, engine, f"tracekit-path-graphs-run{j}-f{n}-{token}", graphs_of, f)
        for n, f in enumerate(att_futs)
    ]
    futures.extend(share)
    path_futs = [_task(client, engine, f"tracekit-path-run{j}-{token}", walk_bucket, 0, offsets, share)]
    futures.extend(path_futs)
    walked: list[PathBucket] = client.gather(path_futs)
    rows = [row for w in walked for row in w.rows]
    segs = [seg for w in walked for seg in w.segments]
    path_ranks = sorted(int(r) for r in pd.unique(att.table["rank"]))
    path = path_of(rows, segs, path_ranks, path_timeline(p.timeline for p in pieces))
    out = RunResult(
        manifest=meta.manifest,
        n_events=sum(p.n_events for p in parts),
        ranks=list(meta.ranks),
        sources=dict(meta.sources),
        files=list(parts),
        buckets=list(buckets),
        attribute_tasks=tasks,
        path_tasks=walked,
    )
    out.parts = finish_attribution(
        meta_full,
        att,
        path,
        coll,
        step_pattern=found.pattern,
        label=label,
        skip_first=skip_first,
        dilation_threshold=threshold,
        dq=dq,
        graph=walked[0].graph if len(walked) == 1 else None,
    )
    out.seconds = time.perf_counter() - t0
    out.peak_rss_bytes = max(
        [t.peak_rss_bytes for t in tasks]
        + [w.peak_rss_bytes for w in walked]
        + [b.peak_rss_bytes for b in buckets]
    )
    return out


def analyse_run(
    parts: list[RankPart],
    job: RunJob,
    manifest: dict[str, Any] | None,
    buckets: list[BucketResult] | None = None,
    level: str = "none",
) -> RunResult:
    """Stage 2b: one run's analyses on its classified Parquet files, the collectives as stage
    2a's bucket tasks matched them."""
    t0 = time.perf_counter()
    run = load_run(parts, manifest, job.paths)
    out = RunResult(
        manifest=manifest,
        n_events=len(run.events),
        ranks=list(run.ranks),
        sources=dict(run.sources),
        files=list(parts),
        buckets=list(buckets or []),
    )
    if job.breakdown is not None:
        from tracekit.analyse.breakdown import breakdown

        out.breakdown = breakdown(run, **job.breakdown)
        from tracekit.analyse.kernels import top_kernels
        from tracekit.analyse.steps import find_steps_detailed

        out.top_kernels = top_kernels(
            run.events, find_steps_detailed(run.events, job.breakdown.get("step_pattern")).steps
        )
    if job.attribute is not None:
        from tracekit.analyse.shortfall import attribute_run

        matcher = _matcher(buckets, level) if buckets is not None else None
        out.parts = attribute_run(run, **job.attribute, matcher=matcher)
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


def analyse(
    engine: Engine, jobs: Sequence[RunJob], client: Any = None, pair: tuple[int, int] | None = None
) -> list[RunResult]:
    """Run `jobs` on the Dask engine; one RunResult per job, in order. `client`: an open
    dask.distributed Client to use (else one is opened from `engine`). `pair`: (baseline, sharded)
    job indices: `check_pair` runs on the client between stage 1 and stage 2 (as the local engine
    runs it before the analyses), its notes on the baseline's RunResult."""
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
            return _run(client, engine, jobs, expanded, work, token, pair)
        with open_client(engine) as own:
            return _run(own, engine, jobs, expanded, work, token, pair)
    finally:
        shutil.rmtree(work if engine.work_dir else root, ignore_errors=True)


def _run(
    client: Any,
    engine: Engine,
    jobs: Sequence[RunJob],
    expanded: list[tuple[list[Path], dict[str, Any] | None]],
    work: Path,
    token: str,
    pair: tuple[int, int] | None,
) -> list[RunResult]:
    distributed = _import_distributed()
    settings = client_settings()
    read_futures: list[list[Any]] = []
    sizes: dict[Any, int] = {}
    for j, (job, (files, _manifest)) in enumerate(zip(jobs, expanded, strict=True)):
        futs = []
        for f in files:
            fut = _task(
                client,
                engine,
                f"tracekit-read-{_file_key(j, f)}-{token}",
                read_rank_file,
                str(f),
                str(work / (_file_key(j, f) + ".parquet")),
                job.rank,
                job.cache,
                settings,
                engine.buckets,
            )
            sizes[fut.key] = f.stat().st_size
            futs.append(fut)
        read_futures.append(futs)
    all_reads = [f for futs in read_futures for f in futs]
    later: list[Any] = []
    try:
        if engine.progress:
            _show_progress(distributed, all_reads, sizes)
        # a bad rank file is reported as the local engine reports it: the first failing file in
        # file order, not whichever worker failed first
        distributed.wait(all_reads)
        for fut in all_reads:
            if fut.status == "error":
                raise fut.exception()
        parts: list[list[RankPart]] = [client.gather(futs) for futs in read_futures]
        metas = [
            metadata_of(p, manifest, job.paths)
            for p, job, (_files, manifest) in zip(parts, jobs, expanded, strict=True)
        ]
        pair_notes: list[tuple[str, str]] = []
        if pair is not None:
            from tracekit.analyse.shortfall import check_pair, check_ranks

            check_ranks(metas[pair[0]][0], "baseline")  # a missing rank first, as the local engine
            check_ranks(metas[pair[1]][0], "sharded")
            pair_notes = check_pair(metas[pair[0]][0], metas[pair[1]][0])
        # no task holds a run: breakdowns (job order), then the shortfall's runs (baseline first,
        # as the local `shortfall` attributes them), each as per-rank, bucket and step tasks
        done: dict[int, RunResult] = {}
        for j, job in enumerate(jobs):
            if job.breakdown is not None:
                done[j] = _breakdown_per_rank(client, engine, j, token, parts[j], *metas[j], job, later)
        att_order = [j for j, job in enumerate(jobs) if job.attribute is not None]
        if pair is not None:
            att_order.sort(key=lambda j: (j != pair[0], j != pair[1], j))
        for j in att_order:
            job = jobs[j]
            bucket_futs, level = _submit_buckets(client, engine, j, token, parts[j], *metas[j], job)
            later.extend(bucket_futs)
            res = _attribute_per_rank(
                client, engine, j, token, parts[j], *metas[j], job, later, bucket_futs, level
            )
            if j in done:
                bd = done[j]
                res.breakdown, res.rank_tasks, res.top_kernels = bd.breakdown, bd.rank_tasks, bd.top_kernels
                res.seconds += bd.seconds
                res.peak_rss_bytes = max(res.peak_rss_bytes, bd.peak_rss_bytes)
            done[j] = res
        for j in range(len(jobs)):  # a job asking for no analysis: its run's metadata only
            if j not in done:
                done[j] = RunResult(
                    manifest=metas[j][0].manifest,
                    n_events=sum(p.n_events for p in parts[j]),
                    ranks=list(metas[j][0].ranks),
                    sources=dict(metas[j][0].sources),
                    files=list(parts[j]),
                )
        results = [done[j] for j in range(len(jobs))]
        if pair is not None:
            results[pair[0]].pair_notes = pair_notes
    finally:
        for fut in [*later, *all_reads]:
            fut.release()
    return results


def _submit_buckets(
    client: Any,
    engine: Engine,
    j: int,
    token: str,
    parts: list[RankPart],
    meta: Run,
    views: list[BucketInput | None],
    job: RunJob,
) -> tuple[list[Any], str]:
    """Stage 2a of one run: a task per bucket holding collective rows; each gets, of every rank
    file, only that bucket's Parquet file. The run's collective level is the best any file has
    (a file of a lower level has no rows at the run's)."""
    from tracekit.analyse.collectives import _world_size

    level = min((p.level for p in parts), key=LEVELS.index, default="none")
    groups = sorted({g for p in parts if p.level == level for g in p.groups})
    group_index = {g: i for i, g in enumerate(groups)}
    order = sorted(range(len(parts)), key=lambda i: views[i].event_offset)  # type: ignore[union-attr]
    futs = []
    for b in sorted({b for p in parts if p.level == level for b in p.buckets}):
        inputs = [
            BucketInput(parts[i].buckets[b], v.rank_map, v.shift_ns, v.event_offset)
            for i in order
            if parts[i].level == level and b in parts[i].buckets and (v := views[i]) is not None
        ]
        futs.append(
            _task(
                client,
                engine,
                f"tracekit-match-run{j}-b{b}-{token}",
                match_bucket,
                b,
                inputs,
                {g: group_index[g] for g in groups if bucket_of(g, engine.buckets) == b},
                sorted(meta.ranks),
                _world_size(meta.rank_info),
                level,
                bool((job.attribute or {}).get("allow_partial", False)),
                engine.buckets,
            )
        )
    return futs, level


def _bar() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn, TransferSpeedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=not sys.stderr.isatty(),
    )


def _show_progress(distributed: Any, reads: list[Any], sizes: dict[Any, int]) -> None:
    """A rich bar on stderr: bytes of rank files read and classified on all workers. Errors are
    left for the caller to raise."""
    with _bar() as bar:
        task = bar.add_task(f"dask: reading {len(reads)} rank file(s)", total=sum(sizes.values()))
        for fut in distributed.as_completed(reads):
            bar.advance(task, sizes.get(fut.key, 0))
