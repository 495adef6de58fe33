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
"""

from __future__ import annotations

import functools
import gc
import math
import operator
import os
import queue
import re
import threading
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from decimal import Decimal, InvalidOperation
from itertools import filterfalse
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import pandas as pd

from tracekit.errors import RankError, TraceFormatError
from tracekit.model.events import COLUMNS, DataQuality, Run, make_events
from tracekit.read.limits import (
    ENV_MAX_BYTES,
    ENV_MAX_EVENTS,
    ENV_MAX_TOKEN_BYTES,
    current_limits,
    describe_bytes,
)

#: Bumped whenever the reader's output for the same file could change (invalidates the cache).
READER_VERSION = "kineto-3"  # 2: bytes of gloo:/nccl: ranges from their shapes; enqueue join
# 3: a `rank` argument that differs from the trace's distributedInfo.rank is noted in data_quality

#: Bytes of decompressed JSON decoded at a time (one chunk of whole events).
CHUNK_BYTES = 4 * 1024 * 1024  # measured (issue 7): 4 MB is as fast as 16 MB on 290 MB, 20% faster on 29 MB
_READ_BLOCK = 4 * 1024 * 1024

_EMPTY_RAW = msgspec.Raw(b"")

KIND_OF_CAT: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
}
_GPU_KINDS = frozenset({"kernel", "memcpy", "memset", "gpu_annotation"})

#: torch dtype names (c10::toString(ScalarType)) -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "Byte": 1,
    "Char": 1,
    "Bool": 1,
    "Short": 2,
    "Int": 4,
    "Long": 8,
    "Half": 2,
    "Float": 4,
    "Double": 8,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "BFloat16": 2,
    "QInt8": 1,
    "QUInt8": 1,
    "QInt32": 4,
    "QUInt4x2": 1,
    "QUInt2x4": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    "Bits8": 1,
    "Bits16": 2,
}

#: Raw collective names (lower-cased) -> normalised op (see tracekit.model.events.COLLECTIVE_OPS).
_COLL_OP: dict[str, str] = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "_allreduce_base": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allreduce_sparse": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "allgather_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoallv": "all_to_all",
    "sendrecv": "send_recv",
    "send_recv": "send_recv",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}


@functools.lru_cache(maxsize=8192)  # pure; called per event row by the collective joins
def normalise_coll_op(name: str) -> str:
    """Normalise a raw collective name ("allreduce", "_allgather_base", "nccl:all_reduce"...) -> op or ""."""
    n = name.strip().lower()
    for prefix in ("nccl:", "gloo:", "c10d::", "rccl:", "c10d_functional::", "_c10d_functional::"):
        if n.startswith(prefix):
            n = n[len(prefix) :]
    n = n.rstrip("_")
    return _COLL_OP.get(n, "")


# NCCL/RCCL kernel names: ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL,
# ncclDevKernel_SendRecv, ncclDevKernel_ReduceScatter_Sum_f32_RING_LL, ncclKernel_Broadcast_...
_NCCL_KERNEL_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_NCCL_KERNEL_OP: dict[str, str] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "send_recv",
    "send": "send",
    "recv": "recv",
    "alltoall": "all_to_all",
    "alltoallpivot": "all_to_all",
}


def coll_op_from_kernel_name(name: str) -> str:
    """The collective an NCCL/RCCL kernel performs, from its name alone ("" when not one)."""
    m = _NCCL_KERNEL_RE.search(name)
    if not m:
        return ""
    return _NCCL_KERNEL_OP.get(m.group(1).lower(), "")


# ----------------------------------------------------------------------------------------------
# Typed decode structs: only the fields we need; msgspec skips the rest without building objects.


class _Args(msgspec.Struct, gc=False):
    device: Any = -1
    stream: Any = -1
    correlation: Any = -1
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    in_size: Any = msgspec.field(default=None, name="In msg size")
    out_size: Any = msgspec.field(default=None, name="Out msg size")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    # record_shapes (`cpu`/`full` modes): kept as raw JSON text, parsed only for collective ops
    in_dims: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input Dims")
    in_types: msgspec.Raw = msgspec.field(default=_EMPTY_RAW, name="Input type")


class _Ev(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event ("ph": "X"), the only kind that becomes a row."""

    cat: str = ""
    name: str = ""
    ts: msgspec.Raw = _EMPTY_RAW
    dur: float = float("nan")
    pid: int | str = -1
    tid: int | str = -1
    args: _Args = msgspec.field(default_factory=_Args)


# Every other Chrome-trace phase decodes into an empty struct (its fields are skipped unparsed).
_OTHER_PHASES = "BEiICbneNODstfPMVvRc()"
_OTHER_TYPES: dict[str, type] = {
    ph: msgspec.defstruct(f"_Ph{ord(ph)}", [], tag_field="ph", tag=ph, gc=False) for ph in _OTHER_PHASES
}
_PhUnknown = msgspec.defstruct("_PhUnknown", [], gc=False)
_PHASE_OF_TYPE: dict[type, str] = {t: ph for ph, t in _OTHER_TYPES.items()}
_PHASE_OF_TYPE[_PhUnknown] = "?"


class _EvLenient(msgspec.Struct, gc=False):
    """Fallback when a chunk has unexpected types (e.g. a string `dur`): slower, accepts anything."""

    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    ts: msgspec.Raw = _EMPTY_RAW
    dur: Any = None
    pid: Any = -1
    tid: Any = -1
    args: _Args | Any = None


_EVENT_UNION: Any = Union[(_Ev, *_OTHER_TYPES.values())]  # noqa: UP007
_DECODER = msgspec.json.Decoder(list[_EVENT_UNION])
_DECODER_LENIENT = msgspec.json.Decoder(list[_EvLenient])
_ANY_DECODER = msgspec.json.Decoder()

_BYTE_RE = re.compile(r"\(byte (\d+)\)")


def _error_byte(exc: Exception) -> int | None:
    m = _BYTE_RE.search(str(exc))
    return int(m.group(1)) if m else None


# ----------------------------------------------------------------------------------------------
# Streaming input: decompressed blocks -> header / chunks of whole events / tail


class _FileProgress:
    """Bytes of the file on disk consumed so far (for a progress display)."""

    def __init__(self) -> None:
        self.done = 0


def _iter_blocks(path: Path, progress: _FileProgress) -> Iterator[bytes]:
    """Decompressed bytes of the file, block by block. Raises TraceFormatError on a bad gzip stream.

    A gzip file is inflated in a helper thread (zlib releases the GIL), so with a second core the
    decompression overlaps the JSON decoding; at most `_GZ_QUEUE` blocks wait, so memory stays bounded.
    """
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        if not gz:
            f.seek(0)
            while True:
                block = f.read(_READ_BLOCK)
                if not block:
                    return
                progress.done += len(block)
                yield block
    yield from _in_thread(_gunzip_blocks(path, progress))


_GZ_READ_BLOCK = 512 * 1024  # compressed bytes per inflate call (a few MB out)
_GZ_QUEUE = 4
_INFLATE_OUT = 8 * 1024 * 1024  # decompressed bytes per inflate call (deflate can inflate 1032:1)
_END = object()


def _in_thread(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """The blocks of `blocks`, produced in a daemon thread; its exception is raised here, in order."""
    q: queue.Queue[Any] = queue.Queue(maxsize=_GZ_QUEUE)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for block in blocks:
                if not put(block):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()

    t = threading.Thread(target=run, name="tracekit-gunzip", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join()


def _gunzip_blocks(path: Path, progress: _FileProgress) -> Iterator[bytes]:
    """Inflated blocks of a gzip file (several members allowed, zero padding after the last)."""
    with open(path, "rb") as f:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        member_started = False
        consumed = 0
        while True:
            block = f.read(_GZ_READ_BLOCK)
            if not block:
                break
            progress.done += len(block)
            data = block
            while data:
                member_started = True
                try:  # at most _INFLATE_OUT bytes out per call: a gzip bomb inflates in bounded blocks
                    out = d.decompress(data, _INFLATE_OUT)
                except zlib.error as exc:
                    raise TraceFormatError(path, f"corrupt gzip stream ({exc})", offset=consumed) from None
                if d.eof:
                    consumed += len(data) - len(d.unused_data)
                    if out:
                        yield out
                    data = d.unused_data
                    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    member_started = False
                    if data and not data.strip(b"\x00"):
                        data = b""  # zero padding after the last member
                else:
                    rest = d.unconsumed_tail
                    consumed += len(data) - len(rest)
                    if out:
                        yield out
                    data = rest
        if member_started and not d.eof:
            rest = d.flush()
            if rest:
                yield rest
            raise TraceFormatError(
                path, "truncated gzip stream (the file ends before the gzip end marker)", offset=consumed
            )


_NOT_WS = re.compile(rb"[^ \t\r\n]")


def _skip_ws(buf: bytearray | bytes, i: int) -> int:
    """The index of the first non-whitespace byte at or after `i` (len(buf) when none); at C speed,
    so a long run of whitespace costs what a memchr does, not a Python loop per byte."""
    m = _NOT_WS.search(buf, i)
    return m.start() if m else len(buf)


def _utf8_error_at(text: bytes | bytearray) -> int:
    """The offset of the first invalid UTF-8 byte of `text` (0 when it decodes)."""
    try:
        bytes(text).decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start
    return 0


#: a dur at or above this (us) is not a duration (2**62 ns: 146 years); skipped and counted
_MAX_DUR_US = 2.0**62 / 1000.0
_DAY_NS = 86_400e9
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1


def _to_int(v: Any) -> int:
    """`v` as an int64 value; -1 (missing) when it is not a number or does not fit an int64
    ("inf", 1e30, 10**30, "12x")."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if _INT64_MIN <= v <= _INT64_MAX else -1
    if isinstance(v, str) and len(v) > 64:  # int() of a long digit string is quadratic
        return -1
    try:
        out = int(v)
    except (TypeError, ValueError, OverflowError):
        try:
            out = int(float(v))
        except (TypeError, ValueError, OverflowError):
            return -1
    return out if _INT64_MIN <= out <= _INT64_MAX else -1


def _to_small_int(v: Any) -> int:
    """`v` as a non-negative int32 value (a rank, a group size); -1 when missing or out of range."""
    out = _to_int(v)
    return out if 0 <= out <= _INT32_MAX else -1


def _ints(values: list[Any]) -> np.ndarray:
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_to_int(v) for v in values], dtype=np.int64)


def _int_column(
    getter: Any, items: list[Any], n: int, dq: DataQuality | None = None, what: str = ""
) -> np.ndarray:
    """getter(item) for every item as int64, straight from the iterator (no list) when all are ints.
    Integers that do not fit an int64 become -1 (missing), counted in `dq` as `values_out_of_range`."""
    try:
        return np.fromiter(map(getter, items), np.int64, n)
    except (TypeError, ValueError, OverflowError):  # e.g. the one "Trace" span with pid "Spans"
        vals = list(map(getter, items))
        huge = sum(1 for v in vals if isinstance(v, (int, float)) and not _INT64_MIN <= v <= _INT64_MAX)
        if huge and dq is not None:
            dq.add(
                "values_out_of_range",
                huge,
                f"event fields ({what}) beyond the int64 range (>= 2**63) were read as missing",
            )
        return np.array(
            [v if v.__class__ is int and _INT64_MIN <= v <= _INT64_MAX else _to_int(v) for v in vals],
            np.int64,
        )


def _to_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _coerce_lenient(evs: list[Any], tally: list[int] | None = None) -> list[Any]:
    """Events decoded leniently, as the typed structs; `tally[0]` counts the complete events that had
    a field of the wrong JSON type (an object pid, args that are not an object, a string dur...)."""
    out: list[Any] = []
    for e in evs:
        if e.ph != "X":
            out.append(_OTHER_TYPES.get(str(e.ph), _PhUnknown)())
            continue
        args = e.args if isinstance(e.args, _Args) else _Args()
        pid = e.pid if isinstance(e.pid, (int, str)) and not isinstance(e.pid, bool) else -1
        tid = e.tid if isinstance(e.tid, (int, str)) and not isinstance(e.tid, bool) else -1
        if tally is not None and (
            pid is not e.pid
            or tid is not e.tid
            or (e.args is not None and not isinstance(e.args, (_Args, dict)))
            or not isinstance(e.cat, str)
            or not isinstance(e.name, str)
            or not (
                e.dur is None
                or isinstance(e.dur, float)
                or (isinstance(e.dur, int) and not isinstance(e.dur, bool))
            )
        ):
            tally[0] += 1
        out.append(
            _Ev(
                cat=str(e.cat),
                name=str(e.name),
                ts=e.ts,
                dur=_to_float(e.dur) if e.dur is not None else float("nan"),
                pid=pid,
                tid=tid,
                args=args,
            )
        )
    return out


class _EvLenientArgs(msgspec.Struct, gc=False):
    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    ts: msgspec.Raw = _EMPTY_RAW
    dur: Any = None
    pid: Any = -1
    tid: Any = -1
    args: Any = None


_DECODER_LENIENT_ARGS = msgspec.json.Decoder(list[_EvLenientArgs])


class _Stream:
    """Splits the decompressed byte stream into the header, decoded chunks of whole events and the tail."""

    def __init__(self, path: Path, chunk_bytes: int, progress: _FileProgress):
        self.path = path
        self.blocks = _iter_blocks(path, progress)
        self.buf = bytearray()
        self.base = 0  # stream offset of buf[0]
        self.eof = False
        self.chunk_bytes = chunk_bytes
        self.meta: dict[str, Any] = {}
        self.total_bytes = 0
        self.events_seen = 0
        self.utf8_replaced = 0  # chunks in which invalid UTF-8 was replaced
        self.coerced = [0]  # complete events with a field of the wrong JSON type
        self.limits = current_limits()
        self.ws_run = 0  # whitespace consumed since the last event (a run of it is bounded too)

    def _fill(self, want: int) -> None:
        while not self.eof and len(self.buf) < want:
            try:
                block = next(self.blocks)
            except StopIteration:
                self.eof = True
                break
            self.buf += block
            self.total_bytes += len(block)
            if self.total_bytes > self.limits.max_bytes:
                raise TraceFormatError(
                    self.path,
                    f"more than {describe_bytes(self.limits.max_bytes)} of JSON once decompressed: the limit on "
                    f"decompressed bytes (--max-bytes or {ENV_MAX_BYTES}; raise it to read this file)",
                    offset=self.limits.max_bytes,
                )

    def _count(self, n: int) -> None:
        self.events_seen += n
        if self.events_seen > self.limits.max_events:
            raise TraceFormatError(
                self.path,
                f"more than {self.limits.max_events} events: the limit on events "
                f"(--max-events or {ENV_MAX_EVENTS}; raise it to read this file)",
                event_index=self.limits.max_events,
            )

    def _too_long(self, what: str, offset: int) -> TraceFormatError:
        lim = self.limits.max_token_bytes
        return TraceFormatError(
            self.path,
            f"{what} longer than {describe_bytes(lim)}: the limit on one JSON token "
            f"({ENV_MAX_TOKEN_BYTES}); not a profiler's trace",
            offset=offset,
        )

    def _consume(self, n: int) -> None:
        del self.buf[:n]
        self.base += n

    def _parse_object_text(self, text: bytes, offset: int) -> dict[str, Any]:
        try:
            obj = _ANY_DECODER.decode(text)
        except RecursionError:
            raise TraceFormatError(
                self.path, "JSON nested too deeply in the trace's metadata", offset=offset
            ) from None
        except msgspec.DecodeError as exc:
            if "UTF-8" in str(exc):
                raise TraceFormatError(
                    self.path, "invalid UTF-8 in the trace's metadata", offset=offset + _utf8_error_at(text)
                ) from None
            pos = _error_byte(exc)
            if pos is None:
                raise TraceFormatError(self.path, "truncated JSON", offset=offset + len(text) - 1) from None
            raise TraceFormatError(
                self.path, f"invalid JSON: {str(exc).split(' (byte')[0]}", offset=offset + pos
            ) from None
        return obj if isinstance(obj, dict) else {}

    def whole_document_error(self) -> TraceFormatError:
        """The file has no `"traceEvents": [`: say whether it is invalid JSON or lacks the key."""
        self._fill(self.limits.max_token_bytes + 1)
        if not self.eof and len(self.buf) > self.limits.max_token_bytes:
            if not bytes(self.buf).strip():
                return self._too_long("a run of whitespace", self.base)
            return TraceFormatError(
                self.path,
                f"no traceEvents within the first {describe_bytes(self.limits.max_token_bytes)}: "
                "not a Kineto/Chrome trace",
                offset=self.base,
            )
        text = bytes(self.buf)
        if not text.strip():
            return TraceFormatError(self.path, "empty file (no JSON at all)", offset=0)
        try:
            obj = _ANY_DECODER.decode(text)
        except RecursionError:
            return TraceFormatError(self.path, "JSON nested too deeply", offset=0)
        except msgspec.DecodeError as exc:
            if "UTF-8" in str(exc):
                return TraceFormatError(self.path, "invalid UTF-8", offset=_utf8_error_at(text))
            pos = _error_byte(exc)
            if pos is None:
                return TraceFormatError(self.path, "truncated JSON (the file ends early)", offset=len(text))
            return TraceFormatError(self.path, f"invalid JSON: {str(exc).split(' (byte')[0]}", offset=pos)
        if isinstance(obj, dict) and "traceEvents" in obj:
            return TraceFormatError(self.path, "traceEvents is not a list of events", offset=None)
        return TraceFormatError(self.path, "no traceEvents: not a Kineto/Chrome trace", offset=None)

    def header(self) -> bool:
        """Find `"traceEvents": [` and parse what precedes it. False when not found."""
        key = b'"traceEvents"'
        searched = 0
        while True:
            idx = self.buf.find(key, max(searched - len(key), 0))
            if idx >= 0:
                break
            if self.eof or len(self.buf) > self.limits.max_token_bytes:
                return False
            searched = len(self.buf)
            self._fill(len(self.buf) + _READ_BLOCK)
        self._fill(idx + len(key) + 4096)
        j = _skip_ws(self.buf, idx + len(key))
        if j >= len(self.buf) or self.buf[j] != ord(":"):
            return False
        j = _skip_ws(self.buf, j + 1)
        if j >= len(self.buf) or self.buf[j] != ord("["):
            return False
        prefix = bytes(self.buf[:idx]).rstrip()
        if prefix.endswith(b","):
            prefix = prefix[:-1]
        if not prefix.lstrip().startswith(b"{"):
            return False
        self.meta.update(self._parse_object_text(prefix + b"}", self.base))
        self._consume(j + 1)
        return True

    def _decode(self, doc: bytes) -> list[Any]:
        try:
            return self._decode_typed(doc)
        except RecursionError:
            raise TraceFormatError(
                self.path,
                f"JSON nested too deeply near event #{self.events_seen}",
                offset=self.base,
            ) from None

    def _decode_typed(self, doc: bytes) -> list[Any]:
        try:
            return _DECODER.decode(doc)
        except msgspec.ValidationError:
            pass
        try:
            return _coerce_lenient(_DECODER_LENIENT.decode(doc), self.coerced)
        except msgspec.ValidationError:
            pass
        try:
            return _coerce_lenient(_DECODER_LENIENT_ARGS.decode(doc), self.coerced)
        except msgspec.ValidationError as exc:
            raise TraceFormatError(
                self.path, f"unexpected event layout: {exc}", event_index=self.events_seen
            ) from None

    def chunks(self) -> Iterator[list[Any]]:
        """Yield decoded lists of whole events until the end of the traceEvents array."""
        while True:
            self._fill(self.chunk_bytes)
            i = _skip_ws(self.buf, 0)
            if i < len(self.buf) and self.buf[i] == ord(","):
                i = _skip_ws(self.buf, i + 1)
            if i >= len(self.buf):
                if self.eof:
                    raise TraceFormatError(
                        self.path,
                        f"truncated JSON: the file ends inside traceEvents (after event #{self.events_seen})",
                        offset=self.base + i,
                    )
                self.ws_run += i
                if self.ws_run > self.limits.max_token_bytes:
                    raise self._too_long("a run of whitespace", self.base + i)
                self._consume(i)
                continue
            self.ws_run = 0
            if self.buf[i] == ord("]"):
                self._consume(i + 1)
                return
            self._consume(i)
            cut = self._last_cut(len(self.buf))
            while True:
                final = False
                if cut is None:
                    if len(self.buf) > self.limits.max_token_bytes + self.chunk_bytes:
                        raise self._too_long(f"event #{self.events_seen} (or what follows it)", self.base)
                    if not self.eof:
                        self._fill(len(self.buf) + self.chunk_bytes)
                        cut = self._last_cut(len(self.buf))
                        continue
                    cut = len(self.buf)
                    final = True
                with memoryview(self.buf) as mv:
                    doc = b"".join((b"[", mv[:cut], b"]"))
                try:
                    evs = self._decode(doc)
                except msgspec.DecodeError as exc:
                    msg = str(exc)
                    pos = _error_byte(exc)
                    if "UTF-8" in msg and pos is None and (bad := _utf8_error_at(doc)) > 0:
                        if bad - 1 < cut:  # a name with invalid UTF-8: replaced (U+FFFD), counted
                            fixed = bytes(self.buf[:cut]).decode("utf-8", "replace").encode("utf-8")
                            self.utf8_replaced += 1
                            self.buf[:cut] = fixed
                            cut = len(fixed)
                            continue
                    if "trailing characters" in msg and pos is not None:
                        # the traceEvents array closed inside doc; doc[:pos] is the array
                        # (msgspec reports one past the first trailing character; find the ']')
                        end = doc.rfind(b"]", 0, pos) + 1
                        try:
                            evs = self._decode(doc[:end])
                        except msgspec.DecodeError as exc2:  # e.g. `]]`: not one array
                            at = _error_byte(exc2)
                            raise TraceFormatError(
                                self.path,
                                f"invalid JSON near event #{self.events_seen}: {str(exc2).split(' (byte')[0]}",
                                offset=self.base + (at - 1 if at else 0),
                            ) from None
                        self._count(len(evs))
                        yield evs
                        self._consume(end - 1)
                        return
                    at_end = pos is None or pos >= len(doc) - 1
                    if at_end and not final:
                        # a '}' inside a string or a nested object: step back to an earlier cut
                        cut = self._last_cut(cut - 1)
                        continue
                    if pos is None or pos >= len(doc) - 1:
                        raise TraceFormatError(
                            self.path,
                            f"truncated JSON: the file ends inside event #{self.events_seen}",
                            offset=self.base + len(self.buf),
                        ) from None
                    raise TraceFormatError(
                        self.path,
                        f"invalid JSON near event #{self.events_seen}: {msg.split(' (byte')[0]}",
                        offset=self.base + pos - 1,
                    ) from None
                self._count(len(evs))
                yield evs
                self._consume(cut)
                break

    def _last_cut(self, end: int) -> int | None:
        buf = self.buf
        j = end
        while j > 0:
            k = buf.rfind(b"}", 0, j)
            if k < 0:
                return None
            m = _skip_ws(buf, k + 1)
            if m < len(buf):
                if buf[m] in b",]":
                    return k + 1
            elif self.eof:
                return k + 1
            j = k
        return None

    def tail(self) -> None:
        """Parse what follows the traceEvents array (`, "key": value ... }`)."""
        self._fill(self.limits.max_token_bytes + 1)
        if not self.eof:
            raise self._too_long("what follows traceEvents", self.base)
        rest = bytes(self.buf)
        i = _skip_ws(rest, 0)
        if i < len(rest) and rest[i] == ord(","):
            self.meta.update(self._parse_object_text(b"{" + rest[i + 1 :], self.base + i))
        elif i >= len(rest) or rest[i] != ord("}"):
            raise TraceFormatError(
                self.path, "truncated JSON: the file ends after traceEvents", offset=self.base + i
            )


# ----------------------------------------------------------------------------------------------
# Exact timestamp parsing: JSON number text (microseconds) -> integer nanoseconds


_POW10 = np.array([10**k for k in range(19)], dtype=np.int64)
_DEC_INT64_MIN = Decimal(-(2**63))
_DEC_INT64_MAX = Decimal(2**63 - 1)


def _text_matrix(texts: Sequence[Any], n: int) -> tuple[np.ndarray, bool]:
    """The texts as an (n, width) uint8 matrix, right-padded with NUL (one join, no object per row),
    and whether every text has the same length."""
    lengths = np.fromiter(map(len, texts), np.int64, n)
    w = int(lengths.max())
    flat = np.frombuffer(b"".join(texts), np.uint8)
    if w == 0:
        return np.zeros((n, 1), np.uint8), True
    if int(lengths.min()) == w:
        return flat.reshape(n, w), True
    m = np.zeros((n, w), np.uint8)
    row = np.repeat(np.arange(n), lengths)
    col = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    m[row, col] = flat
    return m, False


def _parse_fixed(m: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Fast path: every row is digits with the point in one column (Kineto's fixed-decimals ts)."""
    n, w = m.shape
    first = bytes(m[0])
    d0 = first.find(b".")
    cols = np.arange(w)
    other = cols != d0
    if not other.any():
        return None
    if d0 >= 0 and not (m[:, d0] == 46).all():
        return None
    if not ((m[:, other] - np.uint8(48)) <= 9).all():  # uint8 wrap-around: non-digits are > 9
        return None
    if d0 < 0:
        d0 = w
    pw = np.where(cols < d0, d0 - cols + 2, d0 - cols + 3)[other]  # power of ten in ns
    if (pw > 18).any():
        return None
    digits = m[:, other]
    if (pw == 18).any() and (digits[:, pw == 18] >= 57).any():  # >= 9e18 ns: may not fit int64
        return None
    keep = pw >= 0
    ns = (digits[:, keep].astype(np.int64) - 48) @ _POW10[pw[keep]]
    sub = int((digits[:, ~keep] != 48).any(axis=1).sum()) if (~keep).any() else 0
    return ns, sub


def parse_us_to_ns(
    texts: Sequence[Any], counts: dict[str, int] | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Parse JSON number texts (bytes or msgspec.Raw) in microseconds into exact integer ns.

    Returns (ns int64, valid bool, sub_ns) where `valid` is False for empty/non-numeric text and
    `sub_ns` counts values with more than 3 decimals (digits below 1 ns are dropped, truncating).
    Exponent notation (1.5e3) is handled exactly through Decimal for those rows.

    Vectorised over a (rows, characters) byte matrix: each digit's power of ten comes from its
    distance to the row's decimal point, and a row's value is the integer sum of digit x 10**power
    (no float anywhere). When all rows share one layout (the usual case: Kineto writes a fixed
    number of decimals) this is one integer matrix product (`_parse_fixed`).
    """
    n = len(texts)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool), 0
    m, same_length = _text_matrix(texts, n)
    if same_length:
        fixed = _parse_fixed(m)
        if fixed is not None:
            return fixed[0], np.ones(n, bool), fixed[1]
    w = m.shape[1]
    isdig = (m >= 48) & (m <= 57)
    isdot = m == 46
    # allowed non-digits: the point, NUL padding, a sign, the quotes of a string value
    odd_rows = ~(isdig | isdot | (m == 0) | (m == 45) | (m == 43) | (m == 34))
    odd = odd_rows.any(axis=1) | (isdot.sum(axis=1) > 1)
    has_dot = isdot.any(axis=1)
    any_dig: np.ndarray = np.asarray(isdig.any(axis=1))
    last_dig = w - 1 - np.argmax(isdig[:, ::-1], axis=1)
    dot = np.where(has_dot, np.argmax(isdot, axis=1), last_dig + 1)
    cols = np.arange(w)
    pw = np.where(
        cols[None, :] < dot[:, None], dot[:, None] - cols[None, :] + 2, dot[:, None] - cols[None, :] + 3
    )
    sub: np.ndarray = np.asarray((isdig & (pw < 0) & (m != 48)).any(axis=1))
    odd = odd | (isdig & ((pw > 18) | ((pw == 18) & (m >= 57)))).any(axis=1)  # may not fit int64
    use = isdig & (pw >= 0) & (pw <= 18)
    ns = np.where(use, (m.astype(np.int64) - 48) * _POW10[np.clip(pw, 0, 18)], 0).sum(axis=1)
    first = m[:, 0]
    if counts is not None:  # numbers written as JSON strings ("123.5"): read, and counted
        counts["strings"] = counts.get("strings", 0) + int(((first == 34) & valid_text(m)).sum())
    neg = (first == 45) | ((first == 34) & (m[:, 1] == 45) if w > 1 else False)
    if neg.any():
        ns = np.where(neg, -ns, ns)
    valid = any_dig.copy()
    if odd.any():
        for i in np.flatnonzero(odd).tolist():
            try:
                raw = bytes(texts[i])
                if len(raw) > 64:  # no timestamp is written with more digits; 1e900000-style texts
                    raise ValueError(raw[:20])
                v = Decimal(raw.decode().strip('"')) * 1000
                # the check before int(): int() of Decimal("1e900000") builds a 900k-digit number
                valid[i] = v.is_finite() and _DEC_INT64_MIN <= v <= _DEC_INT64_MAX
                ns[i] = int(v) if valid[i] else 0
                sub[i] = bool(valid[i]) and v != v.to_integral_value()
            except (InvalidOperation, ValueError, OverflowError, ArithmeticError, UnicodeDecodeError):
                valid[i] = False
                sub[i] = False
    return ns, valid, int(sub.sum())


def valid_text(m: np.ndarray) -> np.ndarray:
    """Rows of a text matrix holding at least one digit."""
    return np.asarray(((m >= 48) & (m <= 57)).any(axis=1))


# ----------------------------------------------------------------------------------------------
# Chunk -> columns


_is_complete = _Ev.__instancecheck__
_get_ts = operator.attrgetter("ts")
_get_dur = operator.attrgetter("dur")
_get_cat = operator.attrgetter("cat")
_get_name = operator.attrgetter("name")
_get_args = operator.attrgetter("args")
_get_pid = operator.attrgetter("pid")
_get_tid = operator.attrgetter("tid")
_get_device = operator.attrgetter("device")
_get_stream = operator.attrgetter("stream")
_get_corr = operator.attrgetter("correlation")


class _Interner(dict):  # type: ignore[type-arg]
    """str -> code, a new code on first sight (C-speed lookups through map(d.__getitem__, ...))."""

    def __missing__(self, key: str) -> int:
        code = self[key] = len(self)
        return code


class _CatKinds(dict):  # type: ignore[type-arg]
    """Kineto `cat` -> kind code."""

    def __init__(self, kind_codes: dict[str, int]):
        super().__init__()
        self.kind_codes = kind_codes

    def __missing__(self, key: str) -> int:
        code = self[key] = self.kind_codes[KIND_OF_CAT.get(key, "other")]
        return code


class _Columns:
    """Accumulates per-chunk numpy columns and interned strings."""

    def __init__(self) -> None:
        self.start: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.kind: list[np.ndarray] = []
        self.name: list[np.ndarray] = []
        self.device: list[np.ndarray] = []
        self.stream: list[np.ndarray] = []
        self.corr: list[np.ndarray] = []
        self.names: dict[str, int] = _Interner()
        self.kind_codes = {k: i for i, k in enumerate(_KIND_CATEGORIES)}
        self.cat_codes = _CatKinds(self.kind_codes)
        self.rows = 0
        # sparse collective metadata: global row -> tuple
        self.coll_rows: list[int] = []
        self.coll_vals: list[tuple[Any, ...]] = []
        # record_shapes of host collective ops (gloo:, nccl:, c10d::): global row -> raw JSON texts
        self.shape_rows: list[int] = []
        self.shape_vals: list[tuple[bytes, bytes]] = []
        self._coll_codes: list[int] = []
        self._names_checked = 0
        self.dq = DataQuality()
        self.events_total = 0

    def host_collective_codes(self) -> np.ndarray:
        """Name codes of host collective ops (`gloo:*`, `nccl:*`, `c10d::*`), names seen so far."""
        if self._names_checked < len(self.names):
            new = list(self.names)[self._names_checked :]
            self._coll_codes.extend(self.names[n] for n in new if _HOST_COLL_PREFIX.match(n))
            self._names_checked = len(self.names)
        return np.asarray(self._coll_codes, np.int32)

    def add(self, evs: list[Any]) -> None:
        self.events_total += len(evs)
        xs: list[_Ev] = list(filter(_is_complete, evs))
        if len(xs) != len(evs):
            for t, cnt in Counter(map(type, filterfalse(_is_complete, evs))).items():
                self.dq.add(_PHASE_KEY.get(_PHASE_OF_TYPE.get(t, "?"), "skipped_other_phase_events"), cnt)
        if not xs:
            return
        n = len(xs)
        ts_counts: dict[str, int] = {}
        ts_ns, ts_ok, sub_ns = parse_us_to_ns(list(map(_get_ts, xs)), ts_counts)
        if ts_counts.get("strings"):
            self.dq.add(
                "ts_as_string",
                ts_counts["strings"],
                "timestamps written as JSON strings were read as the numbers they spell",
            )
        if sub_ns:
            self.dq.add(
                "ts_sub_ns_digits_dropped", sub_ns, "some timestamps had digits below 1 ns; they were dropped"
            )
        dur_us = np.fromiter(map(_get_dur, xs), np.float64, n)
        dur_ok = np.isfinite(dur_us)
        huge_dur = dur_ok & (np.abs(dur_us) >= _MAX_DUR_US)
        if huge_dur.any():  # would not fit int64 ns (or spans centuries): unusable
            dur_ok &= ~huge_dur
            self.dq.add(
                "events_huge_dur",
                int(huge_dur.sum()),
                f"events with a dur of {_MAX_DUR_US:.0e} us or more (beyond int64 ns) were skipped",
            )
        dur_ns = np.zeros(n, np.int64)
        dur_ns[dur_ok] = np.rint(dur_us[dur_ok] * 1000.0).astype(np.int64)
        neg = dur_ok & (dur_ns < 0)
        keep = ts_ok & dur_ok & ~neg
        if not keep.all():
            self.dq.add(
                "events_without_ts",
                int((~ts_ok).sum()),
                "complete (X) events without a usable ts were skipped",
            )
            self.dq.add(
                "events_without_dur",
                int((ts_ok & ~dur_ok & ~huge_dur).sum()),
                "complete (X) events without a usable dur were skipped",
            )
            self.dq.add(
                "events_negative_dur", int((ts_ok & neg).sum()), "events with a negative dur were skipped"
            )
            idx = np.flatnonzero(keep)
            xs = [xs[i] for i in idx]
            ts_ns = ts_ns[idx]
            dur_ns = dur_ns[idx]
            n = len(xs)
            if not xs:
                return
        # kinds and names: interned through dicts (codes assigned on first sight)
        kind = np.fromiter(map(self.cat_codes.__getitem__, map(_get_cat, xs)), np.int8, n)
        name = np.fromiter(map(self.names.__getitem__, map(_get_name, xs)), np.int32, n)
        # device / stream / correlation
        args: list[_Args] = list(map(_get_args, xs))
        is_gpu = np.isin(kind, self._gpu_codes)
        dq = self.dq
        dev_arg = _int_column(_get_device, args, n, dq, "args.device")
        pid = _int_column(_get_pid, xs, n, dq, "pid")
        device = np.where(is_gpu, np.where(dev_arg >= 0, dev_arg, pid), -1)
        device = np.where(device <= _INT32_MAX, device, -1)  # the device column is int32
        str_arg = _int_column(_get_stream, args, n, dq, "args.stream")
        tid = _int_column(_get_tid, xs, n, dq, "tid")
        stream = np.where(is_gpu & (str_arg >= 0), str_arg, tid)
        corr = _int_column(_get_corr, args, n, dq, "args.correlation")
        # collective metadata (sparse)
        base = self.rows
        for i, a in enumerate(args):
            if a.coll_name is not None or a.in_nelems is not None or a.in_size is not None:
                self.coll_rows.append(base + i)
                self.coll_vals.append(
                    (
                        a.coll_name,
                        a.in_nelems if a.in_nelems is not None else a.in_size,
                        a.out_nelems if a.out_nelems is not None else a.out_size,
                        a.dtype,
                        a.group_size,
                        a.pg_name,
                        a.pg_ranks,
                        a.seq,
                    )
                )
        # record_shapes of host collective ops (their byte counts when the op has no comm args)
        codes = self.host_collective_codes()
        if codes.size:
            for i in np.flatnonzero(np.isin(name, codes)).tolist():
                a = args[i]
                if len(a.in_dims):
                    self.shape_rows.append(base + i)
                    self.shape_vals.append((bytes(a.in_dims), bytes(a.in_types)))
        self.start.append(ts_ns)
        self.dur.append(dur_ns)
        self.kind.append(kind)
        self.name.append(name)
        self.device.append(device.astype(np.int32))
        self.stream.append(stream)
        self.corr.append(corr)
        self.rows += n

    @property
    def _gpu_codes(self) -> list[int]:
        return [self.kind_codes[k] for k in _GPU_KINDS]


_KIND_CATEGORIES: tuple[str, ...] = (
    "kernel",
    "memcpy",
    "memset",
    "runtime",
    "sync",
    "cpu_op",
    "annotation",
    "gpu_annotation",
    "other",
)

_PHASE_KEY = {
    "M": "skipped_metadata_events",
    "s": "skipped_flow_events",
    "t": "skipped_flow_events",
    "f": "skipped_flow_events",
    "i": "skipped_instant_events",
    "I": "skipped_instant_events",
    "C": "skipped_counter_events",
    "B": "skipped_begin_end_events",
    "E": "skipped_begin_end_events",
    "b": "skipped_async_events",
    "e": "skipped_async_events",
    "n": "skipped_async_events",
}


def _cat(codes: np.ndarray, categories: list[str]) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=str))


def _str_or_empty(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return msgspec.json.encode(v).decode()


def _sparse_cat(n: int, rows: list[int], values: list[str]) -> pd.Categorical:
    codes = np.zeros(n, np.int32)
    cats: dict[str, int] = {"": 0}
    if rows:
        vc = np.array([cats.setdefault(v, len(cats)) for v in values], np.int32)
        codes[np.asarray(rows, np.int64)] = vc
    return _cat(codes, list(cats))


# ----------------------------------------------------------------------------------------------
# Collective metadata of host ops: bytes from record_shapes, and the gloo enqueue -> worker join
#
# On gloo, `c10d::allreduce_` (and `record_param_comms`, where torch emits it) runs on the calling
# thread and only enqueues the work; the exchange is the `gloo:all_reduce` range a gloo worker
# thread records when it runs the work, and that range is the collective interval the analysis
# uses. It carries no comm args, only (in `cpu`/`full` modes) its record_shapes. Two post-passes,
# per rank file, fill its columns where they are missing:
# 1. bytes from its own shapes (`Input Dims` x the element size of `Input type`);
# 2. the k-th enqueue on a calling thread <-> the k-th gloo op on the worker threads (one rank,
#    start order; by `Seq` when every enqueue has one in one process group): every field the
#    enqueue carries (bytes, dtype, group, seq, collective name) is copied where the worker op has
#    none. The pairing is refused (counted, nothing copied) unless ops agree pair by pair, every
#    worker op starts after its enqueue, and element counts agree where both sides have shapes.
# Both are per file facts of the trace (no other rank, no manifest), so they live in the reader:
# every consumer (breakdown, shortfall, compare-links, report) sees the same table.

_HOST_COLL_PREFIX = re.compile(r"^(?:gloo:|nccl:|c10d::)")
_PARAM_COMMS = "record_param_comms"

#: record_shapes' `Input type` spellings (C++ type names) -> torch dtype names (DTYPE_BYTES keys).
_SHAPE_DTYPE: dict[str, str] = {
    "float": "Float",
    "double": "Double",
    "c10::Half": "Half",
    "c10::BFloat16": "BFloat16",
    "long int": "Long",
    "long": "Long",
    "int64_t": "Long",
    "int": "Int",
    "short int": "Short",
    "short": "Short",
    "signed char": "Char",
    "unsigned char": "Byte",
    "bool": "Bool",
    "unsigned short": "UInt16",
    "unsigned int": "UInt32",
    "unsigned long": "UInt64",
    "c10::complex<c10::Half>": "ComplexHalf",
    "c10::complex<float>": "ComplexFloat",
    "c10::complex<double>": "ComplexDouble",
    "c10::qint8": "QInt8",
    "c10::quint8": "QUInt8",
    "c10::qint32": "QInt32",
}


def shape_dtype(type_name: str) -> str:
    """The torch dtype name of a record_shapes `Input type` ("float" -> "Float"); "" when not a dtype."""
    if type_name in _SHAPE_DTYPE:
        return _SHAPE_DTYPE[type_name]
    bare = type_name[5:] if type_name.startswith("c10::") else type_name
    return bare if bare in DTYPE_BYTES else ""


def shape_tensors(dims: Any, types: Any) -> list[tuple[int, str]]:
    """(elements, dtype name or "") of each tensor argument in record_shapes `Input Dims` /
    `Input type`; a TensorList argument gives one entry per tensor, its dtype unknown ("")."""
    out: list[tuple[int, str]] = []
    if not isinstance(dims, list):
        return out
    types_l = types if isinstance(types, list) else []
    for i, d in enumerate(dims):
        t = types_l[i] if i < len(types_l) and isinstance(types_l[i], str) else ""
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append((math.prod(d), shape_dtype(t)))
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):  # TensorList
            for inner in d:
                if inner and all(isinstance(x, int) for x in inner):
                    out.append((math.prod(inner), ""))
        elif isinstance(d, list) and not d and shape_dtype(t):  # a 0-d tensor
            out.append((1, shape_dtype(t)))
    return out


def single_process_group(meta: dict[str, Any]) -> tuple[int, str, str] | None:
    """(size, name, ranks text) of the only process group the trace's distributedInfo names, or
    None when it names several or none (then a gloo op's group cannot be known from this file)."""
    di = meta.get("distributedInfo")
    if not isinstance(di, dict):
        return None
    cfg = di.get("pg_config")
    if isinstance(cfg, list):
        if len(cfg) != 1 or not isinstance(cfg[0], dict):
            return None
        size = _to_int(cfg[0].get("pg_size"))
        ranks = cfg[0].get("ranks")
        ranks_text = "[" + ", ".join(str(_to_int(x)) for x in ranks) + "]" if isinstance(ranks, list) else ""
        return (size, str(cfg[0].get("pg_name", "")), ranks_text) if size > 0 else None
    if _to_int(di.get("pg_count", 1)) == 1 and _to_int(di.get("world_size")) > 0:
        return _to_int(di.get("world_size")), "", ""
    return None


def out_bytes_for(op: str, in_bytes: int, group_size: int) -> int:
    """Per-rank output bytes of `op` given its per-rank input bytes (record_param_comms'
    convention: all_gather out = n x in, reduce_scatter out = in / n, the others out = in);
    -1 when it depends on an unknown group size or the op has no fixed relation."""
    if in_bytes < 0:
        return -1
    if op in ("all_reduce", "broadcast", "reduce", "all_to_all", "send", "recv", "send_recv"):
        return in_bytes
    if op == "all_gather":
        return in_bytes * group_size if group_size > 0 else -1
    if op == "reduce_scatter":
        return in_bytes // group_size if group_size > 0 else -1
    return -1


class _CollMeta:
    """The collective columns while they are built: int arrays plus sparse row -> str dicts."""

    def __init__(self, n: int):
        self.n = n
        self.in_b = np.full(n, -1, np.int64)
        self.out_b = np.full(n, -1, np.int64)
        self.gsize = np.full(n, -1, np.int32)
        self.seq = np.full(n, -1, np.int64)
        self.strs: dict[str, dict[int, str]] = {k: {} for k in ("name", "op", "dtype", "pg_name", "pg_ranks")}
        self.nelems: dict[int, int] = {}  # from record_shapes, for the join's check

    def cat(self, key: str) -> pd.Categorical:
        d = self.strs[key]
        return _sparse_cat(self.n, list(d), list(d.values()))


def _fill_from_shapes(
    cm: _CollMeta,
    cols: _Columns,
    names: list[str],
    name_codes: np.ndarray,
    device: np.ndarray,
    meta: dict[str, Any],
) -> None:
    """Bytes / dtype / op of host `gloo:` and `nccl:` ranges from their own record_shapes."""
    if not cols.shape_rows:
        return
    pg = single_process_group(meta)
    # a decode loop repeats the same few shapes every token: decode each distinct text once;
    # per text: (total elements, the one dtype of all its tensors or "") or None without tensors
    shape_of: dict[tuple[bytes, bytes], tuple[int, str] | None] = {}
    op_of: dict[int, str] = {}  # name code -> op of a gloo:/nccl: range, "" otherwise
    for r, key in zip(cols.shape_rows, cols.shape_vals, strict=True):
        if device[r] >= 0:
            continue
        if key in shape_of:
            shape = shape_of[key]
        else:
            dims_raw, types_raw = key
            try:
                dims = _ANY_DECODER.decode(dims_raw)
                types = _ANY_DECODER.decode(types_raw) if types_raw else []
            except (msgspec.DecodeError, RecursionError):
                dims, types = None, None
            tensors = shape_tensors(dims, types)
            dtypes = {dt for _, dt in tensors}
            one_dt = next(iter(dtypes)) if len(dtypes) == 1 else ""
            shape = shape_of[key] = (sum(k for k, _ in tensors), one_dt) if tensors else None
        if shape is None:
            continue
        nelems, one_dt = shape
        cm.nelems[r] = nelems
        code = int(name_codes[r])
        op = op_of.get(code)
        if op is None:
            nm = names[code]
            # c10d:: ops: TensorList shapes carry no dtype (nelems kept for the join)
            op = op_of[code] = normalise_coll_op(nm) if nm.startswith(("gloo:", "nccl:")) else ""
        if not op:
            continue
        cm.strs["op"].setdefault(r, op)
        if cm.in_b[r] < 0 and one_dt:
            dt = one_dt
            cm.in_b[r] = nelems * DTYPE_BYTES[dt]
            cm.strs["dtype"].setdefault(r, dt)
            gs = int(cm.gsize[r]) if cm.gsize[r] > 0 else (pg[0] if pg else -1)
            if cm.out_b[r] < 0:
                cm.out_b[r] = out_bytes_for(op, int(cm.in_b[r]), gs)
            if cm.gsize[r] < 0 and pg is not None:
                cm.gsize[r] = pg[0]


def pair_enqueued(
    enq_ops: Sequence[str],
    enq_start: Sequence[int],
    wk_ops: Sequence[str],
    wk_start: Sequence[int],
    enq_nelems: Sequence[int] | None = None,
    wk_nelems: Sequence[int] | None = None,
) -> tuple[list[tuple[int, int]], str]:
    """Pair the enqueues of one rank (calling threads, in call order) with the worker-thread ops
    (in start order): the k-th with the k-th. Returns (pairs of positions, "") or ([], why not).

    Trace edges: worker ops that start before the first enqueue (enqueued before the trace
    began) and enqueues after the last worker op's start (not run before it ended) are left out.
    Refused when the counts still differ, an op differs, a worker op starts before its enqueue, or
    element counts (-1 = unknown) differ."""
    wk = [i for i in range(len(wk_ops)) if not enq_start or wk_start[i] >= enq_start[0]]
    last_wk = max((wk_start[i] for i in wk), default=None)
    enq = [j for j in range(len(enq_ops)) if last_wk is not None and enq_start[j] <= last_wk]
    if len(enq) != len(wk):
        return [], f"{len(enq)} enqueued collectives but {len(wk)} ran on the gloo worker threads"
    pairs = list(zip(enq, wk, strict=True))
    for k, (j, i) in enumerate(pairs):
        if enq_ops[j] != wk_ops[i]:
            return [], f"call #{k}: enqueued {enq_ops[j]} but the worker ran {wk_ops[i]}"
        if wk_start[i] < enq_start[j]:
            return [], f"call #{k}: the worker op starts before its enqueue"
        if enq_nelems is not None and wk_nelems is not None:
            a, b = enq_nelems[j], wk_nelems[i]
            if a >= 0 and b >= 0 and a != b:
                return [], f"call #{k}: {a} elements enqueued but {b} on the worker"
    return pairs, ""


def _outermost_rows(rows: list[int], stream: np.ndarray, start: np.ndarray, end: np.ndarray) -> list[int]:
    """The rows not inside an earlier row of the same thread."""
    out: list[int] = []
    last_end: dict[int, int] = {}
    for r in sorted(rows, key=lambda x: (int(stream[x]), int(start[x]), -int(end[x]))):
        t = int(stream[r])
        if t in last_end and int(end[r]) <= last_end[t]:
            continue
        out.append(r)
        last_end[t] = max(last_end.get(t, int(end[r])), int(end[r]))
    return out


def _join_enqueued(
    cm: _CollMeta,
    cols: _Columns,
    names: list[str],
    name_codes: np.ndarray,
    device: np.ndarray,
    stream: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    dq: DataQuality,
) -> None:
    """Copy the enqueue's collective metadata onto the gloo worker-thread op it ran as."""
    coll_codes = [c for c, nm in enumerate(names) if nm.startswith("gloo:")]
    if not coll_codes or not cm.n:
        return
    host = device < 0
    wk_rows = [
        int(r)
        for r in np.flatnonzero(host & np.isin(name_codes, coll_codes))
        if normalise_coll_op(names[int(name_codes[r])])
    ]
    if not wk_rows:
        return
    wk_threads = {int(stream[r]) for r in wk_rows}
    off_worker = host & ~np.isin(stream, list(wk_threads))
    pc_codes = [c for c, nm in enumerate(names) if nm == _PARAM_COMMS]
    enq_rows = [
        int(r)
        for r in np.flatnonzero(off_worker & np.isin(name_codes, pc_codes))
        if cm.strs["op"].get(int(r))
    ]
    if enq_rows:
        enq_op = {r: cm.strs["op"][r] for r in enq_rows}
    else:
        c10d_codes = [c for c, nm in enumerate(names) if nm.startswith("c10d::") and normalise_coll_op(nm)]
        cand = [int(r) for r in np.flatnonzero(off_worker & np.isin(name_codes, c10d_codes))]
        enq_rows = _outermost_rows(cand, stream, start, end)
        enq_op = {r: normalise_coll_op(names[int(name_codes[r])]) for r in enq_rows}
    if not enq_rows:
        return  # e.g. `ranges` mode: no op on the calling thread is traced
    pgs = {cm.strs["pg_name"].get(r, "") for r in enq_rows}
    if len(pgs) == 1 and all(cm.seq[r] >= 0 for r in enq_rows):
        enq_rows.sort(key=lambda r: (int(cm.seq[r]), int(start[r])))
    else:
        enq_rows.sort(key=lambda r: int(start[r]))
    wk_rows.sort(key=lambda r: int(start[r]))
    wk_op = {r: cm.strs["op"].get(r) or normalise_coll_op(names[int(name_codes[r])]) for r in wk_rows}
    pairs, why = pair_enqueued(
        [enq_op[r] for r in enq_rows],
        [int(start[r]) for r in enq_rows],
        [wk_op[r] for r in wk_rows],
        [int(start[r]) for r in wk_rows],
        [cm.nelems.get(r, -1) for r in enq_rows],
        [cm.nelems.get(r, -1) for r in wk_rows],
    )
    if why:
        dq.add(
            "collective_enqueue_join_refused",
            len(wk_rows),
            f"gloo worker-thread collectives not joined to their enqueues ({why}); their bytes come from "
            "their own shapes only",
        )
        return
    copied = 0
    for j, i in pairs:
        e, w = enq_rows[j], wk_rows[i]
        got = False
        for arr in (cm.in_b, cm.out_b, cm.gsize, cm.seq):
            if arr[w] < 0 <= arr[e]:
                arr[w] = arr[e]
                got = True
        for key in ("name", "dtype", "pg_name", "pg_ranks"):
            if key in cm.strs and e in cm.strs[key] and w not in cm.strs[key]:
                cm.strs[key][w] = cm.strs[key][e]
                got = True
        cm.strs["op"].setdefault(w, wk_op[w])
        copied += got
    if copied:
        dq.add(
            "collective_metadata_from_enqueue",
            copied,
            "gloo worker-thread collectives took their metadata (bytes, group, seq) from the enqueueing op",
        )


def _build_table(
    cols: _Columns, rank: int, base_ns: int, meta: dict[str, Any] | None = None, dq: DataQuality | None = None
) -> pd.DataFrame:
    meta = meta or {}
    dq = dq if dq is not None else cols.dq
    n = cols.rows

    def cat_arrays(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    start = cat_arrays(cols.start, np.int64)
    dur = cat_arrays(cols.dur, np.int64)
    # int64 wrap-around: base + ts or start + dur beyond 2**63 - 1 ns (year 2262) is dropped, counted
    beyond = start > _INT64_MAX - base_ns if base_ns > 0 else np.zeros(n, bool)
    if base_ns:
        start = np.where(beyond, 0, start) + base_ns
    beyond |= (start > 0) & (dur > _INT64_MAX - np.maximum(start, 0))
    end = start + np.where(beyond, 0, dur)
    drop_far = np.zeros(n, bool)
    if n:  # one trace file spans seconds to hours: an event a day away from its median is no time
        med = float(np.median(start[~beyond])) if (~beyond).any() else 0.0
        far = ~beyond & (np.abs(start.astype(np.float64) - med) > _DAY_NS)
        if far.any():
            dq.add(
                "events_time_outliers",
                int(far.sum()),
                "events starting more than a day from the trace's median time (a timestamp in another "
                "unit or convention) were skipped",
            )
            drop_far = far
    kind = _cat(cat_arrays(cols.kind, np.int8), list(_KIND_CATEGORIES))
    name_codes = cat_arrays(cols.name, np.int32)
    name = _cat(name_codes, list(cols.names))
    device = cat_arrays(cols.device, np.int32)
    stream = cat_arrays(cols.stream, np.int64)
    corr = cat_arrays(cols.corr, np.int64)

    # collective columns
    cm = _CollMeta(n)
    for r, v in zip(cols.coll_rows, cols.coll_vals, strict=True):
        cname, dt = _str_or_empty(v[0]), _str_or_empty(v[3])
        size = DTYPE_BYTES.get(dt)
        if size is not None:
            if v[1] is not None and _to_int(v[1]) >= 0:
                cm.in_b[r] = _to_int(v[1]) * size
            if v[2] is not None and _to_int(v[2]) >= 0:
                cm.out_b[r] = _to_int(v[2]) * size
        if v[4] is not None:
            cm.gsize[r] = _to_int(v[4])
        if v[7] is not None:
            cm.seq[r] = _to_int(v[7])
        for col, val in (
            ("name", cname),
            ("dtype", dt),
            ("pg_name", _str_or_empty(v[5])),
            ("pg_ranks", _str_or_empty(v[6])),
        ):
            if val:
                cm.strs[col][r] = val
        op = normalise_coll_op(cname) if cname else ""
        if op:
            cm.strs["op"][r] = op
    names_list = list(cols.names)
    _fill_from_shapes(cm, cols, names_list, name_codes, device, meta)
    _join_enqueued(cm, cols, names_list, name_codes, device, stream, start, end, dq)
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
        kernel_code = _KIND_CATEGORIES.index("kernel")
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
        if beyond.any():
            dq.add(
                "events_time_out_of_range",
                int(beyond.sum()),
                "events whose start (baseTimeNanoseconds + ts) or end lies beyond the int64 ns range "
                "(after the year 2262) were skipped",
            )
        table = {k: v[keep] for k, v in table.items()}
    return make_events(table)


# ----------------------------------------------------------------------------------------------
# Rank


_RANK_RE = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)


def rank_from_filename(path: str | os.PathLike[str]) -> int | None:
    """Rank from a file name: `rank-3`, `rank3`, `_rank_3`, `rank-3.pt.trace.json.gz` -> 3; None if absent."""
    m = _RANK_RE.search(Path(path).name)
    if not m or len(m.group(1)) > 10 or int(m.group(1)) > _INT32_MAX:  # rank-99999999999999999999
        return None
    return int(m.group(1))


def check_rank_argument(rank: Any) -> None:
    """RankError unless `rank` (--rank, rank=) is a rank: an integer from 0 to 2**31 - 1."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= _INT32_MAX:
        shown = str(rank)
        shown = shown if len(shown) <= 24 else shown[:20] + "..."
        raise RankError(f"rank {shown} is not a rank (an integer from 0 to {_INT32_MAX})")


def _resolve_rank(
    path: Path, meta: dict[str, Any], rank: int | None, default_rank: int | None = None
) -> tuple[int, str]:
    if rank is not None:
        check_rank_argument(rank)
        return int(rank), "argument"
    di = meta.get("distributedInfo")
    if isinstance(di, dict) and di.get("rank") is not None:
        r = _to_small_int(di.get("rank"))
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
    prog = _FileProgress()
    stream = _Stream(p, chunk_bytes, prog)
    cols = _Columns()
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
    own = _to_small_int(di.get("rank")) if isinstance(di, dict) and di.get("rank") is not None else -1
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
    base_ns = _to_int(base_raw) if base_raw is not None else 0
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
    info: dict[str, Any] = {k: v for k, v in meta.items() if k != "traceEvents"}
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
