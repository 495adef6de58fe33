"""Typed documents (tracekit.model.documents): every committed JSON document under reports/ and
every traces/*/manifest.json decodes into its Struct and encodes back to exactly what the file
holds (no key lost or added, an int stays an int, a float a float), and the documents the current
writers produce from a committed run decode the same way. A writer that changes a document's
shape without changing its Struct fails here; so does a Struct that stops fitting real data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tracekit
from tracekit.model.documents import (
    KINDS,
    Breakdown,
    DocumentError,
    Manifest,
    Shortfall,
    convert,
    decode,
    decode_document,
    to_builtins,
)

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted(
    {p for p in (ROOT / "reports").rglob("*.json") if ".tracekit-cache" not in p.parts}
    | set((ROOT / "traces").glob("*/manifest.json"))
)


def _canon(x: Any) -> str:
    """The JSON text with keys sorted: equal when the same keys hold the same typed values."""
    return json.dumps(x, sort_keys=True)


def _first_difference(a: Any, b: Any, where: str = "$") -> str:
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(set(a) ^ set(b))} on one side only"
        return next((d for k in a if (d := _first_difference(a[k], b[k], f"{where}.{k}"))), "")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        return next(
            (
                d
                for i, (x, y) in enumerate(zip(a, b, strict=True))
                if (d := _first_difference(x, y, f"{where}[{i}]"))
            ),
            "",
        )
    return "" if a == b else f"{where}: {a!r} vs {b!r}"


def _assert_exact(doc: Any, original: Any) -> None:
    back = to_builtins(doc)
    assert _canon(back) == _canon(original), _first_difference(back, original)


def test_every_committed_document_is_found():
    kinds = {json.loads(p.read_bytes()).get("kind") for p in COMMITTED if p.read_bytes().lstrip()[:1] == b"{"}
    # every kind a committed file holds has a Struct, and each Struct has real data to check: a
    # committed file, or what a command writes from committed runs (tests/test_documents_writers.py)
    from tests.test_documents_writers import COMMANDS, OUTSIDE_CLI

    written = {struct for _, struct in COMMANDS.values()} | set(OUTSIDE_CLI)
    assert kinds <= set(KINDS), kinds - set(KINDS)
    assert {k for k, s in KINDS.items() if s not in written} <= kinds, set(KINDS) - kinds
    assert len(COMMITTED) >= 50


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(ROOT)) for p in COMMITTED])
def test_committed_document_decodes_exactly(path: Path):
    raw = path.read_bytes()
    doc = decode_document(raw)
    if path.name == "manifest.json":
        assert isinstance(doc, Manifest)
    _assert_exact(doc, json.loads(raw))


def test_a_wrong_shape_is_refused_with_its_place():
    raw = (ROOT / "traces/cpu-tp2/manifest.json").read_bytes()
    doc = json.loads(raw)
    doc["workload"]["tp"] = "two"
    with pytest.raises(DocumentError) as exc:
        decode(json.dumps(doc).encode(), Manifest)
    assert exc.value.where == "$.workload.tp"
    cut = raw.index(b":")
    with pytest.raises(DocumentError) as exc:
        decode(raw[:cut] + b"}" + raw[cut + 1 :], Manifest)
    assert exc.value.offset == cut and "not valid JSON" in str(exc.value)
    with pytest.raises(DocumentError, match="no known document kind"):
        decode_document(b'{"kind": "tracekit.nothing"}')


@pytest.fixture(scope="module")
def cpu_runs() -> tuple[Any, Any]:
    return tracekit.load(ROOT / "traces/cpu-tp1"), tracekit.load(ROOT / "traces/cpu-tp2-straggler")


def test_the_writers_documents_decode_exactly(cpu_runs: tuple[Any, Any]):
    """What the current code writes (not only what was committed): breakdown and shortfall of a
    committed CPU run, through the JSON text the CLI writes."""
    tp1, tp2 = cpu_runs
    for obj, struct in ((tp2.breakdown(), Breakdown), (tracekit.shortfall(tp1, tp2), Shortfall)):
        original = json.loads(json.dumps(obj.to_json()))
        _assert_exact(convert(original, struct), original)


def test_json_md_is_generated_from_the_structs():
    """docs/JSON.md is what `scripts/gen_json_docs.py` renders from the Structs, and names every
    field of every document (a field added to a Struct shows in the doc, or this fails)."""
    from tracekit.model.documents.reference import SECTIONS, render

    text = (ROOT / "docs/JSON.md").read_text()
    assert text == render(), "docs/JSON.md is stale: run python scripts/gen_json_docs.py"
    for _, structs in SECTIONS:
        for cls in structs:
            assert f"Fields of `{cls.__qualname__}`" in text
    assert "| `workload.tp` | integer *(optional)* |" in text
    assert (
        "| `steps[].parts_ns` | object of integer |" in text
        and "| `per_token.parts_ns{}.median` | integer \\| null |" in text  # null: a run without steps
    )


@pytest.mark.parametrize(
    "args",
    [
        ["diff", "traces/cpu-tp2", "traces/cpu-tp2-straggler"],
        [
            "whatif",
            "--baseline",
            "traces/cpu-tp1",
            "--sharded",
            "traces/cpu-tp2-straggler",
            "--check",
            "traces/cpu-tp2",
            "--check-knob",
            "straggler=off",
        ],
    ],
    ids=["diff", "whatif"],
)
def test_the_cli_documents_decode_exactly(args: list[str], tmp_path: Path):
    """The JSON the CLI writes now (diff; whatif with its --check) fits its Struct exactly."""
    from tracekit.cli.main import main

    out = tmp_path / "doc.json"
    assert main([args[0], *(str(ROOT / a) if a.startswith("traces/") else a for a in args[1:]),
                 "--format", "json", "--out", str(out)]) == 0  # fmt: skip
    raw = out.read_bytes()
    _assert_exact(decode_document(raw), json.loads(raw))


def test_roofline_peaks_are_read_typed_and_a_wrong_shape_says_where(tmp_path: Path):
    """`tracekit roofline --copy/--rho` decode their files into Copy rows and Rho: the committed
    H200 files give the figures they hold; a rate that is text is refused naming its place."""
    from tracekit.analyse.compute.roofline import RooflineError, load_peaks

    copy, rho = ROOT / "reports/h200/copy.json", ROOT / "reports/rho/h200.json"
    peaks = load_peaks(copy, rho, "bfloat16")
    rows = json.loads(copy.read_text())
    assert peaks.bw_gbps == max(
        r["rw_gbps"] for r in rows if r["kind"] == "local" and r["rw_gbps"] is not None
    )
    bf16 = [m for m in json.loads(rho.read_text())["matrix"] if m["dtype"] == "bf16"]
    assert peaks.matrix_tflops == bf16[0]["tops"]
    bad = json.loads(rho.read_text())
    bad["matrix"][0]["tops"] = "fast"
    (tmp_path / "rho.json").write_text(json.dumps(bad))
    with pytest.raises(RooflineError, match=r"rho.json at \$\.matrix\[0\]\.tops"):
        load_peaks(None, tmp_path / "rho.json", "bfloat16")
