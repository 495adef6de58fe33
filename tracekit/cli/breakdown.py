"""`tracekit breakdown`: per-step compute / memory / collective / sync / idle of a run (docs/METHOD.md sections "Classes" and "Steps and the partition")."""

from __future__ import annotations

import click

from tracekit.cli import options as opt
from tracekit.model import documents
from tracekit.render import breakdown as view


@click.command("breakdown", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@opt.step_pattern_option
@click.option(
    "--rank",
    type=int,
    default=None,
    metavar="N",
    help="With one trace file: read it as rank N, overriding the rank the file says (distributedInfo; "
    "a differing one is noted in data quality). With several: show only rank N.",
)
@opt.format_option(
    "table",
    "json",
    "csv",
    help="table for people; json (docs/JSON.md#breakdown) or csv (one row per rank and step) for machines.",
)
@opt.skip_first_option(
    0,
    "Drop the first N steps of each rank (warm-up). Default 0 (shortfall's is 1): per-token "
    "figures include the first step unless --skip-first 1.",
)
@opt.analysis_options
def command(
    paths: tuple[str, ...],
    step_pattern: str | None,
    rank: int | None,
    fmt: str,
    out: str | None,
    skip_first: int,
    run_on: opt.RunOn,
) -> None:
    """Split every step of a run into compute, memory, collective (exposed), unknown, sync and idle
    time, per rank, exactly (the parts sum to the step), with the overlapped collective time, a
    per-token summary (median, p10, p90 over steps: the step time is the longest window, each
    part the mean over ranks), GPU time by class and the
    kernels that look like communication but no rule knows, and the whole trace's GPU busy / idle.
    PATHS are Kineto traces (.json / .json.gz), Nsight Systems SQLite exports or reports
    (.sqlite, .sqlite.gz, .nsys-rep), or folders of rank files (a tracekit capture, a torchrun
    profile folder of *.pt.trace.json[.gz], one .sqlite per rank, HTA's rank-N layout). Without
    step markers the steps are found by --steps auto (the rule that chose them is printed), and
    a trace with none at all is one window: breakdown never refuses a readable trace.

    \b
    Examples:
      tracekit breakdown traces/h200-tp1/rank-0.pt.trace.json.gz
      tracekit breakdown traces/cpu-tp2 --format json -o breakdown.json
      tracekit breakdown trace.json.gz --steps 'step\\[DECODE' --format csv
      tracekit breakdown nsys_export.sqlite --steps whole --cache-dir /tmp/tk-cache
      tracekit breakdown runs/tp64 --engine dask --workers 8 --format json -o b.json
    """
    from tracekit.engine import breakdown_paths

    result = breakdown_paths(
        list(paths),
        run_on.engine(),
        step_pattern=step_pattern,
        skip_first=skip_first,
        rank=rank,
        cache=run_on.cache,
    )

    doc = result.to_json()
    opt.emit_document(out, fmt, doc, documents.Breakdown, view, csv=result.to_csv)
