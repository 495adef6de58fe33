"""Reader of tracekit's own Perfetto export (`tracekit export --perfetto`, tracekit.export.perfetto).

An export is a Chrome-trace JSON document whose first key is `tracekitExport`: every rank's events
as complete (X) events carrying their event-table columns in `args` (rank, device, stream,
correlation, kind, the collective columns), plus the tracekit view (step windows, GPU classes,
collective wait / transfer, the critical path; `cat` starting with "tracekit"). This reader gives
back the event table the export was made from, all ranks of the one file, and leaves the view out
(counted in data_quality). `read_run` sends a `.json` / `.json.gz` file here when it starts with
`{"tracekitExport"` (`is_export`); any other Chrome trace goes to the Kineto reader.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson

from tracekit.errors import RankError, TraceFormatError
from tracekit.model.documents.chrome import ExportObject
from tracekit.model.events import COLUMNS, DataQuality, Run, make_events
from tracekit.read.limits import current_limits, describe_bytes

READER_VERSION = "tracekit-export-1"
MAGIC = b'{"tracekitExport"'
#: `cat` prefix of the events tracekit adds (not events of the run)
VIEW_CAT_PREFIX = "tracekit"

_INT_COLS = {c for c, t in COLUMNS.items() if t != "category"}


def is_export(path: str | os.PathLike[str]) -> bool:
    """The file starts with `{"tracekitExport"` (gzipped or not): a tracekit export."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(2)
        opener: Any = gzip.open if head == b"\x1f\x8b" else open
        with opener(p, "rb") as f:
            return bool(f.read(len(MAGIC)) == MAGIC)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):  # damaged gzip: not an export
        return False


def _load(p: Path) -> ExportObject:
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # inflated at most --max-bytes (a gzip bomb is refused, not held)
            limit = current_limits().max_bytes
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(limit + 1)
            if len(raw) > limit:
                raise TraceFormatError(
                    p, f"more than {describe_bytes(limit)} once decompressed: the limit (--max-bytes)"
                )
        doc = orjson.loads(raw)
    except OSError as exc:
        raise TraceFormatError(p, f"cannot read: {exc.strerror or exc}") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(p, f"truncated or damaged gzip stream ({exc})") from None
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(p, f"not valid JSON ({exc.msg})", offset=exc.pos) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceFormatError(p, "a tracekit export without a traceEvents array")
    return cast("ExportObject", doc)  # events that are not objects are skipped where they are read


def read_export(path: str | os.PathLike[str], *, rank: int | None = None) -> Run:
    """The event table a tracekit export was made from (module doc). `rank` relabels an export of
    one rank; RankError for an export of several."""
    p = Path(path)
    doc = _load(p)
    meta = doc.get("tracekitExport") or {}
    base = int(meta.get("base_ns", 0))
    dq = DataQuality()
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    view = 0
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        if str(e.get("cat", "")).startswith(VIEW_CAT_PREFIX):
            view += 1
            continue
        a = e.get("args") or {}
        start = base + int(round(float(e["ts"]) * 1000.0))
        cols["start_ns"].append(start)
        cols["end_ns"].append(start + int(round(float(e.get("dur", 0)) * 1000.0)))
        cols["name"].append(str(e.get("name", "")))
        for c in COLUMNS:
            if c in ("start_ns", "end_ns", "name"):
                continue
            v = a.get(c)
            cols[c].append((-1 if v is None else int(v)) if c in _INT_COLS else ("" if v is None else str(v)))
    if not cols["rank"]:
        raise TraceFormatError(p, "a tracekit export with no events of the run")
    ranks = sorted(set(cols["rank"]))
    if rank is not None:
        if len(ranks) > 1:
            raise RankError(f"{p}: this export holds ranks {ranks}; rank= applies to an export of one rank")
        cols["rank"] = [rank] * len(cols["rank"])
        ranks = [rank]
    if view:
        dq.add(
            "tracekit_view_events_skipped",
            view,
            f"{p.name}: the tracekit view of the export (steps, GPU classes, collective wait/transfer, critical "
            "path) was left out: it is not events of the run",
        )
    events = make_events({c: np.asarray(v) if c in _INT_COLS else v for c, v in cols.items()})
    info_of = meta.get("ranks") or {}
    rank_info = {
        r: {
            **(info_of.get(str(r)) or {}),
            "source": str(p),
            "reader": READER_VERSION,
            "rank_source": "export",
        }
        for r in ranks
    }
    return Run(events=events, sources={r: str(p) for r in ranks}, rank_info=rank_info, data_quality=dq)
