"""The tables of an Nsight Systems SQLite export as `tracekit.read.nsys` reads them (docs/NSYS.md):
their names and enums, the header check, column lookups that hold across nsys versions, text cells
decoded defensively (`TextCells`), pids and thread ids from nsys' serialised ids, and one event
kind's columns before ranks are assigned (`KindPart`).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from tracekit.errors import TraceFormatError
from tracekit.model.events import DataQuality

# 4: every text cell decoded defensively (BLOB, invalid UTF-8); kernel launches without a kernel table

_SQLITE_MAGIC = b"SQLite format 3\x00"

T_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
T_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
T_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
T_RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
T_DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"
T_SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
#: Graph-level CUDA-graph tracing (nsys --cuda-graph-trace=graph): one row per graph execution, its
#: correlationId that of the cudaGraphLaunch (CUPTI's CUpti_ActivityGraphTrace).
T_GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
T_NVTX = "NVTX_EVENTS"
T_STRINGS = "StringIds"
EVENT_TABLES = (T_KERNEL, T_MEMCPY, T_MEMSET, T_RUNTIME, T_DRIVER, T_SYNC, T_NVTX, T_GRAPH)

#: NVTX_EVENTS.eventType codes (ENUM_NSYS_EVENT_TYPE in every export checked: 2024.5, 2025.3).
NVTX_MARK = 34
NVTX_PUSH_POP_RANGE = 59
NVTX_START_END_RANGE = 60
NVTX_DOMAIN_CREATE = 75
NVTX_CATEGORY = 33

#: CUpti_ActivityMemcpyKind -> Kineto's memcpyKindString (nsys copyKind uses the CUPTI numbering).
MEMCPY_KIND = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "HtoD",  # unified memory migrations (nsys-only kinds)
    12: "DtoH",
    13: "DtoD",
}
#: nsys ENUM_CUDA_MEM_KIND (NOT the CUPTI numbering: nsys starts at Pageable=0) -> Kineto's words.
MEMORY_KIND = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}
#: CUpti_ActivitySynchronizationType -> Kineto's syncTypeString (the `cuda_sync` event names).
SYNC_TYPE = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}

#: NCCL kernel / NVTX op token -> normalised collective (tracekit.model.events.COLLECTIVE_OPS).
NCCL_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "send_recv",
    "send": "send",
    "recv": "recv",
    "alltoall": "all_to_all",
    "gather": "gather",
    "scatter": "scatter",
}
NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_([A-Za-z]+)")
NCCL_NVTX = re.compile(r"^(?:nccl)?([A-Za-z]+)$")
RUNTIME_VERSION = re.compile(r"_v\d+$")
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_UINT32_MAX = 0xFFFFFFFF
NCCL_NVTX_DOMAIN = "NCCL"
#: API calls that run kernels on the device (after the `_v7000` version suffix is dropped): a
#: process that makes them has GPU activity records unless the export lost them
KERNEL_LAUNCH = re.compile(r"^cu(?:da)?(?:Launch\w*Kernel\w*|GraphLaunch\w*)$")


class TextCells:
    """Every text value of an export read defensively: TEXT cells through the connection's
    text_factory (invalid UTF-8 decoded with U+FFFD), BLOB / number cells where a text column holds
    them through `text` (a BLOB decoded the same way, a number as its digits, NULL as None); both
    counted for data quality. nsys writes UTF-8 TEXT; anything else is a damaged or hand-made export."""

    def __init__(self) -> None:
        self.invalid_utf8 = 0
        self.not_text = 0

    def decode(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.invalid_utf8 += 1
            return raw.decode("utf-8", "replace")

    def text(self, v: object) -> str | None:
        if v is None or v.__class__ is str:
            return v  # type: ignore[return-value]
        self.not_text += 1
        if isinstance(v, (bytes, bytearray, memoryview)):
            return self.decode(bytes(v))
        return str(v)

    def note(self, dq: DataQuality, name: str) -> None:
        if self.invalid_utf8:
            dq.add(
                "nsys_text_invalid_utf8",
                self.invalid_utf8,
                f"{name}: text cells that are not valid UTF-8 were read with U+FFFD for their bad bytes",
            )
        if self.not_text:
            dq.add(
                "nsys_text_not_text",
                self.not_text,
                f"{name}: cells of text columns (names, NVTX text, metadata) held a BLOB or a number; "
                "read as UTF-8 text (U+FFFD for bad bytes) or as the number's digits",
            )


# --------------------------------------------------------------------------------------------------
# reading


def check_sqlite_header(db: Path, shown: Path | None = None) -> None:
    """SQLite's magic at byte 0 of `db`; errors name `shown` (the file the user gave) when set."""
    name = shown or db
    try:
        with open(db, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise TraceFormatError(name, f"cannot read: {exc.strerror or exc}") from exc
    if len(head) == 0:
        raise TraceFormatError(name, "empty file, not an Nsight Systems SQLite export", offset=0)
    if head != _SQLITE_MAGIC:
        raise TraceFormatError(
            name,
            f"not a SQLite database (expected an `nsys export --type sqlite` file; header {head[:16]!r})",
            offset=0,
        )


def table_columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]


def col_or_default(cols: set[str], name: str, default: int) -> str:
    """A column of an nsys table, or `default` where this nsys version's export lacks it."""
    return f"COALESCE({name}, {default})" if name in cols else str(int(default))


def pid_sql(cols: set[str]) -> str:
    """The serialised globalPid; from a plain `processId` column (pid << 24) where an export has
    that instead; -1 (filled from the API call of the same correlationId by `_PidByCorrelation`)
    where it has neither."""
    if "globalPid" in cols:
        return "globalPid"
    if "processId" in cols:
        return "(COALESCE(processId, 0) << 24)"
    return "-1"


class PidByCorrelation:
    """GPU records of an export without a process column (globalPid -1): each takes the process of
    the runtime or driver call with its correlationId. Correlation ids count per process, so two
    processes can both hold one: the call that started last before the record did wins. Where no call
    matches: the only process with API calls (if there is exactly one), else 0."""

    def __init__(self, con: sqlite3.Connection, tables: set[str]):
        self.con, self.tables = con, tables
        self.by_pid: dict[int, tuple[np.ndarray, np.ndarray]] | None = None

    def _load(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        rows = []
        for t in (T_RUNTIME, T_DRIVER):
            if t in self.tables and {"correlationId", "globalTid"} <= set(table_columns(self.con, t)):
                rows.append(
                    int_matrix(
                        self.con,
                        f"SELECT correlationId, globalTid, start FROM {t} WHERE correlationId >= 0",
                        3,
                    )
                )
        m = np.concatenate(rows) if rows else np.empty((0, 3), np.int64)
        gpid = (m[:, 1] >> 24) << 24
        out = {}
        for g in np.unique(gpid).tolist():
            sel = m[gpid == g]
            order = np.lexsort((sel[:, 2], sel[:, 0]))
            out[int(g)] = (sel[order, 0], sel[order, 2])
        return out

    def fill(self, m: np.ndarray) -> np.ndarray:
        """Rows start, end, deviceId, streamId, correlationId, globalPid, ...: globalPid -1 filled."""
        miss = m[:, 5] == -1
        if not miss.any():
            return m
        if self.by_pid is None:
            self.by_pid = self._load()
        fallback = next(iter(self.by_pid)) if len(self.by_pid) == 1 else 0
        c, t0, dev = m[miss, 4], m[miss, 0], m[miss, 2]
        best_t = np.full(len(c), np.iinfo(np.int64).min)
        got = np.full(len(c), fallback, np.int64)
        matches: dict[int, np.ndarray] = {}
        for g, (corr, start) in self.by_pid.items():
            if not len(corr):
                continue
            # the last call of this process with that correlationId (sorted by id, then start)
            i = np.searchsorted(corr, c, side="right") - 1
            ok = (i >= 0) & (corr[np.clip(i, 0, None)] == c)
            matches[g] = ok
            launch = np.where(ok, start[np.clip(i, 0, None)], np.iinfo(np.int64).min)
            better = ok & (launch <= t0) & (launch > best_t)
            best_t = np.where(better, launch, best_t)
            got = np.where(better, g, got)
        # a device serves one process in a TP run: where most of a device's records chose one
        # process (>= 90%), its records that process also has a call for take it
        for d in np.unique(dev).tolist():
            on = dev == d
            vals, counts = np.unique(got[on], return_counts=True)
            top = int(vals[counts.argmax()])
            if top in matches and counts.max() >= 0.9 * on.sum():
                got = np.where(on & matches[top], top, got)
        m = m.copy()
        m[miss, 5] = got
        return m


def gpu_ids(cols: set[str]) -> str:
    """deviceId, streamId, correlationId, globalPid of a GPU activity table, tolerant of the columns
    an export lacks (nsys versions differ: older and newer schemas add and drop columns)."""
    return ", ".join(
        [
            col_or_default(cols, "deviceId", -1),
            col_or_default(cols, "streamId", -1),
            col_or_default(cols, "correlationId", -1),
            pid_sql(cols),
        ]
    )


def gpu_part(kind: str, m: np.ndarray, names: np.ndarray, **extra: np.ndarray) -> KindPart:
    """A GPU activity part from rows whose first six columns are
    start, end, deviceId, streamId, correlationId, globalPid (kernels, memcpy, memset)."""
    columns = {
        "device": m[:, 2],
        "stream": stream_ids(m[:, 3]),
        "name": names,
        "start_ns": m[:, 0],
        "end_ns": m[:, 1],
        "correlation": m[:, 4],
        **extra,
    }
    return KindPart(kind, os_pid(m[:, 5]), columns)


def int_matrix(con: sqlite3.Connection, sql: str, ncols: int, dq: DataQuality | None = None) -> np.ndarray:
    """Rows of an all-integer query (NULLs coalesced in SQL) as an (n, ncols) int64 array. Rows
    holding anything but an int64 (text, NULL, REAL, a value >= 2**63) are left out, counted in `dq`."""
    rows = con.execute(sql).fetchall()
    if not rows:
        return np.empty((0, ncols), dtype=np.int64)
    try:
        return np.array(rows, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        good, bad = rows_with_ints(rows, range(ncols), ())
        if dq is not None:
            table = m.group(1) if (m := re.search(r"\bFROM\s+(\w+)", sql)) else "?"
            note_bad_rows(dq, table, bad)
        return np.array(good, dtype=np.int64) if good else np.empty((0, ncols), dtype=np.int64)


def is_int64(v: object) -> bool:
    return v.__class__ is int and -(2**63) <= v <= 2**63 - 1  # type: ignore[operator]


def rows_with_ints(rows: list[Any], required: Any, nullable: Any) -> tuple[list[Any], int]:
    """The rows whose `required` columns hold int64 values and `nullable` columns int64 or NULL;
    and how many were left out."""
    req, nul = tuple(required), tuple(nullable)
    good = [
        r
        for r in rows
        if all(is_int64(r[i]) for i in req) and all(r[i] is None or is_int64(r[i]) for i in nul)
    ]
    return good, len(rows) - len(good)


def note_bad_rows(dq: DataQuality, table: str, bad: int) -> None:
    if bad:
        dq.add(
            "nsys_rows_bad_values",
            bad,
            "rows holding text, NULL, a real number or a value beyond int64 where an integer belongs "
            f"(times, ids) were left out ({table})",
        )


def lookup_strings(strings: dict[int, str], ids: np.ndarray, dq: DataQuality, what: str) -> np.ndarray:
    """StringIds ids -> object array of strings, one dictionary lookup per distinct id."""
    if len(ids) == 0:
        return np.empty(0, dtype=object)
    uniq, inv = np.unique(ids, return_inverse=True)
    vals = np.empty(len(uniq), dtype=object)
    missing = 0
    for i, sid in enumerate(uniq.tolist()):
        s = strings.get(sid)
        if s is None:
            missing += int((inv == i).sum())
            s = ""
        vals[i] = s
    if missing:
        dq.add(
            "nsys_missing_string_id",
            missing,
            f"{missing} {what} name ids not found in StringIds (left blank)",
        )
    return vals[inv]


def os_pid(global_id: np.ndarray) -> np.ndarray:
    """nsys serialised globalTid / globalPid -> OS pid: (id >> 24) & 0xFFFFFF (NVIDIA's export docs:
    `globalTid / 0x1000000 % 0x1000000 AS PID`, `globalTid % 0x1000000 AS TID`)."""
    return (global_id >> 24) & 0xFFFFFF


def os_tid(global_tid: np.ndarray) -> np.ndarray:
    return global_tid & 0xFFFFFF


def stream_ids(raw: np.ndarray) -> np.ndarray:
    out = raw.copy()
    out[(raw == _UINT32_MAX) | (raw < 0)] = -1
    return out


class KindPart:
    """Columns of one event kind, before ranks are assigned (`pid` decides the rank)."""

    def __init__(self, kind: str, pid: np.ndarray, cols: dict[str, np.ndarray]):
        self.kind = kind
        self.pid = pid
        self.cols = cols


def nccl_ops_of(names: np.ndarray, pattern: re.Pattern[str]) -> tuple[np.ndarray, np.ndarray]:
    """(coll_name, coll_op) per name for NCCL names, "" elsewhere; regex once per distinct name."""
    coll_name = np.full(len(names), "", dtype=object)
    coll_op = np.full(len(names), "", dtype=object)
    if len(names) == 0:
        return coll_name, coll_op
    uniq, inv = np.unique(names.astype(str), return_inverse=True)
    for i, name in enumerate(uniq.tolist()):
        m = pattern.match(name)
        if not m:
            continue
        token = m.group(1)
        op = NCCL_OPS.get(token.lower(), "")
        mask = inv == i
        coll_name[mask] = token
        coll_op[mask] = op
    return coll_name, coll_op
