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
Each capture is taken when a test first asks for it (`runs[name]` or `runs.speed[name]`): a file
that needs only `inj` does not wait for the other three. Each is taken with the host to itself
(`session_captures.exclusive_host`: no other worker's test runs beside it), so the repeats differ by
the host's own noise, not by another worker's job starting or ending between them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import session_captures

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


class _Speeds(dict[str, list[float]]):
    """`speed[name]`: the probes of capture `name`, taken (with the capture) on first use."""

    def __init__(self, runs: TruthRuns) -> None:
        super().__init__()
        self._runs = runs

    def __missing__(self, name: str) -> list[float]:
        self._runs[name]
        return dict.__getitem__(self, name)


@dataclass
class TruthRuns:
    """`root`: the folder holding the captures (under xdist, the one folder every worker shares:
    `shared`); `scratch`: where `capture_more` writes (this worker's own folder; `root` when None).
    A capture of `_configs()` is taken on first use, under xdist by the first worker to ask."""

    root: Path
    paths: dict[str, Path] = field(default_factory=dict)
    speed: dict[str, list[float]] = field(default_factory=dict)
    scratch: Path | None = None
    shared: bool = False

    def __post_init__(self) -> None:
        speeds = _Speeds(self)
        speeds.update(self.speed)
        self.speed = speeds

    def __getitem__(self, name: str) -> Path:
        if name not in self.paths and name in _configs():
            if self.shared:
                _take_shared(self, name)
            else:
                with session_captures.exclusive_host():
                    _capture(self, name, _configs()[name], self.root)
        return self.paths[name]

    def capture_more(self, name: str, like: str = "a") -> Path:
        """One more capture with the configuration of `like` (a repeat), probed like the others."""
        with session_captures.exclusive_host():
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
    """The truth runs in `root`, each captured when first asked for (one process, no xdist)."""
    return TruthRuns(root)


def is_complete_capture(path: Path) -> bool:
    """A capture folder that exists and whose manifest says every rank finished."""
    import json

    try:
        return bool(json.loads((path / "manifest.json").read_text()).get("complete"))
    except (OSError, ValueError, AttributeError):
        return False


def shared_truth_runs(shared: Path, local: Path) -> TruthRuns:
    """The truth runs captured once for every pytest-xdist worker of a session, in `shared` (a
    folder every worker sees, not under any one worker's temp), each when a worker first asks for
    it: that worker takes the capture's own lock, captures it there and then writes `NAME.json`
    (atomically, last); a worker asking for the same one meanwhile waits for that lock and reads
    it, one asking for another is not held up. A record whose capture folder is missing or
    incomplete (a worker that died mid-capture, a folder cleaned away) is thrown away and the
    capture taken again. `capture_more` writes under this worker's own `local` folder (two workers
    may each ask for the same extra name)."""
    shared.mkdir(parents=True, exist_ok=True)
    return TruthRuns(shared, scratch=local, shared=True)


def _read_shared(runs: TruthRuns, name: str) -> dict[str, Any] | None:
    """The record of capture `name` in the shared folder if its capture is complete (under its lock)."""
    import fcntl
    import json

    record = runs.root / f"{name}.json"
    with open(runs.root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = json.loads(record.read_text()) if record.exists() else None
    if doc is not None and not is_complete_capture(Path(doc["path"])):
        return None
    return doc


def _take_shared(runs: TruthRuns, name: str) -> None:
    import fcntl
    import json
    import os
    import shutil

    shared = runs.root
    record = shared / f"{name}.json"
    doc = _read_shared(runs, name)
    if doc is None:  # to be captured: the host first (other workers wait), then the capture's lock
        with session_captures.exclusive_host(), open(shared / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = json.loads(record.read_text()) if record.exists() else None
            if doc is not None and not is_complete_capture(Path(doc["path"])):
                doc = None
            if doc is None:
                record.unlink(missing_ok=True)
                shutil.rmtree(shared / name, ignore_errors=True)  # leftovers of an interrupted capture
                _capture(runs, name, _configs()[name], shared)
                doc = {"path": str(runs.paths[name]), "speed": dict.__getitem__(runs.speed, name)}
                tmp = shared / f"{name}.json.tmp"
                tmp.write_text(json.dumps(doc))
                os.replace(tmp, record)
    runs.paths[name] = Path(str(doc["path"]))
    dict.__setitem__(runs.speed, name, list(doc["speed"]))
