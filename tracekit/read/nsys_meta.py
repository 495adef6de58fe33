"""What an Nsight Systems export says about its run (docs/NSYS.md): the session's start and the
profiled processes (`run_meta`, `process_names`), memcpy kinds and other enums (`enum_table`,
`memcpy_names`), API names without their `_v3020` suffix, and the rank of each CUDA process
(`assign_ranks`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TypedDict

import numpy as np

from tracekit.errors import RankError
from tracekit.model.events import DataQuality
from tracekit.read.nsys_tables import (
    MEMCPY_KIND,
    RANK_IN_NAME,
    RUNTIME_VERSION,
    TextCells,
    is_int64,
    table_columns,
)


def strip_versions(raw: np.ndarray) -> np.ndarray:
    if len(raw) == 0:
        return raw
    uniq, inv = np.unique(raw.astype(str), return_inverse=True)
    stripped = np.array([RUNTIME_VERSION.sub("", s) for s in uniq.tolist()], dtype=object)
    return stripped[inv]


def enum_table(
    con: sqlite3.Connection, tables: set[str], table: str, fallback: dict[int, str], cells: TextCells
) -> dict[int, str]:
    """An nsys ENUM_* table as {id: label}; the fixed map where the export lacks it."""
    if table not in tables:
        return dict(fallback)
    try:
        rows = con.execute(f"SELECT id, label FROM {table}").fetchall()
    except sqlite3.Error:
        return dict(fallback)
    return {int(i): cells.text(label) or "" for i, label in rows if is_int64(i)} or dict(fallback)


def memcpy_names(
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


class NsysMeta(TypedDict, total=False):
    """What a report's tables say about its session (`run_meta`)."""

    session_start_utc_ns: int  # TARGET_INFO_SESSION_START_TIME: UTC ns of the session start
    nsys_version: str | None  # META_DATA_EXPORT EXPORT_PRODUCT_VERSION
    schema_version: str | None  # META_DATA_EXPORT EXPORT_SCHEMA_VERSION
    gpus: dict[int, str]  # TARGET_INFO_GPU: device id -> name
    env_rank: int  # RANK= in TARGET_INFO_SYSTEM_ENV's DeviceEnvironment


def run_meta(con: sqlite3.Connection, tables: set[str], cells: TextCells) -> NsysMeta:
    meta: NsysMeta = {}
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        if row and is_int64(row[0]):  # text or a REAL there: no session start (not aligned)
            meta["session_start_utc_ns"] = int(row[0])
    if "META_DATA_EXPORT" in tables:
        kv = {
            cells.text(k): cells.text(v) for k, v in con.execute("SELECT name, value FROM META_DATA_EXPORT")
        }
        meta["nsys_version"] = kv.get("EXPORT_PRODUCT_VERSION")
        meta["schema_version"] = kv.get("EXPORT_SCHEMA_VERSION")
    if "TARGET_INFO_GPU" in tables and "name" in table_columns(con, "TARGET_INFO_GPU"):
        meta["gpus"] = {
            int(i): cells.text(n) or ""
            for i, n in con.execute("SELECT id, name FROM TARGET_INFO_GPU")
            if is_int64(i)
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


def process_names(con: sqlite3.Connection, tables: set[str], cells: TextCells) -> dict[int, str]:
    if "PROCESSES" not in tables:
        return {}
    return {
        int(p): cells.text(n) or "" for p, n in con.execute("SELECT pid, name FROM PROCESSES") if is_int64(p)
    }


def assign_ranks(
    pids: list[int], rank: int | None, given: Path, meta: NsysMeta, db: Path, dq: DataQuality
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
    m = RANK_IN_NAME.search(given.name)
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
