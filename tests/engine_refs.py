"""What the Dask engine's documents are compared with (tests/test_engine_dask*.py, issue 24: a fast
suite): the local engine's document, made once per test process, or its pin.

- `local_breakdown` / `local_shortfall`: the local engine's JSON text of a run or a pair, made once
  per process and shared by the tests that compare several Dask runs with it (functools.cache).
- `assert_local_json(text, pin, local)`: `text` (a document the Dask engine wrote) is the local
  engine's. A committed run's `breakdown` and a committed pair's `shortfall`, with the defaults,
  are pinned (tests/data/output_pins.json: the sha256 of what the local engine writes for them,
  run from the repository root on relative paths; `scripts/pin_outputs.py` regenerates them with
  the local engine and checks them): a document whose sha256 is its pin is the local engine's
  without making that again here. A document that is not its pin (a pin out of date during a model
  change, or the Dask engine wrong) is compared with the local engine's document, made here.
- `make_synthetic`: the synthetic many-rank run both Dask test files use (conftest's
  `synthetic_run`, one per test process).

The texts are `json.dumps(doc, indent=1) + "\\n"`, as the CLI writes them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
#: pin name -> sha256 (scripts/pin_outputs.py)
PINS: dict[str, str] = json.loads((ROOT / "tests" / "data" / "output_pins.json").read_text())["pins"]

#: ranks of the synthetic run: more than 10, so rank files ordered by name (rank-10 before rank-2)
#: and by rank differ, and several per worker; what the tests prove holds at any such count, and
#: their cost grows with it
N_SYN = 11


def text(doc: Any) -> str:
    """The document as the CLI writes it (json.dumps, indent=1)."""
    return json.dumps(doc, indent=1) + "\n"


def sha256(s: str | bytes) -> str:
    return hashlib.sha256(s.encode() if isinstance(s, str) else s).hexdigest()


def breakdown_pin(run: str) -> str:
    """The pin of `tracekit breakdown traces/RUN --format json`."""
    return f"runs/breakdown/traces_{run}.json"


def shortfall_pin(sharded: str) -> str:
    """The pin of `tracekit shortfall --baseline traces/BASE --sharded traces/SHARDED --format json`
    (BASE: SHARDED's TP=1 run in scripts/pin_outputs.py's SHARDED)."""
    return f"runs/shortfall/traces_{sharded}.json"


def assert_local_json(got: str | bytes, pin: str, local: Callable[[], str | bytes]) -> None:
    """`got` is the local engine's document: its sha256 is `pin`'s, else it equals `local()`."""
    if sha256(got) == PINS[pin]:
        return
    want = local()
    assert (got.encode() if isinstance(got, str) else got) == (
        want.encode() if isinstance(want, str) else want
    )


def pin_module() -> Any:
    """scripts/pin_outputs.py as a module (the commands it pins, its masked sha256)."""
    import importlib.util
    import sys

    if "pin_outputs" not in sys.modules:
        spec = importlib.util.spec_from_file_location("pin_outputs", ROOT / "scripts" / "pin_outputs.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["pin_outputs"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["pin_outputs"]


def pinned_command(name: str) -> list[str]:
    """The arguments of the pinned command that writes the JSON document `name` (relative to the
    repository root; its other outputs and options as scripts/pin_outputs.py runs it)."""
    (argv,) = [a for a, n in pin_module().all_commands() if n == name]
    return list(argv)


@functools.cache
def local_breakdown(run: str | Path, **kw: Any) -> str:
    """The local engine's breakdown JSON of `run` (breakdown_paths' keywords), once per process."""
    from tracekit.engine import breakdown_paths

    return text(breakdown_paths(run, **kw).to_json())


@functools.cache
def local_shortfall(base: str | Path, sharded: str | Path, **kw: Any) -> str:
    """The local engine's shortfall JSON of the pair (shortfall_paths' keywords), once per process."""
    from tracekit.engine import shortfall_paths

    return text(shortfall_paths(base, sharded, **kw).to_json())


def make_synthetic(out: Path) -> Path:
    """`N_SYN` ranks, each a rank of traces/cpu-tp2 (first 3 steps) with its clock jittered by up
    to 200 us and its events shuffled; one process group of all of them."""
    from tracekit.engine.synthetic import make_synthetic_run

    return make_synthetic_run(TRACES / "cpu-tp2", out / f"tp{N_SYN}", N_SYN, max_steps=3)
