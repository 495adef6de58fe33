"""`tracekit shortfall`: where the per-token shortfall S = TN - T1/N goes (docs/METHOD.md sections "Wait and transfer", "Shortfall attribution" and "Dilation")."""

from __future__ import annotations

import click

from tracekit.cli import options as opt
from tracekit.model import documents
from tracekit.render import shortfall as view


@click.command("shortfall", context_settings={"help_option_names": ["-h", "--help"]})
@opt.run_option("baseline", "TP=1 run: folder of rank files (or one trace).")
@opt.run_option("sharded", "TP=N run: folder of rank files.")
@opt.format_option("table", "json", help="table for people; json per docs/JSON.md#shortfall.")
@opt.steps_option(
    "How to find the steps (default: the manifest's pattern, else auto: decode_step, ProfilerStep#N, a "
    "serving engine's iteration range, a CUDA-graph launch period, repeated NVTX ranges, else the whole trace); "
    "whole: one window per rank; or a REGEX of the step annotations. --step-pattern is the same option."
)
@opt.skip_first_option(help="Warm-up steps left out of the per-token figures.")
@opt.dilation_threshold_option("Dilation above 1 + this is reported as inflating the coordination share.")
@opt.allow_partial_option
@opt.analysis_options
def command(
    baseline: str,
    sharded: str,
    fmt: str,
    step_pattern: str | None,
    skip_first: int,
    dilation_threshold: float,
    allow_partial: bool,
    out: str | None,
    run_on: opt.RunOn,
) -> None:
    """Attribute the per-token shortfall S = TN - T1/N of a tensor-parallel run to compute that did
    not scale, memory, transfer (bytes on the link on GPUs; gloo's exchange on CPU runs) and
    coordination (collective wait + sync + idle), as the mean over ranks and per rank, with the
    critical path of a token across ranks (whose compute / host time / sync / transfer it runs
    through), the spread over steps, the straggler test and the profiler's dilation (the factor
    applied, with its interval). T1 and TN come from the unprofiled pass when the capture
    manifests have it (the traced parts are reconciled to it).

    \b
    Examples:
      tracekit shortfall --baseline traces/cpu-tp1 --sharded traces/cpu-tp2
      tracekit shortfall --baseline traces/cpu-tp1 --sharded traces/cpu-tp2-straggler --format json -o s.json
      tracekit shortfall --baseline traces/h200-tp1 --sharded traces/h200-tp2-straggler
    """
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.engine import shortfall_paths

    options = AttributionOptions(step_pattern, skip_first, dilation_threshold, allow_partial)
    result = shortfall_paths([baseline], [sharded], run_on.engine(), options=options, cache=run_on.cache)
    doc = result.document()
    dq = doc.data_quality
    if dq.counts.get("baseline_workload_differs"):
        # a pair of two different decodes: said first, on stderr, not only in the data-quality notes
        # at the end of the table (issue 24: a CPU tiny TP=1 against an H200 7b TP=2 read as a finding)
        note = next((n for n in dq.notes if "another workload" in n), "the two runs' workloads differ")
        opt.message(f"warning: {note}")
    opt.emit_document(out, fmt, documents.to_builtins(doc), documents.Shortfall, view)
