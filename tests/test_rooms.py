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


def test_the_dtype_sizes_are_one_table() -> None:
    """The probes', the roofline's and the prediction's dtype sizes are `model.dtypes`' (each keeps
    its own set of the dtypes it knows, in its order): a stage that wrote its own sizes again
    could disagree with the others (fp16 at 2 bytes in one, 4 in another)."""
    from tracekit.analyse.compute.roofline import DTYPE_BYTES as ROOFLINE
    from tracekit.analyse.predict import DTYPE_BYTES as PREDICT
    from tracekit.model.dtypes import DTYPE_BYTES, NCCL_TYPE
    from tracekit.probe.spec import DTYPES as PROBE

    for table in (ROOFLINE, PREDICT, {d: b for d, (_n, b) in PROBE.items()}):
        assert table == {d: DTYPE_BYTES[d] for d in table}
    assert {d: n for d, (n, _b) in PROBE.items()} == NCCL_TYPE
    # the short names (rho's, the advice's weight dtypes) too
    from tracekit.analyse.advise_inputs import TORCH_DTYPE
    from tracekit.analyse.compute.roofline import RHO_DTYPE
    from tracekit.model.dtypes import SHORT_NAME

    assert RHO_DTYPE == SHORT_NAME and TORCH_DTYPE == {v: k for k, v in SHORT_NAME.items()}
    # the sizes themselves: torch's element sizes (fp8: e4m3 / e5m2, one byte)
    assert (DTYPE_BYTES["bfloat16"], DTYPE_BYTES["float16"], DTYPE_BYTES["float32"], DTYPE_BYTES["fp8"]) == (
        2,
        2,
        4,
        1,
    )
