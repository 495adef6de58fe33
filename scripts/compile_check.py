"""`--compile` with torch.compile's default backend (inductor): the decoder's static decode step,
compiled, decodes the same greedy tokens as the eager forward. tests/test_compile_cpu.py checks
tracekit's side of it in the suite with the `aot_eager` backend (inductor's C++ code generation
costs ~75 CPU-s on a 2-core host); this runs the real inductor, on the CPU (fp32, the tiny preset,
as the suite's check did) and, where there is one, on a CUDA GPU (bf16, Triton). Prints one line per
device and exits 1 if any device's tokens differ.

    python scripts/compile_check.py            # cpu, and cuda when available
"""

from __future__ import annotations

import time

import torch

from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset


def check(device: str, tokens: int = 6) -> bool:
    shape = preset("tiny")
    prompt = make_prompt(shape.vocab, 1, 4, 0).to(device)
    torch._dynamo.reset()
    eager, _ = TPDecoder(shape, Comm(), max_len=16, device=device).generate(prompt, tokens)
    t = time.perf_counter()
    compiled, _ = TPDecoder(shape, Comm(), max_len=16, device=device, compile=True).generate(prompt, tokens)
    same = bool(torch.equal(eager.cpu(), compiled.cpu()))
    print(
        f"{device}: inductor {'same' if same else 'DIFFERENT'} tokens as eager "
        f"({tokens} tokens, {time.perf_counter() - t:.1f} s with the compile): {compiled.tolist()}",
        flush=True,
    )
    return same


def main() -> int:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return 0 if all([check(d) for d in devices]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
