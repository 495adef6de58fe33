"""Readers: trace files -> one `Run` (the event table of all ranks).

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

import hashlib
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracekit.errors import NoTracesError, RankError, TraceFormatError
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.events import COLUMNS, DataQuality, Run, make_events
from tracekit.model.launch import graph_replay_mask
from tracekit.read.manifests import typed_manifest

__all__ = ["READERS", "assemble_run", "find_trace_files", "load_manifest", "read_file", "read_run"]

#: file-name suffix -> "module:function" of the reader (function(path, rank=None) -> Run).
READERS: dict[str, str] = {
    ".json.gz": "tracekit.read.kineto:read_kineto",
    ".json": "tracekit.read.kineto:read_kineto",
    ".sqlite": "tracekit.read.nsys:read_nsys",
    ".sqlite.gz": "tracekit.read.nsys:read_nsys",
    ".nsys-rep": "tracekit.read.nsys:read_nsys",
    ".qdrep": "tracekit.read.nsys:read_nsys",  # the name of nsys reports before 2021.4
}

_NOT_TRACES = {"manifest.json"}


def _reader_for(path: Path) -> tuple[Callable[..., Run], str] | None:
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):  # tracekit's own Perfetto export: all its ranks, exactly
        from tracekit.read import export

        if export.is_export(path):
            return export.read_export, export.READER_VERSION
    for suffix, target in READERS.items():
        if name.endswith(suffix):
            mod_name, func_name = target.split(":")
            mod = importlib.import_module(mod_name)
            version = str(getattr(mod, "READER_VERSION", mod_name))
            return getattr(mod, func_name), version
    return None


def _is_trace_name(name: str) -> bool:
    low = name.lower()
    return low not in _NOT_TRACES and any(low.endswith(s) for s in READERS) and not low.startswith(".")


#: a manifest is a few kB; one larger than this is not read
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
#: bounds of the workload fields that size loops and sets (docs/RELIABILITY.md)
MAX_TP = 1 << 16
MAX_PER_TOKEN = 100_000
#: every number of a manifest lies within +-MAX_MANIFEST_NUMBER (2**62: 146 years in ns, 4.6 EB in
#: bytes) and is finite; one beyond is treated as missing where it is read (check_manifest)
MAX_MANIFEST_NUMBER = float(1 << 62)
#: workload counts (tokens, prompt, batch, layers, rounds ...): whole numbers from 0 to this
MAX_WORKLOAD_COUNT = 1 << 31
_WORKLOAD_COUNTS = (
    "tokens",
    "prompt",
    "batch",
    "layers",
    "warmup_tokens",
    "profiler_warmup_steps",
    "untimed_tail_steps",
    "rounds",
)


class Manifest(dict):  # type: ignore[type-arg]
    """A manifest's JSON object; `notes` lists (data_quality key, note) for the fields that were
    malformed and left out when it was read (`read_run` adds them to the run's data_quality);
    `doc` the same manifest as its typed document (`tracekit.read.manifests.typed_manifest`,
    docs/JSON.md#manifest), decoded once when it is read."""

    notes: list[tuple[str, str]]
    doc: ManifestDoc | None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.notes = []
        self.doc = None


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def inside_run_folder(name: object) -> bool:
    """True when a manifest's file name stays inside the run folder: a relative path without `..`,
    no drive, no NUL (`../x`, `/etc/passwd`, `C:\\x`, `sub/../../x` are not)."""
    from pathlib import PurePosixPath, PureWindowsPath

    if not isinstance(name, str) or not name or "\x00" in name:
        return False
    posix, win = PurePosixPath(name), PureWindowsPath(name)
    return not (posix.is_absolute() or win.drive or win.root or ".." in posix.parts or ".." in win.parts)


def check_manifest(doc: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """Leave out (in place) the workload fields that are malformed or out of bounds, so that no
    consumer sizes a loop or a set by them (tp 10**30, per_token 1e9); the notes saying so."""
    notes: list[tuple[str, str]] = []
    _drop_unbounded_numbers(doc, name, notes)
    files = doc.get("files")
    if isinstance(files, dict):  # names of the run's own files: never a path out of its folder
        outside = [k for k in files if not inside_run_folder(k)]
        if outside:
            shown = ", ".join(repr(k)[:80] for k in outside[:4])
            notes.append(
                (
                    "manifest_path_outside_run",
                    f"{name}: files names {len(outside)} path(s) outside the run folder ({shown}): ignored",
                )
            )
            for k in outside:
                del files[k]
    wl = doc.get("workload")
    if not isinstance(wl, dict):
        return notes
    key = "manifest_field_malformed"
    if "tp" in wl and not _int_in(wl["tp"], 1, MAX_TP):
        notes.append(
            (key, f"{name}: workload.tp {str(wl['tp'])[:40]!r} is not a TP degree (1 to {MAX_TP}): ignored")
        )
        del wl["tp"]
    counts = [k for k in _WORKLOAD_COUNTS if k in wl and not _int_in(wl[k], 0, MAX_WORKLOAD_COUNT)]
    if counts:
        shown = ", ".join(f"{k} {str(wl[k])[:40]!r}" for k in counts)
        notes.append(
            (key, f"{name}: workload {shown}: not a whole number from 0 to {MAX_WORKLOAD_COUNT}: ignored")
        )
        for k in counts:
            del wl[k]
    if "step_pattern" in wl and wl["step_pattern"] is not None and not isinstance(wl["step_pattern"], str):
        notes.append((key, f"{name}: workload.step_pattern is not a string: ignored"))
        del wl["step_pattern"]
    coll = wl.get("collectives")
    if coll is not None and not isinstance(coll, list):
        notes.append((key, f"{name}: workload.collectives is not a list: ignored"))
        del wl["collectives"]
    elif isinstance(coll, list):
        good = [
            e
            for e in coll
            if isinstance(e, dict)
            and _int_in(e.get("per_token", 1), 1, MAX_PER_TOKEN)
            and all(_int_in(e.get(b, -1), -1, 1 << 62) for b in ("in_bytes", "out_bytes"))
        ]
        if len(good) != len(coll):
            notes.append(
                (
                    key,
                    f"{name}: {len(coll) - len(good)} workload.collectives entries with a per_token outside 1 to "
                    f"{MAX_PER_TOKEN} or byte counts that are not integers were ignored",
                )
            )
            wl["collectives"] = good
    return notes


def _drop_unbounded_numbers(doc: dict[str, Any], name: str, notes: list[tuple[str, str]]) -> None:
    """Every number of the manifest, at any depth: one that is not finite (Python's JSON reads NaN,
    Infinity) or lies beyond +-MAX_MANIFEST_NUMBER is removed where it is (a key of an object is
    deleted, an item of a list becomes null), so no consumer computes with it (unprofiled.per_token_ns
    of 1e30 overflowed int64); noted once with how many and the first one's place."""
    found: list[str] = []

    def bad(v: Any) -> bool:
        return (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and not (math.isfinite(v) and -MAX_MANIFEST_NUMBER <= v <= MAX_MANIFEST_NUMBER)
        )

    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > 64:  # json.loads nests at most ~1000 deep; no manifest field is this deep
            continue
        if isinstance(node, dict):
            for k in [k for k, v in node.items() if bad(v)]:
                found.append(f"{where}{k} = {str(node[k])[:24]}")
                del node[k]
            stack.extend(
                (v, f"{where}{k}.", depth + 1) for k, v in node.items() if isinstance(v, (dict, list))
            )
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if bad(v):
                    found.append(f"{where}[{i}] = {str(v)[:24]}".replace(".[", "["))
                    node[i] = None
                elif isinstance(v, (dict, list)):
                    stack.append((v, f"{where}[{i}].".replace(".[", "["), depth + 1))
    if found:
        notes.append(
            (
                "manifest_field_malformed",
                f"{name}: {len(found)} number(s) not finite or beyond +-2**62 (first: {found[0]}) were "
                "treated as missing",
            )
        )


def load_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A capture manifest (docs/JSON.md#manifest) as a dict (a `Manifest`, its malformed workload
    fields left out and noted). TraceFormatError naming the file when it cannot be read, is larger
    than MAX_MANIFEST_BYTES, is not UTF-8 or JSON (with the byte offset), nests too deeply, or its
    top level is not an object."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_MANIFEST_BYTES:
            raise TraceFormatError(
                p,
                f"manifest is {p.stat().st_size} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may be",
            )
        raw = p.read_bytes()
    except OSError as exc:
        raise TraceFormatError(p, f"manifest cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(p, "manifest is not UTF-8 text", offset=exc.start) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8"))
        raise TraceFormatError(p, f"manifest is not valid JSON ({exc.msg})", offset=offset) from None
    except ValueError as exc:  # e.g. a number too long to convert
        raise TraceFormatError(p, f"manifest is not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceFormatError(p, "manifest is JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise TraceFormatError(
            p, f"manifest's top level is a JSON {json_type(doc)}, not an object (docs/JSON.md#manifest)"
        )
    out = Manifest(doc)
    out.notes = check_manifest(out, p.name)
    out.doc, typed_notes = typed_manifest(out, p.name)
    out.notes += typed_notes
    return out


def json_type(x: Any) -> str:
    """The JSON type name of a decoded value, for error messages ("array", "string", ...)."""
    if isinstance(x, Mapping):
        return "object"
    if isinstance(x, (list, tuple)):
        return "array"
    if isinstance(x, str):
        return "string"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, (int, float)):
        return "number"
    return "null" if x is None else type(x).__name__


def _traces_in(folder: Path) -> list[Path]:
    """The trace files of one folder, sorted; a `.nsys-rep` whose `.sqlite` export lies beside it
    is left out (the export is read instead, once)."""
    found = sorted(c for c in folder.iterdir() if c.is_file() and _is_trace_name(c.name))
    names = {c.name.lower() for c in found}

    def exported_beside(name: str) -> bool:
        low = name.lower()
        return any(
            low.endswith(ext) and low[: -len(ext)] + ".sqlite" in names for ext in (".nsys-rep", ".qdrep")
        )

    return [c for c in found if not exported_beside(c.name)]


def find_trace_files(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Path], dict[str, Any] | None]:
    """Expand files and folders into trace files (sorted per folder) and the first manifest found."""
    files: list[Path] = []
    manifest: dict[str, Any] | None = None
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = _traces_in(p)
            if not found:  # HTA's layout: one subfolder per rank (rank-0/, rank-1/, ...)
                found = [f for sub in sorted(c for c in p.iterdir() if c.is_dir()) for f in _traces_in(sub)]
            mf = p / "manifest.json"
            if manifest is None and mf.is_file():
                manifest = load_manifest(mf)
            if not found:
                raise NoTracesError(
                    f"{p}: no trace files in this folder (expected *.json, *.json.gz, *.pt.trace.json.gz, *.sqlite, "
                    "*.sqlite.gz, *.nsys-rep or *.qdrep)"
                )
            files.extend(found)
        elif p.is_file():
            if _reader_for(p) is None:
                raise NoTracesError(
                    f"{p}: not a trace file (expected .json, .json.gz, .sqlite, .sqlite.gz, .nsys-rep or .qdrep)"
                )
            files.append(p)
            mf = p.parent / "manifest.json"
            if manifest is None and p.name != "manifest.json" and mf.is_file():
                manifest = load_manifest(mf)
        else:
            raise NoTracesError(f"{p}: no such file or folder")
    if not files:
        raise NoTracesError("no trace paths given")
    return files, manifest


def read_file(
    path: str | os.PathLike[str], *, rank: int | None = None, cache: bool = True, on_progress: Any = None
) -> Run:
    """Read one trace file with its registered reader, through the Parquet cache. A Kineto file that
    names no rank is read as rank 0 (rank_source "default"; `read_run` renumbers several such)."""
    from tracekit.read import cache as cache_mod

    p = Path(path)
    found = _reader_for(p)
    if found is None:
        raise NoTracesError(
            f"{p}: not a trace file (expected .json, .json.gz, .sqlite, .sqlite.gz, .nsys-rep or .qdrep)"
        )
    if rank is not None:
        from tracekit.read.kineto import check_rank_argument

        check_rank_argument(rank)
    reader, version = found
    use_cache = cache and cache_mod.cache_enabled()
    if use_cache:
        hit = cache_mod.load(p, version, rank)
        if hit is not None:
            return hit
    if reader.__module__ == "tracekit.read.kineto":
        run = reader(p, rank=rank, on_progress=on_progress, default_rank=0)
    else:
        run = reader(p, rank=rank)
    if use_cache:
        cache_mod.store(p, version, run, rank)
    return run


def check_run_events(total: int, path: object, n_files: int) -> None:
    """The limit on events is per run (`--max-events`, docs/RELIABILITY.md): TraceFormatError naming
    the file whose events took the run's total past it (`total`: the rows of the event tables of
    the first `n_files` files, in file order, this one included). One file alone is stopped while
    it streams, at the same limit."""
    from tracekit.read.limits import current_limits

    limit = current_limits().max_events
    if total > limit:
        raise TraceFormatError(
            path,
            f"the run has {total} events with this file ({n_files} trace files so far), more than {limit}: "
            "the limit on events of one run, all its trace files together (--max-events or "
            "TRACEKIT_MAX_EVENTS)",
        )


def _read_worker(args: tuple[str, int | None, bool]) -> Run:
    path, rank, cache = args
    return read_file(path, rank=rank, cache=cache)


def concat_runs(runs: Sequence[Run]) -> Run:
    """One Run from per-file Runs; RankError when two files hold the same rank. Columns beyond
    `COLUMNS` that the first file's table has are kept (categoricals unioned in order of first
    appearance)."""
    sources: dict[int, str] = {}
    rank_info: dict[int, dict[str, Any]] = {}
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
        cols: dict[str, Any] = {}
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
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn, TransferSpeedColumn

        total = sum(f.stat().st_size for f in files)
        bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
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
                futures = [pool.submit(_read_worker, (str(f), rank, cache)) for f in files]
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
    manifest: dict[str, Any] | None,
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
    run.manifest = manifest
    if notes:
        _note_run_problems(run, paths, counts, digests)
    return run


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_checksums(run: Run, digests: Mapping[str, str] | None = None) -> None:
    """Each trace file the manifest lists (`files`: name -> {sha256, bytes}, written by the capture)
    is checked against its size and SHA-256; a mismatch (a file changed, replaced or damaged since
    the capture) is noted in data_quality, naming the file."""
    files = (run.manifest or {}).get("files")
    if not isinstance(files, dict):
        return
    bad: list[str] = []
    for src in run.sources.values():
        p = Path(src)
        want = files.get(p.name)
        if not isinstance(want, dict) or not isinstance(want.get("sha256"), str):
            continue
        try:
            size = p.stat().st_size
            if isinstance(want.get("bytes"), int) and want["bytes"] != size:
                bad.append(f"{p.name} ({size} bytes, the manifest says {want['bytes']})")
            elif ((digests or {}).get(str(src)) or sha256_of(p)) != want["sha256"].lower():
                bad.append(f"{p.name} (SHA-256 differs)")
        except OSError as exc:
            bad.append(f"{p.name} ({exc.strerror or exc})")
    manifest = run.manifest or {}
    if manifest.get("complete") is False:  # a rank that failed may still have left a whole trace
        unlisted = sorted(Path(src).name for src in run.sources.values() if Path(src).name not in files)
        if unlisted:
            errs = manifest.get("errors")
            said = "; ".join(
                f"rank {e.get('rank')}: {str(e.get('message'))[:120]}"
                for e in (errs if isinstance(errs, list) else [])[:4]
                if isinstance(e, dict)
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
) -> None:
    """Notes on what the run lacks: manifest fields left out, ranks the manifest names but no file
    holds, names of trace files in a folder that are not files (a directory, a dangling link).
    `counts`: (events, duplicated GPU operations, stream overlaps, overlaps inside one graph replay)
    summed over the files, when the
    run's table is not there (the Dask engine's per-rank path)."""
    if run.sources:  # the engines that concatenate first (dask) meet the per-run limit here
        n_events = len(run.events) if counts is None else counts[0]
        check_run_events(n_events, list(run.sources.values())[-1], len(run.sources))
    dq = run.data_quality
    for key, note in getattr(run.manifest, "notes", []):
        dq.add(key, 1, note)
    _check_checksums(run, digests)
    _check_gpu_streams(run, None if counts is None else (counts[1], counts[2], counts[3]))
    wl = (run.manifest or {}).get("workload")
    tp = wl.get("tp") if isinstance(wl, dict) else None
    if isinstance(tp, int) and _int_in(tp, 1, MAX_TP):
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
        odd = sorted(c.name for c in p.iterdir() if _is_trace_name(c.name) and not c.is_file())
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


def _main(argv: list[str]) -> None:  # pragma: no cover - a debugging aid: python -m tracekit.read PATH
    run = read_run(argv, progress=True)
    print(run.events.groupby(["rank", "kind"], observed=True).size())


if __name__ == "__main__":  # pragma: no cover
    _main(sys.argv[1:])
