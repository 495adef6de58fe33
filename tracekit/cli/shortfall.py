"""`tracekit shortfall`: where the per-token shortfall S = TN - T1/N goes (docs/METHOD.md sections "Wait and transfer", "Shortfall attribution" and "Dilation")."""

from __future__ import annotations

import click

from tracekit.cli.options import (
    cache_dir_option,
    emit_result,
    engine_options,
    format_option,
    message,
    no_cache_option,
    out_file_option,
    show_progress,
)
from tracekit.model import documents
from tracekit.render import shortfall as view


@click.command("shortfall", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--baseline",
    "baseline",
    required=True,
    type=click.Path(exists=True, path_type=str),
    help="TP=1 run: folder of rank files (or one trace).",
)
@click.option(
    "--sharded",
    "sharded",
    required=True,
    type=click.Path(exists=True, path_type=str),
    help="TP=N run: folder of rank files.",
)
@format_option("table", "json", help="table for people; json per docs/JSON.md#shortfall.")
@click.option(
    "--steps",
    "--step-pattern",
    "step_pattern",
    default=None,
    metavar="auto|whole|REGEX",
    help="How to find the steps (default: the manifest's pattern, else auto: decode_step, ProfilerStep#N, a "
    "serving engine's iteration range, a CUDA-graph launch period, repeated NVTX ranges, else the whole trace); "
    "whole: one window per rank; or a REGEX of the step annotations. --step-pattern is the same option.",
)
@click.option(
    "--skip-first",
    type=int,
    default=1,
    show_default=True,
    help="Warm-up steps left out of the per-token figures.",
)
@click.option(
    "--dilation-threshold",
    type=float,
    default=0.10,
    show_default=True,
    help="Dilation above 1 + this is reported as inflating the coordination share.",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Match collectives even when their group names ranks that are not in the run.",
)
@out_file_option
@no_cache_option
@cache_dir_option
@engine_options
def command(
    baseline: str,
    sharded: str,
    fmt: str,
    step_pattern: str | None,
    skip_first: int,
    dilation_threshold: float,
    allow_partial: bool,
    out: str | None,
    no_cache: bool,
    engine: str | None,
    scheduler: str | None,
    workers: int | None,
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
    from tracekit.engine import Engine, shortfall_paths

    eng = Engine.parse(engine, scheduler, workers, progress=show_progress())
    result = shortfall_paths(
        [baseline],
        [sharded],
        eng,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        allow_partial=allow_partial,
        cache=not no_cache,
    )
    doc = result.to_json()
    dq = doc.get("data_quality") or {}
    if (dq.get("counts") or {}).get("baseline_workload_differs"):
        # a pair of two different decodes: said first, on stderr, not only in the data-quality notes
        # at the end of the table (issue 24: a CPU tiny TP=1 against an H200 7b TP=2 read as a finding)
        note = next(
            (n for n in dq.get("notes") or [] if "another workload" in n), "the two runs' workloads differ"
        )
        message(f"warning: {note}")
    emit_result(
        out,
        fmt,
        lambda: doc,
        lambda width, color: view.table(documents.convert(doc, documents.Shortfall), width, color),
    )
