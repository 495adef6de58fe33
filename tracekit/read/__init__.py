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

The pieces: `files` (which reader reads a file, which files of a folder are traces, one file read),
`run` (the files of one run read and put together), `manifests` (the capture manifest: bounded
load, checks, the typed document). The names below are the package's public API.
"""

from __future__ import annotations

from tracekit.read.files import READERS, find_trace_files, read_file
from tracekit.read.manifests import inside_run_folder, json_type, load_manifest
from tracekit.read.run import assemble_run, concat_runs, gpu_stream_counts, read_run

__all__ = [
    "READERS",
    "assemble_run",
    "concat_runs",
    "find_trace_files",
    "gpu_stream_counts",
    "inside_run_folder",
    "json_type",
    "load_manifest",
    "read_file",
    "read_run",
]
