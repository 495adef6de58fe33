"""Cost of one tracekit range (annotate.step / annotate.region), in microseconds per range.

    .venv/bin/python benchmarks/bench_annotate.py [--n 200000]

Rows: tracekit ranges with no profiler attached (issue 9 asks < 2 us), the same under an active
torch.profiler (CPU activity), and the named peer: a raw `torch.profiler.record_function` with
no profiler attached (what an annotation costs when it always enters record_function). Each row
is the best of 7 repeats of n ranges; the last column is the ratio to the peer.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def per_range_us(body: Callable[[int], None], n: int, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        body(n)
        best = min(best, (time.perf_counter_ns() - t0) / n / 1000)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000)
    args = ap.parse_args()
    import torch

    from tracekit import annotate

    def steps(n: int) -> None:
        for i in range(n):
            with annotate.step(i):
                pass

    region = annotate.region("mlp")

    def regions(n: int) -> None:
        for _ in range(n):
            with region:
                pass

    def raw_rf(n: int) -> None:
        rf = torch.profiler.record_function
        for _ in range(n):
            with rf("decode_step#1"):
                pass

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    steps(1000)  # resolve NVTX/torch once
    loop = per_range_us(empty, args.n)
    peer = per_range_us(raw_rf, args.n // 10) - loop
    rows = [
        ("annotate.step(i), no profiler", per_range_us(steps, args.n) - loop),
        ("annotate.region(name), no profiler", per_range_us(regions, args.n) - loop),
    ]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        rows.append(
            ("annotate.step(i), torch.profiler (CPU) active", per_range_us(steps, args.n // 10, 3) - loop)
        )
    rows.append(("peer: raw record_function, no profiler", peer))
    print(
        f"torch {torch.__version__}, NVTX via {annotate.nvtx_source()}, n={args.n}, loop overhead {loop:.3f} us subtracted"
    )
    print(f"{'what':48s} {'us/range':>9s} {'x peer':>7s}")
    for name, us in rows:
        print(f"{name:48s} {us:9.3f} {us / peer:7.2f}")


if __name__ == "__main__":
    main()
