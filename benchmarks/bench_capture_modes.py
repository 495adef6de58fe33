"""Per-token time unprofiled vs under each capture mode (the profiler's dilation), from real captures.

    .venv/bin/python benchmarks/bench_capture_modes.py --device cuda --preset 7b --layers 8 --tokens 64
    .venv/bin/python benchmarks/bench_capture_modes.py --device cpu --preset tiny --tokens 32   # CPU modes

Runs `tracekit capture` once per mode (public API: tracekit.capture.runner.capture) into
OUT/<mode>/ and prints, per mode, the median per-token ms of the unprofiled pass and of the
profiled pass (slowest rank per step) and their ratio, the manifest's `dilation`. Each run has its
own unprofiled pass, so run-to-run noise shows in the unprofiled column. Modes default to
full,cuda on CUDA and cpu,ranges on CPU (nvtx-only needs nsys, add --modes nvtx --nsys there).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tracekit.capture.runner import CaptureConfig, capture


def _median_ms(per_rank: dict[str, list[int]]) -> float:
    slowest = [max(v) for v in zip(*per_rank.values(), strict=False)]
    return statistics.median(slowest) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--modes", default=None, help="comma-separated modes")
    ap.add_argument("--nsys", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-modes"))
    args = ap.parse_args()
    import torch

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    modes = args.modes.split(",") if args.modes else (["full", "cuda"] if cuda else ["cpu", "ranges"])
    rows = []
    for mode in modes:
        cfg = CaptureConfig(
            tp=args.tp,
            tokens=args.tokens,
            preset=args.preset,
            layers=args.layers,
            device=args.device,
            mode=mode,
            nsys=args.nsys and mode == "nvtx",
        )
        run = capture(cfg, args.out / mode)
        m = json.loads((run / "manifest.json").read_text())
        rows.append(
            (
                mode,
                _median_ms(m["unprofiled"]["per_token_ns"]),
                _median_ms(m["profiled"]["per_token_ns"]),
                m["dilation"],
            )
        )
    print(
        f"preset {args.preset} layers {args.layers or 'default'} tp {args.tp} tokens {args.tokens} device {'cuda' if cuda else 'cpu'}"
    )
    print(f"{'mode':8s} {'unprofiled ms':>14s} {'profiled ms':>12s} {'dilation':>9s}")
    for mode, u, p, d in rows:
        print(f"{mode:8s} {u:14.3f} {p:12.3f} {d:9.3f}")


if __name__ == "__main__":
    main()
