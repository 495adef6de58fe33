"""`tracekit advise`: one N-way sharded instance, N replicas or N/2 pairs, with memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli.options import format_option, out_file_option, write_text

EXAMPLES = """
\b
Examples:
  tracekit advise --tp1 traces/h200-tp1 --tpn traces/h200-tp2
  tracekit advise --tp1 runs/tp1-b1 --tp1 runs/tp1-b16 --tpn runs/tp2-b1 --gpus 4 --dtype int4
  tracekit advise --tp1 traces/cpu-tp1 --tpn traces/cpu-tp2 --memory-gib 16 --context 4096 --format json
  tracekit advise --tp1 traces/h200-tp1 --tpn traces/h200-tp2 --batch 16 --batch 64   # extrapolated
  tracekit advise --tp1 traces/h200-tp1 --tpn traces/h200-tp2 --layers 32   # memory of the full 32-layer 7b
  tracekit advise --tp1 runs/b1 --tp1 runs/b16 --batch 64 --copy copy.json --rho rho.json   # per-kernel
  tracekit advise --tp1 runs/b1 --gemm-table gemm-table.json --batch 64   # one run + the GEMM sweep
"""


def _measured(path: str) -> Any:
    from tracekit.analyse.advise_inputs import measured_from
    from tracekit.analyse.dilation import dilation_of
    from tracekit.read import load_manifest

    p = Path(path)
    mpath = p / "manifest.json" if p.is_dir() else p.parent / "manifest.json"
    manifest = load_manifest(mpath) if mpath.exists() else None
    traced = None
    if manifest is not None:
        u = dilation_of(manifest).unprofiled
        if u is None or not u.n:  # only then is the trace read
            from tracekit.analyse.attribution.plan import attribute_run
            from tracekit.read import read_run

            traced = float(attribute_run(read_run([p]), label=path).per_token["window"])
    return measured_from(manifest, path, traced)


def _with_kernels(runs: list[Any], batches: tuple[int, ...], table: bool) -> list[Any]:
    """The runs the batch model needs kernels of, with their traced step's kernels (docs/METHOD.md
    section Batch scaling of a decode); runs without a trace stay as they are."""
    from dataclasses import replace

    from tracekit.analyse.advise_inputs import needs_kernels
    from tracekit.analyse.batch_model import kernel_profile
    from tracekit.errors import NoTracesError
    from tracekit.read import find_trace_files, read_run

    want = needs_kernels(runs, batches, table)
    out = []
    for m in runs:
        if m.path in want:
            try:
                find_trace_files([m.path])
            except NoTracesError:
                out.append(m)
                continue
            m = replace(m, kernels=kernel_profile(read_run([m.path]), m.path))
        out.append(m)
    return out


@click.command(
    epilog=EXAMPLES, context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]}
)
@click.option(
    "--tp1",
    "tp1",
    multiple=True,
    required=True,
    type=click.Path(exists=True),
    help="TP=1 run (repeat per batch).",
)
@click.option(
    "--tpn", "tpn", multiple=True, type=click.Path(exists=True), help="TP=n run (repeat per batch or degree)."
)
@click.option("--gpus", type=int, default=None, help="GPUs to spend (default: the TP=n run's n).")
@click.option(
    "--memory-gib", type=float, default=None, help="Memory per GPU (default: the manifest's device)."
)
@click.option(
    "--reserve-gib",
    type=float,
    default=2.0,
    show_default=True,
    help="Kept back per GPU (context, workspace).",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16", "fp8", "int4"]),
    default=None,
    help="Weight dtype for the memory cliff (default: the run's).",
)
@click.option(
    "--context", type=int, default=None, help="Context length for the KV cache (default: prompt + tokens)."
)
@click.option(
    "--layers",
    type=click.IntRange(min=1),
    default=None,
    help="Layers of the real model for the memory (default: the traces'; the 7b-shaped traces run 8 of 32).",
)
@click.option(
    "--batch", "batches", type=int, multiple=True, help="Also a batch size not measured (predicted)."
)
@click.option(
    "--gemm-table",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="GEMM times per batch (benchmarks/advise_batches.py gemmsweep) for --batch.",
)
@click.option(
    "--copy", type=click.Path(exists=True, dir_okay=False), help="Copy probe JSON: the floors' bandwidth."
)
@click.option(
    "--rho", type=click.Path(exists=True, dir_okay=False), help="rho JSON: the floors' matrix rate."
)
@format_option("table", "json", help="table for people; json for machines (text: the old name of table).")
@out_file_option
def command(
    tp1: tuple[str, ...],
    tpn: tuple[str, ...],
    gpus: int | None,
    memory_gib: float | None,
    reserve_gib: float,
    dtype: str | None,
    context: int | None,
    layers: int | None,
    batches: tuple[int, ...],
    gemm_table: str | None,
    copy: str | None,
    rho: str | None,
    fmt: str,
    out: str | None,
) -> None:
    """Shard or replicate: tokens/s and latency per token of one N-way sharded instance, N TP=1
    replicas and N/2 pairs, at the batch sizes measured, with the memory each needs per GPU (weights
    + KV cache at the context, from the manifest's workload) and whether it fits.

    Per-token times are the runs' unprofiled means (the traced ones when a manifest has none).
    --dtype fp8/int4 shows how low-bit weights move the memory cliff: how many more concurrent
    sequences fit. --batch B adds a batch size not measured (marked predicted, its model named):
    per kernel from two or more traced runs at other batches, or from one run and --gemm-table;
    from one run alone the roofline's range (docs/METHOD.md section Batch scaling of a decode).
    --layers N sizes the memory for an N-layer model when the traces were cut to fewer layers (the per-token times stay those
    measured). One plain recommendation per batch size; an option that does not fit is said so.
    """
    from tracekit.analyse.advise import advise, load_table_file, run_peaks
    from tracekit.cli.probe import dumps_json
    from tracekit.render.advise import text

    table = load_table_file(gemm_table) if gemm_table else None
    runs = _with_kernels([_measured(p) for p in (*tp1, *tpn)], batches, table is not None)
    adv = advise(
        runs[: len(tp1)],
        runs[len(tp1) :],
        gemm_table=table,
        gemm_table_name=gemm_table or "--gemm-table",
        peaks=run_peaks(copy, rho, runs[0]),
        gpus=gpus,
        memory_gib=memory_gib,
        reserve_gib=reserve_gib,
        weight_dtype=dtype,
        context=context,
        batches=batches,
        layers=layers,
    )
    write_text(dumps_json(adv.to_json()).decode() if fmt == "json" else text(adv.document()), out)
