"""NVTX ranges of an Nsight Systems export -> annotation rows (docs/NSYS.md): push/pop and start/end
ranges on the host thread, marks counted, domain names from the NvtxDomainCreate rows, and the
sizes NCCL's own NVTX payloads carry.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from typing import Any

import numpy as np

from tracekit.model.events import DataQuality
from tracekit.read.nsys_tables import (
    NCCL_NVTX,
    NCCL_NVTX_DOMAIN,
    NVTX_CATEGORY,
    NVTX_DOMAIN_CREATE,
    NVTX_MARK,
    NVTX_PUSH_POP_RANGE,
    NVTX_START_END_RANGE,
    T_NVTX,
    KindPart,
    TextCells,
    is_int64,
    lookup_strings,
    nccl_ops_of,
    note_bad_rows,
    os_pid,
    os_tid,
    rows_with_ints,
    table_columns,
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
        if is_int64(i) and name in out:
            out[name] = int(i)
    return out


def read_nvtx(
    con: sqlite3.Connection,
    strings: dict[int, str],
    dq: DataQuality,
    parts: list[KindPart],
    tally: Any,
    domains: dict[int, Counter[str]],
    cells: TextCells,
) -> None:
    cols = set(table_columns(con, T_NVTX))
    opt = [c if c in cols else "NULL" for c in ("textId", "domainId", "jsonText", "endGlobalTid")]
    rows = con.execute(
        f"SELECT start, end, eventType, globalTid, text, {', '.join(opt)} FROM {T_NVTX}"
    ).fetchall()
    rows, bad = rows_with_ints(rows, (0, 2), (1, 3, 5, 6, 8))
    note_bad_rows(dq, T_NVTX, bad)
    if not rows:
        return
    arr = np.array(rows, dtype=object)
    etype = arr[:, 2].astype(np.int64)
    gtid_raw = arr[:, 3]
    no_tid = np.array([g is None for g in gtid_raw])
    gtid = np.where(no_tid, 0, gtid_raw).astype(np.int64)
    pid = os_pid(gtid)
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
    names[need] = lookup_strings(strings, ids, dq, "NVTX")

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
    dq.add_rows("nvtx_other_event_types", (~known), "NVTX events of other types (not ranges) were skipped")
    end_null = np.array([e is None for e in arr[:, 1]])
    unclosed = is_range & end_null
    dq.add_rows("nvtx_unclosed_ranges", unclosed, "NVTX ranges without an end were left out")
    sel = is_range & ~end_null & ~no_tid
    dq.add_rows(
        "nvtx_ranges_without_thread", (is_range & no_tid), "NVTX ranges without a thread were left out"
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
        cn, co = nccl_ops_of(names_s[nccl], NCCL_NVTX)
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
        KindPart(
            "annotation",
            pid_s,
            {
                "stream": os_tid(gtid[sel]),
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
