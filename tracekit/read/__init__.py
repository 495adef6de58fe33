"""Readers: trace files -> one `Run` (the event table of all ranks).

`read_run(paths)` takes files and/or folders (a run as users lay it out: tracekit's folders, a
torchrun profile folder, several nsys reports one per rank, HTA's `rank-N` files; the layouts and
the rank rules: `tracekit.read.run`). Each file goes to the reader registered for its suffix
(`READERS`): Kineto JSON -> `tracekit.read.kineto.read_kineto`, Nsight Systems SQLite (plain or
gzipped) -> `tracekit.read.nsys.read_nsys`.

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
