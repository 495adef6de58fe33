"""tracekit/render: each view renders a result from its typed document.

The committed reports were written by the command-line renderers before they moved into
tracekit/render; a view given the committed JSON must write the committed text byte for byte."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import click
import pytest

from tracekit.model import documents as D
from tracekit.render import decompose, links, roofline, whatif

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"


def _doc(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", ["h200-tp2", "cpu-straggler", "h200-tp1-launch0", "h200x2-graphs-fused"])
def test_whatif_markdown_is_the_committed_one(name: str) -> None:
    """scripts/make_reports.sh wrote reports/whatif/NAME.md and NAME.json from the same replay."""
    doc = D.convert(_doc(REPORTS / "whatif" / f"{name}.json"), D.Whatif)
    assert whatif.markdown(doc) == (REPORTS / "whatif" / f"{name}.md").read_text()


@pytest.mark.parametrize("name", ["h200-graphs-compile", "cpu-injected"])
def test_decompose_text_is_the_committed_one(name: str) -> None:
    doc = D.convert(_doc(REPORTS / "decompose" / f"{name}.json"), D.Decompose)
    assert decompose.text(doc) == (REPORTS / "decompose" / f"{name}.txt").read_text()


@pytest.mark.parametrize("name", ["h200x2-tp1-b1-graphs", "h200x2-tp2-b1-graphs"])
def test_roofline_table_is_the_committed_one(name: str) -> None:
    """`tracekit roofline ... --out FILE.txt` writes 120 columns without colour."""
    doc = D.convert(_doc(REPORTS / "roofline" / f"{name}.json"), D.Roofline)
    assert roofline.table(doc, 120, False) == (REPORTS / "roofline" / f"{name}.txt").read_text()


def test_links_view_keeps_every_mode_of_the_comparison() -> None:
    """The side-by-side figures are keyed by mode: a comparison of modes other than nvlink / pcie
    (`--modes nvlink,default`) keeps its figures through the typed document (a Struct with fixed
    nvlink / pcie fields dropped them: the column read '-' everywhere)."""
    raw = _doc(REPORTS / "h200" / "links-graph.json")
    renamed = copy.deepcopy(raw)
    for m in renamed["modes"]:
        if m["mode"] == "pcie":
            m["mode"] = "default"
    for e in renamed["side_by_side"]:
        for key in ("busbw_gbps", "time_us", "correct"):
            e[key] = {("default" if k == "pcie" else k): v for k, v in e[key].items()}
    text = links.table(D.convert(renamed, D.Links))
    before = links.table(D.convert(raw, D.Links))
    assert "default busbw" in text and "pcie busbw" not in text
    # the same figures under the other name: every row of the table is unchanged
    rows = [ln for ln in before.splitlines() if ln.startswith("  ")]
    assert rows == [ln for ln in text.splitlines() if ln.startswith("  ")]
    pcie_cells = [ln.split()[5] for ln in rows if ln.startswith("  all_reduce")]
    assert pcie_cells and any(c != "-" for c in pcie_cells)


def test_probe_and_compare_links_share_their_sweep_options() -> None:
    """The sweep options are declared once (cli/sweep_options.sweep_options): both commands take each
    of them, with the same type and, where no override says otherwise, the same default."""
    from tracekit.cli.compare_links import command as compare
    from tracekit.cli.probe import command as probe
    from tracekit.cli.sweep_options import SWEEP_OPTIONS

    def params(cmd: click.Command) -> dict[str, click.Parameter]:
        return {p.name: p for p in cmd.params if p.name}

    pp, cp = params(probe), params(compare)
    names = {key if key not in ("op", "min", "max") else f"{key}_text" for key in SWEEP_OPTIONS}
    assert names <= set(pp) and names <= set(cp)
    for name in ("factor", "iters", "warmup", "dtype", "device", "algo_pass", "graph", "progress", "log_dir"):
        assert pp[name].default == cp[name].default, name
        assert type(pp[name].type) is type(cp[name].type), name
    # what differs is said where each command declares it
    assert pp["op_text"].default == "all_reduce" and cp["op_text"].default == "all_reduce,all_gather"
    assert "off" in pp["nccl_debug"].type.choices and "off" not in cp["nccl_debug"].type.choices
