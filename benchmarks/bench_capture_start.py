#!/usr/bin/env python3
"""What starting the ranks costs a CPU capture: N TP=2 captures (tiny preset, 4 tokens, one round) in
one fresh process, the ranks forked from tracekit's fork server (tracekit/capture/starter.py: torch
imported once per process) against the peer, the ranks spawned as before (TRACEKIT_CAPTURE_START=
spawn: every rank a fresh interpreter that imports torch). CPU seconds of the whole process tree
(the process, its fork server and every rank, from wait4), and wall seconds.

Without `--calibrate` the profiler calibration is off (CaptureConfig(calibrate=False)), so the
figures are the start and the passes; with it, what a default capture costs (the calibration's
6,400 gloo all-reduces per rank dominate a warm TP=2 capture).

    python benchmarks/bench_capture_start.py [-n 3] [--calibrate]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

CHILD = """
import sys
from pathlib import Path
from tracekit.capture.runner import CaptureConfig, capture
if __name__ == "__main__":
    out, n, cal = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    for i in range(n):
        capture(CaptureConfig(tp=2, tokens=4, warmup=1, device="cpu", rounds=1, calibrate=cal), out / str(i))
"""


def run(mode: str, n: int, calibrate: bool) -> tuple[float, float]:
    """(CPU seconds of the process tree, wall seconds) of `n` captures in one fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        env = dict(os.environ, TRACEKIT_CAPTURE_START=mode)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, script, os.path.join(tmp, "out"), str(n), "1" if calibrate else "0"], env=env
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{mode}: the captures failed (exit {proc.returncode})")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=3, help="captures per process (default 3)")
    ap.add_argument(
        "--calibrate", action="store_true", help="with the profiler calibration (the default capture)"
    )
    args = ap.parse_args()
    got = {mode: run(mode, args.n, args.calibrate) for mode in ("fork-server", "spawn")}
    (ours, ours_wall), (peer, peer_wall) = got["fork-server"], got["spawn"]
    cal = "with" if args.calibrate else "without"
    print(
        f"{args.n} TP=2 CPU captures in one process ({cal} calibration): fork server {ours:.1f} CPU-s "
        f"({ours_wall:.1f} s wall); spawned ranks {peer:.1f} CPU-s ({peer_wall:.1f} s wall); x{peer / ours:.1f}"
    )


if __name__ == "__main__":
    main()
