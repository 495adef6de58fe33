"""`tracekit roofline`: the roofline of a decode step (tracekit/analyse/roofline.py)."""

from __future__ import annotations

import io
from typing import Any

import click

from tracekit.analyse.compute.kernel_scaling import short_kernel_name
from tracekit.cli.options import (
    cache_dir_option,
    emit_result,
    no_cache_option,
    out_file_option,
    step_pattern_option,
)
from tracekit.model import units


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def render_table(doc: dict[str, Any], width: int | None = None, color: bool = True) -> str:
    """The roofline as text: the per-token floor against the achieved time, by role, the top losers."""
    from rich.console import Console
    from rich.table import Table

    console = Console(
        record=True, width=width or 120, force_terminal=color, no_color=not color, file=io.StringIO()
    )
    pt, wl, pk = doc["per_token"], doc["workload"], doc["peaks"]
    eff = pt["efficiency"]
    head = (
        f"Per token: floor {units.ms(pt['floor_ns'])} ms ({pt['bytes'] / 1e9:.2f} GB to move, {pt['flops'] / 1e9:.2f} GFLOP), "
        f"achieved {units.ms(pt['achieved_ns'])} ms ({pt['achieved_source']})"
        + (f": {eff:.0%} of the roofline" if eff is not None else "")
        + f"; kernels {units.ms(pt['kernel_ns'])} ms, of which matrix work {units.ms(pt['matrix_kernel_ns'])} ms "
        f"(TP={wl['tp']}, batch {wl['batch']}, {wl['dtype']}, KV length {wl['kv_len']}: {wl['kv_len_source']})."
    )
    console.print(f"[bold]{doc['verdict']}[/bold]")
    console.print(head)
    console.print(
        f"Peaks: memory {_num(pk['memory_gbps'])} GB/s ({pk['memory_source']}); matrix "
        f"{_num(pk['matrix_tflops'])} TFLOP/s ({pk['matrix_source']}). Shapes: {doc['shapes']['source']}."
    )
    if doc["by_role"]:
        t = Table(title="By role (per token, one rank)", title_justify="left")
        for c in ("role", "units", "ms", "floor ms", "lost ms", "GB/s", "TFLOP/s", "of roofline"):
            t.add_column(c, justify="left" if c == "role" else "right")
        for r in doc["by_role"]:
            t.add_row(
                "other kernels (norms, rotary, casts, copies)" if r["role"] == "other" else r["role"],
                str(r["units_per_token"]),
                units.ms(r["time_ns"]),
                units.ms(r["floor_ns"]),
                units.ms(r["lost_ns"]),
                "-" if r["achieved_gbps"] is None else f"{r['achieved_gbps']:.0f}",
                "-" if r["achieved_tflops"] is None else f"{r['achieved_tflops']:.1f}",
                "-" if r["efficiency"] is None else f"{r['efficiency']:.0%}",
            )
        console.print(t)
    t = Table(title="Kernels losing the most time against their own roofline", title_justify="left")
    for c in ("kernel", "role", "per token", "ms", "floor ms", "lost ms"):
        t.add_column(c, justify="left" if c in ("kernel", "role") else "right")
    for r in doc["top_lost"]:
        t.add_row(
            short_kernel_name(r["name"]),
            r["role"],
            str(r["per_token"]),
            units.ms(r["time_ns"]),
            units.ms(r["floor_ns"]),
            units.ms(r["lost_ns"]),
        )
    console.print(t)
    return console.export_text(styles=color)


@click.command("roofline", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", metavar="RUN", type=click.Path(exists=True, path_type=str))
@click.option(
    "--copy",
    "copy",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="A `tracekit probe --op copy` JSON: the memory bandwidth (best local read + write rate).",
)
@click.option(
    "--rho",
    "rho",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="A `tracekit rho` JSON: the matrix rate of the run's dtype.",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@step_pattern_option
@click.option("--skip-first", type=int, default=1, show_default=True, help="Warm-up steps left out.")
@out_file_option
@no_cache_option
@cache_dir_option
def command(
    run_dir: str,
    copy: str | None,
    rho: str | None,
    fmt: str,
    step_pattern: str | None,
    skip_first: int,
    out: str | None,
    no_cache: bool,
) -> None:
    """The roofline of a decode step: per token, the bytes the step must move (every weight once,
    the KV cache) and the FLOPs it must do, from the capture manifest's model shape matched to the
    step's GEMM and attention kernels by order; the floor at the device's measured peaks; the
    achieved time and the efficiency; per role (QKV, attention, output, gate/up, down, LM head) the
    achieved GB/s; and the kernels that lose the most time against their own roofline (every
    non-matrix kernel moves activation-sized data: its floor is ~0). See docs/METHOD.md section
    Roofline of a decode.

    \b
    Examples:
      tracekit roofline traces/h200x2-tp1-b1-graphs --copy reports/h200/copy.json --rho reports/rho/h200.json
      tracekit roofline traces/h200x2-tp2-b1-graphs --copy reports/h200/copy.json --format json -o r.json
    """
    from tracekit.analyse.compute.roofline import load_peaks, roofline
    from tracekit.read import read_run

    run = read_run([run_dir], cache=not no_cache)
    wl = (run.manifest or {}).get("workload") if isinstance(run.manifest, dict) else None
    dtype = str(wl.get("dtype", "bfloat16")) if isinstance(wl, dict) else "bfloat16"
    doc = roofline(run, load_peaks(copy, rho, dtype), step_pattern=step_pattern, skip_first=skip_first)
    emit_result(out, fmt, lambda: doc, lambda width, color: render_table(doc, width=width, color=color))
