"""The committed runs of traces/ read, classified and attributed once per test process, and the
shortfall of a committed pair made from those attributions, shared by the tests that read them
(test_clocks_steps, test_coordination_truth, test_kernel_scaling, test_noise, test_probe_compare,
test_shortfall, test_whatif): an H200 run's attribution and a pair's profiler correction through the
replay cost seconds, and the same few runs are asked for in several files, in several roles
(h200-tp2 is the sharded run of three pairs and the replay test's run). With `--dist loadfile` a
worker runs whole files, so files on one worker share; every file still makes what it reads.

The objects are shared: a test reads them (`to_json`, `diagnosis`, the attributed runs, the
classified events), never changes them. The Run is `read_run`'s, unclassified (`committed_analysed`
classifies a copy)."""

from __future__ import annotations

import functools
from pathlib import Path

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.pair import check_pair, shortfall, shortfall_of_pair
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.result import Shortfall
from tracekit.analyse.attribution.run import RunParts
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
def committed_analysed(name: str) -> AnalysedRun:
    """traces/`name` classified once (`AnalysedRun.of`: its step windows and partitions shared)."""
    return AnalysedRun.of(committed_run(name))


@functools.cache
def committed_parts(name: str, label: str) -> RunParts:
    """`attribute_run(traces/name, label=label)` with the defaults, once per (run, label): the label
    names the run in its data-quality notes and errors, and is the role `shortfall` gives it
    ("baseline", "sharded")."""
    return attribute_run(committed_analysed(name), label=label)


@functools.cache
def committed_shortfall(base: str, sharded: str) -> Shortfall:
    """`shortfall(read_run(traces/base), read_run(traces/sharded))` with the defaults, once: from the
    process's attributions of the two runs (`shortfall` is `attribute_run` of each, labels
    "baseline" and "sharded", then `shortfall_of_pair`). A pair whose workloads differ gets notes on
    its baseline's data quality: that pair is attributed afresh, so no shared baseline carries them."""
    b, s = committed_run(base), committed_run(sharded)
    notes = check_pair(b, s)
    if notes:
        return shortfall(b, s)
    return shortfall_of_pair(committed_parts(base, "baseline"), committed_parts(sharded, "sharded"), [])
