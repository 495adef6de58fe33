"""`tracekit capture`: record per-rank Kineto traces and manifest.json from a decode run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from tracekit.capture.profile import MODES
from tracekit.cli.options import config_of, message, output_option, quiet

_MODE_HELP = "; ".join(f"{k}: {v}" for k, v in MODES.items())


@click.command(
    "capture",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Examples:
  tracekit capture --tp 2 --preset tiny --tokens 8 -o traces/cpu-tp2
  tracekit capture --device cuda --preset 7b --layers 8 --tokens 32 --rounds 5 -o runs/h200-tp1
  tracekit capture --tp 2 --preset tiny --tokens 16 --inject-delay 1:20 -o traces/cpu-tp2-straggler
  tracekit capture --device cuda --preset 7b --layers 4 --tokens 32 --mode cuda -o runs/h200-tp1
  tracekit capture --device cuda --preset 7b --layers 4 --tokens 32 --mode kernels -o runs/h200-tp1-k
  tracekit capture --device cuda --preset 7b --layers 4 --tokens 32 --nsys -o runs/h200-tp1-nsys
  tracekit capture --device cuda --preset 7b --layers 8 --tp 2 --tokens 8 --nsys -o runs/h200-tp2-nsys
  tracekit capture --device cuda --preset 7b --layers 8 --tokens 32 --cuda-graphs -o runs/h200-tp1-graphs
  tracekit capture --tp 2 --preset tiny --tokens 8 --compile -o runs/cpu-tp2-compile
  tracekit capture --device cuda --preset 7b --layers 8 --cuda-graphs --shard-of 4 -o runs/h200-shard4
  tracekit capture -o runs/mine -- python examples/my_decode.py --tokens 32
  tracekit capture -o runs/mine -- torchrun --nproc-per-node 2 examples/my_decode.py
  tracekit capture --nsys -o runs/mine-nsys -- python examples/my_decode.py --device cuda
""",
)
@click.option(
    "--tp", type=int, default=1, show_default=True, help="Tensor-parallel ranks (processes on this host)."
)
@click.option("--tokens", type=int, default=16, show_default=True, help="Decode steps per pass.")
@click.option(
    "--rounds",
    type=int,
    default=7,
    show_default=True,
    help="Measured rounds, alternating unprofiled and profiled passes (U P U P ...); every profiled "
    "round runs under the profiler, only the last keeps its trace. The dilation is the median of the "
    "per-round profiled/unprofiled ratios, with a bootstrap interval (on one H200, 7 rounds gave "
    "1.63-1.65x on three repeats; 3 rounds 1.53-1.66x). Under --nsys: plain run, run under nsys, "
    "plain run (U P U).",
)
@click.option(
    "--prompt", type=int, default=16, show_default=True, help="Prompt length (prefill, not a step)."
)
@click.option("--batch", type=int, default=1, show_default=True, help="Sequences decoded together.")
@click.option("--preset", default="tiny", show_default=True, help="Model shape: tiny, small, 7b.")
@click.option("--layers", type=int, default=None, help="Override the preset's number of layers.")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--mode", type=click.Choice(list(MODES)), default="auto", show_default=True, help=_MODE_HELP)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and the prompt.")
@click.option(
    "--warmup",
    type=int,
    default=4,
    show_default=True,
    help="Decode steps of the warm-up pass (raised to cover every position the measured passes reach).",
)
@click.option(
    "--inject-delay", default=None, metavar="RANK:MS", help="Sleep MS ms on RANK before each all-reduce."
)
@click.option("--inject-sync", is_flag=True, help="An extra device synchronisation per layer.")
@click.option(
    "--cuda-graphs",
    is_flag=True,
    help="Decode as serving engines do: static KV cache and shapes, masked attention, one CUDA-graph "
    "replay per token (NCCL inside the graph). Needs CUDA.",
)
@click.option(
    "--compile", "compile_", is_flag=True, help="Decode steps through torch.compile (static shapes)."
)
@click.option(
    "--nsys",
    is_flag=True,
    help="Trace under Nsight Systems (nsys on PATH or $NSYS), export SQLite too: a plain run times the "
    "unprofiled pass, then the run under nsys warms up and records only the traced pass. With -- SCRIPT "
    "the script runs twice the same way: only its tracekit.profile(profiled=False) blocks record in the "
    "plain run, only its profiled blocks (NVTX ranges) under nsys; no unprofiled block: dilation null.",
)
@click.option(
    "--timeout", "timeout_s", type=float, default=300.0, show_default=True, help="Collective timeout (s)."
)
@output_option(
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    metavar="DIR",
    help="Run folder.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace the manifest and traces of an earlier capture in -o/--output (without it: an error, "
    "nothing touched).",
)
@click.option(
    "--shard-of",
    "shard_of",
    type=int,
    default=None,
    metavar="N",
    help="Run rank 0's shard of a TP=N decoder on this one device, its collectives no-ops: the per-rank "
    "compute of TP=N where only one GPU is (with --tp 1; the tokens are not the model's).",
)
@click.option(
    "--decoder-impl",
    "decoder_impl",
    type=click.Choice(["fused", "legacy"]),
    default="fused",
    show_default=True,
    help="The reference decoder's implementation: fused (one-op RMSNorm, in-place RoPE, grouped-query "
    "attention without expanding the KV cache) or legacy (as first written; for the A/B). Recorded in the "
    "manifest's workload.decoder_impl.",
)
@click.option(
    "--no-calibrate",
    "no_calibrate",
    is_flag=True,
    help="Skip the profiler calibration after the warm-up (the manifest then has no "
    "profiler_calibration, and the correction solves the profiler's cost instead); seconds faster on a CPU.",
)
@click.argument("script", nargs=-1, type=click.UNPROCESSED)
def command(
    tp: int,
    tokens: int,
    rounds: int,
    prompt: int,
    batch: int,
    preset: str,
    layers: int | None,
    backend: str,
    device: str,
    mode: str,
    seed: int,
    warmup: int,
    inject_delay: str | None,
    inject_sync: bool,
    cuda_graphs: bool,
    compile_: bool,
    nsys: bool,
    timeout_s: float,
    out_dir: Path,
    force: bool,
    shard_of: int | None,
    decoder_impl: str,
    no_calibrate: bool,
    script: tuple[str, ...],
) -> None:
    """Capture per-rank traces of a tensor-parallel decode loop, with per-token times unprofiled
    and profiled (the dilation) in OUT/manifest.json.

    Without SCRIPT: the reference decoder (Llama-style, random weights) over --tp ranks, a warm-up,
    then --rounds alternating unprofiled and profiled passes (the last profiled one traced). With `-- SCRIPT...`: runs your own script, whose loop
    uses `tracekit.profile()` and `tracekit.annotate.step(i)`; tracekit tells it where to write.
    """
    from tracekit.capture import runner

    runner.check_out_dir(out_dir, force)  # before anything runs: nothing replaced without --force
    cmdline = _canonical_command(click.get_current_context())
    if script:
        run_dir = runner.capture_script(list(script), out_dir, mode=mode, nsys=nsys, command=cmdline)
        message(f"wrote {run_dir}/manifest.json")
        return
    config = config_of(  # the other fields: the options of the same names
        runner.CaptureConfig,
        click.get_current_context().params,
        inject_delay=runner.parse_inject_delay(inject_delay),
        compile=compile_,
        command=cmdline,
        calibrate=not no_calibrate,
    )
    if quiet() or not sys.stderr.isatty():
        run_dir = runner.capture(config, out_dir)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        ) as bar:
            tasks: dict[str, object] = {}

            def progress(phase: str, done: int, total: int) -> None:
                kind = runner.phase_kind(phase)  # one bar per kind, its round in the label
                if kind not in tasks:
                    tasks[kind] = bar.add_task(f"rank 0 {phase}", total=total)
                bar.update(tasks[kind], completed=done, total=total, description=f"rank 0 {phase}")  # type: ignore[arg-type]

            run_dir = runner.capture(config, out_dir, progress=progress)
    _summary(run_dir)


def _canonical_command(ctx: click.Context) -> str:
    """The command as it ran: every option that differs from its default, then `-- SCRIPT`."""
    words = ["tracekit", "capture"]
    script_given = bool(ctx.params.get("script"))
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name in (None, "quiet", "force"):
            continue
        value = ctx.params.get(p.name)
        always = p.name in ("tp", "preset", "tokens") and not script_given
        if (value == p.default and not always) or value is None or value is False:
            continue
        name = next((o for o in p.opts if o.startswith("--")), p.opts[0])  # --output, not -o
        words.append(name if value is True else f"{name} {shlex.quote(str(value))}")
    script = ctx.params.get("script") or ()
    if script:
        words += ["--", *(shlex.quote(a) for a in script)]
    return " ".join(words)


def _summary(run_dir: Path) -> None:
    import os

    if os.environ.get("RANK", "0") != "0" and os.environ.get("TRACEKIT_SPAWNED") != "1":
        return  # under torchrun only rank 0 writes (and reports) the manifest

    from tracekit.capture.manifest import workload_of
    from tracekit.model.documents.base import given
    from tracekit.read import load_manifest

    m = load_manifest(run_dir / "manifest.json")
    w = workload_of(m)
    d = given(m.dilation)
    iv = given(m.dilation_interval)
    dil = "n/a" if d is None else f"{d:.2f}" + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "")
    order = given(w.pass_order)
    n = len(given(m.files) or {})
    message(
        f"wrote {run_dir}: {n} file{'' if n == 1 else 's'}, tp={given(w.tp)} {given(w.device)}/{given(w.backend)} "
        f"mode={given(w.mode)}, "
        f"dilation={dil}" + (f" over passes {order}" if order else "")
    )
