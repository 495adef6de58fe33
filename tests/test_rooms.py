"""analyse/ in rooms (issue 27): no module of tracekit/ over 600 lines, and the graph, its replay and
the what-if live in their rooms (path/, retime/, whatif/) with no module left at the old flat paths
to import them through."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tracekit"
MAX_LINES = 600


def test_no_module_of_the_package_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_graph_replay_and_whatif_are_imported_from_their_rooms() -> None:
    """Every import of tracekit/, tests/, benchmarks/ and scripts/ names a module that exists: the
    flat modules the rooms replaced (analyse/graph.py, replay.py, correction.py, critical_path.py)
    are gone, and nothing imports them (no re-export left behind)."""
    gone = {f"tracekit.analyse.{m}" for m in ("graph", "replay", "correction", "critical_path")}
    for m in gone:
        assert not (ROOT / (m.replace(".", "/") + ".py")).exists(), m
    bad = []
    # an import of one of them spells its name: only the files that hold one are parsed
    named = re.compile(r"\b(?:graph|replay|correction|critical_path)\b")
    for folder in ("tracekit", "tests", "benchmarks", "scripts"):
        for p in (ROOT / folder).rglob("*.py"):
            text = p.read_text()
            if not named.search(text):
                continue
            for node in ast.walk(ast.parse(text)):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                if any(n in gone for n in names):
                    bad.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert bad == []
