"""Chrome-trace JSON that is not tracekit's own format: a Kineto (torch.profiler) trace as tracekit
edits it (the step markers a capture adds, the synthetic ranks the scale benchmark writes), and the
events of tracekit's Perfetto export as they are written and read back.

These are TypedDicts, not Structs: the document is the profiler's (or the trace format's), so every
key the file holds must survive a read and a write, in its order; a TypedDict names the keys
tracekit reads or writes and leaves the rest in the plain dict it is at run time. A value tracekit
does not look into (an event's `args` in a Kineto trace, a trace's own `distributedInfo` fields) is
`object`: whatever reads it narrows it first. The export's document is typed as a Struct too
(`tracekit.model.documents.export.Export`, docs/JSON.md#export), for its readers and the docs."""

from __future__ import annotations

from typing import TypedDict

#: the `args` tracekit writes on an export's events: event-table columns and view figures, each a
#: number or a name (docs/JSON.md#export)
ExportArgs = dict[str, int | float | str]


class KinetoEvent(TypedDict, total=False):
    """One event of a Kineto trace's `traceEvents`, the keys tracekit edits or adds."""

    ph: str
    cat: str
    name: str
    pid: int | str
    tid: int | str
    ts: float
    dur: float
    args: dict[str, object]


class DistributedInfo(TypedDict, total=False):
    """A Kineto trace's `distributedInfo`, the keys the synthetic ranks rewrite."""

    rank: int
    world_size: int
    pg_config: list[dict[str, object]]


class KinetoTrace(TypedDict, total=False):
    """A Kineto trace document (the profiler's JSON object), the keys tracekit edits."""

    distributedInfo: DistributedInfo
    traceEvents: list[KinetoEvent]


class ChromeEvent(TypedDict, total=False):
    """One event of tracekit's export: complete (X), metadata (M) or flow (s / t / f)."""

    ph: str
    cat: str
    name: str
    id: int
    pid: int
    tid: int
    ts: float
    dur: float
    bp: str
    args: ExportArgs


class ExportHeaderObject(TypedDict):
    """The export's `tracekitExport` object, as written, read and typed in the `Export` Struct."""

    format: str
    version: int
    base_ns: int
    sources: dict[str, str]
    #: per rank, the trace's own top-level metadata (Kineto's distributedInfo, deviceProperties,
    #: ...) as the profiler wrote it, less the reader's bookkeeping: its values are the profiler's
    #: own (unchecked, so `object`)
    ranks: dict[str, dict[str, object]]
    #: how many events of each tracekit view were added (steps, class, wait, transfer, path, flows, ...)
    view: dict[str, int]
    notes: list[str]


class ExportObject(TypedDict):
    """An export document as written and read (`Export`)."""

    tracekitExport: ExportHeaderObject
    displayTimeUnit: str
    traceEvents: list[ChromeEvent]
