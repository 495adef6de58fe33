"""The package's own errors. The CLI turns each into one line and a non-zero exit."""

from __future__ import annotations

from typing import Any


class TracekitError(Exception):
    """Base of every error tracekit raises on purpose (bad input, impossible request)."""


class TraceFormatError(TracekitError):
    """A trace file cannot be read. Names the file and, where known, the byte offset or event index."""

    def __init__(
        self, path: object, message: str, *, offset: int | None = None, event_index: int | None = None
    ):
        self.path = str(path)
        self.message = message
        self.offset = offset
        self.event_index = event_index
        where = self.path
        if offset is not None:
            where += f" at byte {offset}"
        if event_index is not None:
            where += f" at event #{event_index}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its fields, so it survives the trip back from a reader process (pickle)
        return (_rebuild_format_error, (type(self), self.path, self.message, self.offset, self.event_index))


def _rebuild_format_error(
    cls: type[TraceFormatError], path: str, message: str, offset: int | None, event_index: int | None
) -> TraceFormatError:
    return cls(path, message, offset=offset, event_index=event_index)


class NoTracesError(TracekitError):
    """A path names no trace files."""


class RankError(TracekitError):
    """The rank of a trace cannot be determined, or ranks collide / are missing."""


class MatchError(TracekitError):
    """Collectives cannot be matched across ranks (counts differ, groups disagree)."""


class StepError(TracekitError):
    """No steps found with the step pattern, or steps disagree across ranks."""


class CaptureError(TracekitError):
    """A capture run failed (a rank died, the profiler could not start, nsys not found...)."""


class OutputError(TracekitError):
    """An output file (-o/--output) cannot be written: no such folder, not writable, disk full."""


class ProbeError(TracekitError):
    """A bandwidth probe failed or gave a wrong result."""


def load_json_file(path: Any, what: str, error: type[TracekitError]) -> Any:
    """The JSON document in `path` (a result tracekit wrote: a probe, a compare-links result), or
    `error` in one line naming the file and the byte where it stops being one: not UTF-8 (a gzip
    or binary file given by mistake says which), or not JSON (issue 24: these said "'utf-8' codec
    can't decode byte 0x8b in position 1")."""
    import json
    from pathlib import Path

    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise error(f"{p}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        kind = "a gzip file" if raw[:2] == b"\x1f\x8b" else "binary, not UTF-8 text"
        raise error(f"{p} at byte {exc.start}: not the {what} (the file is {kind})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8"))
        raise error(f"{p} at byte {offset}: the {what} is not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise error(f"{p}: the {what} is not valid JSON ({type(exc).__name__})") from None
