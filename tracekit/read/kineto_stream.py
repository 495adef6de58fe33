"""The Kineto reader's streaming tokenizer (tracekit.read.kineto): the file's decompressed bytes
(gzip inflated incrementally, in a thread) cut into the header, chunks of whole `traceEvents`
entries at top-level boundaries, and the tail; each chunk decoded by msgspec into small typed
Structs (only the fields the event table needs), with a lenient fallback for unexpected types and
byte offsets in every error; the reading limits (tracekit.read.limits) enforced while streaming.
Also the coercion of JSON values to int64 columns shared by the event mapping."""

from __future__ import annotations

import queue
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

from tracekit.errors import TraceFormatError
from tracekit.model.events import DataQuality
from tracekit.read.limits import (
    ENV_MAX_BYTES,
    ENV_MAX_EVENTS,
    ENV_MAX_TOKEN_BYTES,
    current_limits,
    describe_bytes,
)

_READ_BLOCK = 4 * 1024 * 1024

_EMPTY_RAW = msgspec.Raw(b"")


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


class _EvB(msgspec.Struct, gc=False, tag_field="ph", tag="B"):
    """A duration event's begin ("ph": "B"): becomes a row once its "E" on the same thread is found."""

    cat: str = ""
    name: str = ""
    ts: msgspec.Raw = _EMPTY_RAW
    pid: int | str = -1
    tid: int | str = -1
    args: _Args = msgspec.field(default_factory=_Args)


class _EvE(msgspec.Struct, gc=False, tag_field="ph", tag="E"):
    """A duration event's end ("ph": "E"): closes the thread's innermost open "B"."""

    ts: msgspec.Raw = _EMPTY_RAW
    pid: int | str = -1
    tid: int | str = -1


# Every other Chrome-trace phase decodes into an empty struct (its fields are skipped unparsed).
_OTHER_PHASES = "iICbneNODstfPMVvRc()"
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


_EVENT_UNION: Any = Union[(_Ev, _EvB, _EvE, *_OTHER_TYPES.values())]  # noqa: UP007
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
        if e.ph not in ("X", "B", "E"):
            out.append(_OTHER_TYPES.get(str(e.ph), _PhUnknown)())
            continue
        args = e.args if isinstance(e.args, _Args) else _Args()
        pid = e.pid if isinstance(e.pid, (int, str)) and not isinstance(e.pid, bool) else -1
        tid = e.tid if isinstance(e.tid, (int, str)) and not isinstance(e.tid, bool) else -1
        if e.ph == "B":
            out.append(_EvB(cat=str(e.cat), name=str(e.name), ts=e.ts, pid=pid, tid=tid, args=args))
            continue
        if e.ph == "E":
            out.append(_EvE(ts=e.ts, pid=pid, tid=tid))
            continue
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
        #: the Chrome "JSON Array Format": the file is the events array itself (no metadata), and
        #: its closing `]` is optional (the format lets a writer that died leave it out)
        self.array_format = False

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
        if isinstance(obj, dict) and "nodes" in obj and "schema" in obj:
            return TraceFormatError(
                self.path,
                "a PyTorch execution trace (ExecutionTraceObserver: operator graph, no timings), not a "
                "Kineto trace: pass the torch.profiler trace (*.pt.trace.json) recorded with it",
                offset=None,
            )
        return TraceFormatError(self.path, "no traceEvents: not a Kineto/Chrome trace", offset=None)

    def header(self) -> bool:
        """Find `"traceEvents": [` and parse what precedes it. False when not found. A file that
        is a JSON array is the Chrome trace format's other form: the array is the events."""
        self._fill(_READ_BLOCK)
        first = _skip_ws(self.buf, 3 if self.buf.startswith(b"\xef\xbb\xbf") else 0)
        if first < len(self.buf) and self.buf[first] == ord("["):
            self.array_format = True
            self._consume(first + 1)
            return True
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
                if self.eof and self.array_format:
                    self._consume(len(self.buf))
                    return  # the array format's closing `]` is optional
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
        if self.array_format:
            if i < len(rest):
                raise TraceFormatError(
                    self.path, "invalid JSON: text after the events array", offset=self.base + i
                )
            return
        if i < len(rest) and rest[i] == ord(","):
            self.meta.update(self._parse_object_text(b"{" + rest[i + 1 :], self.base + i))
        elif i >= len(rest) or rest[i] != ord("}"):
            raise TraceFormatError(
                self.path, "truncated JSON: the file ends after traceEvents", offset=self.base + i
            )
