"""Limits on what reading one trace may cost, enforced while the file streams (docs/RELIABILITY.md).

A trace is an untrusted file from another machine: a 4 MB gzip can inflate to 4 GiB of whitespace,
a run folder can hold a billion events. The readers stop at these limits with one TraceFormatError
naming the file and the limit, before the memory is spent:

- `max_bytes`: decompressed bytes of one trace file (Kineto JSON, or the SQLite inside a
  `.sqlite.gz`). Default 16 GiB: reading streams, so this bounds time, not memory (about three
  minutes of decoding), and is ten times the largest trace we have seen (1.5 GB).
- `max_events`: events of one run, all its trace files together (the rows of the run's event
  table, checked as each file is read: `tracekit.read.check_run_events`). One file alone is stopped
  while it streams once it passes the same N (every event counted, kept or skipped; for an nsys
  export, the rows of its event tables). Default 40 million: the event table costs about
  100 bytes a row and the analysis about four times that at its peak, so 40 M rows stay within
  about 16 GB, which fits a 24 GB machine with room for the rest. (Per run, not per file: eight
  rank files of 40 M events each would need 128 GB.)
- `max_token_bytes`: one JSON event, string, number or run of whitespace. Default 64 MiB; no
  profiler writes an event of more than a few kB.

Set them with `--max-bytes` / `--max-events` on any analysis command, or the environment
(`TRACEKIT_MAX_BYTES`, `TRACEKIT_MAX_EVENTS`, `TRACEKIT_MAX_TOKEN_BYTES`; sizes take K/M/G/T
suffixes, powers of 1024), which also reaches the reader processes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from tracekit.errors import TracekitError

ENV_MAX_BYTES = "TRACEKIT_MAX_BYTES"
ENV_MAX_EVENTS = "TRACEKIT_MAX_EVENTS"
ENV_MAX_TOKEN_BYTES = "TRACEKIT_MAX_TOKEN_BYTES"
#: how an error past a limit ends, the same for every reader (Kineto's JSON, an nsys report)
OVER_MAX_BYTES = (
    f"the limit on decompressed bytes (--max-bytes or {ENV_MAX_BYTES}; raise it to read this file)"
)
OVER_MAX_EVENTS = f"the limit on events (--max-events or {ENV_MAX_EVENTS}; raise it to read this file)"

DEFAULT_MAX_BYTES = 16 << 30
DEFAULT_MAX_EVENTS = 40_000_000
DEFAULT_MAX_TOKEN_BYTES = 64 << 20


@dataclass(frozen=True)
class Limits:
    """What reading may cost; every field a positive integer."""

    #: decompressed bytes of one trace file
    max_bytes: int = DEFAULT_MAX_BYTES
    #: events of one run (rows of its table); one file is stopped while streaming at the same N
    max_events: int = DEFAULT_MAX_EVENTS
    #: bytes of one JSON event, string, number or whitespace run
    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES


class LimitError(TracekitError):
    """A limit given on the command line or in the environment is not a positive size."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, what: str = "size") -> int:
    """'16G', '512M', '1.5GiB', '1000' -> bytes (or a count); LimitError when it is not one."""
    m = _SIZE.match(str(text)) if len(str(text)) <= 40 else None
    if not m:
        raise LimitError(f"{what} {str(text)[:40]!r} is not a positive number (e.g. 512M, 16G, 1000000)")
    value = int(float(m.group(1)) * _UNIT[m.group(2).lower()])
    if value <= 0:
        raise LimitError(f"{what} {text!r} must be positive")
    return value


def current_limits() -> Limits:
    """The limits in force: the environment's, else the defaults."""
    env = os.environ
    return Limits(
        max_bytes=parse_size(env[ENV_MAX_BYTES], ENV_MAX_BYTES)
        if env.get(ENV_MAX_BYTES)
        else DEFAULT_MAX_BYTES,
        max_events=parse_size(env[ENV_MAX_EVENTS], ENV_MAX_EVENTS)
        if env.get(ENV_MAX_EVENTS)
        else DEFAULT_MAX_EVENTS,
        max_token_bytes=parse_size(env[ENV_MAX_TOKEN_BYTES], ENV_MAX_TOKEN_BYTES)
        if env.get(ENV_MAX_TOKEN_BYTES)
        else DEFAULT_MAX_TOKEN_BYTES,
    )


def describe_bytes(n: int) -> str:
    """1073741824 -> '1 GiB' (for messages)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"
