"""`tracekit roofline`: the roofline of a decode step (tracekit/analyse/roofline.py)."""

from __future__ import annotations

import click

from tracekit.cli.options import (
    cache_dir_option,
    emit_document,
    file_option,
    no_cache_option,
    out_file_option,
    skip_first_option,
    step_pattern_option,
)
from tracekit.model import documents
from tracekit.model.documents import given
from tracekit.render import roofline as view


@click.command("roofline", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", metavar="RUN", type=click.Path(exists=True, path_type=str))
@file_option(
    "copy", "copy", "A `tracekit probe --op copy` JSON: the memory bandwidth (best local read + write rate)."
)
@file_option("rho", "rho", "A `tracekit rho` JSON: the matrix rate of the run's dtype.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@step_pattern_option
@skip_first_option()
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
    manifest = run.manifest
    wl = given(manifest.workload) if manifest is not None else None
    dtype = given(wl.dtype) if wl is not None else None
    doc = roofline(
        run, load_peaks(copy, rho, dtype or "bfloat16"), step_pattern=step_pattern, skip_first=skip_first
    )
    emit_document(out, fmt, doc, documents.Roofline, view)
