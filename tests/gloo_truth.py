"""Fresh CPU ground-truth captures shared by the attribution, diff and what-if tests (one set per
test session: each capture spawns torch processes, and three files used to take the same ones).

The tiny preset with gloo on the CPU, 8 tokens (`tracekit.capture.runner.capture`):
- `tp1`: TP=1, the baseline;
- `a`, `b`: TP=2, two repeats of the same capture;
- `inj`: TP=2 with `inject_delay=(1, DELAY_MS)`: rank 1 sleeps DELAY_MS on the host before each
  all-reduce (2 per layer x 2 layers = 4 per token: 80 ms per token inserted). It takes 3 measured
  rounds (not the CLI's 7): it checks the attribution, not the dilation's stability, and each of
  its rounds sleeps 0.64 s twice.
`speed[name]` holds a host-speed probe taken before and after each capture (`host_speed_s`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DELAY_MS = 20.0
TOKENS = 8


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
    root: Path
    paths: dict[str, Path] = field(default_factory=dict)
    speed: dict[str, list[float]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]

    def capture_more(self, name: str, like: str = "a") -> Path:
        """One more capture with the configuration of `like` (a repeat), probed like the others."""
        _capture(self, name, _configs()[like])
        return self.paths[name]


def _configs() -> dict[str, object]:
    from tracekit.capture.runner import CaptureConfig

    return {
        "tp1": CaptureConfig(tp=1, preset="tiny", tokens=TOKENS, backend="gloo", device="cpu"),
        "a": CaptureConfig(tp=2, preset="tiny", tokens=TOKENS, backend="gloo", device="cpu"),
        "b": CaptureConfig(tp=2, preset="tiny", tokens=TOKENS, backend="gloo", device="cpu"),
        "inj": CaptureConfig(
            tp=2,
            preset="tiny",
            tokens=TOKENS,
            backend="gloo",
            device="cpu",
            rounds=3,
            inject_delay=(1, DELAY_MS),
        ),
    }


def _capture(runs: TruthRuns, name: str, cfg: object) -> None:
    from tracekit.capture.runner import capture

    runs.speed[name] = [host_speed_s()]
    capture(cfg, runs.root / name)  # type: ignore[arg-type]
    runs.speed[name].append(host_speed_s())
    runs.paths[name] = runs.root / name


def capture_truth_runs(root: Path) -> TruthRuns:
    runs = TruthRuns(root)
    for name, cfg in _configs().items():
        _capture(runs, name, cfg)
    return runs


def shared_truth_runs(shared: Path, local: Path) -> TruthRuns:
    """The truth runs captured once for every pytest-xdist worker of a session: the first worker to
    take the lock on `shared` captures them there and writes `runs.json`; the others wait for the
    lock and read it. `capture_more` writes under this worker's own `local` folder (two workers may
    each ask for the same extra name)."""
    import fcntl
    import json

    shared.mkdir(parents=True, exist_ok=True)
    index = shared / "runs.json"
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not index.exists():
            runs = capture_truth_runs(shared)
            doc = {"paths": {k: str(v) for k, v in runs.paths.items()}, "speed": runs.speed}
            index.write_text(json.dumps(doc))
        doc = json.loads(index.read_text())
    return TruthRuns(local, {k: Path(v) for k, v in doc["paths"].items()}, doc["speed"])
