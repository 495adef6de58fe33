"""Several batch sizes of the reference decoder in ONE process, with alternating rounds, one run folder
per batch (issue 26: `tracekit advise` checked by prediction).

    python benchmarks/advise_batches.py --device cuda --preset 7b --layers 8 --cuda-graphs \
        --batches 1,16,64 --tokens 32 --rounds 7 -o runs/advise
    python benchmarks/advise_batches.py check runs/advise --fit 1 -o reports/advise/check.json

`run`: one TP=1 decoder per batch size (the same seed: the same weights), each warmed up over every
position a pass reaches (with --cuda-graphs its graph is captured there), then `--rounds` rounds; in
round k each batch runs one unprofiled pass (`tracekit.capture.rank.run_pass`: a lead step, the
`--tokens` kept steps, a tail step, a device sync per token), the batches in an order rotated by k,
so the host's and the GPU's drift over the run falls on every batch alike and no batch always runs
first. Each batch gets a folder `b<B>/manifest.json` as `tracekit capture` writes it (workload,
devices, `unprofiled.rounds`), without a trace (`files` empty, a note says so): what `tracekit
advise` reads.

`check`: `tracekit advise` given only the `--fit` batch's folder, asked for the other batches
(`--batch`), against their measured unprofiled means; writes the table (batch, predicted,
measured, ratio, what it was fitted on). The advice never sees the measured time of a batch it
predicts (the fit folder is its only --tp1 run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracekit.capture import config, rank, runner  # noqa: E402
from tracekit.capture import environment as env  # noqa: E402

NOTE = (
    "unprofiled rounds only, no trace: benchmarks/advise_batches.py ran several batch sizes in one "
    "process with alternating rounds"
)


def _batches(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or any(b < 1 for b in out) or len(set(out)) != len(out):
        raise SystemExit(f"advise_batches: error: --batches {text!r}: distinct sizes of at least 1")
    return out


def run(args: argparse.Namespace) -> Path:
    import torch

    from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset

    batches = _batches(args.batches)
    base = runner.CaptureConfig(
        tp=1,
        tokens=args.tokens,
        prompt=args.prompt,
        preset=args.preset,
        layers=args.layers,
        device=args.device,
        cuda_graphs=args.cuda_graphs,
        rounds=args.rounds,
        mode="auto",
        calibrate=False,
        passes="unprofiled",
    )
    res = runner.resolve(base)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if res.device == "cpu":
        torch.set_num_threads(config.CPU_THREADS_PER_RANK)
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(0)
    shape = preset(args.preset, args.layers)
    n_warm = config.warmup_steps(base)
    dtype = torch.bfloat16 if res.dtype == "bfloat16" else torch.float32
    models: dict[int, Any] = {}
    prompts: dict[int, Any] = {}
    for b in batches:
        models[b] = TPDecoder(
            shape,
            Comm(1, 0, "none"),
            seed=args.seed,
            device=device,
            dtype=dtype,
            max_len=args.prompt + n_warm + 1,
            cuda_graphs=args.cuda_graphs,
        )
        prompts[b] = make_prompt(shape.vocab, b, args.prompt, args.seed)
        models[b].generate(prompts[b], n_warm, annotate_step=rank.never_annotate)
    kept = slice(config.LEAD_STEPS, config.LEAD_STEPS + args.tokens)
    rounds: dict[int, list[list[int]]] = {b: [] for b in batches}
    tokens: dict[int, Any] = {}
    order: list[str] = []
    t0 = time.time()
    for k in range(args.rounds):
        turn = batches[k % len(batches) :] + batches[: k % len(batches)]
        for b in turn:
            ids, times = rank.run_pass(models[b], prompts[b], args.tokens)
            tokens.setdefault(b, ids)
            rounds[b].append(times[kept])
            order.append(str(b))
    wall = time.time() - t0
    devices = env.devices() if device.type == "cuda" else []
    versions = env.versions()
    for b in batches:
        cfg = replace(base, batch=b, command=_command(args, b))
        results = {
            0: {
                "rank": 0,
                "unprofiled_ns": rounds[b][0],
                "unprofiled_rounds_ns": rounds[b],
                "pass_order": "U" * len(rounds[b]),
                "devices": devices,
                "versions": versions,
                "nccl_env": env.nccl_env(),
                "pid": os.getpid(),
                "tokens_generated": tokens[b][:, : args.tokens].tolist(),
                "inject_sync_count": 0,
            }
        }
        manifest = runner.build_manifest(
            world=1,
            results=results,
            workload_doc=config.workload(cfg, res, 1),
            command=cfg.command,
            needs_traces=False,
        )
        manifest["workload"]["batch_rounds_order"] = " ".join(order)
        manifest["notes"] = [NOTE + f" (batches {','.join(map(str, batches))}, {wall:.1f} s of rounds)"]
        d = out / f"b{b}"
        d.mkdir(exist_ok=True)
        env.atomic_write_json(d / env.MANIFEST_NAME, manifest)
        per = [statistics.fmean(r) / 1e6 for r in rounds[b]]
        print(f"batch {b}: round means (ms/token) " + " ".join(f"{x:.3f}" for x in per), flush=True)
    return out


def _command(args: argparse.Namespace, b: int) -> str:
    words = [
        "python benchmarks/advise_batches.py",
        f"--device {args.device} --preset {args.preset}",
        *([f"--layers {args.layers}"] if args.layers else []),
        *(["--cuda-graphs"] if args.cuda_graphs else []),
        f"--batches {args.batches} --tokens {args.tokens} --rounds {args.rounds} -o {args.output}",
        f"(this folder: batch {b})",
    ]
    return " ".join(words)


def check(folder: Path, fit: int, out: Path | None) -> dict[str, Any]:
    """advise fitted on batch `fit` only, predicting every other batch folder under `folder`."""
    from tracekit.analyse.advise import advise, measured_from
    from tracekit.analyse.dilation import dilation_of
    from tracekit.read import load_manifest

    runs = {}
    for d in sorted(Path(folder).glob("b*")):
        m = load_manifest(d / env.MANIFEST_NAME)
        runs[int(m["workload"]["batch"])] = (d, m)
    if fit not in runs:
        raise SystemExit(f"advise_batches: error: {folder}: no b{fit} folder to fit on")
    fit_dir, fit_manifest = runs[fit]
    others = sorted(b for b in runs if b != fit)
    adv = advise([measured_from(fit_manifest, str(fit_dir))], [], batches=others)
    rows = []
    for b in others:
        pred = next(r for r in adv.rows if r["batch"] == b and r["tp"] == 1)
        u = dilation_of(runs[b][1]).unprofiled
        measured = float(u.mean_ns) if u is not None and u.n else None
        p = pred["per_token_latency_ns"]
        rows.append(
            {
                "batch": b,
                "predicted_per_token_ns": p,
                "measured_per_token_ns": int(round(measured)) if measured else None,
                "ratio": (p / measured) if (p and measured) else None,
                # the same extrapolation with memory and matrix work not overlapping
                "predicted_no_overlap_per_token_ns": pred.get("per_token_latency_no_overlap_ns"),
                "ratio_no_overlap": (pred["per_token_latency_no_overlap_ns"] / measured)
                if (pred.get("per_token_latency_no_overlap_ns") and measured)
                else None,
                "within_15_percent": (abs(p / measured - 1) <= 0.15) if (p and measured) else None,
                "predicted_tokens_per_s": pred["tokens_per_s"],
                "measured_tokens_per_s": (b * 1e9 / measured) if measured else None,
                "status": pred["status"],
                "measured_from": str(runs[b][0]),
            }
        )
    fu = dilation_of(fit_manifest).unprofiled
    doc = {
        "kind": "tracekit.advise-check",
        "fitted_on": {
            "run": str(fit_dir),
            "batch": fit,
            "per_token_ns": int(round(float(fu.mean_ns))) if fu is not None else None,
            "cuda_graphs": bool(fit_manifest["workload"].get("cuda_graphs")),
            "device": (fit_manifest.get("devices") or [{}])[0].get("name"),
            "what": "tracekit advise with only this TP=1 run (--tp1), --batch for the others: "
            "T(B) = T(fit) + max(0, g(B) - g(fit)), g the device's roofline time per token "
            "(max of bytes / bandwidth and flops / matrix peak; the no-overlap bound: their sum) "
            "(tracekit/analyse/advise.py); the measured times of the predicted batches are not given to it",
        },
        "same_process": True,
        "round_order": fit_manifest["workload"].get("batch_rounds_order"),
        "rows": rows,
    }
    text = json.dumps(doc, indent=2) + "\n"
    if out:
        Path(out).write_text(text)

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x / 1e6:.3f} ms"

    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        hi = "-" if r["ratio_no_overlap"] is None else f"{r['ratio_no_overlap']:.3f}"
        print(
            f"batch {r['batch']}: predicted {ms(r['predicted_per_token_ns'])}, measured "
            f"{ms(r['measured_per_token_ns'])}, ratio {ratio}; no-overlap bound "
            f"{ms(r['predicted_no_overlap_per_token_ns'])}, ratio {hi}"
        )
    return doc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        p = argparse.ArgumentParser(prog="advise_batches.py check")
        p.add_argument("folder", type=Path)
        p.add_argument("--fit", type=int, default=1)
        p.add_argument("-o", "--output", type=Path, default=None)
        a = p.parse_args(argv[1:])
        check(a.folder, a.fit, a.output)
        return 0
    if argv[:1] == ["run"]:
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="advise_batches.py")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cuda-graphs", action="store_true")
    p.add_argument("-o", "--output", required=True)
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
