"""The guard of the typed documents: every command that writes a JSON document is run through the
CLI on committed runs (the CPU runs traces/cpu-tp1, cpu-tp2, cpu-gloo-plain, cpu-truth-*, and the
H200 pair traces/h200-tp1 / h200-tp2) and what it writes is decoded strictly into its Struct
(`msgspec.json.decode(..., type=...)`: a string where the Struct says integer, a missing field or a
null the Struct does not allow fails) and encoded back to exactly the same keys and typed values
(no key the Struct does not know). Nothing is captured: the probe and compare-links documents are
re-emitted from saved sweeps (tests/data/probe-cpu-gloo.json, tests/data/links-cpu-gloo.json: a
2-rank gloo sweep on CPU, `tracekit probe|compare-links --device cpu --ranks 2 --max 16K --iters 3
--warmup 1`) and the committed H200 sweep (reports/h200/links.json).

Each command runs once per module (the `written` fixture); the parametrized tests read its file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tracekit.model import documents
from tracekit.model.documents import decode_document, given, to_builtins

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"

T = "traces/"
#: name -> (the command line, the Struct its JSON decodes into; a list[...] for row documents)
COMMANDS: dict[str, tuple[list[str], Any]] = {
    "breakdown-cpu-tp2": (["breakdown", T + "cpu-tp2"], documents.Breakdown),
    "breakdown-gloo-plain": (["breakdown", T + "cpu-gloo-plain"], documents.Breakdown),
    "breakdown-h200-tp2": (["breakdown", T + "h200-tp2"], documents.Breakdown),
    "shortfall-cpu": (
        ["shortfall", "--baseline", T + "cpu-tp1", "--sharded", T + "cpu-tp2"],
        documents.Shortfall,
    ),
    "shortfall-truth": (
        ["shortfall", "--baseline", T + "cpu-truth-tp1", "--sharded", T + "cpu-truth-inj"],
        documents.Shortfall,
    ),
    "shortfall-gloo-plain": (
        ["shortfall", "--baseline", T + "cpu-tp1", "--sharded", T + "cpu-gloo-plain"],
        documents.Shortfall,
    ),
    "shortfall-h200": (
        ["shortfall", "--baseline", T + "h200-tp1", "--sharded", T + "h200-tp2"],
        documents.Shortfall,
    ),
    "whatif-cpu": (["whatif", "--baseline", T + "cpu-tp1", "--sharded", T + "cpu-tp2"], documents.Whatif),
    "whatif-h200": (["whatif", "--baseline", T + "h200-tp1", "--sharded", T + "h200-tp2"], documents.Whatif),
    "diff-truth": (["diff", T + "cpu-truth-a", T + "cpu-truth-b"], documents.Diff),
    "diff-h200": (["diff", T + "h200-tp1", T + "h200-tp1-graphs"], documents.Diff),
    "decompose-truth": (
        [
            "decompose",
            "--baseline",
            T + "cpu-truth-a",
            "--intermediate",
            T + "cpu-truth-b",
            "--full",
            T + "cpu-truth-inj",
        ],
        documents.Decompose,
    ),
    "dilation": (["dilation", T + "cpu-truth-a", T + "cpu-tp2", T + "h200-tp2"], list[documents.DilationRow]),
    "roofline-h200": (
        ["roofline", T + "h200-tp1", "--copy", "reports/h200/copy.json", "--rho", "reports/rho/h200.json"],
        documents.Roofline,
    ),
    "advise-cpu": (["advise", "--tp1", T + "cpu-tp1", "--tpn", T + "cpu-tp2"], documents.Advise),
    "advise-h200": (["advise", "--tp1", T + "h200-tp1", "--tpn", T + "h200-tp2"], documents.Advise),
    "predict-h200": (
        [
            "predict",
            "--shard",
            T + "h200-shard2-graphs",
            "--link",
            "reports/h200/links-graph.json@nvlink",
            "--check",
            T + "h200x2-tp2-b1-graphs",
        ],
        documents.Predict,
    ),
    "compare-links-cpu": (["compare-links", "--load", "tests/data/links-cpu-gloo.json"], documents.Links),
    "compare-links-h200": (
        ["compare-links", "--load", "reports/h200/links.json", "--trace", T + "h200-tp2"],
        documents.Links,
    ),
    "report-cpu": (["report", T + "cpu-tp2", "--baseline", T + "cpu-tp1"], documents.Report),
}


#: the documents written outside the CLI (test_the_api_and_script_documents_decode_strictly)
OUTSIDE_CLI = (documents.Steps, documents.AB)


def _argv(name: str, out: Path) -> list[str]:
    args, _ = COMMANDS[name]
    full = [str(ROOT / a) if a.startswith(("traces/", "reports/", "tests/")) else a for a in args]
    if full[0] == "report":
        return [*full, "-o", str(out)]
    return [*full, "--format", "json", "-o", str(out)]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Each command's JSON, written once through the CLI."""
    from tracekit.cli.main import main

    folder = tmp_path_factory.mktemp("documents")
    out: dict[str, bytes] = {}
    for name in COMMANDS:
        path = folder / f"{name}.json"
        assert main(_argv(name, path)) == 0, name
        out[name] = path.read_bytes()
    return out


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_written_document_decodes_strictly(name: str, written: dict[str, bytes]):
    raw = written[name]
    struct = COMMANDS[name][1]
    doc = msgspec.json.decode(raw, type=struct, strict=True)
    # nothing the Struct does not know, nothing it adds: the same keys and typed values back
    assert _canon(to_builtins(doc)) == _canon(json.loads(raw))
    # and the document names its own kind: decode_document finds the same Struct
    found = decode_document(raw)
    assert type(found) is type(doc) or (isinstance(found, list) and isinstance(doc, list))


def test_the_probe_rows_decode_strictly():
    """`tracekit probe --format json` (a list of collective rows) and the rows re-emitted by the
    writer (probe.results.format_json of the decoded rows) fit ProbeRow exactly."""
    raw = (DATA / "probe-cpu-gloo.json").read_bytes()
    rows = msgspec.json.decode(raw, type=list[documents.ProbeRow], strict=True)
    assert rows and all(r.backend == "gloo" for r in rows)
    assert _canon(to_builtins(rows)) == _canon(json.loads(raw))
    assert isinstance(decode_document(raw), list)


def test_the_api_and_script_documents_decode_strictly():
    """The documents written outside the CLI: the notebook API's steps (`tracekit.load(run).steps()
    .to_json()`) and the paired A/B summary (`tracekit.analyse.ab.ab_document`, what
    scripts/decoder_ab.py writes) of a committed run's unprofiled and profiled rounds."""
    import tracekit
    from tracekit.analyse.ab import ab_document

    for run in ("cpu-tp2", "cpu-gloo-plain", "h200-tp2"):
        doc = tracekit.load(ROOT / T / run).steps().to_json()
        raw = json.dumps(doc).encode()
        steps = msgspec.json.decode(raw, type=documents.Steps, strict=True)
        assert steps.steps and _canon(to_builtins(steps)) == _canon(json.loads(raw))
        assert isinstance(decode_document(raw), documents.Steps)
    m = json.loads((ROOT / T / "cpu-truth-a" / "manifest.json").read_text())
    rounds = {
        kind: [
            [max(per_rank[r][i] for r in per_rank) for i in range(len(per_rank["0"]))]
            for per_rank in m[kind]["rounds"]
        ]
        for kind in ("unprofiled", "profiled")
    }
    raw = json.dumps(ab_document(rounds, baseline="unprofiled", resamples=200).to_json()).encode()
    ab = msgspec.json.decode(raw, type=documents.AB, strict=True)
    assert ab.rounds == len(m["unprofiled"]["rounds"]) and given(ab.arms["profiled"].diff_ns) is not None
    assert _canon(to_builtins(ab)) == _canon(json.loads(raw)) and isinstance(
        decode_document(raw), documents.AB
    )


def test_the_export_header_decodes_strictly(tmp_path: Path):
    """`tracekit export` writes a Perfetto trace whose `tracekitExport` header fits Export."""
    from tracekit.cli.main import main

    out = tmp_path / "run.json"
    assert main(["export", str(ROOT / T / "cpu-tp2"), "-o", str(out)]) == 0
    raw = out.read_bytes()
    doc = msgspec.json.decode(raw, type=documents.Export, strict=True)
    assert doc.tracekitExport["format"] == "tracekit.perfetto"
    assert sorted(doc.tracekitExport["ranks"]) == ["0", "1"]
    assert _canon(to_builtins(doc)) == _canon(json.loads(raw))


def test_a_struct_refuses_what_it_does_not_describe(written: dict[str, bytes]):
    """The guard is strict: a count written as text, or a required field left out, is refused."""
    doc = json.loads(written["shortfall-cpu"])
    doc["n_ranks"] = "2"
    with pytest.raises(msgspec.ValidationError, match=r"\$\.n_ranks"):
        msgspec.json.decode(json.dumps(doc), type=documents.Shortfall, strict=True)
    doc = json.loads(written["breakdown-cpu-tp2"])
    del doc["steps"]
    with pytest.raises(msgspec.ValidationError, match="steps"):
        msgspec.json.decode(json.dumps(doc), type=documents.Breakdown, strict=True)
