"""A Kineto file's decompressed bytes in blocks (tracekit.read.kineto_stream reads them): plain reads,
or gzip inflated incrementally in a thread of its own; the bytes read so far (`FileProgress`) for
the reading limits and error offsets."""

from __future__ import annotations

import queue
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracekit.errors import TraceFormatError

READ_BLOCK = 4 * 1024 * 1024


class FileProgress:
    """Bytes of the file on disk consumed so far (for a progress display)."""

    def __init__(self) -> None:
        self.done = 0


def iter_blocks(path: Path, progress: FileProgress) -> Iterator[bytes]:
    """Decompressed bytes of the file, block by block. Raises TraceFormatError on a bad gzip stream.

    A gzip file is inflated in a helper thread (zlib releases the GIL), so with a second core the
    decompression overlaps the JSON decoding; at most `_GZ_QUEUE` blocks wait, so memory stays bounded.
    """
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
        if not gz:
            f.seek(0)
            while True:
                block = f.read(READ_BLOCK)
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


def _gunzip_blocks(path: Path, progress: FileProgress) -> Iterator[bytes]:
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
