"""The capture manifest (`manifest.json` beside a run's traces), read ONCE into its typed document
(`tracekit.model.documents.Manifest`, docs/JSON.md#manifest): loaded with bounds (`read_manifest`:
at most `MAX_MANIFEST_BYTES`, numbers within `MAX_MANIFEST_NUMBER`, workload counts whole and
bounded: docs/RELIABILITY.md), checked (`check_manifest`) and decoded (`manifest_from_json`); every
consumer reads the Struct's attributes.

A manifest comes from captures of every version, from other tools and from users' own scripts, so
the reading is lenient: a field whose value does not fit its type (a host that is a string, a
device index that is text, a per-token list holding a null) is left out of the typed document and
noted (the object field that holds it: a list with one bad item is left out whole, so no item
shifts); keys the Struct does not know are kept, as they were, in `Manifest.unknown_fields`."""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from tracekit.errors import TraceFormatError
from tracekit.model.documents import DocumentError, Manifest, convert
from tracekit.model.documents.base import given
from tracekit.model.events import Run

#: at most this many malformed fields are left out one by one before the manifest is given up
MAX_DROPPED = 64


class ManifestRead(NamedTuple):
    """A manifest as read: the typed document, and the notes (data_quality key, sentence) for the
    fields left out because they were malformed or out of bounds (`read_run` adds them to the run's
    data_quality)."""

    manifest: Manifest
    notes: list[tuple[str, str]]


def _drop(doc: Any, where: str) -> str | None:
    """Remove from `doc` the object field holding the value at JSON path `where` (`$.a.b[3].c`: the
    field `c`; `$.a.b[3]` or `$.a.b[...][1]`: the field `b`, a list or a rank's values left out whole);
    the path removed, None when it is not there."""
    steps: list[str | int] = []
    # `[...]`: a value of an object keyed by data (rank, name): msgspec does not say its key
    for part in where.removeprefix("$").replace("[...]", ".*").replace("[", ".[").split("."):
        if not part:
            continue
        if part == "*":
            break
        steps.append(int(part[1:-1]) if part.startswith("[") and part[1:-1].isdigit() else part)
    while steps and not isinstance(steps[-1], str):
        steps.pop()
    if not steps:
        return None
    node = doc
    for s in steps[:-1]:
        try:
            node = node[s]
        except (KeyError, IndexError, TypeError):
            return None
    last = steps[-1]
    if not isinstance(node, dict) or last not in node:
        return None
    del node[last]
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps).removeprefix(".")


def _typed_manifest(work: dict[str, object], name: str) -> tuple[Manifest, list[tuple[str, str]]]:
    """`work` (a manifest's JSON object, changed: the fields that do not fit are removed) as the
    typed document, and the notes (data_quality key, sentence) for the fields left out because
    their values do not fit; its keys the Struct does not know kept in `unknown_fields`."""
    unknown = {k: work.pop(k) for k in list(work) if k not in Manifest.__struct_fields__}
    notes: list[tuple[str, str]] = []
    out = Manifest()
    for _ in range(MAX_DROPPED):
        try:
            out = convert(work, Manifest)
            break
        except DocumentError as exc:
            dropped = _drop(work, exc.where or "$")
            if dropped is None:  # not a field's value (cannot happen for an object): keep none
                notes.append(("manifest_field_malformed", f"{name}: {exc}: the manifest was ignored"))
                work = {}
                continue
            notes.append(
                (
                    "manifest_field_malformed",
                    f"{name} field {dropped!r} does not fit ({exc}); treated as missing",
                )
            )
    if unknown:
        out.unknown_fields = unknown
    return out, notes


def manifest_from_json(doc: Mapping[str, Any], name: str = "manifest.json") -> ManifestRead:
    """A manifest's JSON object (as `json.loads` gives it, or a Run built in code) read as
    `read_manifest` reads the file: numbers and workload fields bounded (`check_manifest`), then
    decoded leniently (`typed_manifest`). `doc` is not changed."""
    work = copy.deepcopy(dict(doc))
    notes = check_manifest(work, name)
    typed, typed_notes = _typed_manifest(work, name)
    return ManifestRead(typed, notes + typed_notes)


def attach_manifest(run: Run, manifest: ManifestRead | Mapping[str, Any] | None) -> Run:
    """`run` (changed in place, and returned) with its manifest as `read_run` attaches manifest.json:
    the typed document, the reader's notes in the run's data_quality. `manifest`: as read
    (`read_manifest`), or a manifest's JSON object (a Run built in code: `manifest_from_json`)."""
    if manifest is None:
        return run
    read = manifest if isinstance(manifest, ManifestRead) else manifest_from_json(manifest)
    run.manifest = read.manifest
    for key, note in read.notes:
        run.data_quality.add(key, 1, note)
    return run


def workload_tp(manifest: Manifest | None) -> int | None:
    """The TP degree a run's manifest gives (workload.tp, 1 to MAX_TP); None without one."""
    wl = given(manifest.workload) if manifest is not None else None
    tp = given(wl.tp) if wl is not None else None
    return tp if tp is not None and int_in(tp, 1, MAX_TP) else None


def workload_step_pattern(manifest: Manifest | None) -> str | None:
    """The step pattern a run's manifest gives (workload.step_pattern, a non-empty string), or None."""
    wl = given(manifest.workload) if manifest is not None else None
    return (given(wl.step_pattern) or None) if wl is not None else None


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


def check_manifest(doc: dict[str, object], name: str) -> list[tuple[str, str]]:
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


def _drop_unbounded_numbers(doc: dict[str, object], name: str, notes: list[tuple[str, str]]) -> None:
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


def read_manifest(path: str | os.PathLike[str]) -> ManifestRead:
    """A capture manifest (docs/JSON.md#manifest) as its typed document, with the notes on the
    fields left out (malformed, out of bounds). TraceFormatError naming the file when it cannot be
    read, is larger than MAX_MANIFEST_BYTES, is not UTF-8 or JSON (with the byte offset), nests too
    deeply, or its top level is not an object."""
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
    return manifest_from_json(doc, p.name)


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """`read_manifest(path)`'s typed document (the notes left out: a command that reads only the
    manifest)."""
    return read_manifest(path).manifest


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
