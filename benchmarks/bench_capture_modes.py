"""Per-token time unprofiled vs under each capture mode (the profiler's dilation), one process, TP=1.

    .venv/bin/python benchmarks/bench_capture_modes.py --device cuda --preset 7b --layers 8 --tokens 64 \\
        --out runs/bench-modes.json
    .venv/bin/python benchmarks/bench_capture_modes.py --device cpu --preset tiny --tokens 32   # CPU modes

One model, one process: a warm-up pass over every position, then for each mode an unprofiled
pass immediately followed by a profiled pass (tracekit.capture.rank.run_pass: 1 lead + TOKENS
kept + 1 tail steps, the same positions every time, the profiler's stop/export outside every kept
step), and a last unprofiled pass. Per mode it prints the median per-token ms of its own
unprofiled pass and of its profiled pass and their ratio (the dilation), and the ratio to the
median of all unprofiled passes (drift and any after-effect of an earlier profiler show as the
unprofiled column moving). `nsys` (when found on PATH or $NSYS) is a `tracekit capture --nsys`
of the same workload in its own process: its row's dilation is its profiled median over this
process' unprofiled median (its own unprofiled pass ran under nsys too, and is shown beside it).

Modes: unprofiled, kernels, cuda, ranges, full, nsys on CUDA; cpu, ranges, full on CPU
(--modes to choose). The JSON (--out) holds the rows, every per-token time, and the setup.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracekit.capture.config import LEAD_STEPS, TAIL_STEPS
from tracekit.capture.rank import run_pass
from tracekit.capture.runner import CaptureConfig, capture, find_nsys
from tracekit.errors import CaptureError


def _ms(ns: list[int]) -> float:
    return statistics.median(ns) / 1e6


def _trace_steps(path: Path | None) -> int | None:
    """decode_step annotations in a written trace (None without a trace)."""
    if path is None or not path.exists():
        return None
    import gzip

    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return sum(
        1
        for e in doc.get("traceEvents", [])
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("decode_step#")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--modes", default=None, help="comma-separated (default: every mode of the device)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--trace-dir", type=Path, default=None, help="keep the traces here (default: a temp dir)")
    args = ap.parse_args()

    import torch

    from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset
    from tracekit.capture.profile import Tracer

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(1)  # as tracekit capture does on CPU
    default = "unprofiled,kernels,cuda,ranges,full,nsys" if cuda else "unprofiled,cpu,ranges,full"
    modes = [m for m in (args.modes or default).split(",") if m]
    trace_dir = args.trace_dir or Path(tempfile.mkdtemp(prefix="bench-modes-"))
    t_start = time.perf_counter()

    shape = preset(args.preset, args.layers)
    steps = LEAD_STEPS + args.tokens + TAIL_STEPS
    model = TPDecoder(
        shape,
        Comm(),
        seed=0,
        device=device,
        dtype=torch.bfloat16 if cuda else torch.float32,
        max_len=args.prompt + steps + 1,
    )
    prompt = make_prompt(shape.vocab, args.batch, args.prompt, 0)
    for _ in range(2):  # every position once (new KV lengths are slow the first time), then again
        model.generate(prompt, steps, annotate_step=lambda i: False)

    def kept(times: list[int]) -> list[int]:
        return times[LEAD_STEPS : LEAD_STEPS + args.tokens]

    unprofiled_all: list[list[int]] = []
    rows: list[dict[str, Any]] = []
    for mode in modes:
        if mode == "nsys":
            continue
        u = kept(run_pass(model, prompt, args.tokens)[1])
        unprofiled_all.append(u)
        if mode == "unprofiled":
            rows.append({"mode": mode, "unprofiled_ns": u, "profiled_ns": None})
            continue
        tracer = Tracer(mode, device.type, trace_dir / mode, 0, warmup=LEAD_STEPS, active=args.tokens)
        t0 = time.perf_counter()
        p = kept(run_pass(model, prompt, args.tokens, tracer=tracer)[1])
        path = tracer.stop()
        rows.append(
            {
                "mode": mode,
                "unprofiled_ns": u,
                "profiled_ns": p,
                "pass_and_export_s": round(time.perf_counter() - t0, 2),
                "trace_bytes": path.stat().st_size if path else None,
                "trace_steps": _trace_steps(path),
            }
        )
        print(f"  {mode}: done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
    unprofiled_all.append(kept(run_pass(model, prompt, args.tokens)[1]))
    base_ms = _ms([t for u in unprofiled_all for t in u])

    if "nsys" in modes:
        try:
            find_nsys()
        except CaptureError as exc:
            rows.append({"mode": "nsys", "skipped": str(exc)})
        else:
            del model
            if cuda:
                torch.cuda.empty_cache()
            run = capture(
                CaptureConfig(
                    tp=1,
                    tokens=args.tokens,
                    prompt=args.prompt,
                    batch=args.batch,
                    preset=args.preset,
                    layers=args.layers,
                    device="cuda" if cuda else "cpu",
                    nsys=True,
                ),
                trace_dir / "nsys",
            )
            m = json.loads((run / "manifest.json").read_text())
            rows.append(
                {
                    "mode": "nsys",
                    "unprofiled_ns": m["unprofiled"]["per_token_ns"]["0"],  # also under nsys
                    "profiled_ns": m["profiled"]["per_token_ns"]["0"],
                    "unprofiled_under_nsys": True,
                }
            )

    print(
        f"preset {args.preset} layers {shape.layers} tp 1 batch {args.batch} tokens {args.tokens} "
        f"device {torch.cuda.get_device_name(0) if cuda else 'cpu'} torch {torch.__version__}; "
        f"unprofiled median over all passes {base_ms:.3f} ms"
    )
    header = (
        f"{'mode':10s} {'unprofiled ms':>14s} {'profiled ms':>12s} {'dilation':>9s} {'vs all unprof.':>15s}"
    )
    print(header)
    for r in rows:
        if "skipped" in r:
            print(f"{r['mode']:10s} skipped: {r['skipped']}")
            continue
        u = _ms(r["unprofiled_ns"])
        r["unprofiled_median_ms"] = round(u, 4)
        if r["profiled_ns"] is None:
            print(f"{r['mode']:10s} {u:14.3f} {'-':>12s} {'-':>9s} {u / base_ms:15.3f}")
            continue
        p = _ms(r["profiled_ns"])
        r["profiled_median_ms"] = round(p, 4)
        r["dilation"] = round(p / u, 4)
        r["dilation_vs_all_unprofiled"] = round(p / base_ms, 4)
        mark = " (its unprofiled pass also under nsys)" if r.get("unprofiled_under_nsys") else ""
        print(f"{r['mode']:10s} {u:14.3f} {p:12.3f} {p / u:9.3f} {p / base_ms:15.3f}{mark}")
    total_s = time.perf_counter() - t_start
    print(f"total {total_s:.0f} s; traces in {trace_dir}")
    if args.out:
        doc = {
            "kind": "tracekit.bench_capture_modes",
            "schema_version": "1.0",
            "setup": {
                "preset": args.preset,
                "layers": shape.layers,
                "tokens": args.tokens,
                "prompt": args.prompt,
                "batch": args.batch,
                "tp": 1,
                "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "host": platform.node(),
                "lead_steps": LEAD_STEPS,
                "tail_steps": TAIL_STEPS,
                "nsys": os.environ.get("NSYS") or None,
            },
            "unprofiled_median_ms_all_passes": round(base_ms, 4),
            "unprofiled_passes_ns": unprofiled_all,
            "rows": rows,
            "total_s": round(total_s, 1),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
