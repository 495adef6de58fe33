"""`tracekit decompose`: a per-token speedup split through a matched intermediate (docs/METHOD.md section Speedup decomposition)."""

from __future__ import annotations

import click

from tracekit.cli import options as opt
from tracekit.model import documents
from tracekit.render import decompose as view

EXAMPLES = """
\b
Examples:
  tracekit decompose --baseline runs/eager --intermediate runs/graphs --full runs/graphs-fp8
  tracekit decompose --baseline runs/eager --intermediate runs/compile --full runs/compile-int4 --format json
  tracekit decompose --baseline traces/cpu-tp2-straggler --intermediate traces/cpu-tp2 --full traces/cpu-tp1
"""


@click.command(
    epilog=EXAMPLES, context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]}
)
@click.option(
    "--baseline", "baseline", required=True, type=click.Path(exists=True), help="Run A: the baseline stack."
)
@click.option(
    "--intermediate",
    "intermediate",
    required=True,
    type=click.Path(exists=True),
    help="Run B: new runtime, old kernels.",
)
@click.option("--full", "full", required=True, type=click.Path(exists=True), help="Run C: the full stack.")
@opt.step_pattern_option
@opt.skip_first_option(help="Warm-up steps left out of each run.")
@opt.format_option("table", "json", help="table for people; json for machines (text: the old name of table).")
@opt.analysis_options
def command(
    baseline: str,
    intermediate: str,
    full: str,
    step_pattern: str | None,
    skip_first: int,
    fmt: str,
    out: str | None,
    run_on: opt.RunOn,
) -> None:
    """Split the per-token speedup A/C into runtime (A/B) and kernel (B/C) parts on a log scale.

    A is the baseline stack, B the intermediate (the new runtime with the old kernels: CUDA graphs,
    torch.compile), C the full stack (B in another dtype or kernel path). The runtime part is
    log(A/B)/log(A/C), the kernel part log(B/C)/log(A/C); each with a 95% bootstrap interval over
    steps, and the per-token time each class saved in it (matrix compute, vector compute, memory,
    collective transfer, coordination), which sums exactly to the part's saving. Per-token times
    are the unprofiled ones when the manifests carry them (the traced parts reconciled to them, as
    `tracekit shortfall` does), else the traced ones.
    """
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.cli.probe import dumps_json
    from tracekit.engine import decompose_paths

    paths = {"baseline": baseline, "intermediate": intermediate, "full": full}
    options = AttributionOptions(step_pattern, skip_first)
    result = decompose_paths(paths, run_on.engine(), options=options, cache=run_on.cache)
    doc = result.to_json()
    opt.write_text(
        dumps_json(doc).decode() if fmt == "json" else view.text(documents.convert(doc, documents.Decompose)),
        out,
    )
