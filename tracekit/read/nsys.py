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
import shutil
import sqlite3
import subprocess
import tempfile
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from tracekit.errors import TraceFormatError
from tracekit.model.events import COLUMNS, DataQuality, Run, make_events
from tracekit.read import cache as cache_mod
from tracekit.read.limits import OVER_MAX_BYTES, OVER_MAX_EVENTS, current_limits, describe_bytes
from tracekit.read.nsys_meta import (
    assign_ranks,
    enum_table,
    memcpy_names,
    process_names,
    run_meta,
    strip_versions,
)
from tracekit.read.nsys_nvtx import read_nvtx
from tracekit.read.nsys_tables import (
    EVENT_TABLES,
    KERNEL_LAUNCH,
    MEMORY_KIND,
    NCCL_KERNEL,
    SYNC_TYPE,
    T_DRIVER,
    T_GRAPH,
    T_KERNEL,
    T_MEMCPY,
    T_MEMSET,
    T_NVTX,
    T_RUNTIME,
    T_STRINGS,
    T_SYNC,
    KindPart,
    PidByCorrelation,
    TextCells,
    check_sqlite_header,
    col_or_default,
    gpu_ids,
    gpu_part,
    int_matrix,
    lookup_strings,
    nccl_ops_of,
    os_pid,
    os_tid,
    pid_sql,
    table_columns,
)

#: Bumped when the reader's output changes (keys the Parquet cache of tracekit.read).
READER_VERSION = "nsys-4"  # nsys-2: ranks are the processes with GPU activity; 3: graph-level trace rows


# --------------------------------------------------------------------------------------------------
# public API


def _export_version(con: sqlite3.Connection) -> str:
    """ ", an export of Nsight Systems V (schema S)" from META_DATA_EXPORT, for an error that may be a
    schema tracekit was not written against (a column renamed by another nsys version); "" without."""
    try:
        meta = dict(
            con.execute(
                "SELECT name, value FROM META_DATA_EXPORT WHERE name IN "
                "('EXPORT_PRODUCT_VERSION', 'EXPORT_SCHEMA_VERSION')"
            ).fetchall()
        )
    except sqlite3.Error:
        return ""
    if not meta:
        return ""
    version = str(meta.get("EXPORT_PRODUCT_VERSION", "?"))[:40]
    schema = str(meta.get("EXPORT_SCHEMA_VERSION", "?"))[:40]
    return (
        f" (an export of Nsight Systems {version}, schema {schema}; the tables and columns tracekit "
        "reads, and the nsys versions it was tried on: docs/NSYS.md)"
    )


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
        check_sqlite_header(db, given if db != given else None)
        try:
            con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise TraceFormatError(given, f"cannot open as SQLite: {exc}") from exc
        try:
            return _read(con, db, given, rank)
        except sqlite3.DatabaseError as exc:
            raise TraceFormatError(given, f"SQLite error while reading: {exc}{_export_version(con)}") from exc
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
                        f"more than {describe_bytes(max_bytes)} once decompressed: {OVER_MAX_BYTES}",
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
            f"{n_rows} event rows, more than {max_events}: {OVER_MAX_EVENTS}",
        )
    cells = TextCells()
    con.text_factory = cells.decode
    strings: dict[int, str] = {
        i: txt
        for i, v in con.execute(f"SELECT id, value FROM {T_STRINGS}")
        if (txt := cells.text(v)) is not None
    }
    dq = DataQuality()
    parts: list[KindPart] = []
    per_pid: dict[int, Counter[str]] = {}

    def tally(pid: np.ndarray, key: str, weights: np.ndarray | None = None) -> None:
        if len(pid) == 0:
            return
        uniq, inv = np.unique(pid, return_inverse=True)
        sums = np.bincount(inv, weights=weights, minlength=len(uniq))
        for p, s in zip(uniq.tolist(), sums.tolist(), strict=True):
            per_pid.setdefault(p, Counter())[key] += int(s)

    pid_fill = PidByCorrelation(con, tables)

    def gpu_matrix(sql: str, width: int) -> np.ndarray:
        """The rows of a device-side query (start, end, device, stream, correlation, pid, ...),
        each row's missing pid taken from its launch (`PidByCorrelation`)."""
        return pid_fill.fill(int_matrix(con, sql, width, dq))

    # ---- kernels
    if T_KERNEL in tables:
        cols = set(table_columns(con, T_KERNEL))
        name_cols = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
        if not name_cols:
            raise TraceFormatError(db, f"table {T_KERNEL} has no demangledName/shortName/mangledName column")
        name_sql = f"COALESCE({', '.join(name_cols)}, -1)"
        m = gpu_matrix(f"SELECT start, end, {gpu_ids(cols)}, {name_sql} FROM {T_KERNEL}", 7)
        names = lookup_strings(strings, m[:, 6], dq, "kernel")
        coll_name, coll_op = nccl_ops_of(names, NCCL_KERNEL)
        parts.append(gpu_part("kernel", m, names, coll_name=coll_name, coll_op=coll_op))
        pid = parts[-1].pid
        tally(pid, "kernels")
        nccl = coll_name != ""
        tally(pid[nccl], "nccl_kernels")

    # ---- CUDA graphs traced as a whole (nodes not recorded): one GPU operation per graph execution,
    # joined to its cudaGraphLaunch by correlationId like a kernel to its launch
    if T_GRAPH in tables:
        cols = set(table_columns(con, T_GRAPH))
        m = gpu_matrix(
            f"SELECT start, end, {gpu_ids(cols)}, {col_or_default(cols, 'graphId', -1)} FROM {T_GRAPH} "
            "WHERE NOT (start = 0 AND end = 0)",
            7,
        )
        if len(m):
            names = np.array([f"CUDA graph {g} (graph-level trace)" for g in m[:, 6].tolist()], dtype=object)
            parts.append(gpu_part("kernel", m, names))
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
        cols = set(table_columns(con, T_MEMCPY))
        m = gpu_matrix(
            f"SELECT start, end, {gpu_ids(cols)}, {col_or_default(cols, 'bytes', 0)}, {col_or_default(cols, 'copyKind', 0)}, "
            f"{col_or_default(cols, 'srcKind', 7)}, {col_or_default(cols, 'dstKind', 7)} FROM {T_MEMCPY}",
            10,
        )
        mem_kind = enum_table(con, tables, "ENUM_CUDA_MEM_KIND", MEMORY_KIND, cells)
        names = memcpy_names(m[:, 7], m[:, 8], m[:, 9], mem_kind)
        parts.append(gpu_part("memcpy", m, names))
        pid = parts[-1].pid
        tally(pid, "memcpys")
        tally(pid, "memcpy_bytes", m[:, 6].astype(np.float64))

    # ---- memset
    if T_MEMSET in tables:
        cols = set(table_columns(con, T_MEMSET))
        m = gpu_matrix(
            f"SELECT start, end, {gpu_ids(cols)}, {col_or_default(cols, 'bytes', 0)}, "
            f"{col_or_default(cols, 'memKind', 7)} FROM {T_MEMSET}",
            8,
        )
        mem_kind = enum_table(con, tables, "ENUM_CUDA_MEM_KIND", MEMORY_KIND, cells)
        kinds = np.array([f"Memset ({mem_kind.get(k, 'Unknown')})" for k in range(8)], dtype=object)
        names = kinds[np.clip(m[:, 7], 0, 7)]
        parts.append(gpu_part("memset", m, names))
        pid = parts[-1].pid
        tally(pid, "memsets")
        tally(pid, "memset_bytes", m[:, 6].astype(np.float64))

    # ---- runtime and driver API calls
    for table in (T_RUNTIME, T_DRIVER):
        if table not in tables:
            continue
        cols = set(table_columns(con, table))
        m = int_matrix(
            con,
            f"SELECT start, end, globalTid, {col_or_default(cols, 'correlationId', -1)}, {col_or_default(cols, 'nameId', -1)} FROM {table}",
            5,
            dq,
        )
        raw = lookup_strings(strings, m[:, 4], dq, "API call")
        names = strip_versions(raw)
        pid = os_pid(m[:, 2])
        parts.append(
            KindPart(
                "runtime",
                pid,
                {
                    "stream": os_tid(m[:, 2]),
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
        cols = set(table_columns(con, T_SYNC))
        type_col = "syncType" if "syncType" in cols else "deprecatedSyncType"
        m = gpu_matrix(
            f"SELECT start, end, {col_or_default(cols, 'deviceId', -1)}, {col_or_default(cols, 'streamId', -1)}, "
            f"{col_or_default(cols, 'correlationId', -1)}, {pid_sql(cols)}, {col_or_default(cols, type_col, 0)} FROM {T_SYNC}",
            7,
        )
        lut = np.array(["Unknown Sync"] + [SYNC_TYPE[k] for k in (1, 2, 3, 4)], dtype=object)
        t = m[:, 6]
        names = lut[np.where((t >= 1) & (t <= 4), t, 0)]
        part = gpu_part("sync", m, names)  # the same six leading columns as the GPU activity
        parts.append(part)
        tally(part.pid, "sync_records")

    # ---- NVTX
    domains: dict[int, Counter[str]] = {}
    if T_NVTX in tables:
        read_nvtx(con, strings, dq, parts, tally, domains, cells)
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
    meta = run_meta(con, tables, cells)
    proc_names = process_names(con, tables, cells)
    cells.note(dq, given.name)
    ranks, rank_source = assign_ranks(rank_pids, rank, given, meta, db, dq)
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
    dq.add_rows("nsys_end_before_start", bad, "events ending before they start were left out")
    # nsys times count ns from the session start: one before it, or 146 years after it, is no time
    # (and near 2**63 it would wrap around when the sessions of several reports are aligned)
    odd = ~bad & ((start < 0) | (end > 1 << 62))
    dq.add_rows(
        "nsys_times_out_of_range",
        odd,
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
    rank_info: dict[int, dict[str, object]] = {}
    for proc_id, r in pid_to_rank.items():
        counts = per_pid.get(proc_id, Counter())
        rank_events = events[events["rank"] == r]
        devices = sorted(int(d) for d in rank_events["device"].unique() if d >= 0)
        info: dict[str, object] = {
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
    tables: set[str], parts: list[KindPart], per_pid: dict[int, Counter[str]], given: Path, dq: DataQuality
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
        hit = np.array([bool(KERNEL_LAUNCH.match(u)) for u in uniq.tolist()], dtype=bool)[inv]
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
