"""The one event model every reader produces (docs/METHOD.md section Events).

An event table is a pandas DataFrame with exactly the columns in `COLUMNS`, in that order and with
those dtypes. One row per event. Times are integer nanoseconds on one clock per host (readers keep
every nanosecond the source has; Kineto's fractional microseconds are not rounded).

Conventions:
- `device` is the GPU ordinal for GPU activity and -1 for host-side events.
- `stream` is the CUDA stream for GPU activity and the host thread id for host events.
- Missing integers are -1, missing strings are "" (never NaN), so columns stay integer-typed.
- `name` and the other string columns are pandas categoricals: names are interned once per table.
- Collective columns are filled on the events that carry collective metadata (NCCL kernels,
  `record_param_comms` / `c10d::` / `gloo:` CPU ops); empty elsewhere.
  `coll_in_bytes` / `coll_out_bytes` are the per-rank input / output message sizes in bytes
  (nelems x dtype size, or the trace's own byte count where only that is given).
- `coll_op` is the normalised collective: one of COLLECTIVE_OPS, or "" when unknown / not one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.model.documents.base import Documented
from tracekit.model.documents.breakdown import BreakdownDataQuality
from tracekit.model.documents.manifest import Manifest
from tracekit.model.ops import COLLECTIVE_OPS as COLLECTIVE_OPS  # (the `coll_op` values: ops.py, no pandas)

#: Event kinds (the `kind` column).
KINDS: tuple[str, ...] = (
    "kernel",  # GPU kernel
    "memcpy",  # GPU memcpy (any direction)
    "memset",  # GPU memset
    "runtime",  # CUDA/HIP runtime or driver API call on the host
    "sync",  # host blocked on the device: cuda_sync events, *Synchronize runtime calls (readers may
    # emit these as kind "runtime"; the classifier decides what blocks)
    "cpu_op",  # framework operator on the host (aten::, c10d::, gloo: ...)
    "annotation",  # user range on the host: record_function, NVTX push/pop, ProfilerStep#N
    "gpu_annotation",  # user range projected on a GPU stream (Kineto gpu_user_annotation)
    "other",  # anything else the reader kept (python_function, overhead, ...)
)

#: Column name -> dtype. The order is the table's column order.
COLUMNS: dict[str, str] = {
    "rank": "int32",
    "device": "int32",
    "stream": "int64",
    "kind": "category",
    "name": "category",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "coll_name": "category",  # raw collective name as the trace says it ("allreduce", "_allgather_base")
    "coll_op": "category",  # normalised, see COLLECTIVE_OPS
    "coll_in_bytes": "int64",
    "coll_out_bytes": "int64",
    "coll_dtype": "category",
    "coll_group_size": "int32",
    "coll_pg_name": "category",
    "coll_pg_ranks": "category",  # as the trace writes it, e.g. "[0, 1]"
    "coll_seq": "int64",
}

_INT_MISSING = -1
_STR_MISSING = ""


def empty_events() -> pd.DataFrame:
    """An event table with no rows and the right columns and dtypes."""
    return make_events({c: [] for c in COLUMNS})


def make_events(columns: Mapping[str, Any], n: int | None = None) -> pd.DataFrame:
    """Build a well-typed event table from a mapping of column -> sequence/array.

    Columns that are absent are filled with their missing value (-1 or ""). `n` is the row count
    when no column is given. Raises ValueError on unknown columns or ragged lengths.
    """
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown event columns: {sorted(unknown)}")
    lengths = {len(v) for v in columns.values()}
    if n is not None:
        lengths.add(n)
    if len(lengths) > 1:
        raise ValueError(f"event columns have different lengths: {sorted(lengths)}")
    rows = lengths.pop() if lengths else 0
    data: dict[str, pd.Categorical | np.ndarray] = {}
    for col, dtype in COLUMNS.items():
        if col in columns:
            values = columns[col]
        elif dtype == "category":
            values = np.full(rows, _STR_MISSING, dtype=object)
        else:
            values = np.full(rows, _INT_MISSING, dtype=dtype)
        if dtype == "category":
            data[col] = pd.Categorical(
                values if isinstance(values, pd.Categorical) else np.asarray(values, dtype=object)
            )
        else:
            data[col] = np.asarray(values, dtype=dtype)
    # copy=False: one block per column, no consolidation into 2-D blocks (which copies every
    # column and took ~0.7 s for 5 M rows); the columns are the arrays built above.
    df = pd.DataFrame(data, columns=list(COLUMNS), copy=False)
    return df


def check_events(df: pd.DataFrame) -> None:
    """Raise ValueError when `df` is not a valid event table (columns, dtypes, end >= start)."""
    if list(df.columns[: len(COLUMNS)]) != list(COLUMNS):
        raise ValueError(f"event table columns {list(df.columns)} != {list(COLUMNS)}")
    for col, dtype in COLUMNS.items():
        if str(df[col].dtype) != dtype:
            raise ValueError(f"event column {col!r} has dtype {df[col].dtype}, expected {dtype}")
    bad = int((df["end_ns"] < df["start_ns"]).sum())
    if bad:
        raise ValueError(f"{bad} events end before they start")


@dataclass
class DataQuality(Documented):
    """What a reader or analysis skipped or found suspicious, with counts. Nothing is dropped silently.

    `counts` maps a short, stable key (e.g. "events_without_ts", "unknown_kernel") to a count;
    `notes` holds human sentences for the report.
    """

    counts: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def add(self, key: str, count: int = 1, note: str | None = None) -> None:
        if count:
            self.counts[key] += count
        if note and note not in self.notes:
            self.notes.append(note)

    def add_rows(self, key: str, rows: np.ndarray, note: str) -> None:
        """The rows a boolean mask marks, counted under `key` with `note`, when it marks any (a
        reader's "these events were skipped")."""
        n = int(np.count_nonzero(rows))
        if n:
            self.add(key, n, note)

    def merge(self, other: DataQuality) -> DataQuality:
        self.counts.update(other.counts)
        for note in other.notes:
            if note not in self.notes:
                self.notes.append(note)
        return self

    def document(self) -> BreakdownDataQuality:
        """The `data_quality` object of a document: counts by key (sorted), the notes in order."""
        return BreakdownDataQuality(counts=dict(sorted(self.counts.items())), notes=list(self.notes))

    to_dict = Documented.to_json  # the data_quality object as plain JSON values


@dataclass
class Run:
    """All ranks of one run: the event table plus what was learned about each rank's file.

    - `events`: the event table (see module doc); all ranks in one table, `rank` column set.
    - `sources`: rank -> the file it came from.
    - `rank_info`: rank -> what the reader learned of its file, JSON-serialisable: the trace's own
      top-level metadata as the profiler wrote it (Kineto's distributedInfo, deviceProperties,
      baseTimeNanoseconds, ...; nsys' session start and version) beside the reader's keys (source,
      reader, rank_source, session_shift_ns, ...). The values are the file's, unchecked (`object`):
      whatever reads one narrows it (`tracekit.analyse.collectives.groups.world_size`).
    - `data_quality`: counts of skipped / suspicious things, over all files.
    - `manifest`: the capture manifest (manifest.json beside the traces) when there is one, as its
      typed document (`tracekit.read.manifests.read_manifest`; a Run built in code: `manifest_from_json`).
    """

    events: pd.DataFrame
    sources: dict[int, str] = field(default_factory=dict)
    rank_info: dict[int, dict[str, object]] = field(default_factory=dict)
    data_quality: DataQuality = field(default_factory=DataQuality)
    manifest: Manifest | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.sources) if self.sources else sorted(int(r) for r in self.events["rank"].unique())


class RunFields:
    """The run's own fields read through `self.run`, for a class that wraps a `Run` (the analysed
    run, the API's `TraceRun`) and reads as that run where only these are needed."""

    run: Run

    @property
    def events(self) -> pd.DataFrame:
        """The event table (columns `COLUMNS`; `cls`, `subclass`, `rule` once classified)."""
        return self.run.events

    @property
    def ranks(self) -> list[int]:
        return self.run.ranks

    @property
    def manifest(self) -> Manifest | None:
        """The capture manifest, typed (docs/JSON.md#manifest); None without one."""
        return self.run.manifest

    @property
    def data_quality(self) -> DataQuality:
        return self.run.data_quality
