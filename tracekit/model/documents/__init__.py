"""Typed JSON documents: one `msgspec.Struct` per document tracekit writes, and the manifest.

`KINDS` maps each document's `kind` to its Struct; `decode_document` reads any of them by its
`kind`. docs/JSON.md is generated from these Structs (`scripts/gen_json_docs.py`)."""

from __future__ import annotations

import msgspec

from tracekit.model.documents.ab import AB
from tracekit.model.documents.advise import Advise, GemmTable
from tracekit.model.documents.base import (
    Doc,
    DocumentError,
    convert,
    decode,
    given,
    read,
    to_builtins,
)
from tracekit.model.documents.breakdown import Breakdown
from tracekit.model.documents.copy import Copy
from tracekit.model.documents.decompose import Decompose
from tracekit.model.documents.diff import Diff
from tracekit.model.documents.dilation import Dilation, DilationRow, TokenTimes
from tracekit.model.documents.export import Export
from tracekit.model.documents.kernels import TopKernel, TopKernels, TopKernelsClass
from tracekit.model.documents.links import Links, LinksTransportsValue, ProbeRow
from tracekit.model.documents.manifest import Manifest
from tracekit.model.documents.modes import AdviseCheck, CaptureModes
from tracekit.model.documents.predict import Predict
from tracekit.model.documents.report import Report
from tracekit.model.documents.rho import Rho
from tracekit.model.documents.roofline import Roofline
from tracekit.model.documents.shortfall import Shortfall
from tracekit.model.documents.steps import Steps
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
    "tracekit.predict": Predict,
    "tracekit.steps": Steps,
    "tracekit.ab": AB,
    "tracekit.report": Report,
    "tracekit.bench_capture_modes": CaptureModes,
    "tracekit.advise-check": AdviseCheck,
    "tracekit.gemm-table": GemmTable,
}
#: documents that are a JSON array of rows, not an object with a `kind`: the rows' name (a copy
#: probe row's `probe`; "collective" for the rows of `tracekit probe`, "dilation" for those of
#: `tracekit dilation`) and the row Struct
ROWS: dict[str, type[Doc]] = {"copy": Copy, "collective": ProbeRow, "dilation": DilationRow}
#: the first key of a document that is not tracekit's own format (a Perfetto trace) and its Struct
FIRST_KEYS: dict[str, type[Doc]] = {"tracekitExport": Export}


def _row_name(row: object) -> str | None:
    if not isinstance(row, dict):
        return None
    if "probe" in row:
        return str(row["probe"])
    if "op" in row and "busbw_gbps" in row:
        return "collective"
    if "run" in row and "dilation" in row:
        return "dilation"
    return None


def decode_document(data: bytes) -> Doc | list[Doc]:
    """A document of any kind, decoded into its Struct by its `kind` (a list of rows by what its
    rows are, ROWS; an export by its first key); DocumentError when the kind is unknown or the
    shape does not fit."""
    head = msgspec.json.decode(data)
    if isinstance(head, list):
        name = _row_name(head[0]) if head else None
        if name not in ROWS:
            raise DocumentError(f"a list of rows of no known probe ({name!r})")
        rows: list[Doc] = decode(data, list[ROWS[name]])  # type: ignore[valid-type]
        return rows
    first = next(iter(head), None) if isinstance(head, dict) else None
    if first in FIRST_KEYS:
        return decode(data, FIRST_KEYS[first])
    kind = head.get("kind") if isinstance(head, dict) else None
    if kind not in KINDS:
        raise DocumentError(f"no known document kind ({kind!r})")
    return decode(data, KINDS[kind])


__all__ = [
    "AB",
    "KINDS",
    "ROWS",
    "Advise",
    "AdviseCheck",
    "Breakdown",
    "CaptureModes",
    "Copy",
    "Decompose",
    "Diff",
    "Dilation",
    "DilationRow",
    "Doc",
    "DocumentError",
    "Export",
    "FIRST_KEYS",
    "GemmTable",
    "Links",
    "LinksTransportsValue",
    "Manifest",
    "Predict",
    "ProbeRow",
    "Report",
    "Rho",
    "Roofline",
    "Shortfall",
    "Steps",
    "TokenTimes",
    "TopKernel",
    "TopKernels",
    "TopKernelsClass",
    "Whatif",
    "convert",
    "decode",
    "decode_document",
    "given",
    "read",
    "to_builtins",
]
