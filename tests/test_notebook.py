"""examples/api_tour.ipynb runs top to bottom (nbclient, a fresh kernel) on the committed CPU traces
and shows the breakdown of traces/cpu-tp1 and traces/cpu-tp2 and their shortfall as tables, with the
figures `tracekit breakdown` / `tracekit shortfall --format json` print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tracekit.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "api_tour.ipynb"


def _text(output: dict) -> str:
    """An output's text; a multi-line string as the .ipynb file stores it (a list of lines) joined."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    else:
        text = output.get("data", {}).get("text/plain", "")
    return text if isinstance(text, str) else "".join(text)


@pytest.fixture(scope="module")
def executed() -> list:
    # imported here, not at collection: nbformat's import (jsonschema's format checkers) cost every
    # xdist worker about 2 CPU-s
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # run from examples/, as a user opening the notebook would
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    return nb.cells


@pytest.fixture(scope="module")
def cli_shortfall(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`tracekit shortfall --format json` of traces/cpu-tp1 and cpu-tp2 (the figures the notebook
    must print), run once for the tests that compare with it."""
    out = tmp_path_factory.mktemp("cli") / "s.json"
    argv = [
        "shortfall",
        "--baseline",
        str(ROOT / "traces/cpu-tp1"),
        "--sharded",
        str(ROOT / "traces/cpu-tp2"),
    ]
    assert main([*argv, "--format", "json", "--out", str(out), "--no-cache"]) == 0
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_notebook_runs_without_errors(executed):
    code = [c for c in executed if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
    errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, errors


def test_notebook_shows_breakdown_and_shortfall_frames(executed, cli_shortfall: dict):
    src = {i: "".join(c.source) for i, c in enumerate(executed)}
    html = {
        i: [o["data"]["text/html"] for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
        for i, c in enumerate(executed)
    }
    b_cells = [i for i, s in src.items() if "b1.to_frame()" in s or "b2.to_frame()" in s]
    sf_cell = next(i for i, s in src.items() if "sf.to_frame()" in s)
    assert len(b_cells) == 2 and all(html[i] and "<table" in html[i][0] for i in b_cells)
    assert html[sf_cell] and "<table" in html[sf_cell][0]
    for term in ("compute", "transfer", "coordination", "wait"):
        assert f"<td>{term}</td>" in html[sf_cell][0] or f">{term}<" in html[sf_cell][0]
    # the S the notebook printed is the CLI's
    cli = cli_shortfall
    printed = "".join(_text(o) for o in executed[sf_cell].outputs)
    m = re.search(r"S = (-?\d+) ns per token", printed)
    assert m and int(m.group(1)) == cli["shortfall_ns"]
    assert cli["verdict"] in printed
    # the per-rank medians of TP=2 list both ranks; TP=1's steps are one rank's
    med_cell = next(i for i, s in src.items() if "b2.to_frame().groupby" in s)
    table = html[med_cell][0]
    assert re.search(r"<th>0</th>", table) and re.search(r"<th>1</th>", table)


def test_committed_notebook_carries_its_outputs(cli_shortfall: dict):
    """The notebook is committed executed (issue 24), and its outputs are current: the S it printed
    is the CLI's on the committed traces (no kernel needed; the notebook read as the JSON it is)."""
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["nbformat"] == 4
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["execution_count"] and c["outputs"] for c in code)
    printed = "".join(_text(o) for c in code for o in c["outputs"])
    m = re.search(r"S = (-?\d+) ns per token", printed)
    assert m and int(m.group(1)) == cli_shortfall["shortfall_ns"]
    # the shortfall's own display (verdict and terms) is in the notebook, and no absolute path
    html_out = [
        "".join(o["data"]["text/html"])
        for c in code
        for o in c["outputs"]
        if "text/html" in o.get("data", {})
    ]
    assert any('class="tk-result"' in h and "coordination" in h for h in html_out)
    assert "/work/" not in json.dumps(nb) and "/home/" not in json.dumps(nb)
