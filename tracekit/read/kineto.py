"""Kineto (torch.profiler) Chrome-trace reader: `.json` and `.json.gz` -> the event table.

Design (issue 7): the file is streamed (gzip decompressed incrementally), the `traceEvents` array is
cut into chunks of whole events at top-level boundaries, and each chunk is decoded by msgspec into
small typed Structs holding only the fields needed (ph, cat, name, ts, dur, pid, tid and an args
subset); each chunk is turned into numpy columns at once and its Structs are dropped. Peak memory
is one chunk plus the columns, whatever the file size. Names are interned (categorical codes).

Timestamps: `ts` is decoded as the raw JSON number text and parsed exactly into integer ns with
integer arithmetic (no float rounding), so a fractional-microsecond trace keeps every ns digit:
- without `baseTimeNanoseconds`, `ts` is microseconds since the epoch (integer or fractional);
- with `baseTimeNanoseconds`, `ts` is microseconds relative to it: start_ns = base + ts * 1000.
`dur` is decoded as a float and rounded to ns: exact for any duration below ~9e9 us with at most
three decimals (a double has 53 bits; dur * 1000 < 2**53 / 1000 leaves rounding error < 1e-3 ns).

Rows: only complete events (`"ph": "X"`) become rows. Everything else is counted in data quality,
by phase: `skipped_metadata_events` (M), `skipped_flow_events` (s/t/f), `skipped_instant_events`
(i/I), `skipped_counter_events` (C), `skipped_other_phase_events`. An X event without `ts` or `dur`
is skipped and counted as `events_without_ts` / `events_without_dur`; a file in which *every* X
event lacks `ts` is an error (TraceFormatError), as is a file with no events at all, a file without
`traceEvents`, truncated or invalid JSON (byte offset given) and a truncated gzip stream.

Kinds from `cat`: kernel->kernel, gpu_memcpy->memcpy, gpu_memset->memset,
cuda_runtime/cuda_driver->runtime, cuda_sync->sync, cpu_op->cpu_op, user_annotation->annotation,
gpu_user_annotation->gpu_annotation, anything else (python_function, overhead, Trace...)->other.

Modules (this one assembles them and is the public entry, `read_kineto`):
- `kineto_stream.py`: the streaming tokenizer (chunks of whole events) over `kineto_blocks.py` (blocks,
  gzip), `kineto_decode.py` (the typed decode) and `kineto_ints.py` (int64 coercion);
- `kineto_events.py`: the event mapping (chunk -> columns, exact timestamps, kinds from `cat`);
- `kineto_collectives.py`: collective metadata (op names, dtype sizes, record_shapes bytes, the gloo
  enqueue -> worker join);
- here: the table from the columns (`_build_table`), the rank, and `read_kineto`.
"""

from __future__ import annotations

import gc
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tracekit.errors import RankError, TraceFormatError
from tracekit.model.events import COLUMNS, DataQuality, Run, make_events
from tracekit.read.kineto_blocks import FileProgress
from tracekit.read.kineto_collectives import (
    DTYPE_BYTES,
    CollMeta,
    coll_op_from_kernel_name,
    fill_from_shapes,
    join_enqueued,
    normalise_coll_op,
)
from tracekit.read.kineto_collectives import out_bytes_for as out_bytes_for
from tracekit.read.kineto_collectives import pair_enqueued as pair_enqueued
from tracekit.read.kineto_collectives import shape_dtype as shape_dtype
from tracekit.read.kineto_collectives import shape_tensors as shape_tensors
from tracekit.read.kineto_collectives import single_process_group as single_process_group
from tracekit.read.kineto_events import KIND_CATEGORIES, Columns, categorical, str_or_empty
from tracekit.read.kineto_events import KIND_OF_CAT as KIND_OF_CAT
from tracekit.read.kineto_events import parse_us_to_ns as parse_us_to_ns
from tracekit.read.kineto_events import valid_text as valid_text
from tracekit.read.kineto_ints import DAY_NS, INT32_MAX, INT64_MAX, to_int, to_small_int
from tracekit.read.kineto_stream import Stream

#: Bumped whenever the reader's output for the same file could change (invalidates the cache).
READER_VERSION = "kineto-4"  # 2: bytes of gloo:/nccl: ranges from their shapes; enqueue join
# 3: a `rank` argument that differs from the trace's distributedInfo.rank is noted in data_quality
# 4: `ProfilerStep#N` written as a CPU op (PyTorch 1.8's `Operator`) reads as an annotation

#: Bytes of decompressed JSON decoded at a time (one chunk of whole events).
CHUNK_BYTES = 4 * 1024 * 1024  # measured (issue 7): 4 MB is as fast as 16 MB on 290 MB, 20% faster on 29 MB


def _build_table(
    cols: Columns,
    rank: int,
    base_ns: int,
    meta: dict[str, object] | None = None,
    dq: DataQuality | None = None,
) -> pd.DataFrame:
    meta = meta or {}
    dq = dq if dq is not None else cols.dq
    n = cols.rows

    def cat_arrays(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    start = cat_arrays(cols.start, np.int64)
    dur = cat_arrays(cols.dur, np.int64)
    # int64 wrap-around: base + ts or start + dur beyond 2**63 - 1 ns (year 2262) is dropped, counted
    beyond = start > INT64_MAX - base_ns if base_ns > 0 else np.zeros(n, bool)
    if base_ns:
        start = np.where(beyond, 0, start) + base_ns
    beyond |= (start > 0) & (dur > INT64_MAX - np.maximum(start, 0))
    end = start + np.where(beyond, 0, dur)
    drop_far = np.zeros(n, bool)
    if n:  # one trace file spans seconds to hours: an event a day away from its median is no time
        med = float(np.median(start[~beyond])) if (~beyond).any() else 0.0
        far = ~beyond & (np.abs(start.astype(np.float64) - med) > DAY_NS)
        dq.add_rows(
            "events_time_outliers",
            far,
            "events starting more than a day from the trace's median time (a timestamp in another "
            "unit or convention) were skipped",
        )
        drop_far = far
    kind = categorical(cat_arrays(cols.kind, np.int8), list(KIND_CATEGORIES))
    name_codes = cat_arrays(cols.name, np.int32)
    name = categorical(name_codes, list(cols.names))
    device = cat_arrays(cols.device, np.int32)
    stream = cat_arrays(cols.stream, np.int64)
    corr = cat_arrays(cols.corr, np.int64)

    # collective columns
    cm = CollMeta(n)
    for r, v in zip(cols.coll_rows, cols.coll_vals, strict=True):
        cname, dt = str_or_empty(v[0]), str_or_empty(v[3])
        size = DTYPE_BYTES.get(dt)
        if size is not None:
            if v[1] is not None and to_int(v[1]) >= 0:
                cm.in_b[r] = to_int(v[1]) * size
            if v[2] is not None and to_int(v[2]) >= 0:
                cm.out_b[r] = to_int(v[2]) * size
        if v[4] is not None:
            cm.gsize[r] = to_int(v[4])
        if v[7] is not None:
            cm.seq[r] = to_int(v[7])
        for col, val in (
            ("name", cname),
            ("dtype", dt),
            ("pg_name", str_or_empty(v[5])),
            ("pg_ranks", str_or_empty(v[6])),
        ):
            if val:
                cm.strs[col][r] = val
        op = normalise_coll_op(cname) if cname else ""
        if op:
            cm.strs["op"][r] = op
    names_list = list(cols.names)
    fill_from_shapes(cm, cols, names_list, name_codes, device, meta)
    join_enqueued(cm, cols, names_list, name_codes, device, stream, start, end, dq)
    # host comm ranges (gloo:*, nccl:*) without shapes (`ranges`/`cuda` modes): the op from the name
    range_ops = {
        c: normalise_coll_op(nm) for c, nm in enumerate(names_list) if nm.startswith(("gloo:", "nccl:"))
    }
    range_ops = {c: op for c, op in range_ops.items() if op}
    if range_ops and n:
        for r in np.flatnonzero((device < 0) & np.isin(name_codes, list(range_ops))).tolist():
            cm.strs["op"].setdefault(r, range_ops[int(name_codes[r])])
    # NCCL kernels without (or with unrecognised) collective args: the op from the kernel name
    name_ops = {code: coll_op_from_kernel_name(s) for s, code in cols.names.items() if "ernel_" in s}
    name_ops = {c: op for c, op in name_ops.items() if op}
    if name_ops and n:
        have = np.zeros(n, bool)
        if cm.strs["op"]:
            have[np.fromiter(cm.strs["op"], np.int64)] = True
        kernel_code = KIND_CATEGORIES.index("kernel")
        is_kernel = kind.codes == kernel_code
        cand = np.flatnonzero(is_kernel & ~have & np.isin(name_codes, list(name_ops)))
        for r in cand.tolist():
            cm.strs["op"][r] = name_ops[int(name_codes[r])]
    table = {
        "rank": np.full(n, rank, np.int32),
        "device": device,
        "stream": stream,
        "kind": kind,
        "name": name,
        "start_ns": start,
        "end_ns": end,
        "correlation": corr,
        "coll_name": cm.cat("name"),
        "coll_op": cm.cat("op"),
        "coll_in_bytes": cm.in_b,
        "coll_out_bytes": cm.out_b,
        "coll_dtype": cm.cat("dtype"),
        "coll_group_size": cm.gsize,
        "coll_pg_name": cm.cat("pg_name"),
        "coll_pg_ranks": cm.cat("pg_ranks"),
        "coll_seq": cm.seq,
    }
    assert list(table) == list(COLUMNS)
    if beyond.any() or drop_far.any():
        keep = ~(beyond | drop_far)
        dq.add_rows(
            "events_time_out_of_range",
            beyond,
            "events whose start (baseTimeNanoseconds + ts) or end lies beyond the int64 ns range "
            "(after the year 2262) were skipped",
        )
        table = {k: v[keep] for k, v in table.items()}
    return make_events(table)


# ----------------------------------------------------------------------------------------------
# Rank


_RANK_RE = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)


#: SGLang's profiler names each TP worker's file `<time>-TP-<tp_rank>[-<stage>].trace.json.gz`
_SGLANG_TP_RE = re.compile(r"(?:^|[^A-Za-z])TP-(\d+)(?![0-9])")


def rank_from_filename(path: str | os.PathLike[str]) -> int | None:
    """Rank from a file name: `rank-3`, `rank3`, `_rank_3`, `rank-3.pt.trace.json.gz` -> 3; else
    SGLang's `1733000000.1-TP-3.trace.json.gz` -> 3 (its TP rank); None if absent."""
    name = Path(path).name
    m = _RANK_RE.search(name) or _SGLANG_TP_RE.search(name)
    if not m or len(m.group(1)) > 10 or int(m.group(1)) > INT32_MAX:  # rank-99999999999999999999
        return None
    return int(m.group(1))


def check_rank_argument(rank: Any) -> None:
    """RankError unless `rank` (--rank, rank=) is a rank: an integer from 0 to 2**31 - 1."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= INT32_MAX:
        shown = str(rank)
        shown = shown if len(shown) <= 24 else shown[:20] + "..."
        raise RankError(f"rank {shown} is not a rank (an integer from 0 to {INT32_MAX})")


def _resolve_rank(
    path: Path, meta: dict[str, object], rank: int | None, default_rank: int | None = None
) -> tuple[int, str]:
    if rank is not None:
        check_rank_argument(rank)
        return int(rank), "argument"
    di = meta.get("distributedInfo")
    if isinstance(di, dict) and di.get("rank") is not None:
        r = to_small_int(di.get("rank"))
        if r >= 0:
            return r, "distributedInfo"
    r2 = rank_from_filename(path)
    if r2 is not None:
        return r2, "file name"
    if default_rank is not None:
        return int(default_rank), "default"
    raise RankError(
        f"{path}: cannot tell the rank (no distributedInfo.rank in the trace, no rank-N in the file name); "
        "pass it with --rank N (rank= in Python) or name the file rank-N.json[.gz]"
    )


# ----------------------------------------------------------------------------------------------
# Public API


def read_kineto(
    path: str | os.PathLike[str],
    *,
    rank: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    on_progress: Any = None,
    default_rank: int | None = None,
) -> Run:
    """Read one Kineto trace (`.json` or `.json.gz`) into a Run with one rank.

    `rank` overrides the rank found in the trace (`distributedInfo.rank`) or in the file name
    (`rank-3`, `rank3`, `_rank_3`); without any of these the rank is `default_rank` (rank_source
    "default", noted in data_quality), or, when that is None, RankError says how to pass it.
    Streams the file in chunks of about `chunk_bytes` of JSON, so memory stays bounded.
    `on_progress(bytes_done_on_disk, file_size)` is called after each chunk when given.
    Errors: TraceFormatError (file + byte offset / event index) for a truncated gzip, truncated or
    invalid JSON, no `traceEvents`, a trace with no events, or one where no X event has a `ts`.
    X events lacking `ts`/`dur` among good ones are skipped and counted in data_quality.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise TraceFormatError(p, f"cannot read: {exc.strerror}") from None
    prog = FileProgress()
    stream = Stream(p, chunk_bytes, prog)
    cols = Columns()
    # The decoded events are acyclic (JSON cannot make cycles): the cyclic GC only costs time here.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if not stream.header():
            raise stream.whole_document_error()
        for evs in stream.chunks():
            cols.add(evs)
            del evs
            if on_progress is not None:
                on_progress(prog.done, size)
        stream.tail()
        cols.finish_begin_end()
        cols.note_merged_ranks(p.name)
    finally:
        if gc_was_enabled:
            gc.enable()
    meta = stream.meta
    if stream.coerced[0]:
        cols.dq.add(
            "events_fields_wrong_type",
            stream.coerced[0],
            f"{p.name}: complete events with a field of the wrong JSON type (a string dur, an object pid, "
            "args that are not an object...): each such field read as the value it spells, else as missing",
        )
    if stream.utf8_replaced:
        cols.dq.add(
            "invalid_utf8_replaced",
            stream.utf8_replaced,
            f"{p.name}: invalid UTF-8 bytes in event strings (names) were replaced by U+FFFD",
        )
    if cols.events_total == 0:
        raise TraceFormatError(p, "empty trace: traceEvents has no events")
    if cols.rows == 0 and cols.dq.counts.get("events_without_ts", 0):
        raise TraceFormatError(p, "no complete (X) event has a ts: cannot place anything in time")
    r, rank_source = _resolve_rank(p, meta, rank, default_rank)
    if rank_source == "default":
        cols.dq.add(
            "rank_assumed",
            1,
            f"{p.name}: no distributedInfo.rank and no rank-N in the file name: read as rank {r} "
            "(pass --rank N to choose)",
        )
    di = meta.get("distributedInfo")
    own = to_small_int(di.get("rank")) if isinstance(di, dict) and di.get("rank") is not None else -1
    if isinstance(di, dict) and di.get("rank") is not None and own < 0:
        cols.dq.add(
            "rank_unusable",
            1,
            f"{p.name}: distributedInfo.rank {str(di.get('rank'))[:40]!r} is not a rank (0 to 2**31-1): ignored",
        )
    if rank_source == "argument" and own >= 0 and own != r:
        cols.dq.add(
            "rank_overridden",
            1,
            f"{p.name}: the trace says rank {own} (distributedInfo.rank) but rank {r} was given: read as rank {r}",
        )
    base_raw = meta.get("baseTimeNanoseconds")
    base_ns = to_int(base_raw) if base_raw is not None else 0
    if base_raw is not None and (base_ns < 0 or isinstance(base_raw, bool)):
        cols.dq.add(
            "base_time_unusable",
            1,
            f"{p.name}: baseTimeNanoseconds {str(base_raw)[:40]!r} is not a time in int64 ns: read as 0 "
            "(the timestamps stay relative to an unknown start)",
        )
        base_ns = 0
    kept_before = cols.rows
    events = _build_table(cols, r, base_ns, meta)
    if kept_before and events.empty:
        raise TraceFormatError(
            p,
            f"baseTimeNanoseconds {str(base_raw)[:40]} puts every event beyond the int64 ns range "
            "(after the year 2262): not a time",
        )
    if cols.rows == 0:
        cols.dq.add("traces_without_complete_events", 1, f"{p.name}: no complete (X) events")
    info: dict[str, object] = {k: v for k, v in meta.items() if k != "traceEvents"}
    info.update(
        {
            "source": str(p),
            "reader": READER_VERSION,
            "rank_source": rank_source,
            "ts_convention": "us relative to baseTimeNanoseconds"
            if base_raw is not None
            else "us since epoch",
            "events_total": cols.events_total,
            "events_kept": cols.rows,
            "json_bytes": stream.total_bytes,
            "file_bytes": size,
        }
    )
    return Run(events=events, sources={r: str(p)}, rank_info={r: info}, data_quality=cols.dq)
