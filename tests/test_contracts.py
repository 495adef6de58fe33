"""The import contracts of docs/ARCHITECTURE.md ([tool.importlinter] in pyproject.toml), checked
with import-linter: the stages are layered, nothing below capture imports capture, probe, the CLI,
the orchestration or torch, and model imports nothing of tracekit. `lint-imports` itself runs in
.ci/run beside ruff and mypy; here a planted violation must fail it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c for c in CONFIG["contracts"]}

pytest.importorskip("importlinter", reason="import-linter is in the test extra")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports on the `tracekit` package found first from `cwd`, with this checkout's contracts."""
    code = (
        "import sys; sys.path.insert(0, '.'); from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))"
    )
    env = {**os.environ, "COLUMNS": "1000"}  # the report's lines unwrapped
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


def _top_level() -> set[str]:
    pkg = ROOT / "tracekit"
    return {
        p.stem if p.is_file() else p.name
        for p in pkg.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }


def test_every_package_has_a_layer() -> None:
    """A new sub-package cannot escape the layers unnoticed: each one is placed (leaf modules such
    as errors.py and _version.py, imported from every layer, are not layers)."""
    placed = {
        name.strip().strip("()")
        for layer in CONTRACTS["layers"]["layers"]
        for name in layer.replace(":", "|").split("|")
    }
    packages = {p.name for p in (ROOT / "tracekit").iterdir() if (p / "__init__.py").is_file()}
    assert packages - placed == set()
    assert placed - packages <= {"api"}  # a module, not a package
    # model imports nothing of tracekit: every other top-level module is forbidden to it
    assert set(CONTRACTS["model-imports-nothing"]["forbidden_modules"]) >= {
        f"tracekit.{m}" for m in _top_level() - {"model", "_version", "__main__"}
    }


#: one forbidden import per contract rule: (module of tracekit/, the import added, the contract's name
#: starts with)
VIOLATIONS = [
    ("analyse/collectives/bandwidth.py", "import torch", "below capture"),
    ("report/markdown.py", "from tracekit.capture import runner", "below capture"),
    ("analyse/timeline/steps.py", "from tracekit.report import data", "analyse never imports report"),
    (
        "analyse/timeline/breakdown.py",
        "from tracekit.render import writers",
        "analyse never imports report",
    ),
    ("render/writers.py", "from tracekit.report import data", "layers"),
    ("render/shortfall.py", "from tracekit.cli import options", "below capture"),
    ("model/events.py", "from tracekit import errors", "model imports nothing of tracekit"),
    ("read/limits.py", "from tracekit.probe import sweep", "layers"),
    (
        "analyse/timeline/steps.py",
        "from tracekit.analyse.collectives import matching",
        "analyse rooms are layered",
    ),
    (
        "analyse/compute/kernels.py",
        "from tracekit.analyse.links import verdict",
        "analyse rooms are layered",
    ),
    ("analyse/links/curves.py", "from tracekit.analyse.compare import diff", "analyse rooms are layered"),
    (
        "analyse/collectives/select.py",
        "from tracekit.analyse.attribution import pair",
        "rooms below the attribution",
    ),
    (
        "analyse/compute/roofline.py",
        "from tracekit.analyse.retime import model",
        "rooms below the attribution",
    ),
    ("analyse/path/walk.py", "from tracekit.analyse.retime import model", "analyse rooms are layered"),
    ("analyse/retime/model.py", "from tracekit.analyse.whatif import knobs", "analyse rooms are layered"),
    (
        "analyse/retime/calibrate.py",
        "from tracekit.analyse import plans",
        "the graph and its replay never import what runs on them",
    ),
]


def _imported(line: str) -> str:
    """The module an import line imports: `import a.b` -> a.b, `from a import b` -> a.b."""
    words = line.split()
    return words[1] if words[0] == "import" else f"{words[1]}.{words[3]}"


def test_a_violation_fails(tmp_path: Path) -> None:
    """The check is live: each forbidden import added to a copy of the package breaks its contract,
    the direct import named under that contract in lint-imports' report. All are planted in one
    copy and checked by one lint-imports run (one per violation was 16 runs of a few seconds): each
    contract's section of the report must list each of its planted imports itself (module ->
    imported, a direct import), so one planted import cannot stand in for another."""
    shutil.copytree(ROOT / "tracekit", tmp_path / "tracekit", ignore=shutil.ignore_patterns("__pycache__"))
    for i, (module, line, _contract) in enumerate(VIOLATIONS):
        target = tmp_path / "tracekit" / module
        target.write_text(target.read_text() + f"\n\ndef _violation{i}() -> None:\n    {line}  # noqa\n")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout
    out = res.stdout
    names = [c["name"] for c in CONFIG["contracts"]]
    heads = {n: out.find(f"\n{n}\n-") for n in names}  # each broken contract's section of the report
    missing = []
    for module, line, contract in VIOLATIONS:
        (name,) = [n for n in names if n.startswith(contract)]
        start = heads[name]
        assert start >= 0, f"contract {name!r} is not broken:\n{out}"
        end = min([h for h in heads.values() if h > start] + [len(out)])
        direct = f"tracekit.{module.removesuffix('.py').replace('/', '.')} -> {_imported(line)} (l."
        if direct not in out[start:end]:
            missing.append((module, line, name))
    assert missing == [], out


def test_the_architecture_diagram_lists_the_contract_layers() -> None:
    """docs/ARCHITECTURE.md's layer diagram (the ```text block under "## Layers") names the same
    layers, in the same order and with the same siblings, as the layers contract."""
    doc = (ROOT / "docs/ARCHITECTURE.md").read_text()
    block = doc.split("## Layers", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    drawn = [re.split(r"\s{2,}", ln.strip())[0] for ln in block.splitlines() if ln.strip() not in ("", "|")]
    assert drawn == [layer.replace("(", "").replace(")", "") for layer in CONTRACTS["layers"]["layers"]]


def _rooms() -> set[str]:
    return {p.name for p in (ROOT / "tracekit/analyse").iterdir() if (p / "__init__.py").is_file()}


def test_every_analyse_room_has_a_layer() -> None:
    """A new room of analyse/ is placed in the rooms' layers (docs/ARCHITECTURE.md, "Rooms of
    analyse"), and the diagram there draws the same layers as the contract."""
    layers = CONTRACTS["analyse-rooms"]["layers"]
    placed = {name.strip() for layer in layers for name in layer.replace(":", "|").split("|")}
    assert placed == _rooms()
    doc = (ROOT / "docs/ARCHITECTURE.md").read_text()
    block = doc.split("## Rooms of analyse", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    drawn = [re.split(r"\s{2,}", ln.strip())[0] for ln in block.splitlines() if ln.strip() not in ("", "|")]
    assert drawn == layers
