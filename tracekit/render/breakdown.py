"""The view of a breakdown (`tracekit breakdown`'s table): its typed document
(`tracekit.model.documents.Breakdown`, docs/JSON.md#breakdown) as text."""

from __future__ import annotations

from tracekit.model import units
from tracekit.model.documents import Breakdown, given
from tracekit.model.parts import PARTS
from tracekit.render.writers import Table, console_text, text_console, titled_table

#: Steps listed in the terminal table (the per-rank and per-token summaries cover all of them).
MAX_STEP_ROWS = 40


def _pct(ns: int | float | None, total: int | float | None) -> str:
    """`ns` as a share of `total` ("-" without a total)."""
    return units.pct(None if ns is None or not total else ns / total)


def table(doc: Breakdown, width: int | None = None, color: bool = True) -> str:
    """The human-readable report (rich tables) as text."""
    console = text_console(width, color)
    src = doc.source
    console.print(
        f"[bold]tracekit breakdown[/bold]  ranks {src.ranks}  steps by rule {given(src.step_rule)!r} "
        f"({src.step_pattern!r})  "
        f"timeline {src.timeline}"
        + (
            f"  (first {src.skipped_steps_per_rank} steps per rank skipped)"
            if src.skipped_steps_per_rank
            else ""
        )
    )

    steps = titled_table("Steps (ms)", ("rank", "step", "window", *PARTS, "overlapped coll."))
    shown = doc.steps[:MAX_STEP_ROWS]
    for s in shown:
        steps.add_row(
            str(s.rank),
            str(s.step),
            units.ms(s.window_ns),
            *(units.ms(s.parts_ns[p]) for p in PARTS),
            units.ms(s.overlapped_collective_ns),
        )
    console.print(steps)
    if len(doc.steps) > len(shown):
        console.print(
            f"  ... {len(doc.steps) - len(shown)} more steps (all of them with --format csv or json)"
        )

    per_rank = titled_table(
        "Per rank: median over steps, ms and share of the median step",
        ("rank", "steps", "timeline", "step", *PARTS),
        no_wrap=True,
    )
    for r in doc.per_rank:
        total = r.step_ns_median
        med = r.parts_ns_median
        per_rank.add_row(
            str(r.rank), str(r.steps), r.timeline, units.ms(total), *(units.ms(med[p]) for p in PARTS)
        )
        per_rank.add_row("", "", "", "", *(_pct(med[p], total) for p in PARTS))
    console.print(per_rank)

    pt = doc.per_token
    tok = titled_table(
        "Per token (step: the longest window; parts: mean over ranks), ms",
        ("", "median", "p10", "p90", "mean", "share of median step"),
    )
    step_med = pt.step_ns.median
    tok.add_row(
        f"step (n={pt.step_ns.n})",
        units.ms(step_med),
        units.ms(pt.step_ns.p10),
        units.ms(pt.step_ns.p90),
        units.ms(pt.step_ns.mean),
        "",
    )
    for p in PARTS:
        st = pt.parts_ns[p]
        tok.add_row(
            p,
            units.ms(st.median),
            units.ms(st.p10),
            units.ms(st.p90),
            units.ms(st.mean),
            _pct(st.median, step_med),
        )
    ov = pt.overlapped_collective_ns
    tok.add_row(
        "overlapped collective",
        units.ms(ov.median),
        units.ms(ov.p10),
        units.ms(ov.p90),
        units.ms(ov.mean),
        "",
    )
    console.print(tok)

    kc = titled_table("GPU activity by class (whole trace)", ("class", "count", "total ms"))
    for cls, v in doc.kernels_by_class.items():
        kc.add_row(cls, str(v.count), units.ms(v.total_ns))
    kc.add_row("", "", "")
    for sub, v in sorted(doc.kernels_by_subclass.items(), key=lambda kv: -kv[1].total_ns):
        kc.add_row(f"  {sub}", str(v.count), units.ms(v.total_ns))
    console.print(kc)

    tt = given(doc.trace_totals)
    if tt is not None and tt.ranks:
        console.print(
            f"Whole trace GPU timeline (summed over ranks): span {units.ms(tt.span_ns)} ms, busy (kernels) "
            f"{units.ms(tt.busy_ns)} ms ({_pct(tt.busy_ns, tt.span_ns)}), exposed memcpy "
            f"{units.ms(tt.exposed_memcpy_ns)} ms, idle {units.ms(tt.idle_ns)} ms ({_pct(tt.idle_ns, tt.span_ns)})"
        )

    if doc.unknown_kernels:
        uk = Table(
            title="Unknown kernels (look like communication, no collective rule matched; top by time)",
            title_justify="left",
        )
        uk.add_column("count", justify="right")
        uk.add_column("total ms", justify="right")
        uk.add_column("name", overflow="fold")
        for u in doc.unknown_kernels:
            uk.add_row(str(u.count), units.ms(u.total_ns), u.name[:200])
        console.print(uk)

    dq = doc.data_quality
    console.print("[bold]Data quality[/bold]")
    for key, count in dq.counts.items():
        console.print(f"  {key}: {count}")
    for note in dq.notes:
        console.print(f"  - {note}")
    if not dq.counts and not dq.notes:
        console.print("  nothing skipped or suspicious")
    if doc.dilation is not None:
        console.print(f"Profiler dilation (profiled / unprofiled per-token time): {doc.dilation:.2f}x")
    return console_text(console, color)
