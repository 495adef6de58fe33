"""The shortfall of a committed pair (traces/), made once per test process and shared by the tests
that read it (test_coordination_truth, test_kernel_scaling, test_noise, test_probe_compare,
test_shortfall): an H200 pair's attribution and profiler correction through the replay cost
seconds, and the same few pairs are asked for in several files. With `--dist loadfile` a worker
runs whole files, so files on one worker share; every file still makes what it reads.

The objects are shared: a test reads them (`to_json`, `diagnosis`, the attributed runs), never
changes them. The Run is `read_run`'s, unclassified (the shortfall classifies a copy)."""

from __future__ import annotations

import functools
from pathlib import Path

from tracekit.analyse.attribution.pair import shortfall
from tracekit.analyse.attribution.result import Shortfall
from tracekit.model.events import Run
from tracekit.read import read_run

TRACES = Path(__file__).resolve().parents[1] / "traces"


@functools.cache
def committed_run(name: str) -> Run:
    """traces/`name` read once (`read_run`); a missing committed trace is a failure."""
    path = TRACES / name
    assert path.is_dir(), f"committed trace {path} is missing"
    return read_run([path])


@functools.cache
def committed_shortfall(base: str, sharded: str) -> Shortfall:
    """`shortfall(read_run(traces/base), read_run(traces/sharded))` with the defaults, once."""
    return shortfall(committed_run(base), committed_run(sharded))
