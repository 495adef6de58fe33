#!/usr/bin/env python3
"""Speed claims that used to be timed assertions inside the tests (issue 24: no timed assertions in
the suite). Each case prints tracekit's time and a ratio against a named peer:

- classify 1M kernel events (tests/test_classify.py checks the answer): peer = the per-name
  function `classify_name` called once per event, the obvious loop the vectorised path replaces;
- refusing a gzip bomb of SIZE of whitespace (tests/test_reliability.py checks the one error line
  and the memory): peer = gzip inflating the same file to the end, what a reader without the
  limit would do before it could say anything (`gzip -dc FILE | wc -c`);
- `--capture`: a TP=2 CPU capture whose rank 1 never leaves its teardown (tests/
  test_capture_teardown.py checks the run is complete): peer = the 120 s collective timeout that
  would end it without the parent's grace period (needs torch; ~30 s on 2 cores).

    python benchmarks/bench_refusals.py [--bomb-gib 1] [--capture]
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def bench_classify(n: int = 1_000_000) -> None:
    from tracekit.classify import classify, classify_name
    from tracekit.model import make_events

    rng = np.random.default_rng(0)
    pool = ["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    pool += [f"void my_kernel_{i}<float>(float*)" for i in range(3000)]
    codes = rng.integers(0, len(pool), n)
    names = pd.Categorical.from_codes(codes, categories=pool)
    kinds = pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), categories=["kernel"])
    start = np.arange(n, dtype=np.int64) * 10
    ev = make_events({"kind": kinds, "name": names, "start_ns": start, "end_ns": start + 5})
    t0 = time.perf_counter()
    classify(ev)
    ours = time.perf_counter() - t0
    sample = 20_000  # the peer on a sample, scaled to n
    t0 = time.perf_counter()
    for c in codes[:sample]:
        classify_name("kernel", pool[c])
    peer = (time.perf_counter() - t0) * n / sample
    print(
        f"classify {n:,} events: {ours:.3f} s; per-event classify_name loop {peer:.2f} s; x{peer / ours:.1f}"
    )


def bench_bomb(gib: int) -> None:
    piece = 64 << 20
    member = gzip.compress(b" " * piece, compresslevel=9)
    with tempfile.TemporaryDirectory() as tmp:
        bomb = Path(tmp) / "rank-0.pt.trace.json.gz"
        with open(bomb, "wb") as f:
            f.write(gzip.compress(b'{"traceEvents": ['))
            for _ in range((gib << 30) // piece):
                f.write(member)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "tracekit", "breakdown", str(bomb), "--no-cache", "--max-bytes", "64M"],
            capture_output=True,
            text=True,
        )
        ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run(
            ["sh", "-c", 'gzip -dc "$1" | wc -c', "sh", str(bomb)], capture_output=True, check=True
        )
        peer = time.perf_counter() - t0
    print(
        f"gzip bomb of {gib} GiB refused at 64 MiB: {ours:.2f} s (exit {proc.returncode}, interpreter start "
        f"included); gzip -dc | wc -c to the end {peer:.2f} s; x{peer / ours:.1f}"
    )


def bench_teardown() -> None:
    from tracekit.capture import runner

    runner.TEARDOWN_GRACE_S = 2.0
    cfg = runner.CaptureConfig(
        tp=2, tokens=3, warmup=1, device="cpu", hang_rank=1, hang_at="teardown", timeout_s=120, rounds=1
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        runner.capture(cfg, Path(tmp))
        ours = time.perf_counter() - t0
    print(
        f"capture with rank 1 stuck in teardown: {ours:.1f} s; the 120 s collective timeout x{120 / ours:.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bomb-gib", type=int, default=1)
    ap.add_argument("--capture", action="store_true", help="also the teardown capture (needs torch)")
    args = ap.parse_args()
    bench_classify()
    bench_bomb(args.bomb_gib)
    if args.capture:
        bench_teardown()


if __name__ == "__main__":
    main()
