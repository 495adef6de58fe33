"""Probe files, decoded once where they are read: `tracekit probe`'s rows (a JSON list of
`ProbeRow`) and the probe's part of a `tracekit compare-links` result (`LinksProbe`: its rows, modes
and NCCL's account, from a file of any schema); docs/JSON.md#probe.

A file that is not one is refused in one line naming it: the byte where it stops being JSON
(`tracekit.errors.load_json_file`), or the JSON path where it stops fitting its Struct
(`$.rows[3]`). JSON null in a row's number field is how the writers write NaN (a zero time): it
reads back as NaN (`nan_for_null`)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from tracekit.errors import TracekitError, load_json_file
from tracekit.model.documents import DocumentError, convert
from tracekit.model.documents.links import LinksProbe, ProbeRow, nan_for_null

T = TypeVar("T")


def read_probe(
    path: str | Path, *, what: str, error: type[TracekitError], kind: str | None = None
) -> LinksProbe | list[ProbeRow]:
    """The probe file at `path` typed: a list of rows, or an object with `rows` (the probe's part of
    a compare-links result; `kind`, when given, must be its `kind`). `error` in one line naming the
    file when it is not one (`what` names the file in the message: "compare-links result")."""
    return read_rows_file(path, LinksProbe, what=what, error=error, kind=kind)


def read_rows_file(
    path: str | Path, doc: type[T], *, what: str, error: type[TracekitError], kind: str | None = None
) -> T | list[ProbeRow]:
    """A file of probe rows at `path` typed: a list of rows, or an object with `rows` as `doc`
    (`LinksProbe`: the probe's part of a compare-links result; `Links`: all of it, for the report).
    `kind`, `what` and `error` as in `read_probe`."""
    p = Path(path)
    obj = load_json_file(p, what, error)
    if kind is not None and (not isinstance(obj, dict) or obj.get("kind") != kind):
        got = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise error(f"{p}: not a {what} (kind {got!r}, want {kind!r})")
    try:
        if isinstance(obj, list):
            return convert(nan_for_null(obj), list[ProbeRow])
        if isinstance(obj, dict) and "rows" in obj:
            return convert({**obj, "rows": nan_for_null(obj["rows"])}, doc)
    except DocumentError as exc:
        raise error(f"{p} at {exc.where or '$'}: not a {what} ({exc})") from None
    raise error(f"{p}: not a {what} (a list of probe rows, or an object with 'rows')")
