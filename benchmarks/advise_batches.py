"""Several batch sizes of the reference decoder in ONE process, with alternating rounds, one run folder
per batch (issue 26: `tracekit advise` checked by prediction).

    python benchmarks/advise_batches.py --device cuda --preset 7b --layers 8 --cuda-graphs \
        --batches 1,16,64 --tokens 32 --rounds 7 -o runs/advise
    python benchmarks/advise_batches.py check runs/advise --fit 1 -o check.json \
        --kernels runs/graphs-b1 --gemm-table gemm-table.json
    python benchmarks/advise_batches.py check runs/advise --fit 1 -o check-b1-b16.json \
        --kernels runs/graphs-b1 --kernels runs/graphs-b16 --compare runs/graphs-b64
    python benchmarks/advise_batches.py gemmsweep --device cuda --preset 7b --layers 8 -o gemm-table.json

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
predicts (the fit folder is its only --tp1 run): from one run the roofline band [overlap, no
overlap], and whether the measured mean lies in it. With `--kernels DIR` (repeat: traced runs at
batches other than the predicted ones, e.g. graph captures at 1 and 16), `tracekit advise` is given
those runs and predicts each batch folder it has no traced run of (per-kernel model, docs/METHOD.md
section Batch scaling of a decode); with `--gemm-table FILE`, the fit run and the table. Each
predicted row: predicted / measured, and the same over the measured rounds' means (the spread).
`--compare DIR` (traced runs at predicted batches) only adds their kernel kinds' measured times
beside the predicted ones; the prediction never reads them.

`gemmsweep`: the decoder's GEMMs (q/k/v fused, o, gate/up fused, down, LM head at the preset's
shape, per TP shard, `x @ W.t()` as the decoder multiplies) timed alone at M = 1, 2, 4, ...,
`--m-max`: on CUDA one CUDA graph of `--reps` products per M (over as many distinct weights as the
step has of that role, so a product reads its weight from memory as in the step: 8 layers' qkv are
400 MB, past the L2), replayed once un-timed, then timed by events over `--repeats` replays (the
median); on a CPU the host clock over `--reps` calls, the median of `--repeats`. Writes the
`tracekit.gemm-table` document `tracekit advise --gemm-table` reads (docs/JSON.md#gemm-table).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracekit.capture import config, rank, runner  # noqa: E402
from tracekit.capture import environment as env  # noqa: E402
from tracekit.capture.rank_result import RankResult  # noqa: E402
from tracekit.model.documents.base import given  # noqa: E402
from tracekit.model.documents.manifest import Manifest  # noqa: E402

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
            0: RankResult(
                rank=0,
                unprofiled_ns=rounds[b][0],
                unprofiled_rounds_ns=rounds[b],
                pass_order="U" * len(rounds[b]),
                devices=devices,
                versions=versions,
                nccl_env=env.nccl_env(),
                pid=os.getpid(),
                tokens_generated=tokens[b][:, : args.tokens].tolist(),
                inject_sync_count=0,
            )
        }
        manifest = runner.build_manifest(
            world=1,
            results=results,
            workload=config.workload(cfg, res, 1),
            command=cfg.command,
            needs_traces=False,
        )
        runner.workload_of(manifest).batch_rounds_order = " ".join(order)
        manifest.notes = [NOTE + f" (batches {','.join(map(str, batches))}, {wall:.1f} s of rounds)"]
        d = out / f"b{b}"
        d.mkdir(exist_ok=True)
        env.atomic_write_json(d / env.MANIFEST_NAME, manifest.to_json())
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


def _rounds_means(manifest: Manifest) -> list[float]:
    """The mean per-token time of each unprofiled round (rank 0)."""
    up = given(manifest.unprofiled)
    rounds = (given(up.rounds) if up is not None else None) or []
    return [statistics.fmean(r["0"]) for r in rounds if r.get("0")]


def _measured_row(b: int, p: float | None, runs: dict[int, tuple[Path, Manifest]]) -> dict[str, Any]:
    """predicted / measured at batch b: the mean over the rounds and over each round's mean."""
    from tracekit.analyse.dilation import dilation_of

    u = dilation_of(runs[b][1]).unprofiled
    measured = float(u.mean_ns) if u is not None and u.n else None
    per_round = _rounds_means(runs[b][1])
    return {
        "measured_per_token_ns": int(round(measured)) if measured else None,
        "measured_round_means_ns": [int(round(x)) for x in per_round],
        "ratio": (p / measured) if (p and measured) else None,
        "ratio_over_rounds": [p / max(per_round), p / min(per_round)] if (p and per_round) else None,
        "within_15_percent": (abs(p / measured - 1) <= 0.15) if (p and measured) else None,
        "measured_tokens_per_s": (b * 1e9 / measured) if measured else None,
        "measured_from": str(runs[b][0]),
    }


def check(
    folder: Path,
    fit: int,
    out: Path | None,
    kernels: list[Path] | None = None,
    compare: list[Path] | None = None,
    gemm_table: Path | None = None,
    copy: Path | None = None,
    rho: Path | None = None,
) -> dict[str, Any]:
    """advise fitted on batch `fit` only (the roofline band), and with `kernels` / `gemm_table` the
    per-kernel model, predicting every other batch folder under `folder` (module doc)."""
    from tracekit.analyse.advise import advise, run_peaks
    from tracekit.analyse.advise_inputs import measured_from
    from tracekit.analyse.dilation import dilation_of
    from tracekit.read import load_manifest

    runs = {}
    for d in sorted(Path(folder).glob("b*")):
        m = load_manifest(d / env.MANIFEST_NAME)
        wl = given(m.workload)
        batch = given(wl.batch) if wl is not None else None
        if batch is None:
            raise SystemExit(f"advise_batches: error: {d}: its manifest has no workload.batch")
        runs[batch] = (d, m)
    if fit not in runs:
        raise SystemExit(f"advise_batches: error: {folder}: no b{fit} folder to fit on")
    fit_dir, fit_manifest = runs[fit]
    others = sorted(b for b in runs if b != fit)
    fit_run = measured_from(fit_manifest, str(fit_dir))
    peaks = run_peaks(str(copy) if copy else None, str(rho) if rho else None, fit_run)
    adv = advise([fit_run], [], batches=others)
    rows = []
    for b in others:
        # the row as its JSON (fields a row leaves unset are absent, hence .get)
        pred = msgspec.to_builtins(next(r for r in adv.rows if r.batch == b and r.tp == 1))
        p = pred["per_token_latency_ns"]
        hi = pred.get("per_token_latency_no_overlap_ns")
        row = {"batch": b, "predicted_per_token_ns": p, **_measured_row(b, p, runs)}
        measured = row["measured_per_token_ns"]
        row.update(
            {
                # the same extrapolation with memory and matrix work not overlapping: the band's top
                "predicted_no_overlap_per_token_ns": hi,
                "ratio_no_overlap": (hi / measured) if (hi and measured) else None,
                "band_ns": pred.get("per_token_latency_range_ns"),
                "in_band": (p <= measured <= hi) if (p and hi and measured) else None,
                "predicted_tokens_per_s": pred["tokens_per_s"],
                "status": pred["status"],
                "model": pred.get("model"),
            }
        )
        rows.append(row)
    fu = dilation_of(fit_manifest).unprofiled
    fit_wl, fit_devices = given(fit_manifest.workload), given(fit_manifest.devices)
    doc: dict[str, Any] = {
        "kind": "tracekit.advise-check",
        "fitted_on": {
            "run": str(fit_dir),
            "batch": fit,
            "per_token_ns": int(round(float(fu.mean_ns))) if fu is not None else None,
            "cuda_graphs": bool(fit_wl is not None and given(fit_wl.cuda_graphs)),
            "device": given(fit_devices[0].name) if fit_devices else None,
            "what": "tracekit advise with only this TP=1 run (--tp1), --batch for the others: "
            "T(B) = T(fit) + max(0, g(B) - g(fit)), g the device's roofline time per token "
            "(max of bytes / bandwidth and flops / matrix peak; the no-overlap bound: their sum): the band "
            "[overlap, no overlap] (tracekit/analyse/advise.py); the measured times of the predicted batches "
            "are not given to it",
        },
        "same_process": True,
        "round_order": given(fit_wl.batch_rounds_order) if fit_wl is not None else None,
        "rows": rows,
    }
    if kernels or gemm_table:
        doc["per_kernel"] = _check_per_kernel(runs, fit_run, kernels or [], compare or [], gemm_table, peaks)
    text = json.dumps(doc, indent=2) + "\n"
    if out:
        Path(out).write_text(text)

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x / 1e6:.3f} ms"

    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(
            f"batch {r['batch']}: roofline band {ms(r['predicted_per_token_ns'])} .. "
            f"{ms(r['predicted_no_overlap_per_token_ns'])}, measured {ms(r['measured_per_token_ns'])} "
            f"(in the band: {r['in_band']}), ratio of the band's foot {ratio}"
        )
    for r in (doc.get("per_kernel") or {}).get("rows", []):
        lo, hi = r["ratio_over_rounds"] or (None, None)
        print(
            f"batch {r['batch']} ({r['model']}, from {r['fitted_on_batches']}): predicted "
            f"{ms(r['predicted_per_token_ns'])}, measured {ms(r['measured_per_token_ns'])}, ratio "
            f"{r['ratio']:.3f} (over the rounds {lo:.3f}-{hi:.3f})"
        )
    return doc


def _check_per_kernel(
    runs: dict[int, tuple[Path, Manifest]],
    fit_run: Any,
    kernels: list[Path],
    compare: list[Path],
    gemm_table: Path | None,
    peaks: Any,
) -> dict[str, Any]:
    """The per-kernel part of the check: advise given the traced `kernels` runs (else the fit run)
    and the table, predicting every batch folder it has no traced run of."""
    from dataclasses import replace

    from tracekit.analyse.advise import advise, load_table_file
    from tracekit.analyse.advise_inputs import measured_from
    from tracekit.analyse.batch_model import kernel_profile
    from tracekit.read import load_manifest, read_run

    traced = []
    for d in kernels:
        m = measured_from(load_manifest(Path(d) / env.MANIFEST_NAME), str(d))
        traced.append(replace(m, kernels=kernel_profile(read_run([d]), str(d))))
    if not traced:
        traced = [fit_run]
    have = {m.batch for m in traced}
    asked = sorted(b for b in runs if b not in have)
    table = load_table_file(gemm_table) if gemm_table else None
    adv = advise(traced, [], batches=asked, gemm_table=table, gemm_table_name=str(gemm_table), peaks=peaks)
    truth = {}
    for d in compare:
        prof = kernel_profile(read_run([d]), str(d))
        gemm = sum(t for (r, _), t in zip(prof.roles, prof.times_ns, strict=True) if r != "attention")
        attn = sum(t for (r, _), t in zip(prof.roles, prof.times_ns, strict=True) if r == "attention")
        truth[prof.batch] = (str(d), {"gemm": gemm, "attention": attn, "other": prof.other_ns})
    rows = []
    for b in asked:
        # the row as its JSON (fields a row leaves unset are absent, hence .get)
        pred = msgspec.to_builtins(next(r for r in adv.rows if r.batch == b and r.tp == 1))
        p = pred["per_token_latency_ns"]
        row = {
            "batch": b,
            "model": pred.get("model"),
            "fitted_on_batches": sorted(have),
            "predicted_per_token_ns": p,
            **_measured_row(b, p, runs),
            "status": pred["status"],
        }
        bm = pred.get("batch_model") or {}
        parts = []
        for part in bm.get("by_kind", []):
            entry = dict(part)
            if b in truth:
                entry["measured_ns"] = int(round(truth[b][1][part["kind"]]))
                entry["measured_from"] = truth[b][0]
            parts.append(entry)
        row["by_kind"] = parts
        row["detail"] = bm.get("detail")
        rows.append(row)
    return {
        "runs": [str(m.path) for m in traced],
        "gemm_table": str(gemm_table) if gemm_table else None,
        "floors": next(
            (msgspec.to_builtins(r.batch_model)["floors"] for r in adv.rows if r.batch_model), None
        ),
        "designed_after_the_miss": True,
        "what": "tracekit advise given only these runs (and the table), --batch for the other batch folders: "
        "the per-kernel batch model (docs/METHOD.md section Batch scaling of a decode); the measured times are "
        "the one-process batch folders' (never given to it); by_kind's measured_ns, from --compare traced runs, "
        "are beside the prediction only",
        "rows": rows,
    }


def gemmsweep(args: argparse.Namespace) -> dict[str, Any]:
    """The decoder's GEMMs timed alone per batch size (module doc): a tracekit.gemm-table."""
    import torch

    from tracekit.analyse.compute.roofline import gemm_shapes
    from tracekit.capture.decoder import preset

    shape = preset(args.preset, args.layers)
    sh = {k: getattr(shape, k) for k in ("hidden", "heads", "kv_heads", "intermediate", "layers", "vocab")}
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if not cuda:
        torch.set_num_threads(config.CPU_THREADS_PER_RANK)
    ms = [2**i for i in range(int(math.log2(args.m_max)) + 1)]
    rows = []
    for role, (k, n) in gemm_shapes(sh, args.tp).items():
        copies = 1 if role == "lm_head" else shape.layers  # the step's distinct weights of this role
        torch.manual_seed(args.seed)  # drawn on the device: 8 layers' gate_up weights are 1.9 GB in bf16
        ws = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
        for m in ms:
            x = torch.randn(m, 1, k, device=dev, dtype=dtype)
            t = _time_gemm(torch, x, ws, args.reps, args.repeats, cuda)
            rows.append({"role": role, "k": k, "n": n, "m": m, "time_ns": max(1, int(round(t)))})
            print(f"{role} {m} x {k} x {n}: {t / 1e3:.2f} us", flush=True)
        del ws
    timing = (
        f"cuda-graph replay of {args.reps} products over the step's distinct weights of each role, the median "
        f"of {args.repeats} replays timed by CUDA events"
        if cuda
        else f"host clock over {args.reps} calls over the step's distinct weights of each role, the median of "
        f"{args.repeats} ({config.CPU_THREADS_PER_RANK} thread(s))"
    )
    doc = {
        "schema_version": "1.0",
        "kind": "tracekit.gemm-table",
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "dtype": "bfloat16" if cuda else "float32",
        "tp": args.tp,
        "shape": sh,
        "timing": timing,
        "rows": rows,
    }
    if args.output:
        env.atomic_write_json(Path(args.output), doc)
    return doc


def _time_gemm(torch: Any, x: Any, ws: list[Any], reps: int, repeats: int, cuda: bool) -> float:
    """ns per product `x @ w.t()`, cycling over `ws` (module doc)."""
    outs = [x @ w.t() for w in ws]  # warm-up, and the output buffers
    if not cuda:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            for i in range(reps):
                torch.matmul(x, ws[i % len(ws)].t(), out=outs[i % len(ws)])
            times.append((time.perf_counter_ns() - t0) / reps)
        return statistics.median(times)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(len(ws)):
            torch.matmul(x, ws[i].t(), out=outs[i])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for i in range(reps):
            torch.matmul(x, ws[i % len(ws)].t(), out=outs[i % len(ws)])
    graph.replay()  # un-timed: the upload
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e6 / reps)
    graph.reset()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        p = argparse.ArgumentParser(prog="advise_batches.py check")
        p.add_argument("folder", type=Path)
        p.add_argument("--fit", type=int, default=1)
        p.add_argument("--kernels", type=Path, action="append", help="a traced run advise is given (repeat)")
        p.add_argument("--compare", type=Path, action="append", help="a traced run at a predicted batch")
        p.add_argument("--gemm-table", type=Path, default=None)
        p.add_argument("--copy", type=Path, default=None)
        p.add_argument("--rho", type=Path, default=None)
        p.add_argument("-o", "--output", type=Path, default=None)
        a = p.parse_args(argv[1:])
        check(a.folder, a.fit, a.output, a.kernels, a.compare, a.gemm_table, a.copy, a.rho)
        return 0
    if argv[:1] == ["gemmsweep"]:
        p = argparse.ArgumentParser(prog="advise_batches.py gemmsweep")
        p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
        p.add_argument("--preset", default="tiny")
        p.add_argument("--layers", type=int, default=None)
        p.add_argument("--tp", type=int, default=1)
        p.add_argument("--m-max", type=int, default=256)
        p.add_argument("--reps", type=int, default=64)
        p.add_argument("--repeats", type=int, default=5)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("-o", "--output", required=True)
        gemmsweep(p.parse_args(argv[1:]))
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
