"""Do the reference decoder's implementations compute the same function on this device? (issue 26)

Teacher-forced: the legacy decoder generates --tokens greedy tokens; then both implementations are fed
that same sequence, one cached decode step at a time, eager (`forward`) and on static shapes
(`_decode_static`, the function a CUDA graph captures, called without one), and per step the logits of
the eager path are compared (max abs difference, against the logits' own scale and the gap between the
two largest) and the greedy choices of both paths counted. In float32 both must choose the same token
at every step (differences at rounding level); in bfloat16 a choice may flip where the top two logits
are closer than the rounding differences. Prints one line per dtype and writes a JSON.

  python3 scripts/decoder_check.py --device cuda --preset 7b --layers 8 -o check.json
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
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)

    import torch

    from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset

    shape = preset(a.preset, a.layers)
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(2)
    prompt = make_prompt(shape.vocab, 1, a.prompt, 0).to(device)
    max_len = a.prompt + a.tokens + 2
    out: dict[str, object] = {"preset": a.preset, "layers": shape.layers, "tokens": a.tokens, "dtypes": {}}
    for name in a.dtypes.split(","):
        dtype = getattr(torch, name)
        models = {
            i: TPDecoder(shape, Comm(), seed=0, device=device, dtype=dtype, max_len=max_len, impl=i)
            for i in ("legacy", "fused")
        }
        seq, _ = models["legacy"].generate(prompt.cpu(), a.tokens)
        seq = seq.to(device)
        per: dict[str, list] = {"eager_logits": [], "static_next": []}
        with torch.inference_mode():
            for m in models.values():
                m._reset_cache(1)
                logits = [m.forward(prompt, 0).float()]
                for i in range(a.tokens - 1):
                    logits.append(m.forward(seq[:, i : i + 1], a.prompt + i).float())
                per["eager_logits"].append(torch.cat(logits, 0))
                m._reset_cache(1)
                m.forward(prompt, 0)
                nxt = []
                pos = torch.zeros(1, dtype=torch.long, device=device)
                for i in range(a.tokens - 1):
                    pos.fill_(a.prompt + i)
                    nxt.append(m._decode_static(seq[:, i : i + 1], pos))
                per["static_next"].append(torch.cat(nxt))
        (la, fa), (ls, fs) = per["eager_logits"], per["static_next"]
        diff = (la - fa).abs().amax(-1)
        top2 = la.topk(2, dim=-1).values
        gap = top2[:, 0] - top2[:, 1]
        row = {
            "eager_same_choice": int((la.argmax(-1) == fa.argmax(-1)).sum()),
            "static_same_choice": int((ls == fs).sum()),
            "static_matches_legacy_sequence": int((fs == seq[0, 1:]).sum()),
            "steps": int(la.shape[0]),
            "max_abs_logit_diff": float(diff.max()),
            "median_abs_logit_diff": float(diff.median()),
            "logit_scale": float(la.abs().max()),
            "min_top2_gap": float(gap.min()),
            "flips_where_gap_below_diff": int(((la.argmax(-1) != fa.argmax(-1)) & (gap <= 2 * diff)).sum()),
        }
        out["dtypes"][name] = row  # type: ignore[index]
        print(
            f"{name}: eager same choice {row['eager_same_choice']}/{row['steps']}, static "
            f"{row['static_same_choice']}/{row['steps'] - 1}; max |logit diff| {row['max_abs_logit_diff']:.3g} "
            f"(median {row['median_abs_logit_diff']:.3g}, |logits| up to {row['logit_scale']:.3g}, smallest top-2 gap "
            f"{row['min_top2_gap']:.3g}); flips where the gap < 2x the diff: {row['flips_where_gap_below_diff']}"
        )
        del models
        if device.type == "cuda":
            torch.cuda.empty_cache()
    a.output.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
