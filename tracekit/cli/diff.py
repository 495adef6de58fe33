"""`tracekit diff BEFORE AFTER`: two runs of the same workload side by side, and a CI gate (issue 20)."""

from __future__ import annotations

import math
from typing import Any

import click

from tracekit.cli import options as opt
from tracekit.errors import TracekitError
from tracekit.model import documents
from tracekit.model.documents import given, to_builtins
from tracekit.read.manifests import workload_tp
from tracekit.render import diff as view


def _tp_of(run: Any, partial: bool) -> int | None:
    """A run's TP degree: its manifest's workload.tp when that is a sane integer, else its ranks
    (unknown with --allow-partial: ranks are missing on purpose there)."""
    tp = workload_tp(run.manifest)
    if tp is not None:
        return tp
    return None if partial else len(run.ranks)


#: the manifest's workload fields that make two runs different decodes (the device is not one of
#: them: the same decode on two machines is a comparison diff is for)
WORKLOAD_FIELDS = ("preset", "shape", "layers", "batch", "prompt", "dtype")


def _workload_change(before: Any, after: Any) -> str:
    """The workload fields two runs' manifests both give and disagree on, as "batch 1 vs 8; ..."
    (empty when they agree or a manifest is missing)."""
    docs = [r.manifest for r in (before, after)]
    wb, wa = (to_builtins(given(d.workload)) if d is not None else None for d in docs)
    if not isinstance(wb, dict) or not isinstance(wa, dict):
        return ""
    return "; ".join(
        f"{k} {str(wb[k])[:60]} vs {str(wa[k])[:60]}"
        for k in WORKLOAD_FIELDS
        if k in wb and k in wa and wb[k] != wa[k]
    )


@click.command("diff", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("before", metavar="BEFORE")
@click.argument("after", metavar="AFTER")
@opt.format_option(
    "table", "json", "md", help="table for people, md for a pull request comment, json per docs/JSON.md#diff."
)
@click.option(
    "--fail-if-slower",
    "fail_pct",
    type=str,
    default=None,
    metavar="PCT",
    help="Exit 1 when the 95% lower bound of the per-token slowdown exceeds PCT percent (a CI gate); "
    "one line on stderr says what moved.",
)
@click.option("--top", type=int, default=10, show_default=True, help="Kernels and collectives listed.")
@opt.step_pattern_option
@opt.skip_first_option()
@opt.dilation_threshold_option(
    "A profiled pass faster than the unprofiled one by more than this: per-token times from the traces."
)
@opt.allow_partial_option
@click.option(
    "--allow-tp-change",
    is_flag=True,
    help="Compare runs of different TP degrees (refused without it: the change would be the sharding; "
    "`tracekit shortfall --baseline TP1 --sharded TPN` is the analysis of that).",
)
@opt.analysis_options
def command(
    before: str,
    after: str,
    fmt: str,
    fail_pct: str | None,
    top: int,
    step_pattern: str | None,
    skip_first: int,
    dilation_threshold: float,
    allow_partial: bool,
    allow_tp_change: bool,
    out: str | None,
    run_on: opt.RunOn,
) -> None:
    """Compare two runs of the same workload (any input tracekit reads, the same TP degree unless
    --allow-tp-change): the per-token time
    before and after with a 95% bootstrap interval and a plain verdict (faster / slower / no
    significant change); the change split by part (compute, matrix/vector on GPUs, memory,
    collective transfer, coordination wait/sync/idle; the parts sum to the change exactly), per
    rank and on the critical path (which rank's host time, compute or transfer moved); the kernels
    and collectives that moved most; the profiler's dilation of both runs, with a warning when it
    differs enough to explain the change. Per-token times are corrected for the profiler as the
    shortfall does (traced time / the dilation the capture measured) when both manifests have
    unprofiled passes, else the traced step times of both.

    \b
    Examples:
      tracekit diff traces/h200-tp2 traces/h200-tp2-straggler
      tracekit diff runs/main runs/pr --format md -o diff.md
      tracekit diff runs/main runs/pr --fail-if-slower 5        # CI: exit 1 on a slowdown > 5%
      tracekit diff runs/main runs/pr --format json -o diff.json
    """
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.engine import diff_paths

    pct: float | None = None
    if fail_pct is not None:
        try:
            pct = float(fail_pct.rstrip("%"))
        except ValueError:
            raise TracekitError(
                f"--fail-if-slower: {fail_pct!r} is not a number (a percentage, e.g. 5)"
            ) from None
        if not math.isfinite(pct):
            raise TracekitError(f"--fail-if-slower: {fail_pct!r} is not a finite percentage")
    if top < 0:
        raise TracekitError(f"--top: {top} is negative")
    if skip_first < 0:
        raise TracekitError(f"--skip-first: {skip_first} is negative")
    result, run_b, run_a = diff_paths(
        before,
        after,
        run_on.engine(),
        before_path=before,
        after_path=after,
        top=top,
        options=AttributionOptions(step_pattern, skip_first, dilation_threshold, allow_partial),
        cache=run_on.cache,
    )
    # after diff's own refusals (a partial group, no steps ...): those name the problem first
    tp_b, tp_a = _tp_of(run_b, allow_partial), _tp_of(run_a, allow_partial)
    if None not in (tp_b, tp_a) and tp_b != tp_a and not allow_tp_change:
        raise TracekitError(
            f"{after}: TP={tp_a} against {before}: TP={tp_b}: diff compares runs of one TP degree; "
            "for what sharding costs use `tracekit shortfall --baseline <TP=1 run> --sharded <TP=N run>`, "
            "or give --allow-tp-change"
        )
    changed = _workload_change(run_b, run_a)
    if changed:
        opt.message(
            f"warning: {after} is another workload than {before} ({changed}): what moved includes the "
            "change of model or input, not only of the code"
        )
    doc = result.to_json()
    opt.emit_document(out, fmt, doc, documents.Diff, view, md=True, file_width=140)
    if pct is not None and result.fails(pct):
        click.echo(f"tracekit: {result.gate_line(pct)}", err=True)
        raise click.exceptions.Exit(1)
