"""`tracekit compare-links`: NVLink vs PCIe (P2P disabled) on the same GPUs, side by side."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import (
    file_option,
    format_option,
    message,
    run_option,
    show_progress,
)
from tracekit.cli.sweep_options import fork_cpu_ranks, sweep_options, sweep_output_option
from tracekit.errors import ProbeError
from tracekit.model.documents import Links, to_builtins
from tracekit.probe import spec


@click.command("compare-links", context_settings={"help_option_names": ["-h", "--help"]})
@sweep_options(
    gpus={"help": "GPUs to use, e.g. 0,1 [all visible; on CPU: --ranks gloo ranks]."},
    op={"default": "all_reduce,all_gather"},
    max={"help": "Largest size (K/M/G suffixes) [1G on CUDA, 1M on CPU]."},
    ranks={"help": "Ranks on CPU (gloo) [2]."},
    log_dir={"help": "Keep NCCL's logs here (one subfolder per mode)."},
)
@click.option(
    "--modes",
    default="nvlink,pcie",
    show_default=True,
    help="Comma list of nvlink (NCCL default, P2P allowed), pcie (NCCL_P2P_DISABLE=1), default.",
)
@click.option(
    "--pcie-p2p-level",
    default=None,
    help="For the pcie mode set NCCL_P2P_LEVEL=<LEVEL> (e.g. PHB) instead of NCCL_P2P_DISABLE=1.",
)
@run_option(
    "trace",
    "A decode trace run (folder of rank traces): mark its message sizes, compare its realised busbw.",
    dest="trace_dir",
    required=False,
    path_type=Path,
)
@run_option(
    "baseline",
    "The --trace run's baseline (TP=1 run): the verdict sets the link bound against its shortfall S.",
    dest="baseline_dir",
    required=False,
    path_type=Path,
)
@file_option(
    "load",
    "load_path",
    "Re-use a saved compare-links JSON instead of running sweeps (no GPU needed); the sweep options "
    "are then ignored, --trace/--baseline recompute the trace part and the verdict.",
    exists=True,
    path_type=Path,
)
@format_option("table", "json", default=None, help="[table; json when -o/--output ends .json]")
@sweep_output_option
def command(
    gpus: str | None,
    modes: str,
    op_text: str,
    min_text: str,
    max_text: str | None,
    factor: int,
    iters: int,
    warmup: int,
    dtype: str,
    device: str,
    ranks: int | None,
    pcie_p2p_level: str | None,
    trace_dir: Path | None,
    baseline_dir: Path | None,
    load_path: Path | None,
    nccl_debug: str,
    algo_pass: bool,
    graph: bool,
    log_dir: Path | None,
    fmt: str | None,
    out: Path | None,
    progress: bool | None,
) -> None:
    """Run the same nccl-tests-style sweep with NVLink allowed and with P2P disabled, record the
    transport NCCL really used in each, and show busbw side by side with the ratio per size.

    \b
    NCCL_NVLS_ENABLE=0 in every mode. With --trace, the decode's message sizes are marked (*) and
    the verdict answers "would a faster link shrink my per-token shortfall?" (docs/METHOD.md
    section Bandwidth and the link verdict): probe busbw per mode at the decode's sizes (latency-
    or bandwidth-bound), the busbw the trace realised, and the bound XN (1 - 1/k) per token, as a
    share of S with --baseline.
    --load re-uses a saved result (no sweeps, no GPU). On a CPU-only machine every mode runs the
    gloo path (nothing to compare; it says so). --graph (CUDA only) times CUDA-graph replays
    instead of one Python call per iteration; the verdict says which timing was used.

    \b
    Examples:
      tracekit compare-links --gpus 0,1 --op all_reduce,all_gather -o reports/links.json
      tracekit compare-links --gpus 0,1 --trace traces/h200-tp2 --baseline traces/h200-tp1 --max 64M
      tracekit compare-links --gpus 0,1 --op all_reduce --max 64M --graph --trace traces/h200-tp2 \\
          --baseline traces/h200-tp1 -o reports/h200/links-graph.json
      tracekit compare-links --load reports/h200/links.json --trace traces/h200-tp2 \\
          --baseline traces/h200-tp1 -o reports/h200/links-verdict.json
      tracekit compare-links --device cpu --ranks 2 --max 64K --iters 5   # the sweep on gloo: a test, no links
    """

    from tracekit.analyse.links.verdict import load_compare, recompute

    if baseline_dir is not None and trace_dir is None:
        raise ProbeError("--baseline needs --trace (the sharded decode run it is the baseline of)")
    fmt = fmt or ("json" if out is not None and out.suffix.lower() == ".json" else "table")
    if load_path is not None:
        result = recompute(
            load_compare(load_path), trace_dir=trace_dir, baseline_dir=baseline_dir, loaded_from=load_path
        )
        _emit(result, fmt, out)
        return

    if device == "auto" and not _have_cuda_gpus():
        raise ProbeError(
            "compare-links compares GPU-to-GPU links (NVLink against P2P disabled) and this machine has "
            "no CUDA GPU; `tracekit probe --device cpu` measures gloo collectives here, `--load FILE` "
            "re-judges a saved result, `--device cpu` runs the sweep machinery itself as a test"
        )
    from tracekit.probe.compare import MODES, CompareConfig, compare_links

    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    bad = [m for m in mode_list if m not in MODES]
    if bad or not mode_list:
        raise ProbeError(f"unknown mode(s) {bad or modes!r}; known: {', '.join(MODES)}")
    cfg = CompareConfig(
        ops=spec.parse_ops(op_text),
        modes=mode_list,
        gpus=spec.parse_gpus(gpus),
        min_bytes=spec.parse_size(min_text),
        max_bytes=spec.parse_size(max_text) if max_text else None,
        factor=factor,
        iters=iters,
        warmup=warmup,
        dtype=dtype,
        device=device,
        ranks=ranks,
        pcie_p2p_level=pcie_p2p_level,
        trace_dir=str(trace_dir) if trace_dir else None,
        baseline_dir=str(baseline_dir) if baseline_dir else None,
        nccl_debug=nccl_debug,
        algo_pass=algo_pass,
        graph=graph,
        log_dir=str(log_dir) if log_dir else None,
        progress=show_progress() if progress is None else progress,
    )
    fork_cpu_ranks()
    _emit(compare_links(cfg), fmt, out)


def _have_cuda_gpus() -> bool:
    """At least one CUDA GPU visible to torch (no torch: none)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def _emit(result: Links, fmt: str, out: Path | None) -> None:
    from tracekit.cli.probe import dumps_json
    from tracekit.render import links as view

    table = view.table(result)
    text = dumps_json(to_builtins(result)).decode() if fmt == "json" else table
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        message(table.rstrip("\n"))
        message(f"wrote {out}")
    else:
        click.echo(text, nl=False)
