"""The CPU ground-truth runs shared by the attribution, diff and noise tests:
real captures committed under traces/ (scripts/capture_cpu_test_traces.py took them back to back
and kept the set only if the host ran at one speed throughout), read instead of captured afresh in
every session (each fresh capture spawns torch processes: ~11 CPU-s, and its timings move with
whatever else the host runs).

The tiny preset with gloo on the CPU, 8 tokens, mode cpu:
- `tp1`: TP=1, the baseline (traces/cpu-truth-tp1);
- `a`, `b`: TP=2, two repeats of the same capture (cpu-truth-a, cpu-truth-b);
- `inj`: TP=2 with `inject_delay=(1, DELAY_MS)`: rank 1 sleeps DELAY_MS on the host before each
  all-reduce (2 per layer x 2 layers = 4 per token: 80 ms per token inserted); 3 measured rounds
  (cpu-truth-inj).
`speed[name]` holds the host-speed probe (`host_speed_s`, seconds) the script took with capture
`name` (the mean of one before and one after; traces/cpu-truth-probes.json).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DELAY_MS = 20.0
TOKENS = 8

TRACES = Path(__file__).resolve().parents[1] / "traces"
#: the runs' names and their committed folders
FOLDERS = {
    "tp1": "cpu-truth-tp1",
    "a": "cpu-truth-a",
    "b": "cpu-truth-b",
    "inj": "cpu-truth-inj",
}


def host_speed_s() -> float:
    """Median time of a fixed pure-Python loop: how fast this host runs one thread right now."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        x = 0
        for i in range(200_000):
            x += i * i
        times.append(time.perf_counter() - t)
    return float(np.median(times))


@dataclass
class TruthRuns:
    """`runs[name]`: the committed folder of run `name`; `paths`: all of them; `speed[name]`: its
    host probe as a one-element list (seconds)."""

    paths: dict[str, Path] = field(default_factory=dict)
    speed: dict[str, list[float]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]


def truth_runs(traces: Path = TRACES) -> TruthRuns:
    probes = json.loads((traces / "cpu-truth-probes.json").read_text())["host_probe_s"]
    return TruthRuns(
        paths={name: traces / folder for name, folder in FOLDERS.items()},
        speed={name: [float(probes[folder])] for name, folder in FOLDERS.items()},
    )
