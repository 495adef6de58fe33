"""The Kineto reader's streaming tokenizer (tracekit.read.kineto): the file's decompressed bytes
(`tracekit.read.kineto_blocks`: gzip inflated incrementally, in a thread) cut into the header,
chunks of whole `traceEvents` entries at top-level boundaries, and the tail; each chunk decoded by
msgspec into small typed Structs (`tracekit.read.kineto_decode`: only the fields the event table
needs), with a lenient fallback for unexpected types and byte offsets in every error; the reading
limits (tracekit.read.limits) enforced while streaming."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from tracekit.errors import TraceFormatError
from tracekit.read.kineto_blocks import READ_BLOCK, FileProgress, iter_blocks
from tracekit.read.kineto_decode import (
    ANY_DECODER,
    DECODER,
    DECODER_LENIENT,
    DECODER_LENIENT_ARGS,
    coerce_lenient,
)
from tracekit.read.limits import (
    ENV_MAX_TOKEN_BYTES,
    OVER_MAX_BYTES,
    OVER_MAX_EVENTS,
    current_limits,
    describe_bytes,
)

_BYTE_RE = re.compile(r"\(byte (\d+)\)")


def _error_byte(exc: Exception) -> int | None:
    m = _BYTE_RE.search(str(exc))
    return int(m.group(1)) if m else None


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


class Stream:
    """Splits the decompressed byte stream into the header, decoded chunks of whole events and the tail."""

    def __init__(self, path: Path, chunk_bytes: int, progress: FileProgress):
        self.path = path
        self.blocks = iter_blocks(path, progress)
        self.buf = bytearray()
        self.base = 0  # stream offset of buf[0]
        self.eof = False
        self.chunk_bytes = chunk_bytes
        #: the trace's top-level metadata as the profiler wrote it (values unchecked)
        self.meta: dict[str, object] = {}
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
                    f"more than {describe_bytes(self.limits.max_bytes)} of JSON once decompressed: {OVER_MAX_BYTES}",
                    offset=self.limits.max_bytes,
                )

    def _count(self, n: int) -> None:
        self.events_seen += n
        if self.events_seen > self.limits.max_events:
            raise TraceFormatError(
                self.path,
                f"more than {self.limits.max_events} events: {OVER_MAX_EVENTS}",
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

    def _parse_object_text(self, text: bytes, offset: int) -> dict[str, object]:
        try:
            obj = ANY_DECODER.decode(text)
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
            obj = ANY_DECODER.decode(text)
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
        self._fill(READ_BLOCK)
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
            self._fill(len(self.buf) + READ_BLOCK)
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
            return DECODER.decode(doc)
        except msgspec.ValidationError:
            pass
        try:
            return coerce_lenient(DECODER_LENIENT.decode(doc), self.coerced)
        except msgspec.ValidationError:
            pass
        try:
            return coerce_lenient(DECODER_LENIENT_ARGS.decode(doc), self.coerced)
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
