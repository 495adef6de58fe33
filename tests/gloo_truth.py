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
    """`root`: the folder holding the captures (under xdist, the one folder every worker shares);
    `scratch`: where `capture_more` writes (this worker's own folder; `root` when None)."""

    root: Path
    paths: dict[str, Path] = field(default_factory=dict)
    speed: dict[str, list[float]] = field(default_factory=dict)
    scratch: Path | None = None

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]

    def capture_more(self, name: str, like: str = "a") -> Path:
        """One more capture with the configuration of `like` (a repeat), probed like the others."""
        _capture(self, name, _configs()[like], self.scratch or self.root)
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


def _capture(runs: TruthRuns, name: str, cfg: object, where: Path) -> None:
    from tracekit.capture.runner import capture

    runs.speed[name] = [host_speed_s()]
    capture(cfg, where / name)  # type: ignore[arg-type]
    runs.speed[name].append(host_speed_s())
    runs.paths[name] = where / name


def capture_truth_runs(root: Path) -> TruthRuns:
    runs = TruthRuns(root)
    for name, cfg in _configs().items():
        _capture(runs, name, cfg, root)
    return runs


def is_complete_capture(path: Path) -> bool:
    """A capture folder that exists and whose manifest says every rank finished."""
    import json

    try:
        return bool(json.loads((path / "manifest.json").read_text()).get("complete"))
    except (OSError, ValueError, AttributeError):
        return False


def shared_truth_runs(shared: Path, local: Path) -> TruthRuns:
    """The truth runs captured once for every pytest-xdist worker of a session, in `shared` (a
    folder every worker sees, not under any one worker's temp): the first worker to take the lock
    on `shared` captures them there and then writes `runs.json` (atomically, last); the others wait
    for the lock and read it. An index whose capture folders are missing or incomplete (a worker
    that died mid-capture, a folder cleaned away) is thrown away and the captures taken again.
    `capture_more` writes under this worker's own `local` folder (two workers may each ask for the
    same extra name)."""
    import fcntl
    import json
    import os
    import shutil

    shared.mkdir(parents=True, exist_ok=True)
    index = shared / "runs.json"
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = None
        if index.exists():
            doc = json.loads(index.read_text())
            if set(doc["paths"]) != set(_configs()) or not all(
                is_complete_capture(Path(v)) for v in doc["paths"].values()
            ):
                doc = None
        if doc is None:
            index.unlink(missing_ok=True)
            for name in _configs():  # leftovers of an interrupted capture
                shutil.rmtree(shared / name, ignore_errors=True)
            runs = capture_truth_runs(shared)
            doc = {"paths": {k: str(v) for k, v in runs.paths.items()}, "speed": runs.speed}
            tmp = shared / "runs.json.tmp"
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, index)
    return TruthRuns(shared, {k: Path(v) for k, v in doc["paths"].items()}, doc["speed"], scratch=local)
