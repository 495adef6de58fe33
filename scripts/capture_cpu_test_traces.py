"""Capture the small committed CPU runs the tests read instead of capturing afresh.

A fresh CPU capture costs about 11 CPU seconds whatever its length (two rank processes that import
torch, join a gloo group and start the profiler), and on a loaded host its timings move with the
load, so the tests that need a real CPU run but not a fresh one read these (tests/gloo_truth.py
lists who reads what). All: the tiny preset, gloo, fp32 on the CPU, 8 tokens, mode cpu.

- cpu-truth-tp1: TP=1, the baseline (7 rounds)
- cpu-truth-a, cpu-truth-b: TP=2, two repeats of one capture (7 rounds)
- cpu-truth-inj: TP=2, rank 1 sleeps 20 ms on the host before each all-reduce (3 rounds)
- cpu-tp2-ranges: TP=2 in mode ranges (user ranges only, no op shapes), 4 tokens, 1 round

Set `decompose` (tests/test_decompose.py's ground truth of the speedup split), TP=2, 2 rounds:
- cpu-decompose-baseline: rank 1 sleeps 30 ms on the host before each all-reduce
- cpu-decompose-intermediate: the same with 10 ms
- cpu-decompose-full: no sleep

Each set is taken back to back and kept only if the runs the tests compare with each other (set
`truth`: the TP=2 ground-truth runs a, b, inj; set `decompose`: all three) ran at one host speed:
a fixed pure-Python loop is timed before and after each capture (tests/gloo_truth.py
host_speed_s), and the script stops without replacing anything of that set if the slowest probe
mean of those is more than 1.25x the fastest (the TP=1 baseline and the ranges run are probed and
recorded, not held to it: no test compares their timings with another run's). The probes go to
the set's probes file under traces/ (both probes of each capture and their mean). Run it from the
repository root, on a host as quiet as you have:

    python scripts/capture_cpu_test_traces.py            # every set, into traces/
    python scripts/capture_cpu_test_traces.py decompose  # one set
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
#: tests/test_decompose.py: rank 1's sleep before each all-reduce in the baseline and intermediate
DECOMPOSE_DELAYS_MS = {"baseline": 30.0, "intermediate": 10.0, "full": None}


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


def decompose_configs() -> dict[str, CaptureConfig]:
    """The fixture tests/test_decompose.py took live before: TP=2, tiny, gloo, 8 tokens, 2 rounds."""
    return {
        f"cpu-decompose-{role}": CaptureConfig(
            tp=2,
            preset="tiny",
            tokens=TOKENS,
            backend="gloo",
            device="cpu",
            inject_delay=None if delay is None else (1, delay),
            rounds=2,
        )
        for role, delay in DECOMPOSE_DELAYS_MS.items()
    }


#: set name -> (its captures, the runs held to one host speed, its probes file under traces/)
SETS = {
    "truth": (configs, COMPARED, "cpu-truth-probes.json"),
    "decompose": (
        decompose_configs,
        tuple(f"cpu-decompose-{r}" for r in DECOMPOSE_DELAYS_MS),
        "cpu-decompose-probes.json",
    ),
}


def capture_set(name: str) -> int:
    make, compared_names, probes_file = SETS[name]
    work = Path(tempfile.mkdtemp(prefix="tracekit-test-traces-"))
    speed: dict[str, float] = {}
    probes: dict[str, list[float]] = {}
    for run, cfg in make().items():
        before = host_speed_s()
        capture(
            dataclasses.replace(cfg, command=f"python scripts/capture_cpu_test_traces.py ({run})"),
            work / run,
        )
        probes[run] = [round(before, 4), round(host_speed_s(), 4)]
        speed[run] = round(sum(probes[run]) / 2, 4)
        print(f"{run}: host probe {probes[run][0] * 1e3:.1f} / {probes[run][1] * 1e3:.1f} ms", flush=True)
    compared = [speed[n] for n in compared_names]
    ratio = max(compared) / min(compared)
    if ratio > MAX_SPEED_RATIO:
        print(
            f"set {name}: host speed moved {ratio:.2f}x across {compared_names}: nothing replaced ({work})",
            file=sys.stderr,
        )
        return 1
    for run in speed:
        dest = REPO / "traces" / run
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(work / run, dest)
    (REPO / "traces" / probes_file).write_text(
        json.dumps(
            {
                "host_probe_s": speed,
                "before_after_s": probes,
                "compared": list(compared_names),
                "max_ratio": round(ratio, 3),
            },
            indent=1,
        )
        + "\n"
    )
    shutil.rmtree(work)
    print(f"set {name}: host speed ratio across {compared_names} {ratio:.2f}x; written under traces/")
    return 0


def main(argv: list[str]) -> int:
    names = argv or list(SETS)
    unknown = [n for n in names if n not in SETS]
    if unknown:
        print(f"unknown set {unknown[0]!r}: the sets are {', '.join(SETS)}", file=sys.stderr)
        return 2
    return max(capture_set(n) for n in names)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
