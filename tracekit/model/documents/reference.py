"""docs/JSON.md, generated from the document Structs (`scripts/gen_json_docs.py` writes it;
tests/test_documents.py checks the committed file is what this renders).

Per document: its prose (the Struct's docstring: what writes it, an annotated example, the
invariants), then every field by its JSON path with its type, nested objects expanded (`a.b`),
array items as `a[]`, the values of an object keyed by rank, part or name as `a{}`."""

from __future__ import annotations

import inspect

from msgspec import inspect as mi

from tracekit.model.documents.ab import AB
from tracekit.model.documents.advise import Advise, GemmTable
from tracekit.model.documents.base import Doc
from tracekit.model.documents.breakdown import Breakdown
from tracekit.model.documents.copy import Copy
from tracekit.model.documents.decompose import Decompose
from tracekit.model.documents.diff import Diff
from tracekit.model.documents.dilation import DilationRow
from tracekit.model.documents.export import Export
from tracekit.model.documents.links import Links, ProbeRow
from tracekit.model.documents.manifest import Manifest
from tracekit.model.documents.modes import AdviseCheck, CaptureModes
from tracekit.model.documents.predict import Predict
from tracekit.model.documents.report import Report
from tracekit.model.documents.rho import Rho
from tracekit.model.documents.roofline import Roofline
from tracekit.model.documents.shortfall import Shortfall
from tracekit.model.documents.steps import Steps
from tracekit.model.documents.whatif import Whatif

PREAMBLE = """\
# tracekit JSON contracts

<!-- generated from tracekit/model/documents by scripts/gen_json_docs.py: edit the Structs, not this file -->

Every document carries `schema_version` (semver string; a minor bump adds fields, a major bump
changes or removes them) and `kind`. Times are integer nanoseconds (`*_ns`), bandwidths decimal
GB/s (`*_gbps`), sizes bytes. Readers must ignore fields they do not know.

Each document is a `msgspec.Struct` in `tracekit/model/documents/` (`decode_document` reads any of
them by its `kind`); every committed document under `reports/` and every `traces/*/manifest.json`
decodes into its Struct exactly (tests/test_documents.py). In the field lists, *optional* marks a
field that a writer leaves out in some runs or that an older schema version lacks.
"""

#: the sections of docs/JSON.md: anchor and the Structs it documents (the first one's docstring
#: opens the section)
SECTIONS: tuple[tuple[str, tuple[type[Doc], ...]], ...] = (
    ("manifest", (Manifest,)),
    ("breakdown", (Breakdown,)),
    ("shortfall", (Shortfall,)),
    ("diff", (Diff,)),
    ("probe", (ProbeRow, Copy, Links)),
    ("decompose", (Decompose,)),
    ("advise", (Advise,)),
    ("rho", (Rho,)),
    ("report", (Report,)),
    ("whatif", (Whatif,)),
    ("roofline", (Roofline,)),
    ("dilation", (DilationRow,)),
    ("predict", (Predict,)),
    ("export", (Export,)),
    ("steps", (Steps,)),
    ("ab", (AB,)),
    ("capture-modes", (CaptureModes,)),
    ("advise-check", (AdviseCheck,)),
    ("gemm-table", (GemmTable,)),
)


def _type_text(t: mi.Type) -> str:
    if isinstance(t, mi.UnionType):
        return " \\| ".join(_type_text(x) for x in t.types)
    if isinstance(t, mi.ListType):
        return f"array of {_type_text(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"object of {_type_text(t.value_type)}"
    if isinstance(t, (mi.StructType, mi.DataclassType, mi.TypedDictType)):
        return "object"
    if isinstance(t, mi.CustomType) and t.cls is object:  # a value the document does not shape
        return "any JSON value"
    names = {
        mi.IntType: "integer",
        mi.FloatType: "number",
        mi.StrType: "string",
        mi.BoolType: "boolean",
        mi.NoneType: "null",
        mi.AnyType: "any JSON value",
    }
    return names.get(type(t), type(t).__name__)


def _rows(t: mi.Type, path: str, out: list[str]) -> None:
    """The field rows below `path` (the nested objects of `t`)."""
    if isinstance(t, mi.UnionType):
        for x in t.types:
            _rows(x, path, out)
    elif isinstance(t, mi.ListType):
        _rows(t.item_type, f"{path}[]", out)
    elif isinstance(t, mi.DictType):
        _rows(t.value_type, f"{path}{{}}", out)
    elif isinstance(t, (mi.StructType, mi.DataclassType, mi.TypedDictType)):
        # a dataclass (the model's shape) or a TypedDict (the export's header) like a Struct: the
        # fields in declaration order (msgspec lists a TypedDict's by name)
        order = list(getattr(t.cls, "__annotations__", ()))
        fields = (
            sorted(t.fields, key=lambda f: order.index(f.name))
            if isinstance(t, mi.TypedDictType)
            else t.fields
        )
        for f in fields:
            here = f"{path}.{f.encode_name}" if path else f.encode_name
            optional = "" if f.required else " *(optional)*"
            out.append(f"| `{here}` | {_type_text(f.type)}{optional} |")
            _rows(f.type, here, out)


def fields_table(cls: type[Doc]) -> str:
    """Every field of `cls` by its JSON path, with its type."""
    rows: list[str] = []
    _rows(mi.type_info(cls), "", rows)
    return "\n".join(["| field | type |", "| --- | --- |", *rows])


def render() -> str:
    """The text of docs/JSON.md."""
    out = [PREAMBLE]
    for anchor, structs in SECTIONS:
        out.append(f"## {anchor}")
        for cls in structs:
            doc = inspect.cleandoc(cls.__doc__ or "")
            if doc:
                out.append(doc)
            where = f"{cls.__module__}.{cls.__qualname__}"
            out.append(f"Fields of `{cls.__qualname__}` (`{where}`):\n\n{fields_table(cls)}")
        out[-1] += "\n"
    return "\n\n".join(out)


__all__ = ["SECTIONS", "fields_table", "render"]
