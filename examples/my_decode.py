"""A user's own decode loop, profiled by tracekit.

    tracekit capture --out runs/mine -- python examples/my_decode.py --tokens 32
    tracekit capture --out runs/mine -- torchrun --nproc-per-node 2 examples/my_decode.py
    tracekit capture --nsys --out runs/mine-nsys -- python examples/my_decode.py --device cuda

The pattern: mark each decode step with `annotate.step(i)` (and optionally regions), run the loop
once inside `tracekit.profile(profiled=False)` for the unprofiled per-token times and once inside
`tracekit.profile()` for the trace. Under `tracekit capture` the output folder and profiler mode
come from tracekit; run alone, this writes ./tracekit-trace/.

With `--nsys` tracekit runs the script twice: plain, where only the `profiled=False` block
records, then under Nsight Systems, where only the profiled block opens NVTX ranges (the warm-up
loop and the other block open none, so the report holds only the traced steps).

The model here is tracekit's reference decoder, but any loop works the same way.
"""

from __future__ import annotations

import argparse
import os

import torch

import tracekit
from tracekit import annotate
from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = ap.parse_args()

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if world > 1:
        import torch.distributed as dist

        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo")
    comm = Comm(world, rank, "nccl" if cuda else "gloo")
    shape = preset(args.preset)
    model = TPDecoder(shape, comm, device=device, max_len=args.prompt + args.tokens + 2)
    prompt = make_prompt(shape.vocab, 1, args.prompt, 0).to(device)

    @torch.inference_mode()
    def decode() -> list[int]:
        model._reset_cache(1)
        nxt = model.forward(prompt, 0).argmax(-1)
        out = []
        for i in range(args.tokens):
            with annotate.step(i):  # "decode_step#i": what tracekit finds steps by
                out.append(int(nxt[0]))
                nxt = model.forward(nxt[:, None], args.prompt + i).argmax(-1)
        return out

    decode()  # warm-up
    with tracekit.profile(profiled=False):  # per-token times without a profiler
        decode()
    with tracekit.profile():  # the trace; its first step warms the profiler and is not recorded
        tokens = decode()
    if rank == 0:
        print("tokens:", tokens)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
