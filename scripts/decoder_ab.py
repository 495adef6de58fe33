"""A/B of the reference decoder's implementations in one process, alternating rounds (issue 26).

Both decoders (`--impls`, default legacy and fused) are built from the same seed; each is warmed up
(on CUDA with --graphs its graph is captured there); then for every round each arm decodes --tokens
tokens, the arms' order flipping every round (L F, F L, ...). The per-token times are the decoder's
own (host wall from before a step to after its token exists, a device sync on CUDA: what `tracekit
capture` records as unprofiled), the first step of each round dropped. The summary is
`tracekit.analyse.ab.ab_document` (paired bootstrap by round). No profiler runs.

  python3 scripts/decoder_ab.py --device cuda --preset 7b --layers 8 --graphs -o ab-graphs.json
  python3 scripts/decoder_ab.py --device cpu --preset tiny --tokens 6 --rounds 2 -o ab.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="7b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--graphs", action="store_true", help="decode steps as CUDA-graph replays")
    ap.add_argument("--impls", default="legacy,fused", help="arms, the first is the baseline")
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)

    import torch

    from tracekit.analyse.ab import ab_document
    from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset

    shape = preset(a.preset, a.layers)
    impls = a.impls.split(",")
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    max_len = a.prompt + a.tokens + 2
    models = {
        impl: TPDecoder(
            shape, Comm(), seed=0, device=device, max_len=max_len, cuda_graphs=a.graphs, impl=impl
        )
        for impl in impls
    }
    prompt = make_prompt(shape.vocab, a.batch, a.prompt, 0)
    tokens = {}
    for impl, m in models.items():  # warm-up: allocations, kernel choice, the graph's capture
        tokens[impl] = m.generate(prompt, a.tokens)[0]
    same = all(torch.equal(tokens[impls[0]], t) for t in tokens.values())
    rounds: dict[str, list[list[int]]] = {impl: [] for impl in impls}
    for r in range(a.rounds):
        for impl in impls if r % 2 == 0 else impls[::-1]:
            _, times = models[impl].generate(prompt, a.tokens)
            rounds[impl].append(times[1:])
    doc = ab_document(rounds, baseline=impls[0]).to_json()
    doc["workload"] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "preset": a.preset,
        "layers": shape.layers,
        "batch": a.batch,
        "prompt": a.prompt,
        "tokens": a.tokens,
        "dtype": str(next(iter(models.values())).dtype).removeprefix("torch."),
        "cuda_graphs": a.graphs,
        "kv_cache_len": {impl: m.cache_len for impl, m in models.items()},
        "order": "alternating: even rounds "
        + " ".join(impls)
        + ", odd rounds reversed; first step of each round dropped",
    }
    doc["same_tokens"] = same
    doc["per_token_ns"] = rounds
    a.output.write_text(json.dumps(doc, indent=1) + "\n")
    for impl in impls:
        arm = doc["arms"][impl]
        extra = ""
        if "ratio_to_baseline" in arm:
            lo, hi = arm["ratio_interval"]
            extra = f"  x{arm['ratio_to_baseline']:.3f} [{lo:.3f}, {hi:.3f}] of {impls[0]}"
        lo, hi = arm["interval_ns"]
        print(
            f"{impl:8s} {'graphs' if a.graphs else 'eager'}: {arm['mean_ns'] / 1e6:.4f} ms/token "
            f"[{lo / 1e6:.4f}, {hi / 1e6:.4f}]{extra}"
        )
    print(f"same greedy tokens: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
