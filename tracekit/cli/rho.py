"""`tracekit rho`: tensor-core matrix vs CUDA-core vector throughput, and their ratio rho."""

from __future__ import annotations

import click

from tracekit.cli.options import OutputPath, format_option, out_file_option, write_text

EXAMPLES = """
\b
Examples:
  tracekit rho                                  # every dtype the device runs, 8192^3 products
  tracekit rho --format json -o reports/rho/h200.json
  tracekit rho --json reports/rho/h200.json -o reports/rho/h200.txt   # both
  tracekit rho --matrix bf16,fp8 --vector fp32 --size 4096
  tracekit rho --matrix int8,int8-rowb --vector fp32 --fma-unroll 4   # what layout and unroll cost
  tracekit rho --device cpu                     # small CPU fallback (CI, laptops): no tensor cores
"""


def _dtypes(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in items if t not in allowed]
    if bad:
        raise click.BadParameter(f"{', '.join(bad)} not in {', '.join(allowed)}", param_hint=flag)
    return items


@click.command(
    epilog=EXAMPLES, context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]}
)
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option(
    "--matrix",
    "matrix",
    default="bf16,fp16,fp8,int8",
    show_default=True,
    help="Matrix dtypes; also int8-rowb (int8 with a row-major B: the slow layout, for comparison).",
)
@click.option("--vector", "vector", default="fp32,int32", show_default=True, help="Vector dtypes.")
@click.option(
    "--fma-unroll",
    type=click.IntRange(1, 256),
    default=None,
    help="Unroll factor of the FMA kernel's loop (default 32; the first H200 figures used 4).",
)
@click.option(
    "--size", type=int, default=None, help="M = N = K of the products (default 8192 on CUDA, 256 on CPU)."
)
@click.option(
    "--iterations", type=int, default=None, help="Calls per timed batch (default 10 on CUDA, 5 on CPU)."
)
@click.option(
    "--repeats", type=int, default=5, show_default=True, help="Timed batches; the median is reported."
)
@format_option("table", "json", help="table for people; json for machines.")
@out_file_option
@click.option("--json", "json_out", type=OutputPath(), default=None, help="Also write the JSON to FILE.")
def command(
    device: str,
    matrix: str,
    vector: str,
    fma_unroll: int | None,
    size: int | None,
    iterations: int | None,
    repeats: int,
    fmt: str,
    out: str | None,
    json_out: str | None,
) -> None:
    """Measure rho = tensor-core matrix throughput / CUDA-core fp32 FMA throughput, per dtype.

    Matrix: bf16/fp16 torch.mm, fp8 torch._scaled_mm, int8 torch._int_mm on random data; vector: a
    kernel of independent fused multiply-add chains (fp32, int32). Each figure is the median of
    --repeats batches timed between CUDA events, with the datasheet figure beside it when the device
    is known. A dtype the device cannot run is skipped with the reason. Without a CUDA device it runs
    a small CPU fallback and says so. High rho means vector work (dequantisation, norms, activations)
    costs many matrix operations' worth of time: compare with the matrix/vector split of
    `tracekit breakdown`.
    """
    from tracekit.cli.probe import dumps_json
    from tracekit.probe.rho import MATRIX_DTYPES, MATRIX_EXTRA, VECTOR_DTYPES, run_rho
    from tracekit.probe.rho_kernels import FMA_UNROLL
    from tracekit.render.rho import table

    md = _dtypes(matrix, MATRIX_DTYPES + MATRIX_EXTRA, "--matrix")
    vd = _dtypes(vector, VECTOR_DTYPES, "--vector")
    if "fp32" not in vd:
        vd = ("fp32", *vd)  # rho needs the fp32 FMA figure

    def say(msg: str) -> None:
        click.echo(f"rho: {msg}", err=True)

    result = run_rho(
        device=device,
        size=size,
        matrix_dtypes=md,
        vector_dtypes=vd,
        iterations=iterations,
        repeats=repeats,
        progress=say,
        fma_unroll=fma_unroll or FMA_UNROLL,
    )
    if json_out:
        from pathlib import Path

        Path(json_out).write_bytes(dumps_json(result.to_json()))
    if fmt == "json":
        write_text(dumps_json(result.to_json()).decode(), out)
    else:
        write_text(table(result.document()), out)
