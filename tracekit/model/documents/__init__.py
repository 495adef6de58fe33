"""Typed JSON documents: one `msgspec.Struct` per document tracekit writes, and the manifest.

`KINDS` maps each document's `kind` to its Struct; `decode_document` reads any of them by its
`kind`. docs/JSON.md is generated from these Structs (`scripts/gen_json_docs.py`)."""

from __future__ import annotations

from typing import Any

import msgspec

from tracekit.model.documents.advise import Advise, GemmTable
from tracekit.model.documents.base import Doc, DocumentError, convert, decode, given, read, to_builtins
from tracekit.model.documents.breakdown import Breakdown
from tracekit.model.documents.copy import Copy
from tracekit.model.documents.decompose import Decompose
from tracekit.model.documents.diff import Diff
from tracekit.model.documents.links import Links
from tracekit.model.documents.manifest import Manifest
from tracekit.model.documents.modes import AdviseCheck, CaptureModes
from tracekit.model.documents.report import Report
from tracekit.model.documents.rho import Rho
from tracekit.model.documents.roofline import Roofline
from tracekit.model.documents.shortfall import Shortfall
from tracekit.model.documents.whatif import Whatif

#: each document's `kind` and its Struct, in the order docs/JSON.md lists them
KINDS: dict[str, type[Doc]] = {
    "tracekit.capture": Manifest,
    "tracekit.breakdown": Breakdown,
    "tracekit.shortfall": Shortfall,
    "tracekit.diff": Diff,
    "tracekit.compare_links": Links,
    "tracekit.decompose": Decompose,
    "tracekit.advise": Advise,
    "tracekit.rho": Rho,
    "tracekit.roofline": Roofline,
    "tracekit.whatif": Whatif,
    "tracekit.report": Report,
    "tracekit.bench_capture_modes": CaptureModes,
    "tracekit.advise-check": AdviseCheck,
    "tracekit.gemm-table": GemmTable,
}
#: documents that are a JSON array of rows, not an object with a `kind`: (row Struct, row `probe`)
ROWS: dict[str, type[Doc]] = {"copy": Copy}

_KIND_ONLY = msgspec.json.Decoder(dict[str, Any])


def decode_document(data: bytes) -> Doc | list[Doc]:
    """A document of any kind, decoded into its Struct by its `kind` (a list of probe rows by the
    rows' `probe`); DocumentError when the kind is unknown or the shape does not fit."""
    head = msgspec.json.decode(data)
    if isinstance(head, list):
        probe = head[0].get("probe") if head and isinstance(head[0], dict) else None
        if probe not in ROWS:
            raise DocumentError(f"a list of rows of no known probe ({probe!r})")
        rows: list[Doc] = decode(data, list[ROWS[probe]])  # type: ignore[valid-type]
        return rows
    kind = head.get("kind") if isinstance(head, dict) else None
    if kind not in KINDS:
        raise DocumentError(f"no known document kind ({kind!r})")
    return decode(data, KINDS[kind])


__all__ = [
    "KINDS",
    "ROWS",
    "Advise",
    "AdviseCheck",
    "Breakdown",
    "CaptureModes",
    "Copy",
    "Decompose",
    "Diff",
    "Doc",
    "DocumentError",
    "GemmTable",
    "Links",
    "Manifest",
    "Report",
    "Rho",
    "Roofline",
    "Shortfall",
    "Whatif",
    "convert",
    "decode",
    "decode_document",
    "given",
    "read",
    "to_builtins",
]
