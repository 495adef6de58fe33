"""The `Export` document: tracekit export (a Perfetto / Chrome trace, tracekit.export.perfetto),
its `tracekitExport` header typed, its events as the trace format defines them
(docs/JSON.md#export)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc
from tracekit.model.documents.chrome import ExportHeaderObject


class TraceEvent(Doc, kw_only=True):
    """One Chrome-trace event: complete (X), metadata (M) or flow (s / f); `args` holds the
    event-table columns of the run's own events (rank, device, stream, correlation, kind, ...)."""

    ph: str
    cat: str | UnsetType = UNSET
    name: str
    id: int | UnsetType = UNSET
    pid: int
    tid: int
    ts: float | UnsetType = UNSET
    dur: float | UnsetType = UNSET
    bp: str | UnsetType = UNSET
    args: dict[str, int | float | str] | UnsetType = UNSET


class Export(Doc, kw_only=True):
    r"""`tracekit export PATHS -o OUT.json`: a Chrome-trace JSON document Perfetto opens, read back
    by `tracekit.read` (tracekit.read.export) into the event table it was made from.
    ```
    {"tracekitExport": {"format": "tracekit.perfetto", "version": 1,
                        "base_ns": ...,                 # ts / dur are microseconds (3 decimals) from base_ns
                        "sources": {"0": "rank-0.pt.trace.json.gz", ...},
                        "ranks": {"0": {...the trace's own metadata...}, ...},
                        "view": {"steps": 32, "wait": 80, ...}, "notes": [...]},
     "displayTimeUnit": "ns",
     "traceEvents": [ {"ph": "X", "cat": "kernel", "name": ..., "pid": rank, "tid": lane, "ts": ..., "dur": ...,
                       "args": {...}}, ... ]}
    ```
    """

    tracekitExport: ExportHeaderObject  # the one definition of the header (tracekit.model.documents.chrome)
    displayTimeUnit: str
    traceEvents: list[TraceEvent]
