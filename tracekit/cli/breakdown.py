"""`tracekit breakdown`: per-step compute / memory / collective / sync / idle of a run (docs/METHOD.md sections "Classes" and "Steps and the partition")."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import click

from tracekit.cli.options import (
    cache_dir_option,
    emit_result,
    engine_options,
    format_option,
    no_cache_option,
    out_file_option,
    show_progress,
    step_pattern_option,
)
from tracekit.model import units
from tracekit.model.parts import PARTS

if TYPE_CHECKING:
    from tracekit.analyse.timeline.breakdown import Breakdown

#: Steps listed in the terminal table (the per-rank and per-token summaries cover all of them).
MAX_STEP_ROWS = 40


def _pct(ns: int | float | None, total: int | float | None) -> str:
    """`ns` as a share of `total` ("-" without a total)."""
    return units.pct(None if ns is None or not total else ns / total)


def render_table(b: Breakdown, width: int | None = None, color: bool = True) -> str:
    """The human-readable report (rich tables) as text."""
    from rich.console import Console
    from rich.table import Table

    console = Console(
        record=True, width=width or 120, force_terminal=color, no_color=not color, file=io.StringIO()
    )
    doc = b.to_json()
    src = doc["source"]
    console.print(
        f"[bold]tracekit breakdown[/bold]  ranks {src['ranks']}  steps by rule {src['step_rule']!r} "
        f"({src['step_pattern']!r})  "
        f"timeline {src['timeline']}"
        + (
            f"  (first {src['skipped_steps_per_rank']} steps per rank skipped)"
            if src["skipped_steps_per_rank"]
            else ""
        )
    )

    steps = Table(title="Steps (ms)", title_justify="left")
    for col in ("rank", "step", "window", *PARTS, "overlapped coll."):
        steps.add_column(col, justify="right")
    shown = doc["steps"][:MAX_STEP_ROWS]
    for s in shown:
        steps.add_row(
            str(s["rank"]),
            str(s["step"]),
            units.ms(s["window_ns"]),
            *(units.ms(s["parts_ns"][p]) for p in PARTS),
            units.ms(s["overlapped_collective_ns"]),
        )
    console.print(steps)
    if len(doc["steps"]) > len(shown):
        console.print(
            f"  ... {len(doc['steps']) - len(shown)} more steps (all of them with --format csv or json)"
        )

    per_rank = Table(
        title="Per rank: median over steps, ms and share of the median step", title_justify="left"
    )
    for col in ("rank", "steps", "timeline", "step", *PARTS):
        per_rank.add_column(col, justify="right", no_wrap=True)
    for r in doc["per_rank"]:
        total = r["step_ns_median"]
        med = r["parts_ns_median"]
        per_rank.add_row(
            str(r["rank"]),
            str(r["steps"]),
            r["timeline"],
            units.ms(total),
            *(units.ms(med[p]) for p in PARTS),
        )
        per_rank.add_row("", "", "", "", *(_pct(med[p], total) for p in PARTS))
    console.print(per_rank)

    pt = doc["per_token"]
    tok = Table(
        title="Per token (step: the longest window; parts: mean over ranks), ms", title_justify="left"
    )
    for col in ("", "median", "p10", "p90", "mean", "share of median step"):
        tok.add_column(col, justify="right")
    step_med = pt["step_ns"]["median"]
    tok.add_row(
        f"step (n={pt['step_ns']['n']})",
        units.ms(step_med),
        units.ms(pt["step_ns"]["p10"]),
        units.ms(pt["step_ns"]["p90"]),
        units.ms(pt["step_ns"]["mean"]),
        "",
    )
    for p in PARTS:
        st = pt["parts_ns"][p]
        tok.add_row(
            p,
            units.ms(st["median"]),
            units.ms(st["p10"]),
            units.ms(st["p90"]),
            units.ms(st["mean"]),
            _pct(st["median"], step_med),
        )
    ov = pt["overlapped_collective_ns"]
    tok.add_row(
        "overlapped collective",
        units.ms(ov["median"]),
        units.ms(ov["p10"]),
        units.ms(ov["p90"]),
        units.ms(ov["mean"]),
        "",
    )
    console.print(tok)

    kc = Table(title="GPU activity by class (whole trace)", title_justify="left")
    for col in ("class", "count", "total ms"):
        kc.add_column(col, justify="right")
    for cls, v in doc["kernels_by_class"].items():
        kc.add_row(cls, str(v["count"]), units.ms(v["total_ns"]))
    kc.add_row("", "", "")
    for sub, v in sorted(doc["kernels_by_subclass"].items(), key=lambda kv: -kv[1]["total_ns"]):
        kc.add_row(f"  {sub}", str(v["count"]), units.ms(v["total_ns"]))
    console.print(kc)

    tt = doc.get("trace_totals") or {}
    if tt.get("ranks"):
        console.print(
            f"Whole trace GPU timeline (summed over ranks): span {units.ms(tt['span_ns'])} ms, busy (kernels) "
            f"{units.ms(tt['busy_ns'])} ms ({_pct(tt['busy_ns'], tt['span_ns'])}), exposed memcpy "
            f"{units.ms(tt['exposed_memcpy_ns'])} ms, idle {units.ms(tt['idle_ns'])} ms ({_pct(tt['idle_ns'], tt['span_ns'])})"
        )

    if doc["unknown_kernels"]:
        uk = Table(
            title="Unknown kernels (look like communication, no collective rule matched; top by time)",
            title_justify="left",
        )
        uk.add_column("count", justify="right")
        uk.add_column("total ms", justify="right")
        uk.add_column("name", overflow="fold")
        for u in doc["unknown_kernels"]:
            uk.add_row(str(u["count"]), units.ms(u["total_ns"]), u["name"][:200])
        console.print(uk)

    dq = doc["data_quality"]
    console.print("[bold]Data quality[/bold]")
    for key, count in dq["counts"].items():
        console.print(f"  {key}: {count}")
    for note in dq["notes"]:
        console.print(f"  - {note}")
    if not dq["counts"] and not dq["notes"]:
        console.print("  nothing skipped or suspicious")
    if doc["dilation"] is not None:
        console.print(f"Profiler dilation (profiled / unprofiled per-token time): {doc['dilation']:.2f}x")
    return console.export_text(styles=color)


@click.command("breakdown", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@step_pattern_option
@click.option(
    "--rank",
    type=int,
    default=None,
    metavar="N",
    help="With one trace file: read it as rank N, overriding the rank the file says (distributedInfo; "
    "a differing one is noted in data quality). With several: show only rank N.",
)
@format_option(
    "table",
    "json",
    "csv",
    help="table for people; json (docs/JSON.md#breakdown) or csv (one row per rank and step) for machines.",
)
@out_file_option
@click.option(
    "--skip-first",
    type=int,
    default=0,
    show_default=True,
    help="Drop the first N steps of each rank (warm-up). Default 0 (shortfall's is 1): per-token "
    "figures include the first step unless --skip-first 1.",
)
@no_cache_option
@cache_dir_option
@engine_options
def command(
    paths: tuple[str, ...],
    step_pattern: str | None,
    rank: int | None,
    fmt: str,
    out: str | None,
    skip_first: int,
    no_cache: bool,
    engine: str | None,
    scheduler: str | None,
    workers: int | None,
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
    from tracekit.engine import Engine, breakdown_paths

    eng = Engine.parse(engine, scheduler, workers, progress=show_progress())
    result = breakdown_paths(
        list(paths), eng, step_pattern=step_pattern, skip_first=skip_first, rank=rank, cache=not no_cache
    )

    emit_result(
        out,
        fmt,
        result.to_json,
        lambda width, color: render_table(result, width=width, color=color),
        others={"csv": result.to_csv},
    )
