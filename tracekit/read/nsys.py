"""Nsight Systems reader: an `nsys export --type sqlite` database -> the event table (docs/NSYS.md).

`read_nsys(path, rank=None)` reads a `.sqlite` export (or a `.sqlite.gz`, decompressed once into
the cache folder of `tracekit.read.cache`, keyed by path + size + mtime; or a `.nsys-rep`, exported
first with the `nsys` binary found on PATH or in the `NSYS` variable) with the standard library's
sqlite3, one query per table, straight into numpy columns. No torch.

What becomes rows (kind):
- CUPTI_ACTIVITY_KIND_KERNEL -> kernel; name = demangledName (as Kineto shows it), else shortName,
  else mangledName; NCCL kernels get `coll_name` / `coll_op` from their name.
- CUPTI_ACTIVITY_KIND_MEMCPY / _MEMSET -> memcpy / memset, named as Kineto names them
  ("Memcpy HtoD (Pageable -> Device)", "Memset (Device)"); bytes are totalled in `rank_info`.
- CUPTI_ACTIVITY_KIND_RUNTIME (+ _DRIVER where present) -> runtime; the `_v3020`-style version
  suffix is dropped ("cudaDeviceSynchronize_v3020" -> "cudaDeviceSynchronize", Kineto's name).
- CUPTI_ACTIVITY_KIND_SYNCHRONIZATION -> sync, named like Kineto's `cuda_sync` events
  ("Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync").
- NVTX_EVENTS push/pop (eventType 59) and start/end (60) ranges -> annotation on the host thread;
  marks (34) are counted, not rows; domain names come from the NvtxDomainCreate rows (75).

Times stay as nsys writes them: integer ns since the session start (one clock for every process of
one report); the session start (UTC ns) is in `rank_info[r]["session_start_utc_ns"]`.
Ranks: the `rank` argument, else `rank-N` / `rankN` in the file name, else `RANK=` in the profiled
environment, else 0; a report holding several CUDA processes gives one rank per process, by pid.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tracekit.errors import RankError, TraceFormatError
from tracekit.model.events import COLUMNS, DataQuality, Run, make_events
from tracekit.read.limits import ENV_MAX_BYTES, ENV_MAX_EVENTS, current_limits, describe_bytes

#: Bumped when the reader's output changes (keys the Parquet cache of tracekit.read).
READER_VERSION = "nsys-4"  # nsys-2: ranks are the processes with GPU activity; 3: graph-level trace rows
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
_NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl(?:Dev)?Kernel_([A-Za-z]+)")
_NCCL_NVTX = re.compile(r"^(?:nccl)?([A-Za-z]+)$")
_RUNTIME_VERSION = re.compile(r"_v\d+$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_UINT32_MAX = 0xFFFFFFFF
NCCL_NVTX_DOMAIN = "NCCL"
#: API calls that run kernels on the device (after the `_v7000` version suffix is dropped): a
#: process that makes them has GPU activity records unless the export lost them
_KERNEL_LAUNCH = re.compile(r"^cu(?:da)?(?:Launch\w*Kernel\w*|GraphLaunch\w*)$")


class _TextCells:
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
# public API


def read_nsys(path: str | os.PathLike[str], *, rank: int | None = None) -> Run:
    """Read an Nsight Systems SQLite export (or a `.nsys-rep`, exported first) into a `Run`.

    `rank` names the rank of a one-process report; without it the rank comes from the file name
    (`rank-3`, `rank3`), else from `RANK=` in the profiled environment, else 0 (noted in
    data_quality). A report with several CUDA processes yields one rank per process, in pid order.
    Raises TraceFormatError (not SQLite, not an nsys export, no events) or RankError.
    """
    given = Path(path)
    scratch: Path | None = None
    if given.name.lower().endswith(".sqlite.gz"):
        db, scratch = decompress_sqlite(given)
    elif given.suffix in (".nsys-rep", ".qdrep"):
        db = export_sqlite(given)
    else:
        db = given
    try:
        _check_header(db, given if db != given else None)
        try:
            con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise TraceFormatError(given, f"cannot open as SQLite: {exc}") from exc
        try:
            return _read(con, db, given, rank)
        except sqlite3.DatabaseError as exc:
            raise TraceFormatError(given, f"SQLite error while reading: {exc}") from exc
        except (TypeError, ValueError, OverflowError) as exc:  # a value of a type no export writes
            raise TraceFormatError(
                given, f"a column holds a value of the wrong type or range ({exc})"
            ) from None
        finally:
            con.close()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def decompress_sqlite(gz: Path) -> tuple[Path, Path | None]:
    """The SQLite database inside `gz` (a gzipped export), decompressed once into the cache folder
    (`tracekit.read.cache.cache_dir_for`: --cache-dir / $TRACEKIT_CACHE_DIR, else
    $XDG_CACHE_HOME/tracekit; never beside the file) as `<stem>-<path hash>-<size+mtime hash>.sqlite`; a copy of an older
    version of the same path is removed. Written to a temporary name and renamed. With the cache
    off (TRACEKIT_NO_CACHE) or nowhere writable, into a temporary folder, returned second so the
    caller removes it. TraceFormatError when the file is not gzip or is truncated."""
    from tracekit.read import cache as cache_mod

    try:
        st = gz.stat()
        with open(gz, "rb") as fh:
            magic = fh.read(2)
    except OSError as exc:
        raise TraceFormatError(gz, f"cannot read: {exc.strerror or exc}") from exc
    if magic != b"\x1f\x8b":
        raise TraceFormatError(gz, f"not a gzip file (header {magic!r})", offset=0)
    resolved = str(gz.resolve())
    path_key = hashlib.sha1(resolved.encode()).hexdigest()[:12]
    version_key = hashlib.sha1(f"{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:8]
    stem = gz.name[: -len(".sqlite.gz")][:60] or "nsys"
    folder = cache_mod.cache_dir_for(gz) if cache_mod.cache_enabled() else None
    scratch = None
    if folder is None:
        scratch = Path(tempfile.mkdtemp(prefix="tracekit-nsys-"))
        folder = scratch
    target = folder / f"{stem}-{path_key}-{version_key}.sqlite"
    if target.is_file():
        return target, scratch
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".sqlite", dir=folder)
    max_bytes = current_limits().max_bytes
    written = 0
    try:
        with os.fdopen(fd, "wb") as out, open(gz, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as src:
            while True:
                try:
                    chunk = src.read(1 << 22)
                except (OSError, EOFError, zlib.error) as exc:
                    raise TraceFormatError(
                        gz, f"gzip data is corrupt or truncated ({exc})", offset=raw.tell()
                    ) from None
                if not chunk:
                    break
                written += len(chunk)
                if written > max_bytes:
                    raise TraceFormatError(
                        gz,
                        f"more than {describe_bytes(max_bytes)} once decompressed: the limit on decompressed "
                        f"bytes (--max-bytes or {ENV_MAX_BYTES}; raise it to read this file)",
                        offset=raw.tell(),
                    )
                try:
                    out.write(chunk)
                except OSError as exc:  # the cache folder is full or gone
                    raise TraceFormatError(
                        gz, f"cannot decompress into {folder}: {exc.strerror or exc}"
                    ) from None
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    for old in folder.glob(f"{stem}-{path_key}-*.sqlite"):
        if old != target:
            try:
                old.unlink()
            except OSError:
                pass
    return target, scratch


def find_nsys() -> str | None:
    """The `nsys` binary: $NSYS (a file, or a folder holding `nsys`), else `nsys` on PATH."""
    env = os.environ.get("NSYS")
    if env:
        p = Path(env)
        if p.is_dir():
            p = p / "nsys"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which("nsys")


def export_sqlite(rep: Path) -> Path:
    """The SQLite export of `rep` (a `.nsys-rep`): `X.sqlite` next to it when that exists and is not
    older than the report, else made with `nsys export --type sqlite` (next to the report, or in
    $XDG_CACHE_HOME/tracekit/nsys when that folder is not writable). Written to a temporary name
    and renamed. TraceFormatError when the report is missing or no `nsys` is found."""
    if not rep.is_file():
        raise TraceFormatError(rep, "no such file")
    beside = rep.with_suffix(".sqlite")
    rep_mtime = rep.stat().st_mtime
    if beside.is_file() and beside.stat().st_mtime >= rep_mtime:
        return beside
    if os.access(rep.parent, os.W_OK):
        target = beside
    else:
        st = rep.stat()
        key = hashlib.sha1(f"{rep.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit" / "nsys"
        target = cache / f"{rep.stem}-{key}.sqlite"
        if target.is_file():
            return target
    nsys = find_nsys()
    if nsys is None:
        raise TraceFormatError(
            rep,
            "is an Nsight Systems report and no `nsys` was found (PATH or the NSYS variable); "
            f"export it first: nsys export --type sqlite -o {beside.name} {rep.name}",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.stem}.tmp-{os.getpid()}.sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "-o", str(tmp), str(rep)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TraceFormatError(rep, f"`{' '.join(cmd)}` failed: {exc}") from exc
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        raise TraceFormatError(rep, f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {' | '.join(tail)}")
    os.replace(tmp, target)
    return target


# --------------------------------------------------------------------------------------------------
# reading


def _check_header(db: Path, shown: Path | None = None) -> None:
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


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]


def _col(cols: set[str], name: str, default: int) -> str:
    """A column of an nsys table, or `default` where this nsys version's export lacks it."""
    return f"COALESCE({name}, {default})" if name in cols else str(int(default))


def _pid_sql(cols: set[str]) -> str:
    """The serialised globalPid; from a plain `processId` column (pid << 24) where an export has
    that instead; -1 (filled from the API call of the same correlationId by `_PidByCorrelation`)
    where it has neither."""
    if "globalPid" in cols:
        return "globalPid"
    if "processId" in cols:
        return "(COALESCE(processId, 0) << 24)"
    return "-1"


class _PidByCorrelation:
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
            if t in self.tables and {"correlationId", "globalTid"} <= set(_columns(self.con, t)):
                rows.append(
                    _int_matrix(
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


def _gpu_ids(cols: set[str]) -> str:
    """deviceId, streamId, correlationId, globalPid of a GPU activity table, tolerant of the columns
    an export lacks (nsys versions differ: older and newer schemas add and drop columns)."""
    return ", ".join(
        [
            _col(cols, "deviceId", -1),
            _col(cols, "streamId", -1),
            _col(cols, "correlationId", -1),
            _pid_sql(cols),
        ]
    )


def _gpu_part(kind: str, m: np.ndarray, names: np.ndarray, **extra: np.ndarray) -> _Part:
    """A GPU activity part from rows whose first six columns are
    start, end, deviceId, streamId, correlationId, globalPid (kernels, memcpy, memset)."""
    columns = {
        "device": m[:, 2],
        "stream": _stream(m[:, 3]),
        "name": names,
        "start_ns": m[:, 0],
        "end_ns": m[:, 1],
        "correlation": m[:, 4],
        **extra,
    }
    return _Part(kind, _pid(m[:, 5]), columns)


def _int_matrix(con: sqlite3.Connection, sql: str, ncols: int, dq: DataQuality | None = None) -> np.ndarray:
    """Rows of an all-integer query (NULLs coalesced in SQL) as an (n, ncols) int64 array. Rows
    holding anything but an int64 (text, NULL, REAL, a value >= 2**63) are left out, counted in `dq`."""
    rows = con.execute(sql).fetchall()
    if not rows:
        return np.empty((0, ncols), dtype=np.int64)
    try:
        return np.array(rows, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        good, bad = _rows_with_ints(rows, range(ncols), ())
        if dq is not None:
            table = m.group(1) if (m := re.search(r"\bFROM\s+(\w+)", sql)) else "?"
            _note_bad_rows(dq, table, bad)
        return np.array(good, dtype=np.int64) if good else np.empty((0, ncols), dtype=np.int64)


def _is_int64(v: object) -> bool:
    return v.__class__ is int and -(2**63) <= v <= 2**63 - 1  # type: ignore[operator]


def _rows_with_ints(rows: list[Any], required: Any, nullable: Any) -> tuple[list[Any], int]:
    """The rows whose `required` columns hold int64 values and `nullable` columns int64 or NULL;
    and how many were left out."""
    req, nul = tuple(required), tuple(nullable)
    good = [
        r
        for r in rows
        if all(_is_int64(r[i]) for i in req) and all(r[i] is None or _is_int64(r[i]) for i in nul)
    ]
    return good, len(rows) - len(good)


def _note_bad_rows(dq: DataQuality, table: str, bad: int) -> None:
    if bad:
        dq.add(
            "nsys_rows_bad_values",
            bad,
            "rows holding text, NULL, a real number or a value beyond int64 where an integer belongs "
            f"(times, ids) were left out ({table})",
        )


def _lookup(strings: dict[int, str], ids: np.ndarray, dq: DataQuality, what: str) -> np.ndarray:
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


def _pid(global_id: np.ndarray) -> np.ndarray:
    """nsys serialised globalTid / globalPid -> OS pid: (id >> 24) & 0xFFFFFF (NVIDIA's export docs:
    `globalTid / 0x1000000 % 0x1000000 AS PID`, `globalTid % 0x1000000 AS TID`)."""
    return (global_id >> 24) & 0xFFFFFF


def _tid(global_tid: np.ndarray) -> np.ndarray:
    return global_tid & 0xFFFFFF


def _stream(raw: np.ndarray) -> np.ndarray:
    out = raw.copy()
    out[(raw == _UINT32_MAX) | (raw < 0)] = -1
    return out


class _Part:
    """Columns of one event kind, before ranks are assigned (`pid` decides the rank)."""

    def __init__(self, kind: str, pid: np.ndarray, cols: dict[str, Any]):
        self.kind = kind
        self.pid = pid
        self.cols = cols


def _nccl_ops(names: np.ndarray, pattern: re.Pattern[str]) -> tuple[np.ndarray, np.ndarray]:
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


def _read(con: sqlite3.Connection, db: Path, given: Path, rank: int | None) -> Run:
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    present = [t for t in EVENT_TABLES if t in tables]
    if not present:
        raise TraceFormatError(
            db,
            f"not an Nsight Systems export with CUDA or NVTX data: none of the tables {T_KERNEL}, "
            f"{T_RUNTIME}, {T_NVTX} is there (profile with `nsys profile -t cuda,nvtx`, then "
            "`nsys export --type sqlite`)",
        )
    if T_STRINGS not in tables:
        raise TraceFormatError(db, f"missing table {T_STRINGS} (names of kernels, API calls and NVTX ranges)")
    max_events = current_limits().max_events
    n_rows = sum(int(con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in present)
    if n_rows > max_events:
        raise TraceFormatError(
            given,
            f"{n_rows} event rows, more than {max_events}: the limit on events (--max-events or "
            f"{ENV_MAX_EVENTS}; raise it to read this file)",
        )
    cells = _TextCells()
    con.text_factory = cells.decode
    strings: dict[int, str] = {
        i: txt
        for i, v in con.execute(f"SELECT id, value FROM {T_STRINGS}")
        if (txt := cells.text(v)) is not None
    }
    dq = DataQuality()
    parts: list[_Part] = []
    per_pid: dict[int, Counter[str]] = {}

    def tally(pid: np.ndarray, key: str, weights: np.ndarray | None = None) -> None:
        if len(pid) == 0:
            return
        uniq, inv = np.unique(pid, return_inverse=True)
        sums = np.bincount(inv, weights=weights, minlength=len(uniq))
        for p, s in zip(uniq.tolist(), sums.tolist(), strict=True):
            per_pid.setdefault(p, Counter())[key] += int(s)

    pid_fill = _PidByCorrelation(con, tables)

    # ---- kernels
    if T_KERNEL in tables:
        cols = set(_columns(con, T_KERNEL))
        name_cols = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
        if not name_cols:
            raise TraceFormatError(db, f"table {T_KERNEL} has no demangledName/shortName/mangledName column")
        name_sql = f"COALESCE({', '.join(name_cols)}, -1)"
        m = _int_matrix(
            con,
            f"SELECT start, end, {_gpu_ids(cols)}, {name_sql} FROM {T_KERNEL}",
            7,
            dq,
        )
        m = pid_fill.fill(m)
        names = _lookup(strings, m[:, 6], dq, "kernel")
        coll_name, coll_op = _nccl_ops(names, _NCCL_KERNEL)
        parts.append(_gpu_part("kernel", m, names, coll_name=coll_name, coll_op=coll_op))
        pid = parts[-1].pid
        tally(pid, "kernels")
        nccl = coll_name != ""
        tally(pid[nccl], "nccl_kernels")

    # ---- CUDA graphs traced as a whole (nodes not recorded): one GPU operation per graph execution,
    # joined to its cudaGraphLaunch by correlationId like a kernel to its launch
    if T_GRAPH in tables:
        cols = set(_columns(con, T_GRAPH))
        graph_sql = "COALESCE(graphId, -1)" if "graphId" in cols else "-1"
        m = _int_matrix(
            con,
            f"SELECT start, end, {_gpu_ids(cols)}, {graph_sql} FROM {T_GRAPH} WHERE NOT (start = 0 AND end = 0)",
            7,
            dq,
        )
        m = pid_fill.fill(m)
        if len(m):
            names = np.array([f"CUDA graph {g} (graph-level trace)" for g in m[:, 6].tolist()], dtype=object)
            parts.append(_gpu_part("kernel", m, names))
            tally(parts[-1].pid, "graph_executions")
            dq.add(
                "nsys_graph_level_trace",
                len(m),
                f"{given.name}: {len(m)} CUDA-graph executions were traced as a whole (nsys "
                "--cuda-graph-trace=graph): each is one GPU operation of class compute (subclass other), "
                "its own kernels (and any collective among them) unseen; profile with "
                "--cuda-graph-trace=node to classify them",
            )

    # ---- memcpy
    if T_MEMCPY in tables:
        cols = set(_columns(con, T_MEMCPY))
        m = _int_matrix(
            con,
            f"SELECT start, end, {_gpu_ids(cols)}, {_col(cols, 'bytes', 0)}, {_col(cols, 'copyKind', 0)}, "
            f"{_col(cols, 'srcKind', 7)}, {_col(cols, 'dstKind', 7)} FROM {T_MEMCPY}",
            10,
            dq,
        )
        m = pid_fill.fill(m)
        mem_kind = _enum(con, tables, "ENUM_CUDA_MEM_KIND", MEMORY_KIND, cells)
        names = _memcpy_names(m[:, 7], m[:, 8], m[:, 9], mem_kind)
        parts.append(_gpu_part("memcpy", m, names))
        pid = parts[-1].pid
        tally(pid, "memcpys")
        tally(pid, "memcpy_bytes", m[:, 6].astype(np.float64))

    # ---- memset
    if T_MEMSET in tables:
        cols = set(_columns(con, T_MEMSET))
        kind_sql = "COALESCE(memKind, 7)" if "memKind" in cols else "7"
        m = _int_matrix(
            con,
            f"SELECT start, end, {_gpu_ids(cols)}, {_col(cols, 'bytes', 0)}, {kind_sql} FROM {T_MEMSET}",
            8,
            dq,
        )
        m = pid_fill.fill(m)
        mem_kind = _enum(con, tables, "ENUM_CUDA_MEM_KIND", MEMORY_KIND, cells)
        kinds = np.array([f"Memset ({mem_kind.get(k, 'Unknown')})" for k in range(8)], dtype=object)
        names = kinds[np.clip(m[:, 7], 0, 7)]
        parts.append(_gpu_part("memset", m, names))
        pid = parts[-1].pid
        tally(pid, "memsets")
        tally(pid, "memset_bytes", m[:, 6].astype(np.float64))

    # ---- runtime and driver API calls
    for table in (T_RUNTIME, T_DRIVER):
        if table not in tables:
            continue
        cols = set(_columns(con, table))
        m = _int_matrix(
            con,
            f"SELECT start, end, globalTid, {_col(cols, 'correlationId', -1)}, {_col(cols, 'nameId', -1)} FROM {table}",
            5,
            dq,
        )
        raw = _lookup(strings, m[:, 4], dq, "API call")
        names = _strip_versions(raw)
        pid = _pid(m[:, 2])
        parts.append(
            _Part(
                "runtime",
                pid,
                {
                    "stream": _tid(m[:, 2]),
                    "name": names,
                    "start_ns": m[:, 0],
                    "end_ns": m[:, 1],
                    "correlation": m[:, 3],
                },
            )
        )
        tally(pid, "api_calls")

    # ---- CUPTI synchronisation records (host blocked on the device) -> kind sync
    if T_SYNC in tables:
        cols = set(_columns(con, T_SYNC))
        type_col = "syncType" if "syncType" in cols else "deprecatedSyncType"
        m = _int_matrix(
            con,
            f"SELECT start, end, {_col(cols, 'deviceId', -1)}, {_col(cols, 'streamId', -1)}, "
            f"{_col(cols, 'correlationId', -1)}, {_pid_sql(cols)}, {_col(cols, type_col, 0)} FROM {T_SYNC}",
            7,
            dq,
        )
        m = pid_fill.fill(m)
        lut = np.array(["Unknown Sync"] + [SYNC_TYPE[k] for k in (1, 2, 3, 4)], dtype=object)
        t = m[:, 6]
        names = lut[np.where((t >= 1) & (t <= 4), t, 0)]
        pid = _pid(m[:, 5])
        parts.append(
            _Part(
                "sync",
                pid,
                {
                    "device": m[:, 2],
                    "stream": _stream(m[:, 3]),
                    "name": names,
                    "start_ns": m[:, 0],
                    "end_ns": m[:, 1],
                    "correlation": m[:, 4],
                },
            )
        )
        tally(pid, "sync_records")

    # ---- NVTX
    domains: dict[int, Counter[str]] = {}
    if T_NVTX in tables:
        _read_nvtx(con, strings, dq, parts, tally, domains, cells)
    _check_gpu_activity(tables, parts, per_pid, given, dq)

    # ---- which processes are ranks
    # processes with GPU activity first: a launcher that only queried the device count (a few
    # runtime calls, no kernel) is not a rank (tracekit capture --nsys before 2026-11-29: 3
    # "CUDA processes" for tp=2)
    gpu_pids = sorted(
        {int(p) for part in parts if part.kind in ("kernel", "memcpy", "memset") for p in np.unique(part.pid)}
    )
    cuda_pids = sorted({int(p) for part in parts if part.kind != "annotation" for p in np.unique(part.pid)})
    all_pids = sorted({int(p) for part in parts for p in np.unique(part.pid)})
    rank_pids = gpu_pids or cuda_pids or all_pids
    if not rank_pids:
        raise TraceFormatError(
            db, f"empty report: no kernels, memcpys, API calls or NVTX ranges in {', '.join(present)}"
        )
    meta = _meta(con, tables, cells)
    proc_names = _process_names(con, tables, cells)
    cells.note(dq, given.name)
    ranks, rank_source = _assign_ranks(rank_pids, rank, given, meta, db, dq)
    pid_to_rank = dict(zip(rank_pids, ranks, strict=True))

    # ---- assemble
    cols_out: dict[str, list[np.ndarray]] = {c: [] for c in COLUMNS}
    dropped = 0
    for part in parts:
        keep = np.isin(part.pid, rank_pids)
        dropped += int((~keep).sum())
        n = int(keep.sum())
        rank_col = np.array([pid_to_rank[p] for p in part.pid[keep].tolist()], dtype=np.int32)
        for c, dtype in COLUMNS.items():
            if c == "rank":
                cols_out[c].append(rank_col)
            elif c == "kind":
                cols_out[c].append(np.full(n, part.kind, dtype=object))
            elif c in part.cols:
                cols_out[c].append(np.asarray(part.cols[c])[keep])
            elif dtype == "category":
                cols_out[c].append(np.full(n, "", dtype=object))
            else:
                cols_out[c].append(np.full(n, -1, dtype=np.int64))
    if dropped:
        dq.add(
            "nsys_events_other_processes",
            dropped,
            f"{dropped} NVTX events from processes without CUDA activity were left out",
        )
    merged = {c: np.concatenate(v) if v else np.empty(0) for c, v in cols_out.items()}
    start = merged["start_ns"].astype(np.int64)
    end = merged["end_ns"].astype(np.int64)
    bad = end < start
    if bad.any():
        dq.add("nsys_end_before_start", int(bad.sum()), "events ending before they start were left out")
    # nsys times count ns from the session start: one before it, or 146 years after it, is no time
    # (and near 2**63 it would wrap around when the sessions of several reports are aligned)
    odd = ~bad & ((start < 0) | (end > 1 << 62))
    if odd.any():
        dq.add(
            "nsys_times_out_of_range",
            int(odd.sum()),
            "events starting before the session start (negative) or ending beyond 2**62 ns were left out",
        )
        bad |= odd
    if bad.any():
        merged = {c: v[~bad] for c, v in merged.items()}
        start = start[~bad]
    order = np.lexsort((start, merged["rank"]))
    merged = {c: v[order] for c, v in merged.items()}
    events = make_events(merged)

    sources = {r: str(given) for r in ranks}
    rank_info: dict[int, dict[str, Any]] = {}
    for proc_id, r in pid_to_rank.items():
        counts = per_pid.get(proc_id, Counter())
        rank_events = events[events["rank"] == r]
        devices = sorted(int(d) for d in rank_events["device"].unique() if d >= 0)
        info: dict[str, Any] = {
            "source": "nsys",
            "path": str(given),
            "sqlite": str(db),
            "pid": proc_id,
            "process_name": proc_names.get(proc_id, ""),
            "rank_source": rank_source,
            "time_base": "ns since the nsys session start (session_start_utc_ns)",
            "session_start_utc_ns": meta.get("session_start_utc_ns"),
            "nsys_version": meta.get("nsys_version"),
            "export_schema_version": meta.get("schema_version"),
            "devices": [{"id": d, "name": meta.get("gpus", {}).get(d, "")} for d in devices],
            "memcpy_bytes": counts.get("memcpy_bytes", 0),
            "memset_bytes": counts.get("memset_bytes", 0),
            "nvtx_marks": counts.get("nvtx_marks", 0),
            "nvtx_domains": dict(sorted(domains.get(proc_id, Counter()).items())),
            "counts": {
                k: v
                for k, v in sorted(counts.items())
                if k not in ("memcpy_bytes", "memset_bytes", "nvtx_marks")
            },
        }
        rank_info[r] = info
    return Run(events=events, sources=sources, rank_info=rank_info, data_quality=dq)


def _check_gpu_activity(
    tables: set[str], parts: list[_Part], per_pid: dict[int, Counter[str]], given: Path, dq: DataQuality
) -> None:
    """A process that launched kernels has kernel records; an export without them is damaged or
    mis-exported, not an idle run. No kernel table at all (nor graph-level rows) while the API
    calls launch kernels: refused (TraceFormatError). The table there but a launching process
    without one kernel in it: noted (`nsys_kernels_missing`), since that process's GPU time would
    read as idle."""
    launches: Counter[int] = Counter()
    for part in parts:
        if part.kind != "runtime" or not len(part.pid):
            continue
        uniq, inv = np.unique(np.asarray(part.cols["name"]).astype(str), return_inverse=True)
        hit = np.array([bool(_KERNEL_LAUNCH.match(u)) for u in uniq.tolist()], dtype=bool)[inv]
        for p, c in zip(*np.unique(part.pid[hit], return_counts=True), strict=True):
            launches[int(p)] += int(c)
    total = sum(launches.values())
    if not total:
        return
    if T_KERNEL not in tables and T_GRAPH not in tables:
        raise TraceFormatError(
            given,
            f"{total} kernel launches in {T_RUNTIME}/{T_DRIVER} but no {T_KERNEL} table: the export lost its "
            "GPU activity (damaged, or cut short); its steps would read as idle GPU time. Export the report "
            "again (`nsys export --type sqlite`)",
        )
    silent = {
        p: n
        for p, n in launches.items()
        if per_pid.get(p, Counter())["kernels"] + per_pid.get(p, Counter())["graph_executions"] == 0
    }
    if silent:
        dq.add(
            "nsys_kernels_missing",
            sum(silent.values()),
            f"{given.name}: process(es) {', '.join(map(str, sorted(silent)))} launched "
            f"{sum(silent.values())} kernels but the export holds none of theirs ({T_KERNEL}): its GPU "
            "activity is missing (a damaged or partial export), so their GPU time reads as idle",
        )


def _nvtx_event_types(con: sqlite3.Connection) -> dict[str, int]:
    """The NVTX eventType ids, by name from the export's own ENUM_NSYS_EVENT_TYPE (so that another
    nsys version's numbering is read right), else the values nsys has used (34, 59, 60, 75)."""
    out = {
        "NvtxMark": NVTX_MARK,
        "NvtxPushPopRange": NVTX_PUSH_POP_RANGE,
        "NvtxStartEndRange": NVTX_START_END_RANGE,
        "NvtxDomainCreate": NVTX_DOMAIN_CREATE,
    }
    try:
        rows = con.execute(
            "SELECT id, name FROM ENUM_NSYS_EVENT_TYPE WHERE name IN (?, ?, ?, ?)", tuple(out)
        ).fetchall()
    except sqlite3.Error:  # no such table (or column) in this export
        return out
    for i, name in rows:
        if _is_int64(i) and name in out:
            out[name] = int(i)
    return out


def _read_nvtx(
    con: sqlite3.Connection,
    strings: dict[int, str],
    dq: DataQuality,
    parts: list[_Part],
    tally: Any,
    domains: dict[int, Counter[str]],
    cells: _TextCells,
) -> None:
    cols = set(_columns(con, T_NVTX))
    opt = [c if c in cols else "NULL" for c in ("textId", "domainId", "jsonText", "endGlobalTid")]
    rows = con.execute(
        f"SELECT start, end, eventType, globalTid, text, {', '.join(opt)} FROM {T_NVTX}"
    ).fetchall()
    rows, bad = _rows_with_ints(rows, (0, 2), (1, 3, 5, 6, 8))
    _note_bad_rows(dq, T_NVTX, bad)
    if not rows:
        return
    arr = np.array(rows, dtype=object)
    etype = arr[:, 2].astype(np.int64)
    gtid_raw = arr[:, 3]
    no_tid = np.array([g is None for g in gtid_raw])
    gtid = np.where(no_tid, 0, gtid_raw).astype(np.int64)
    pid = _pid(gtid)
    domain_id = np.array([0 if d is None else d for d in arr[:, 6]], dtype=np.int64)

    # names: inline text, else the registered string (textId -> StringIds)
    text = np.array([cells.text(t) for t in arr[:, 4]], dtype=object)
    arr[:, 7] = [cells.text(j) for j in arr[:, 7]]  # jsonText: the NCCL payload
    text_id = arr[:, 5]
    names = np.empty(len(arr), dtype=object)
    has_text = np.array([t is not None for t in text])
    names[has_text] = text[has_text]
    need = ~has_text
    ids = np.array([-1 if t is None else t for t in text_id[need]], dtype=np.int64)
    names[need] = _lookup(strings, ids, dq, "NVTX")

    # domains: NvtxDomainCreate rows name (pid, domainId); domain 0 is the default domain ("")
    types = _nvtx_event_types(con)
    dom_rows = etype == types["NvtxDomainCreate"]
    dom_name: dict[tuple[int, int], str] = {
        (int(p), int(d)): str(n)
        for p, d, n in zip(pid[dom_rows], domain_id[dom_rows], names[dom_rows], strict=True)
    }

    is_mark = etype == types["NvtxMark"]
    tally(pid[is_mark], "nvtx_marks")
    is_range = (etype == types["NvtxPushPopRange"]) | (etype == types["NvtxStartEndRange"])
    known = is_range | is_mark | dom_rows | (etype == NVTX_CATEGORY)
    if (~known).any():
        dq.add(
            "nvtx_other_event_types",
            int((~known).sum()),
            "NVTX events of other types (not ranges) were skipped",
        )
    end_null = np.array([e is None for e in arr[:, 1]])
    unclosed = is_range & end_null
    if unclosed.any():
        dq.add("nvtx_unclosed_ranges", int(unclosed.sum()), "NVTX ranges without an end were left out")
    sel = is_range & ~end_null & ~no_tid
    if (is_range & no_tid).any():
        dq.add(
            "nvtx_ranges_without_thread",
            int((is_range & no_tid).sum()),
            "NVTX ranges without a thread were left out",
        )
    if not sel.any():
        return
    pid_s = pid[sel]
    dom_s = domain_id[sel]
    dom_names = np.array(
        [
            dom_name.get((int(p), int(d)), "" if d == 0 else f"domain#{d}")
            for p, d in zip(pid_s, dom_s, strict=True)
        ],
        dtype=object,
    )
    for p, d in zip(pid_s.tolist(), dom_names.tolist(), strict=True):
        domains.setdefault(p, Counter())[d] += 1
    names_s = names[sel]
    # NCCL's own NVTX domain: collective ranges ("AllReduce" / "ncclAllReduce") with a payload.
    coll_name = np.full(int(sel.sum()), "", dtype=object)
    coll_op = np.full(int(sel.sum()), "", dtype=object)
    coll_bytes = np.full(int(sel.sum()), -1, dtype=np.int64)
    coll_pg = np.full(int(sel.sum()), "", dtype=object)
    coll_size = np.full(int(sel.sum()), -1, dtype=np.int64)
    nccl = dom_names == NCCL_NVTX_DOMAIN
    if nccl.any():
        cn, co = _nccl_ops(names_s[nccl], _NCCL_NVTX)
        coll_name[nccl] = cn
        coll_op[nccl] = co
        json_s = arr[sel, 7][nccl]
        sizes = np.array([_payload_bytes(j) for j in json_s], dtype=np.int64)
        coll_bytes[nccl] = sizes
        # NCCL >= 2.24 also names the communicator ("NCCL communicator ID", its hash) and, where it
        # knows it, the rank count ("No. of ranks"): the collective's group, as Kineto's args give it
        comm_ids = [_payload_field(j, _COMM_IN_JSON) for j in json_s]
        coll_pg[nccl] = np.array([f"nccl-comm:{c}" if c else "" for c in comm_ids], dtype=object)
        coll_size[nccl] = np.array(
            [int(v) if v else -1 for v in (_payload_field(j, _NRANKS_IN_JSON) for j in json_s)]
        )
        unknown = int((sizes < 0).sum())
        if unknown:
            dq.add(
                "nccl_nvtx_bytes_unread",
                unknown,
                "NCCL NVTX ranges whose payload (message size) is not in a readable form: bytes left -1",
            )
    parts.append(
        _Part(
            "annotation",
            pid_s,
            {
                "stream": _tid(gtid[sel]),
                "name": names_s,
                "start_ns": arr[sel, 0].astype(np.int64),
                "end_ns": arr[sel, 1].astype(np.int64),
                "coll_name": coll_name,
                "coll_op": coll_op,
                "coll_in_bytes": coll_bytes,
                "coll_pg_name": coll_pg,
                "coll_group_size": coll_size,
            },
        )
    )
    tally(pid_s, "nvtx_ranges")


_SIZE_IN_JSON = re.compile(r'"[^"]*(?:[Mm]essage size|[Ss]ize)[^"]*"\s*:\s*(\d+)')


_COMM_IN_JSON = re.compile(r'"NCCL communicator ID"\s*:\s*"?(\w+)"?')
_NRANKS_IN_JSON = re.compile(r'"No\. of ranks"\s*:\s*(\d+)')


def _payload_field(json_text: object, rx: re.Pattern[str]) -> str:
    """One field of an NCCL NVTX payload exported as JSON text, or ""."""
    if not isinstance(json_text, str):
        return ""
    m = rx.search(json_text)
    return m.group(1) if m else ""


def _payload_bytes(json_text: object) -> int:
    """Message size from an NVTX payload exported as JSON text (NCCL's "Message size [bytes]"), else -1."""
    if not isinstance(json_text, str):
        return -1
    m = _SIZE_IN_JSON.search(json_text)
    return int(m.group(1)) if m else -1


def _strip_versions(raw: np.ndarray) -> np.ndarray:
    if len(raw) == 0:
        return raw
    uniq, inv = np.unique(raw.astype(str), return_inverse=True)
    stripped = np.array([_RUNTIME_VERSION.sub("", s) for s in uniq.tolist()], dtype=object)
    return stripped[inv]


def _enum(
    con: sqlite3.Connection, tables: set[str], table: str, fallback: dict[int, str], cells: _TextCells
) -> dict[int, str]:
    """An nsys ENUM_* table as {id: label}; the fixed map where the export lacks it."""
    if table not in tables:
        return dict(fallback)
    try:
        rows = con.execute(f"SELECT id, label FROM {table}").fetchall()
    except sqlite3.Error:
        return dict(fallback)
    return {int(i): cells.text(label) or "" for i, label in rows if _is_int64(i)} or dict(fallback)


def _memcpy_names(
    copy_kind: np.ndarray, src: np.ndarray, dst: np.ndarray, mem_kind: dict[int, str]
) -> np.ndarray:
    if len(copy_kind) == 0:
        return np.empty(0, dtype=object)
    key = np.stack([copy_kind, src, dst], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    labels = np.array(
        [
            f"Memcpy {MEMCPY_KIND.get(int(k), 'Unknown')} ({mem_kind.get(int(s), 'Unknown')} -> "
            f"{mem_kind.get(int(d), 'Unknown')})"
            for k, s, d in uniq.tolist()
        ],
        dtype=object,
    )
    return labels[np.asarray(inv).reshape(-1)]


def _meta(con: sqlite3.Connection, tables: set[str], cells: _TextCells) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        if row and _is_int64(row[0]):  # text or a REAL there: no session start (not aligned)
            meta["session_start_utc_ns"] = int(row[0])
    if "META_DATA_EXPORT" in tables:
        kv = {
            cells.text(k): cells.text(v) for k, v in con.execute("SELECT name, value FROM META_DATA_EXPORT")
        }
        meta["nsys_version"] = kv.get("EXPORT_PRODUCT_VERSION")
        meta["schema_version"] = kv.get("EXPORT_SCHEMA_VERSION")
    if "TARGET_INFO_GPU" in tables and "name" in _columns(con, "TARGET_INFO_GPU"):
        meta["gpus"] = {
            int(i): cells.text(n) or ""
            for i, n in con.execute("SELECT id, name FROM TARGET_INFO_GPU")
            if _is_int64(i)
        }
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        env_rank = None
        for (value,) in con.execute(
            "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'"
        ):
            for item in (cells.text(value) or "").split(";"):
                if item.startswith("RANK=") and item[5:].strip().isdigit():
                    env_rank = int(item[5:].strip())
        if env_rank is not None:
            meta["env_rank"] = env_rank
    return meta


def _process_names(con: sqlite3.Connection, tables: set[str], cells: _TextCells) -> dict[int, str]:
    if "PROCESSES" not in tables:
        return {}
    return {
        int(p): cells.text(n) or "" for p, n in con.execute("SELECT pid, name FROM PROCESSES") if _is_int64(p)
    }


def _assign_ranks(
    pids: list[int], rank: int | None, given: Path, meta: dict[str, Any], db: Path, dq: DataQuality
) -> tuple[list[int], str]:
    if len(pids) > 1:
        if rank is not None:
            raise RankError(
                f"{db}: rank={rank} was given but the report holds {len(pids)} CUDA processes "
                f"(pids {pids}); they are read as ranks 0..{len(pids) - 1} in pid order when no rank is given"
            )
        dq.add(
            "nsys_ranks_from_processes",
            len(pids),
            f"{given.name}: one report with {len(pids)} CUDA processes: read as ranks 0..{len(pids) - 1} "
            "in pid order (nsys does not record torch.distributed ranks)",
        )
        return list(range(len(pids))), "process order"
    if rank is not None:
        return [int(rank)], "argument"
    m = _RANK_IN_NAME.search(given.name)
    if m:
        return [int(m.group(1))], "file name"
    if "env_rank" in meta:
        return [int(meta["env_rank"])], "environment RANK"
    dq.add(
        "nsys_rank_assumed",
        1,
        f"{given.name}: no rank in the file name or the profiled environment; one process, read as rank 0",
    )
    return [0], "default"
