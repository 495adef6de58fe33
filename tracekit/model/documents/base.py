"""The base of every typed JSON document (docs/JSON.md, generated from these Structs).

A document is a `msgspec.Struct` whose fields are the JSON object's keys in the order the writer
emits them; a field that a writer emits only sometimes (or that an older schema version lacks)
defaults to `UNSET` and is then left out when encoded, so a decoded document encodes back to the
same keys in the same order (`to_builtins`). Decoding ignores keys a Struct does not know (readers
must ignore fields they do not know, docs/JSON.md); tests/test_documents.py checks every committed
document decodes to exactly what it holds, so a writer that changes shape without its Struct fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

T = TypeVar("T")


def given(x: T | UnsetType) -> T | None:
    """A field's value, None when the document left it out (UNSET)."""
    return None if x is UNSET else x  # type: ignore[return-value]


class Doc(msgspec.Struct, kw_only=True):
    """A JSON object of a tracekit document: keys in the writer's order; UNSET fields absent."""

    def to_json(self) -> dict[str, object]:
        """The object as plain JSON values (`to_builtins`)."""
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


class Documented:
    """A result whose JSON is its typed document: `document()` builds the Struct, `to_json()` is
    that document as plain JSON values (`to_builtins`), what `--format json` writes. The one place
    a result becomes a dict."""

    def document(self) -> Doc:
        raise NotImplementedError

    def to_json(self) -> dict[str, object]:
        """The document as plain JSON values (`to_builtins(document())`)."""
        out: dict[str, object] = msgspec.to_builtins(self.document())
        return out


class Header(Doc, kw_only=True):
    """The two fields every command's document opens with, in this order: `schema_version` (the
    document's version, "1.0", ...) and `kind` (`tracekit.<command>`)."""

    schema_version: str
    kind: str


class BaselineSharded(Doc, Generic[T], kw_only=True):
    """A figure of the baseline run and of the sharded run, of one type (a shortfall compares them so)."""

    baseline: T
    sharded: T


class PerTokenOf(BaselineSharded[T], kw_only=True):
    """A per-token figure of the baseline, the sharded run and the ideal (T1 / N), of one type."""

    ideal: T


class DocumentError(ValueError):
    """A document that is not JSON or not of its Struct's shape: `where` is the JSON path
    (`$.steps[3].rank`), `offset` the byte offset when the JSON itself is malformed."""

    def __init__(self, message: str, *, where: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.where = where
        self.offset = offset


def _where(exc: msgspec.ValidationError) -> str | None:
    text = str(exc)
    return text.rsplit(" - at `", 1)[1].rstrip("`") if " - at `" in text else None


def decode(data: bytes | str, type_: type[T]) -> T:
    """`data` (JSON text) decoded into `type_`; DocumentError saying where it does not fit."""
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        raise DocumentError(str(exc).split(" - at `", 1)[0], where=_where(exc)) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        offset = None
        if "(byte " in text:
            try:
                offset = int(text.rsplit("(byte ", 1)[1].rstrip(")"))
            except ValueError:
                offset = None
        raise DocumentError(f"not valid JSON ({text.split(' (byte ', 1)[0]})", offset=offset) from None


def convert(obj: Any, type_: type[T]) -> T:
    """A decoded JSON value (dicts and lists) as `type_`; DocumentError saying where it does not fit."""
    try:
        return msgspec.convert(obj, type=type_)
    except msgspec.ValidationError as exc:
        raise DocumentError(str(exc).split(" - at `", 1)[0], where=_where(exc)) from None


def read(path: str | Path, type_: type[T]) -> T:
    """The JSON file at `path` decoded into `type_` (OSError when it cannot be read)."""
    return decode(Path(path).read_bytes(), type_)


def to_builtins(doc: Any) -> Any:
    """A document as plain dicts and lists, keys in field order, UNSET fields left out (what the
    writers dump: `json.dumps(..., indent=1)` or orjson, byte for byte the same as before)."""
    return msgspec.to_builtins(doc)
