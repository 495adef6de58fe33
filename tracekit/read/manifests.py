"""The capture manifest as its typed document (tracekit.model.documents.Manifest), decoded once
where it is read (`tracekit.read.load_manifest` sets `Manifest.doc`).

A manifest comes from captures of every version and from users' own scripts, so the reading is
lenient as `check_manifest` is: a field whose value does not fit its type (a host that is a string,
a device index that is text) is left out of the typed document and noted, the rest is kept."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tracekit.model.documents import DocumentError, convert
from tracekit.model.documents import Manifest as ManifestDoc

#: at most this many malformed fields are left out one by one before the manifest is given up
MAX_DROPPED = 64


def _drop(doc: Any, where: str) -> bool:
    """Remove the value at JSON path `where` ($.a.b[3].c) from `doc`; False when it is not there."""
    steps: list[str | int] = []
    for part in where.removeprefix("$").replace("[", ".[").split("."):
        if not part:
            continue
        steps.append(int(part[1:-1]) if part.startswith("[") and part[1:-1].isdigit() else part)
    if not steps:
        return False
    node = doc
    for s in steps[:-1]:
        try:
            node = node[s]
        except (KeyError, IndexError, TypeError):
            return False
    last = steps[-1]
    if isinstance(node, dict) and last in node:
        del node[last]
        return True
    if isinstance(node, list) and isinstance(last, int) and last < len(node):
        del node[last]
        return True
    return False


def typed_manifest(doc: Mapping[str, Any], name: str) -> tuple[ManifestDoc, list[tuple[str, str]]]:
    """`doc` (a manifest's JSON object) as the typed document, and the notes (data_quality key,
    sentence) for the fields left out because their values do not fit."""
    work = copy.deepcopy(dict(doc))
    notes: list[tuple[str, str]] = []
    for _ in range(MAX_DROPPED):
        try:
            return convert(work, ManifestDoc), notes
        except DocumentError as exc:
            where = exc.where or "$"
            if where == "$" or not _drop(work, where):
                # the top level itself (schema_version or kind of another type): keep only the rest
                work = {k: v for k, v in work.items() if k not in ("schema_version", "kind")}
                work.update(schema_version=str(doc.get("schema_version")), kind=str(doc.get("kind")))
                if where == "$":
                    continue
                break
            notes.append(("manifest_field_malformed", f"{name}: {where.removeprefix('$.')} {exc}: ignored"))
    return ManifestDoc(schema_version=str(doc.get("schema_version")), kind=str(doc.get("kind"))), notes
