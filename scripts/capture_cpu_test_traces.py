"""Capture the small committed CPU runs the tests read instead of capturing afresh.

A fresh CPU capture costs about 11 CPU seconds whatever its length (two rank processes that import
torch, join a gloo group and start the profiler), and on a loaded host its timings move with the
load, so the tests that need a real CPU run but not a fresh one read these (tests/gloo_truth.py
lists who reads what). All: the tiny preset, gloo, fp32 on the CPU, 8 tokens, mode cpu.

- cpu-truth-tp1: TP=1, the baseline (7 rounds)
- cpu-truth-a, cpu-truth-b: TP=2, two repeats of one capture (7 rounds)
- cpu-truth-inj: TP=2, rank 1 sleeps 20 ms on the host before each all-reduce (3 rounds)
- cpu-tp2-ranges: TP=2 in mode ranges (user ranges only, no op shapes), 4 tokens, 1 round

The set is taken back to back and kept only if the runs the tests compare with each other (the
TP=2 ground-truth runs: a, b, inj) ran at one host speed: a fixed pure-Python loop is timed
before and after each capture (tests/gloo_truth.py host_speed_s), and the script stops without
replacing anything if the slowest probe mean of those is more than 1.25x the fastest (the TP=1
baseline and the ranges run are probed and recorded, not held to it: no test compares their
timings with another run's). Run it from the repository root, on a host as quiet as you have:

    python scripts/capture_cpu_test_traces.py            # captures into traces/
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from gloo_truth import DELAY_MS, TOKENS, host_speed_s  # noqa: E402

from tracekit.capture.runner import CaptureConfig, capture  # noqa: E402

MAX_SPEED_RATIO = 1.25
#: the runs whose timings the tests compare with each other
COMPARED = ("cpu-truth-a", "cpu-truth-b", "cpu-truth-inj")


def configs() -> dict[str, CaptureConfig]:
    base = {"preset": "tiny", "tokens": TOKENS, "backend": "gloo", "device": "cpu"}
    return {
        "cpu-truth-tp1": CaptureConfig(tp=1, **base),  # type: ignore[arg-type]
        "cpu-truth-a": CaptureConfig(tp=2, **base),  # type: ignore[arg-type]
        "cpu-truth-b": CaptureConfig(tp=2, **base),  # type: ignore[arg-type]
        "cpu-truth-inj": CaptureConfig(tp=2, rounds=3, inject_delay=(1, DELAY_MS), **base),  # type: ignore[arg-type]
        "cpu-tp2-ranges": CaptureConfig(
            tp=2, preset="tiny", tokens=4, backend="gloo", device="cpu", mode="ranges", rounds=1
        ),
    }


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="tracekit-test-traces-"))
    speed: dict[str, float] = {}
    for name, cfg in configs().items():
        before = host_speed_s()
        capture(
            dataclasses.replace(cfg, command=f"python scripts/capture_cpu_test_traces.py ({name})"),
            work / name,
        )
        speed[name] = (before + host_speed_s()) / 2
        print(f"{name}: host probe {speed[name] * 1e3:.1f} ms", flush=True)
    compared = [speed[n] for n in COMPARED]
    ratio = max(compared) / min(compared)
    if ratio > MAX_SPEED_RATIO:
        print(f"host speed moved {ratio:.2f}x across {COMPARED}: nothing replaced ({work})", file=sys.stderr)
        return 1
    for name in speed:
        dest = REPO / "traces" / name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(work / name, dest)
    (REPO / "traces" / "cpu-truth-probes.json").write_text(
        json.dumps(
            {"host_probe_s": speed, "compared": list(COMPARED), "max_ratio": round(ratio, 3)}, indent=1
        )
        + "\n"
    )
    shutil.rmtree(work)
    print(f"host speed ratio across {COMPARED} {ratio:.2f}x; written under traces/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
