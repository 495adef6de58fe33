"""A tiny CPU run of N gloo ranks under plain torch.profiler (no tracekit capture, no manifest):
what a user's own profiling script writes. Imports torch.

Each rank runs `steps` decode-like steps under `record_function("decode_step")`: a few matmuls and
one `dist.all_reduce` per step, and writes `rank-<r>.pt.trace.json` into OUT_DIR.

What such a capture contains (torch 2.13, seen with this script): on the calling thread a cpu_op
`c10d::allreduce_` (tens of us: it only enqueues the work) and, on a gloo worker thread, a
`user_annotation` `gloo:all_reduce` spanning the actual exchange; `dist.all_reduce`'s wait is not
an op of its own. distributedInfo carries backend "gloo", rank and world_size.

The committed traces/cpu-gloo-plain (read by tests/test_steps.py) are its output, gzipped:
    python scripts/gloo_plain_capture.py /tmp/plain --world-size 2 --steps 3
    mkdir -p traces/cpu-gloo-plain && for r in 0 1; do
      gzip -9n -c /tmp/plain/rank-$r.pt.trace.json > traces/cpu-gloo-plain/rank-$r.pt.trace.json.gz; done
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, out_dir: str, steps: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(rank)
    x = torch.randn(64, 128)
    w1 = torch.randn(128, 256)
    w2 = torch.randn(256, 128)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("decode_step"):
                h = torch.relu(x @ w1) @ w2
                dist.all_reduce(h)
                x = h / h.norm()
    prof.export_chrome_trace(str(Path(out_dir) / f"rank-{rank}.pt.trace.json"))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(a.world_size, a.out_dir, a.steps, _free_port()), nprocs=a.world_size)


if __name__ == "__main__":
    main()
