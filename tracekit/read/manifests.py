"""The capture manifest (`manifest.json` beside a run's traces): loaded with bounds
(`load_manifest`: at most `MAX_MANIFEST_BYTES`, numbers within `MAX_MANIFEST_NUMBER`, workload
counts whole and bounded: docs/RELIABILITY.md), checked (`check_manifest`) and kept as the `Manifest`
dict with its typed document (tracekit.model.documents.Manifest), decoded once where it is read
(`typed_manifest` sets `Manifest.doc`).

A manifest comes from captures of every version and from users' own scripts, so the reading is
lenient as `check_manifest` is: a field whose value does not fit its type (a host that is a string,
a device index that is text) is left out of the typed document and noted, the rest is kept."""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracekit.errors import TraceFormatError
from tracekit.model.documents import DocumentError, convert
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.documents.base import given

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


def manifest_document(manifest: Mapping[str, Any] | None) -> ManifestDoc | None:
    """A run's manifest (`Run.manifest`: the reader's `Manifest`, decoded once when it was read, its
    `doc`; a plain dict is decoded now) as its typed document; None without one."""
    if not manifest:
        return None
    doc = getattr(manifest, "doc", None)
    return doc if isinstance(doc, ManifestDoc) else typed_manifest(manifest, "manifest.json")[0]


def workload_tp(manifest: Mapping[str, Any] | None) -> int | None:
    """The TP degree a run's manifest gives (workload.tp, 1 to MAX_TP); None without one."""
    doc = manifest_document(manifest)
    wl = given(doc.workload) if doc is not None else None
    tp = given(wl.tp) if wl is not None else None
    return tp if tp is not None and int_in(tp, 1, MAX_TP) else None


#: a manifest is a few kB; one larger than this is not read
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
#: bounds of the workload fields that size loops and sets (docs/RELIABILITY.md)
MAX_TP = 1 << 16
MAX_PER_TOKEN = 100_000
#: every number of a manifest lies within +-MAX_MANIFEST_NUMBER (2**62: 146 years in ns, 4.6 EB in
#: bytes) and is finite; one beyond is treated as missing where it is read (check_manifest)
MAX_MANIFEST_NUMBER = float(1 << 62)
#: workload counts (tokens, prompt, batch, layers, rounds ...): whole numbers from 0 to this
MAX_WORKLOAD_COUNT = 1 << 31
_WORKLOAD_COUNTS = (
    "tokens",
    "prompt",
    "batch",
    "layers",
    "warmup_tokens",
    "profiler_warmup_steps",
    "untimed_tail_steps",
    "rounds",
)


class Manifest(dict):  # type: ignore[type-arg]
    """A manifest's JSON object; `notes` lists (data_quality key, note) for the fields that were
    malformed and left out when it was read (`read_run` adds them to the run's data_quality);
    `doc` the same manifest as its typed document (`tracekit.read.manifests.typed_manifest`,
    docs/JSON.md#manifest), decoded once when it is read."""

    notes: list[tuple[str, str]]
    doc: ManifestDoc | None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.notes = []
        self.doc = None


def int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def inside_run_folder(name: object) -> bool:
    """True when a manifest's file name stays inside the run folder: a relative path without `..`,
    no drive, no NUL (`../x`, `/etc/passwd`, `C:\\x`, `sub/../../x` are not)."""
    from pathlib import PurePosixPath, PureWindowsPath

    if not isinstance(name, str) or not name or "\x00" in name:
        return False
    posix, win = PurePosixPath(name), PureWindowsPath(name)
    return not (posix.is_absolute() or win.drive or win.root or ".." in posix.parts or ".." in win.parts)


def check_manifest(doc: dict[str, Any], name: str) -> list[tuple[str, str]]:
    """Leave out (in place) the workload fields that are malformed or out of bounds, so that no
    consumer sizes a loop or a set by them (tp 10**30, per_token 1e9); the notes saying so."""
    notes: list[tuple[str, str]] = []
    _drop_unbounded_numbers(doc, name, notes)
    files = doc.get("files")
    if isinstance(files, dict):  # names of the run's own files: never a path out of its folder
        outside = [k for k in files if not inside_run_folder(k)]
        if outside:
            shown = ", ".join(repr(k)[:80] for k in outside[:4])
            notes.append(
                (
                    "manifest_path_outside_run",
                    f"{name}: files names {len(outside)} path(s) outside the run folder ({shown}): ignored",
                )
            )
            for k in outside:
                del files[k]
    wl = doc.get("workload")
    if not isinstance(wl, dict):
        return notes
    key = "manifest_field_malformed"
    if "tp" in wl and not int_in(wl["tp"], 1, MAX_TP):
        notes.append(
            (key, f"{name}: workload.tp {str(wl['tp'])[:40]!r} is not a TP degree (1 to {MAX_TP}): ignored")
        )
        del wl["tp"]
    counts = [k for k in _WORKLOAD_COUNTS if k in wl and not int_in(wl[k], 0, MAX_WORKLOAD_COUNT)]
    if counts:
        shown = ", ".join(f"{k} {str(wl[k])[:40]!r}" for k in counts)
        notes.append(
            (key, f"{name}: workload {shown}: not a whole number from 0 to {MAX_WORKLOAD_COUNT}: ignored")
        )
        for k in counts:
            del wl[k]
    if "step_pattern" in wl and wl["step_pattern"] is not None and not isinstance(wl["step_pattern"], str):
        notes.append((key, f"{name}: workload.step_pattern is not a string: ignored"))
        del wl["step_pattern"]
    coll = wl.get("collectives")
    if coll is not None and not isinstance(coll, list):
        notes.append((key, f"{name}: workload.collectives is not a list: ignored"))
        del wl["collectives"]
    elif isinstance(coll, list):
        good = [
            e
            for e in coll
            if isinstance(e, dict)
            and int_in(e.get("per_token", 1), 1, MAX_PER_TOKEN)
            and all(int_in(e.get(b, -1), -1, 1 << 62) for b in ("in_bytes", "out_bytes"))
        ]
        if len(good) != len(coll):
            notes.append(
                (
                    key,
                    f"{name}: {len(coll) - len(good)} workload.collectives entries with a per_token outside 1 to "
                    f"{MAX_PER_TOKEN} or byte counts that are not integers were ignored",
                )
            )
            wl["collectives"] = good
    return notes


def _drop_unbounded_numbers(doc: dict[str, Any], name: str, notes: list[tuple[str, str]]) -> None:
    """Every number of the manifest, at any depth: one that is not finite (Python's JSON reads NaN,
    Infinity) or lies beyond +-MAX_MANIFEST_NUMBER is removed where it is (a key of an object is
    deleted, an item of a list becomes null), so no consumer computes with it (unprofiled.per_token_ns
    of 1e30 overflowed int64); noted once with how many and the first one's place."""
    found: list[str] = []

    def bad(v: Any) -> bool:
        return (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and not (math.isfinite(v) and -MAX_MANIFEST_NUMBER <= v <= MAX_MANIFEST_NUMBER)
        )

    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > 64:  # json.loads nests at most ~1000 deep; no manifest field is this deep
            continue
        if isinstance(node, dict):
            for k in [k for k, v in node.items() if bad(v)]:
                found.append(f"{where}{k} = {str(node[k])[:24]}")
                del node[k]
            stack.extend(
                (v, f"{where}{k}.", depth + 1) for k, v in node.items() if isinstance(v, (dict, list))
            )
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if bad(v):
                    found.append(f"{where}[{i}] = {str(v)[:24]}".replace(".[", "["))
                    node[i] = None
                elif isinstance(v, (dict, list)):
                    stack.append((v, f"{where}[{i}].".replace(".[", "["), depth + 1))
    if found:
        notes.append(
            (
                "manifest_field_malformed",
                f"{name}: {len(found)} number(s) not finite or beyond +-2**62 (first: {found[0]}) were "
                "treated as missing",
            )
        )


def load_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A capture manifest (docs/JSON.md#manifest) as a dict (a `Manifest`, its malformed workload
    fields left out and noted). TraceFormatError naming the file when it cannot be read, is larger
    than MAX_MANIFEST_BYTES, is not UTF-8 or JSON (with the byte offset), nests too deeply, or its
    top level is not an object."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_MANIFEST_BYTES:
            raise TraceFormatError(
                p,
                f"manifest is {p.stat().st_size} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may be",
            )
        raw = p.read_bytes()
    except OSError as exc:
        raise TraceFormatError(p, f"manifest cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(p, "manifest is not UTF-8 text", offset=exc.start) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8"))
        raise TraceFormatError(p, f"manifest is not valid JSON ({exc.msg})", offset=offset) from None
    except ValueError as exc:  # e.g. a number too long to convert
        raise TraceFormatError(p, f"manifest is not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceFormatError(p, "manifest is JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise TraceFormatError(
            p, f"manifest's top level is a JSON {json_type(doc)}, not an object (docs/JSON.md#manifest)"
        )
    out = Manifest(doc)
    out.notes = check_manifest(out, p.name)
    out.doc, typed_notes = typed_manifest(out, p.name)
    out.notes += typed_notes
    return out


def json_type(x: Any) -> str:
    """The JSON type name of a decoded value, for error messages ("array", "string", ...)."""
    if isinstance(x, Mapping):
        return "object"
    if isinstance(x, (list, tuple)):
        return "array"
    if isinstance(x, str):
        return "string"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, (int, float)):
        return "number"
    return "null" if x is None else type(x).__name__
