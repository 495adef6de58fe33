"""One run from its trace files: every rank's events in one `Run`.

`read_run(paths)` takes files and/or folders. A folder is read as the set of its trace files
(`*.json`, `*.json.gz`, `*.pt.trace.json*`, `*.sqlite`, `*.sqlite.gz`, `*.nsys-rep` unless its
`.sqlite` export lies beside it (`*.qdrep`, nsys' name before 2021.4, likewise); `manifest.json` is loaded into `Run.manifest`, not read as a
trace); a folder without trace files of its own but with subfolders holding them (HTA's `rank-N/`
layout) is read as the set of those. Runs as users lay them out: a torchrun profile folder
(`*.pt.trace.json[.gz]` per rank, no manifest: the rank from each file's `distributedInfo`),
several `.sqlite` / `.nsys-rep` files one per rank (aligned on the earliest session start: nsys
times count from each report's own session start), HTA's `rank-N` files. A file that names no rank
is rank 0 when alone; several such files get the ranks no other file claims, in file order
(data_quality says so). Each file goes to the reader registered for its suffix
(`READERS`, imported lazily): Kineto JSON -> `tracekit.read.kineto.read_kineto`, Nsight Systems
SQLite (plain or gzipped) -> `tracekit.read.nsys.read_nsys`. Several files are read in parallel with a process pool,
each through the Parquet cache (`tracekit.read.cache`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracekit.errors import RankError, TraceFormatError
from tracekit.model.documents.base import given
from tracekit.model.events import COLUMNS, DataQuality, Run, make_events
from tracekit.model.launch import graph_replay_mask
from tracekit.read.files import find_trace_files, is_trace_name, read_file, read_worker, sha256_of
from tracekit.read.limits import current_limits
from tracekit.read.manifests import ManifestRead, workload_tp


def check_run_events(total: int, path: object, n_files: int) -> None:
    """The limit on events is per run (`--max-events`, docs/RELIABILITY.md): TraceFormatError naming
    the file whose events took the run's total past it (`total`: the rows of the event tables of
    the first `n_files` files, in file order, this one included). One file alone is stopped while
    it streams, at the same limit."""

    limit = current_limits().max_events
    if total > limit:
        raise TraceFormatError(
            path,
            f"the run has {total} events with this file ({n_files} trace files so far), more than {limit}: "
            "the limit on events of one run, all its trace files together (--max-events or "
            "TRACEKIT_MAX_EVENTS)",
        )


def concat_runs(runs: Sequence[Run]) -> Run:
    """One Run from per-file Runs; RankError when two files hold the same rank. Columns beyond
    `COLUMNS` that the first file's table has are kept (categoricals unioned in order of first
    appearance)."""
    sources: dict[int, str] = {}
    rank_info: dict[int, dict[str, object]] = {}
    dq = DataQuality()
    for run in runs:
        for r, src in run.sources.items():
            if r in sources:
                raise RankError(
                    f"rank {r} appears in two files: {sources[r]} and {src} "
                    "(one file per rank; pass a single file with --rank to override)"
                )
            sources[r] = src
        rank_info.update(run.rank_info)
        dq.merge(run.data_quality)
    if len(runs) == 1:
        events = runs[0].events
    else:
        order = sorted(range(len(runs)), key=lambda i: min(runs[i].sources) if runs[i].sources else 0)
        frames = [runs[i].events for i in order]
        cols: dict[str, pd.Categorical | np.ndarray] = {}
        for col, dtype in COLUMNS.items():
            if dtype == "category":
                cols[col] = _union_categoricals([f[col] for f in frames])
            else:
                cols[col] = np.concatenate([f[col].to_numpy() for f in frames])
        events = make_events(cols)
        # columns beyond the event table's (classify's cls, subclass, rule: the Dask engine's
        # per-rank Parquet files), in the first table's order
        for col in [c for c in frames[0].columns if c not in COLUMNS]:
            if isinstance(frames[0][col].dtype, pd.CategoricalDtype):
                events[col] = pd.Series(_union_categoricals([f[col] for f in frames]), copy=False)
            else:
                events[col] = np.concatenate([f[col].to_numpy() for f in frames])
    return Run(
        events=events,
        sources=dict(sorted(sources.items())),
        rank_info=dict(sorted(rank_info.items())),
        data_quality=dq,
    )


def _union_categoricals(parts: Sequence[pd.Series]) -> pd.Categorical:
    """Concatenate categorical columns: categories in order of first appearance, every part's
    codes remapped through a small lookup array (no per-row hashing)."""
    index: dict[Any, int] = {}
    codes: list[np.ndarray] = []
    for part in parts:
        cat = part if isinstance(part.dtype, pd.CategoricalDtype) else part.astype("category")
        lut = np.array([index.setdefault(c, len(index)) for c in cat.cat.categories] + [-1], dtype=np.int32)
        codes.append(lut[cat.cat.codes.to_numpy()])  # code -1 (missing) -> the last entry, -1
    all_codes = np.concatenate(codes) if codes else np.zeros(0, np.int32)
    return pd.Categorical.from_codes(all_codes, categories=pd.Index(list(index)))


def reading_bar(*, transient: bool) -> Any:
    """The progress display of reading trace files on stderr (a rich Progress: bytes read, rate,
    time), for read_run and the Dask engine's reads; rich is imported only when one is shown."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn, TransferSpeedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=transient,
    )


def read_run(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    rank: int | None = None,
    cache: bool = True,
    progress: bool = False,
    jobs: int | None = None,
) -> Run:
    """Read trace files and/or folders of rank files as one run.

    - `rank` overrides the rank of a single trace file (RankError with several files).
    - `cache`: use the Parquet cache (also off with TRACEKIT_NO_CACHE=1).
    - `progress`: a rich progress bar on stderr.
    - `jobs`: processes for reading several files (default min(files, CPUs); 1 = in this process).
    Raises NoTracesError (a path with no traces), RankError (duplicate or unknown ranks),
    TraceFormatError (a bad file: path + byte offset or event index).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, manifest = find_trace_files(paths)
    if rank is not None and len(files) > 1:
        raise RankError(f"--rank applies to one trace file, but {len(files)} were given")
    n_jobs = jobs if jobs is not None else min(len(files), os.cpu_count() or 1)
    n_jobs = max(1, min(n_jobs, len(files)))

    bar: Any = None
    task: Any = None
    if progress:
        total = sum(f.stat().st_size for f in files)
        bar = reading_bar(transient=True)
        bar.start()
        task = bar.add_task(f"reading {len(files)} trace file(s)", total=total)

    runs: list[Run] = []
    try:
        if n_jobs == 1:
            for f in files:
                size = f.stat().st_size
                done_before = bar.tasks[0].completed if bar is not None else 0

                def _cb(done: int, _total: int, _base: float = done_before) -> None:
                    if bar is not None:
                        bar.update(task, completed=_base + done)

                runs.append(read_file(f, rank=rank, cache=cache, on_progress=_cb if bar else None))
                check_run_events(sum(len(r.events) for r in runs), f, len(runs))
                if bar is not None:
                    bar.update(task, completed=done_before + size)
        else:
            with ProcessPoolExecutor(max_workers=n_jobs) as pool:
                futures = [pool.submit(read_worker, (str(f), rank, cache)) for f in files]
                try:
                    for f, fut in zip(files, futures, strict=True):
                        try:
                            runs.append(fut.result())
                        except BrokenProcessPool:
                            raise TraceFormatError(
                                f,
                                "the process reading this file died (out of memory or killed); "
                                "read it alone, or lower --max-bytes / --max-events",
                            ) from None
                        check_run_events(sum(len(r.events) for r in runs), f, len(runs))
                        if bar is not None:
                            bar.advance(task, f.stat().st_size)
                finally:
                    for fut in futures:  # one bad file: the others are not waited for
                        fut.cancel()
    finally:
        if bar is not None:
            bar.stop()
    return assemble_run(runs, manifest, paths)


def assemble_run(
    runs: Sequence[Run],
    manifest: ManifestRead | None,
    paths: Sequence[str | os.PathLike[str]],
    *,
    notes: bool = True,
    counts: tuple[int, int, int, int] | None = None,
    digests: Mapping[str, str] | None = None,
) -> Run:
    """The run of per-file Runs (in file order), as `read_run` puts it together after reading:
    ranks numbered for files that name none, Nsight sessions aligned, tables concatenated in rank
    order (`concat_runs`), the manifest attached, the run-level notes (`_note_run_problems`). The
    one assembler of both engines: the Dask engine calls it on its per-rank Parquet tables and, with
    empty tables, on the files' metadata alone (`notes=False`: the run-level notes, which read the
    events and hash the files, are left to the call with the events; or `counts`: the events'
    figures those notes need, summed over the files, see `_note_run_problems`). `digests`: the
    files' SHA-256 where already computed (the Dask engine's read tasks, beside each file)."""
    runs = _number_default_ranks(list(runs))
    runs = _align_nsys_sessions(runs)
    run = concat_runs(runs)
    if manifest is not None:
        run.manifest = manifest.manifest
    if notes:
        _note_run_problems(run, paths, counts, digests, manifest.notes if manifest is not None else [])
    return run


def _check_checksums(run: Run, digests: Mapping[str, str] | None = None) -> None:
    """Each trace file the manifest lists (`files`: name -> {sha256, bytes}, written by the capture)
    is checked against its size and SHA-256; a mismatch (a file changed, replaced or damaged since
    the capture) is noted in data_quality, naming the file."""
    doc = run.manifest
    files = given(doc.files) if doc is not None else None
    if doc is None or files is None:
        return
    bad: list[str] = []
    for src in run.sources.values():
        p = Path(src)
        want = files.get(p.name)
        sha = given(want.sha256) if want is not None else None
        if want is None or sha is None:
            continue
        try:
            size, listed = p.stat().st_size, given(want.bytes)
            if listed is not None and listed != size:
                bad.append(f"{p.name} ({size} bytes, the manifest says {listed})")
            elif ((digests or {}).get(str(src)) or sha256_of(p)) != sha.lower():
                bad.append(f"{p.name} (SHA-256 differs)")
        except OSError as exc:
            bad.append(f"{p.name} ({exc.strerror or exc})")
    if doc.complete is False:  # a rank that failed may still have left a whole trace
        unlisted = sorted(Path(src).name for src in run.sources.values() if Path(src).name not in files)
        if unlisted:
            said = "; ".join(
                f"rank {given(e.rank)}: {str(given(e.message))[:120]}" for e in (given(doc.errors) or [])[:4]
            )
            run.data_quality.add(
                "trace_not_in_manifest",
                len(unlisted),
                f"{', '.join(unlisted[:8])} not listed in manifest.json files: the capture did not finish "
                f"that rank ({said or 'manifest complete: false'}); read, but unverified",
            )
    if bad:
        run.data_quality.add(
            "checksum_mismatch",
            len(bad),
            f"trace files differ from what the capture wrote (manifest.json files): {', '.join(bad[:8])}: "
            "changed, replaced or damaged since",
        )


#: kernels on one stream overlapping by more than this are damaged data, not programmatic dependent
#: launch (which overlaps consecutive kernels by up to ~1 us on the H200 traces)
STREAM_OVERLAP_NOTE_NS = 10_000


def gpu_stream_counts(ev: pd.DataFrame) -> tuple[int, int, int]:
    """(GPU operations recorded twice, operations overlapping the previous one on their stream by
    more than STREAM_OVERLAP_NOTE_NS, such overlaps between two operations of one CUDA-graph
    replay): per rank, so a run's counts are the sums of its files'. A graph replay runs the
    captured graph's branches concurrently even when they were captured on one stream
    (`tracekit.model.launch.graph_replay_mask`), so its overlaps are not damage."""
    if ev.empty:
        return 0, 0, 0
    gpu = ev["kind"].isin(["kernel", "memcpy", "memset"]).to_numpy()
    if gpu.sum() < 2:
        return 0, 0, 0
    g = ev.loc[gpu, ["rank", "device", "stream", "start_ns", "end_ns", "correlation"]].to_numpy(np.int64)
    names = ev["name"].cat.codes.to_numpy()[gpu]
    in_graph = graph_replay_mask(ev)[gpu]
    order = np.lexsort((g[:, 4], g[:, 3], g[:, 2], g[:, 1], g[:, 0]))
    g, names, in_graph = g[order], names[order], in_graph[order]
    same_stream = (g[1:, :3] == g[:-1, :3]).all(axis=1)
    dup = same_stream & (g[1:, 3] == g[:-1, 3]) & (g[1:, 4] == g[:-1, 4]) & (names[1:] == names[:-1])
    overlap = same_stream & ~dup & (g[:-1, 4] - g[1:, 3] > STREAM_OVERLAP_NOTE_NS)
    one_replay = in_graph[1:] & in_graph[:-1] & (g[1:, 5] == g[:-1, 5])
    return int(dup.sum()), int((overlap & ~one_replay).sum()), int((overlap & one_replay).sum())


def _check_gpu_streams(run: Run, counts: tuple[int, int, int] | None = None) -> None:
    """Notes on GPU activity that cannot be: one event recorded twice (same rank, device, stream,
    name, start and end), or operations on one stream overlapping by more than STREAM_OVERLAP_NOTE_NS
    outside a CUDA-graph replay; and a count of the overlaps inside one replay (concurrent graph
    branches, not damage). `counts`: `gpu_stream_counts` already summed over the run's files."""
    n_dup, n_overlap, n_graph = gpu_stream_counts(run.events) if counts is None else counts
    if n_dup:
        run.data_quality.add(
            "gpu_events_duplicated",
            n_dup,
            "GPU operations recorded twice (same rank, stream, name, start and end): both kept, counted once in "
            "each window (the partition takes the union of the time)",
        )
    if n_overlap:
        run.data_quality.add(
            "gpu_stream_overlaps",
            n_overlap,
            f"GPU operations on one stream overlapping the previous one by more than {STREAM_OVERLAP_NOTE_NS // 1000} us "
            "(one stream runs its work in order: timestamps damaged or from two clocks)",
        )
    if n_graph:
        run.data_quality.add(
            "graph_replay_concurrent",
            n_graph,
            f"GPU operations of one CUDA-graph replay overlapping the previous one on their stream by more than "
            f"{STREAM_OVERLAP_NOTE_NS // 1000} us: a replay runs the graph's branches concurrently, so stream order "
            "does not hold inside it (not damage; tracekit.model.launch.graph_replay_mask marks these operations)",
        )


def _note_run_problems(
    run: Run,
    paths: Sequence[str | os.PathLike[str]],
    counts: tuple[int, int, int, int] | None = None,
    digests: Mapping[str, str] | None = None,
    manifest_notes: Sequence[tuple[str, str]] = (),
) -> None:
    """Notes on what the run lacks: manifest fields left out (`manifest_notes`: the reader's), ranks the manifest names but no file
    holds, names of trace files in a folder that are not files (a directory, a dangling link).
    `counts`: (events, duplicated GPU operations, stream overlaps, overlaps inside one graph replay)
    summed over the files, when the
    run's table is not there (the Dask engine's per-rank path)."""
    if run.sources:  # the engines that concatenate first (dask) meet the per-run limit here
        n_events = len(run.events) if counts is None else counts[0]
        check_run_events(n_events, list(run.sources.values())[-1], len(run.sources))
    dq = run.data_quality
    for key, note in manifest_notes:
        dq.add(key, 1, note)
    _check_checksums(run, digests)
    _check_gpu_streams(run, None if counts is None else (counts[1], counts[2], counts[3]))
    tp = workload_tp(run.manifest)
    if tp is not None:
        missing = sorted(set(range(tp)) - set(run.ranks))
        if missing:
            dq.add(
                "ranks_missing",
                len(missing),
                f"the manifest says tp={tp} but no trace file holds rank(s) {', '.join(map(str, missing[:16]))}"
                f"{' ...' if len(missing) > 16 else ''} (found {sorted(run.ranks)[:16]}): the figures are of the "
                "ranks present only",
            )
    for raw in paths:
        p = Path(raw)
        if not p.is_dir():
            continue
        odd = sorted(c.name for c in p.iterdir() if is_trace_name(c.name) and not c.is_file())
        if odd:
            dq.add(
                "trace_names_not_files",
                len(odd),
                f"{p}: {', '.join(odd[:8])} named like trace files but not readable files (a directory or a "
                "dangling link): left out",
            )


def _with_rank(run: Run, new: int, note: str) -> Run:
    """`run` (one rank) as rank `new`."""
    (old,) = run.sources
    events = run.events.copy(deep=False)
    events["rank"] = np.full(len(events), new, dtype=events["rank"].dtype)
    info = dict(run.rank_info.get(old, {}))
    info["rank_source"] = "default (file order)"
    dq = DataQuality().merge(run.data_quality)
    dq.add("ranks_from_file_order", 1, note)
    return Run(events=events, sources={new: run.sources[old]}, rank_info={new: info}, data_quality=dq)


def _number_default_ranks(runs: list[Run]) -> list[Run]:
    """Files that name no rank (rank_source "default") get, in file order, the smallest ranks no
    other file claims; alone, such a file stays rank 0."""
    defaulted = [
        i
        for i, r in enumerate(runs)
        if len(r.sources) == 1 and r.rank_info.get(next(iter(r.sources)), {}).get("rank_source") == "default"
    ]
    if len(runs) < 2 or not defaulted:
        return runs
    taken = {rk for i, r in enumerate(runs) if i not in defaulted for rk in r.sources}
    out = list(runs)
    nxt = 0
    for i in defaulted:
        while nxt in taken:
            nxt += 1
        src = next(iter(runs[i].sources.values()))
        out[i] = _with_rank(
            runs[i],
            nxt,
            f"{Path(src).name}: names no rank (no distributedInfo, rank-N or RANK=): read as rank {nxt}, "
            "its place among the files that name none (pass one file with --rank N to choose)",
        )
        taken.add(nxt)
    return out


def _align_nsys_sessions(runs: list[Run]) -> list[Run]:
    """Several Nsight Systems reports (one per rank): each counts ns from its own session start, so
    shift each onto the earliest report's clock by the difference of the sessions' UTC starts."""
    starts: list[int | None] = []
    for r in runs:
        vals = {v for info in r.rank_info.values() if isinstance(v := info.get("session_start_utc_ns"), int)}
        starts.append(next(iter(vals)) if len(vals) == 1 else None)
    known = [s for s in starts if s is not None]
    if len(known) < 2 or len(set(known)) < 2:
        return runs
    base = min(known)
    out = list(runs)
    for i, (r, s0) in enumerate(zip(runs, starts, strict=True)):
        if s0 is None or s0 == base:
            continue
        shift = s0 - base
        if shift > 1 << 62:  # session starts centuries apart: not one run's clocks (and would wrap)
            dq0 = DataQuality().merge(r.data_quality)
            dq0.add(
                "nsys_sessions_not_aligned",
                1,
                f"session starts {shift} ns apart (TARGET_INFO_SESSION_START_TIME): not shifted",
            )
            out[i] = Run(events=r.events, sources=dict(r.sources), rank_info=r.rank_info, data_quality=dq0)
            continue
        events = r.events.copy(deep=False)
        events["start_ns"] = events["start_ns"].to_numpy(np.int64) + shift
        events["end_ns"] = events["end_ns"].to_numpy(np.int64) + shift
        info = {k: {**v, "session_shift_ns": shift} for k, v in r.rank_info.items()}
        dq = DataQuality().merge(r.data_quality)
        dq.add(
            "nsys_sessions_aligned",
            1,
            "several Nsight Systems reports: each one's times were shifted onto the earliest session's clock "
            "by the difference of their session starts (TARGET_INFO_SESSION_START_TIME)",
        )
        out[i] = Run(events=events, sources=dict(r.sources), rank_info=info, data_quality=dq)
    return out


def _main(argv: list[str]) -> None:  # pragma: no cover - a debugging aid: python -m tracekit.read.run PATH
    run = read_run(argv, progress=True)
    print(run.events.groupby(["rank", "kind"], observed=True).size())


if __name__ == "__main__":  # pragma: no cover
    _main(sys.argv[1:])
