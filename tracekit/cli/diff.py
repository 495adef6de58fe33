"""`tracekit diff BEFORE AFTER`: two runs of the same workload side by side, and a CI gate (issue 20)."""

from __future__ import annotations

import functools
import io
import math
import re
from typing import Any

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
from tracekit.errors import TracekitError
from tracekit.model import units

#: one rendered table: title, header, rows (strings)
Section = tuple[str, list[str], list[list[str]]]

_NAME_WIDTH = 64


_ms = units.ms
_us = units.us
_dms = functools.partial(units.ms, sign=True)
_dus = functools.partial(units.us, sign=True)
_pct = functools.partial(units.pct, sign=True)


def _iv(iv: list[float] | None, fmt: Any = _dms) -> str:
    return "-" if not iv else f"{fmt(iv[0])} .. {fmt(iv[1])}"


def _name(text: str) -> str:
    """Long kernel names keep their head and tail (template variants differ at the end)."""
    if len(text) <= _NAME_WIDTH:
        return text
    half = (_NAME_WIDTH - 3) // 2
    return text[:half] + "..." + text[-(_NAME_WIDTH - 3 - half) :]


def _count(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x == x else "-"


def sections(doc: dict[str, Any]) -> list[Section]:
    """The tables of the human-readable forms (table and md), from the JSON document."""
    out: list[Section] = []
    pt = doc["per_token_ns"]
    iv = doc["interval"]
    own = doc["per_token_interval_ns"]
    rel = f"; relative {_pct(doc['relative_change'])}"
    if iv["relative"]:
        rel += f" ({_iv(iv['relative'], _pct)})"
    out.append(
        (
            f"Per-token time, ms ({doc['per_token_source']}: {doc['per_token_source_reason']})",
            ["", "ms", "95% interval (bootstrap)", "tokens (rounds)"],
            [
                [
                    "before",
                    _ms(pt["before"]),
                    _iv(own["before"], _ms),
                    f"{doc['runs']['before']['tokens']} ({doc['runs']['before']['rounds']})",
                ],
                [
                    "after",
                    _ms(pt["after"]),
                    _iv(own["after"], _ms),
                    f"{doc['runs']['after']['tokens']} ({doc['runs']['after']['rounds']})",
                ],
                ["change" + rel, _dms(doc["change_ns"]), _iv(iv["change_ns"]), ""],
            ],
        )
    )
    bp = doc["by_part"]
    rows = []
    for g, r in bp["terms"].items():
        rows.append([g, _ms(r["before_ns"]), _ms(r["after_ns"]), _dms(r["change_ns"]), _iv(r["interval_ns"])])
        subs = (
            ("matrix", "vector")
            if g == "compute"
            else (("wait", "sync", "idle") if g == "coordination" else ())
        )
        for k in subs:
            if k in bp["leaves"]:
                s = bp["leaves"][k]
                rows.append(
                    [
                        f"  {g}: {k}",
                        _ms(s["before_ns"]),
                        _ms(s["after_ns"]),
                        _dms(s["change_ns"]),
                        _iv(s["interval_ns"]),
                    ]
                )
    rows.append(
        ["per token", _ms(pt["before"]), _ms(pt["after"]), _dms(doc["change_ns"]), _iv(iv["change_ns"])]
    )
    out.append(
        (
            "The change by part, ms per token (mean over ranks; the changes sum to the per-token change exactly)",
            ["part", "before", "after", "change", "95% interval"],
            rows,
        )
    )
    if doc["per_rank"]:
        ranks = doc["per_rank"]
        header = ["part", *[f"rank {r['rank']}" for r in ranks]]
        rows = []
        for g in ranks[0]["change_ns"]:
            if g == "unknown" and not any(r["change_ns"][g] for r in ranks):
                continue
            rows.append([g, *[_dms(r["change_ns"][g]) for r in ranks]])
        for k in ("wait", "sync", "idle"):
            rows.append([f"  coordination: {k}", *[_dms(r["coordination_ns"][k]) for r in ranks]])
        out.append(
            (
                "Per rank: each rank's own parts, change in ms per token (each sums to the change)",
                header,
                rows,
            )
        )
    cp = doc["critical_path"]
    ranks_cp = sorted(cp["change"]["by_rank"], key=int)
    if ranks_cp:
        header = ["on the path", *[f"rank {r} before / after / change" for r in ranks_cp]]
        rows = []
        for p in ("compute", "memory", "transfer", "host", "sync", "unknown"):
            cells = []
            for r in ranks_cp:
                b = cp["before"]["by_rank"].get(r, {}).get(f"{p}_ns", 0)
                a = cp["after"]["by_rank"].get(r, {}).get(f"{p}_ns", 0)
                d = cp["change"]["by_rank"][r][f"{p}_ns"]
                cells.append(f"{_ms(b)} / {_ms(a)} / {_dms(d)}")
            if p in ("memory", "unknown", "sync") and all(c == "0.000 / 0.000 / +0.000" for c in cells):
                continue
            rows.append([p, *cells])
        rows.append(
            [
                "offset",
                f"{_ms(cp['before']['offset_ns'])} / {_ms(cp['after']['offset_ns'])} / {_dms(cp['change']['offset_ns'])}",
                *["" for _ in ranks_cp[1:]],
            ]
        )
        out.append(("Critical path of a token, ms (whose work the token waited on)", header, rows))
    if doc["kernels"]:
        rows = [
            [
                _name(k["name"]),
                k["status"],
                f"{_count(k['count_before'])} / {_count(k['count_after'])}",
                _us(k["time_ns_before"]),
                _us(k["time_ns_after"]),
                _dus(k["time_ns_change"]),
            ]
            for k in doc["kernels"]
        ]
        out.append(
            (
                "Kernels that moved most (matched by name; per token per rank, traced durations; on CPU runs "
                "host ops, inclusive)",
                ["name", "status", "count before / after", "us before", "us after", "us change"],
                rows,
            )
        )
    if doc["collectives"]:
        rows = [
            [
                c["op"],
                str(c["bytes"]) if c["bytes"] >= 0 else "?",
                c["status"],
                f"{_count(c['count_before'])} / {_count(c['count_after'])}",
                _dus(c["wait_ns_change"]),
                _dus(c["transfer_ns_change"]),
                _dus(c["time_ns_change"]),
            ]
            for c in doc["collectives"]
        ]
        out.append(
            (
                "Collectives that moved most (matched by op and bytes; per token per rank, traced)",
                [
                    "op",
                    "bytes",
                    "status",
                    "count before / after",
                    "wait us change",
                    "transfer us change",
                    "us change",
                ],
                rows,
            )
        )
    return out


def _dilation_lines(doc: dict[str, Any]) -> list[str]:
    dil = doc["dilation"]

    def one(d: dict[str, Any]) -> str:
        if d["factor"] is None:
            return "unknown"
        text = f"{d['factor']:.2f}x"
        if d.get("interval"):
            text += f" [{d['interval'][0]:.2f}-{d['interval'][1]:.2f}]"
        return text

    lines = [
        f"Profiler dilation D applied (profiled / unprofiled per-token time as the capture measured it; 95% interval): before {one(dil['before'])}, "
        f"after {one(dil['after'])}"
    ]
    return lines


def _notes(doc: dict[str, Any]) -> list[str]:
    dq = doc["data_quality"]
    return [f"{k}: {v}" for k, v in dq["counts"].items()] + list(dq["notes"])


def render_table(doc: dict[str, Any], width: int | None = None, color: bool = True) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(
        record=True, width=width or 140, force_terminal=color, no_color=not color, file=io.StringIO()
    )
    console.print(f"[bold]{escape(doc['summary'])}[/bold]")
    warning = doc["dilation"]["warning"]
    if warning:
        console.print(f"[bold]Warning:[/bold] {escape(warning)}")
    console.print()
    for title, header, rows in sections(doc):
        t = Table(title=escape(title), title_justify="left")
        for i, h in enumerate(header):
            t.add_column(escape(h), justify="left" if i == 0 else "right")
        for r in rows:
            t.add_row(*[escape(c) for c in r])
        console.print(t)
    for line in _dilation_lines(doc):
        console.print(escape(line))
    notes = _notes(doc)
    if notes:
        console.print("[bold]Data quality[/bold]")
        for n in notes:
            console.print(f"  - {escape(n)}")
    return console.export_text(styles=color)


def render_markdown(doc: dict[str, Any]) -> str:
    def cell(s: str) -> str:
        # a sub-row's indent as non-breaking spaces: Markdown trims the spaces of a cell
        body = s.lstrip(" ")
        return "&nbsp;" * (len(s) - len(body)) + body.replace("|", "\\|").replace("<", "&lt;").replace(
            ">", "&gt;"
        )

    lines = [f"# tracekit diff: {doc['runs']['before']['path']} -> {doc['runs']['after']['path']}", ""]
    lines += [f"**{doc['summary']}**", ""]
    if doc["dilation"]["warning"]:
        lines += [f"> Warning: {doc['dilation']['warning']}", ""]
    for title, header, rows in sections(doc):
        lines += [f"### {title}", "", "| " + " | ".join(cell(h) for h in header) + " |"]
        # number columns right-aligned: every filled cell starts as a number does
        num = [
            i > 0 and all(re.match(r"[-+]?[\d.]", r[i].strip()) for r in rows if i < len(r) and r[i].strip())
            for i in range(len(header))
        ]
        lines.append("| " + " | ".join("---:" if n else "---" for n in num) + " |")
        lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
        lines.append("")
    lines += [*_dilation_lines(doc), ""]
    notes = _notes(doc)
    if notes:
        lines += ["Data quality:", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


def _tp_of(run: Any, partial: bool) -> int | None:
    """A run's TP degree: its manifest's workload.tp when that is a sane integer, else its ranks
    (unknown with --allow-partial: ranks are missing on purpose there)."""
    wl = (run.manifest or {}).get("workload")
    tp = wl.get("tp") if isinstance(wl, dict) else None
    if isinstance(tp, int) and not isinstance(tp, bool) and 0 < tp <= 1 << 16:
        return tp
    return None if partial else len(run.ranks)


@click.command("diff", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("before", metavar="BEFORE")
@click.argument("after", metavar="AFTER")
@format_option(
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
@step_pattern_option
@click.option("--skip-first", type=int, default=1, show_default=True, help="Warm-up steps left out.")
@click.option(
    "--dilation-threshold",
    type=float,
    default=0.10,
    show_default=True,
    help="A profiled pass faster than the unprofiled one by more than this: per-token times from the traces.",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Match collectives even when their group names ranks that are not in the run.",
)
@click.option(
    "--allow-tp-change",
    is_flag=True,
    help="Compare runs of different TP degrees (refused without it: the change would be the sharding; "
    "`tracekit shortfall --baseline TP1 --sharded TPN` is the analysis of that).",
)
@out_file_option
@no_cache_option
@cache_dir_option
@engine_options
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
    no_cache: bool,
    engine: str | None,
    scheduler: str | None,
    workers: int | None,
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
    from tracekit.engine import Engine, diff_paths

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
    eng = Engine.parse(engine, scheduler, workers, progress=show_progress())
    result, run_b, run_a = diff_paths(
        before,
        after,
        eng,
        before_path=before,
        after_path=after,
        top=top,
        cache=not no_cache,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        allow_partial=allow_partial,
    )
    # after diff's own refusals (a partial group, no steps ...): those name the problem first
    tp_b, tp_a = _tp_of(run_b, allow_partial), _tp_of(run_a, allow_partial)
    if None not in (tp_b, tp_a) and tp_b != tp_a and not allow_tp_change:
        raise TracekitError(
            f"{after}: TP={tp_a} against {before}: TP={tp_b}: diff compares runs of one TP degree; "
            "for what sharding costs use `tracekit shortfall --baseline <TP=1 run> --sharded <TP=N run>`, "
            "or give --allow-tp-change"
        )
    doc = result.to_json()
    emit_result(
        out,
        fmt,
        lambda: doc,
        lambda width, color: render_table(doc, width=width, color=color),
        others={"md": lambda: render_markdown(doc)},
        file_width=140,
    )
    if pct is not None and result.fails(pct):
        click.echo(f"tracekit: {result.gate_line(pct)}", err=True)
        raise click.exceptions.Exit(1)
