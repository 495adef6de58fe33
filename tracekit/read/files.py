"""Trace files: which reader reads a file (`READERS`, by suffix), which files of a folder are traces
(`find_trace_files`), and one file read as a `Run` (`read_file`, through the Parquet cache).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracekit.errors import NoTracesError
from tracekit.model.events import Run
from tracekit.read import cache as cache_mod
from tracekit.read import export
from tracekit.read.kineto import check_rank_argument
from tracekit.read.manifests import ManifestRead, read_manifest

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


def reader_for(path: Path) -> tuple[Callable[..., Run], str] | None:
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):  # tracekit's own Perfetto export: all its ranks, exactly
        if export.is_export(path):
            return export.read_export, export.READER_VERSION
    for suffix, target in READERS.items():
        if name.endswith(suffix):
            mod_name, func_name = target.split(":")
            mod = importlib.import_module(mod_name)
            version = str(getattr(mod, "READER_VERSION", mod_name))
            return getattr(mod, func_name), version
    return None


def is_trace_name(name: str) -> bool:
    low = name.lower()
    return low not in _NOT_TRACES and any(low.endswith(s) for s in READERS) and not low.startswith(".")


def _traces_in(folder: Path) -> list[Path]:
    """The trace files of one folder, sorted; a `.nsys-rep` whose `.sqlite` export lies beside it
    is left out (the export is read instead, once)."""
    found = sorted(c for c in folder.iterdir() if c.is_file() and is_trace_name(c.name))
    names = {c.name.lower() for c in found}

    def exported_beside(name: str) -> bool:
        low = name.lower()
        return any(
            low.endswith(ext) and low[: -len(ext)] + ".sqlite" in names for ext in (".nsys-rep", ".qdrep")
        )

    return [c for c in found if not exported_beside(c.name)]


def find_trace_files(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Path], ManifestRead | None]:
    """Expand files and folders into trace files (sorted per folder) and the first manifest found
    (read: its typed document and the notes on what was left out)."""
    files: list[Path] = []
    manifest: ManifestRead | None = None
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = _traces_in(p)
            subs = sorted(c for c in p.iterdir() if c.is_dir())
            runs = [c.name for c in subs if (c / "manifest.json").is_file()]
            if runs and not (p / "manifest.json").is_file():
                # the folder a user keeps runs in (runs/, traces/, a study's output), not a run: its
                # own JSON files (results, probes) would be read as traces or its runs as ranks
                shown = ", ".join(runs[:4]) + (f" and {len(runs) - 4} more" if len(runs) > 4 else "")
                raise NoTracesError(
                    f"{p}: a folder of runs ({shown}: each has its manifest.json), not one run: give one of them"
                )
            if not found:  # HTA's layout: one subfolder per rank (rank-0/, rank-1/, ...)
                found = [f for sub in subs for f in _traces_in(sub)]
            mf = p / "manifest.json"
            if manifest is None and mf.is_file():
                manifest = read_manifest(mf)
            if not found:
                raise NoTracesError(
                    f"{p}: no trace files in this folder (expected *.json, *.json.gz, *.pt.trace.json.gz, *.sqlite, "
                    "*.sqlite.gz, *.nsys-rep or *.qdrep)"
                )
            files.extend(found)
        elif p.is_file():
            if reader_for(p) is None:
                raise NoTracesError(
                    f"{p}: not a trace file (expected .json, .json.gz, .sqlite, .sqlite.gz, .nsys-rep or .qdrep)"
                )
            files.append(p)
            mf = p.parent / "manifest.json"
            if manifest is None and p.name != "manifest.json" and mf.is_file():
                manifest = read_manifest(mf)
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
    p = Path(path)
    found = reader_for(p)
    if found is None:
        raise NoTracesError(
            f"{p}: not a trace file (expected .json, .json.gz, .sqlite, .sqlite.gz, .nsys-rep or .qdrep)"
        )
    if rank is not None:
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


def read_worker(args: tuple[str, int | None, bool]) -> Run:
    path, rank, cache = args
    return read_file(path, rank=rank, cache=cache)
