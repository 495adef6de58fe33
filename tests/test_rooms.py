"""analyse/ in rooms (issue 27): no module of tracekit/ over 600 lines, the graph, its replay and
the what-if in their rooms (path/, retime/, whatif/) with no module left at the old flat paths
to import them through, and tracekit imported at a module's top unless a reason is written."""

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


#: The modules that may import tracekit inside a function, and why (issue 27: "imports at the top
#: unless an optional dependency justifies otherwise"). Every other module imports tracekit at its
#: top, so that an import cycle shows when the module is imported, not when a function first runs.
LAZY_TRACEKIT_IMPORTS: dict[str, str] = {
    "tracekit/__init__.py": "`import tracekit` runs inside the user's decode loop: only annotate/profile load",
    "tracekit/api.py": "the notebook API is re-exported from `tracekit`, which stays light (above)",
    "tracekit/model/__init__.py": "module-level __getattr__: the model's names load on first use",
    "tracekit/cli/": "`tracekit --help` imports every command module; a command imports its analysis when it runs",
    "tracekit/capture/": "runs in the ranks' processes beside torch, which import only what a rank uses",
    "tracekit/report/build.py": "report.html imports plotly (an optional dependency) at its top: only for HTML",
}


def _lazy_tracekit_imports(path: Path) -> list[int]:
    lines = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            mod = (
                node.module
                if isinstance(node, ast.ImportFrom)
                else node.names[0].name
                if isinstance(node, ast.Import)
                else None
            )
            if mod is not None and (mod == "tracekit" or mod.startswith("tracekit.")):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_tracekit_is_imported_at_the_top_except_where_a_reason_is_written() -> None:
    """A module not in LAZY_TRACEKIT_IMPORTS has no `import tracekit...` inside a function: the
    imports hoisted in stop 40 (analysed, predict, export/perfetto, pipeline/study, read/files,
    probe/compare, probe/rho) stay hoisted, and a new lazy import needs its reason written here."""
    found = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = str(p.relative_to(ROOT))
        if any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in LAZY_TRACEKIT_IMPORTS):
            continue
        if lines := _lazy_tracekit_imports(p):
            found[rel] = lines
    assert found == {}
    # every reason is for a module that has a lazy import (a stale entry fails: the rule sees them)
    for key in LAZY_TRACEKIT_IMPORTS:
        paths = sorted((ROOT / key).rglob("*.py")) if key.endswith("/") else [ROOT / key]
        assert any(_lazy_tracekit_imports(p) for p in paths), key


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The tracekit modules `path` imports when it is imported: its module-level imports, those
    under `if` / `try` too, not those under `if TYPE_CHECKING:` (they never run). `from pkg import
    sub` names the submodule `sub`, and `pkg` only when a name imported is not a submodule."""
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = {f"{node.module}.{a.name}" for a in node.names}
                out.update(subs & modules)
                if subs - modules:
                    out.add(node.module)

    visit(ast.parse(path.read_text()).body)
    return (out & modules) - {_module_name(path)}


def test_the_modules_import_each_other_without_a_cycle() -> None:
    """No cycle among the imports the package's modules run when imported (the plans <-> attribution
    and engine <-> executor cycles were undone by moving code, not by importing late: issue 27).
    A cycle imports in one order and fails in another (a module imported first in a fresh
    interpreter); together with the test above, no cycle hides in a function either."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: _top_level_imports(p, set(paths)) for m, p in paths.items()}
    # a cycle is a module reached again from itself: depth-first, with the path kept
    done: set[str] = set()
    cycles = []

    def walk(m: str, path: list[str]) -> None:
        if m in path:
            cycles.append(path[path.index(m) :] + [m])
            return
        if m in done:
            return
        for n in sorted(graph[m]):
            walk(n, [*path, m])
        done.add(m)

    for m in sorted(graph):
        walk(m, [])
    assert cycles == []
    # the graph is the one the interpreter follows: the engine's package imports its executor,
    # which imports the Dask executor, and the attribution's plan imports the plan machinery
    assert "tracekit.engine.executor" in graph["tracekit.engine"]
    assert "tracekit.engine.dask_engine" in graph["tracekit.engine.executor"]
    assert "tracekit.analyse.plans" in graph["tracekit.analyse.attribution.plan"]
