"""The view of a diff (`tracekit diff`'s table and Markdown): its typed document
(`tracekit.model.documents.Diff`, docs/JSON.md#diff) as tables of rows, then text or Markdown."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from tracekit.model import units
from tracekit.model.documents import Diff
from tracekit.model.documents.shortfall import ShortfallAppliedBaseline
from tracekit.render.writers import console_text, escape, markdown_table, text_console, titled_table

#: one rendered table: title, header, rows (strings)
Section = tuple[str, list[str], list[list[str]]]

_NAME_WIDTH = 64

_ms = units.ms
_us = units.us
_dms = functools.partial(units.ms, sign=True)
_dus = functools.partial(units.us, sign=True)
_pct = functools.partial(units.pct, sign=True)


def _iv(iv: Sequence[float | None] | None, fmt: Callable[..., str] = _dms) -> str:
    return "-" if not iv else f"{fmt(iv[0])} .. {fmt(iv[1])}"


def _name(text: str | None) -> str:
    """Long kernel names keep their head and tail (template variants differ at the end)."""
    text = text or ""
    if len(text) <= _NAME_WIDTH:
        return text
    half = (_NAME_WIDTH - 3) // 2
    return text[:half] + "..." + text[-(_NAME_WIDTH - 3 - half) :]


def _count(x: float | None) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x is not None and x == x else "-"


def sections(doc: Diff) -> list[Section]:
    """The tables of the human-readable forms (table and md), from the document."""
    out: list[Section] = []
    pt = doc.per_token_ns
    iv = doc.interval
    own = doc.per_token_interval_ns
    rel = f"; relative {_pct(doc.relative_change)}"
    if iv.relative:
        rel += f" ({_iv(iv.relative, _pct)})"
    runs = doc.runs
    out.append(
        (
            f"Per-token time, ms ({doc.per_token_source}: {doc.per_token_source_reason})",
            ["", "ms", "95% interval (bootstrap)", "tokens (rounds)"],
            [
                [
                    "before",
                    _ms(pt.before),
                    _iv(own.before, _ms),
                    f"{runs.before.tokens} ({runs.before.rounds})",
                ],
                ["after", _ms(pt.after), _iv(own.after, _ms), f"{runs.after.tokens} ({runs.after.rounds})"],
                ["change" + rel, _dms(doc.change_ns), _iv(iv.change_ns), ""],
            ],
        )
    )
    bp = doc.by_part
    rows = []
    for g, r in bp.terms.items():
        rows.append([g, _ms(r.before_ns), _ms(r.after_ns), _dms(r.change_ns), _iv(r.interval_ns)])
        subs = (
            ("matrix", "vector")
            if g == "compute"
            else (("wait", "sync", "idle") if g == "coordination" else ())
        )
        for k in subs:
            if k in bp.leaves:
                s = bp.leaves[k]
                rows.append(
                    [f"  {g}: {k}", _ms(s.before_ns), _ms(s.after_ns), _dms(s.change_ns), _iv(s.interval_ns)]
                )
    rows.append(["per token", _ms(pt.before), _ms(pt.after), _dms(doc.change_ns), _iv(iv.change_ns)])
    out.append(
        (
            "The change by part, ms per token (mean over ranks; the changes sum to the per-token change exactly)",
            ["part", "before", "after", "change", "95% interval"],
            rows,
        )
    )
    if doc.per_rank:
        ranks = doc.per_rank
        header = ["part", *[f"rank {r.rank}" for r in ranks]]
        rows = []
        for g in ranks[0].change_ns:
            if g == "unknown" and not any(r.change_ns[g] for r in ranks):
                continue
            rows.append([g, *[_dms(r.change_ns[g]) for r in ranks]])
        for k in ("wait", "sync", "idle"):
            rows.append([f"  coordination: {k}", *[_dms(r.coordination_ns[k]) for r in ranks]])
        out.append(
            (
                "Per rank: each rank's own parts, change in ms per token (each sums to the change)",
                header,
                rows,
            )
        )
    cp = doc.critical_path
    ranks_cp = sorted(cp.change.by_rank, key=int)
    if ranks_cp:
        header = ["on the path", *[f"rank {r} before / after / change" for r in ranks_cp]]
        rows = []
        for p in ("compute", "memory", "transfer", "host", "sync", "unknown"):
            cells = []
            for rank in ranks_cp:
                rb, ra = cp.before.by_rank.get(rank), cp.after.by_rank.get(rank)
                b = getattr(rb, f"{p}_ns") if rb is not None else 0
                a = getattr(ra, f"{p}_ns") if ra is not None else 0
                d = getattr(cp.change.by_rank[rank], f"{p}_ns")
                cells.append(f"{_ms(b)} / {_ms(a)} / {_dms(d)}")
            if p in ("memory", "unknown", "sync") and all(c == "0.000 / 0.000 / +0.000" for c in cells):
                continue
            rows.append([p, *cells])
        rows.append(
            [
                "offset",
                f"{_ms(cp.before.offset_ns)} / {_ms(cp.after.offset_ns)} / {_dms(cp.change.offset_ns)}",
                *["" for _ in ranks_cp[1:]],
            ]
        )
        out.append(("Critical path of a token, ms (whose work the token waited on)", header, rows))
    if doc.kernels:
        rows = [
            [
                _name(k.name),
                k.status or "",
                f"{_count(k.count_before)} / {_count(k.count_after)}",
                _us(k.time_ns_before),
                _us(k.time_ns_after),
                _dus(k.time_ns_change),
            ]
            for k in doc.kernels
        ]
        out.append(
            (
                "Kernels that moved most (matched by name; per token per rank, traced durations; on CPU runs "
                "host ops, inclusive)",
                ["name", "status", "count before / after", "us before", "us after", "us change"],
                rows,
            )
        )
    if doc.collectives:
        rows = [
            [
                c.op or "",
                str(c.bytes) if c.bytes is not None and c.bytes >= 0 else "?",
                c.status or "",
                f"{_count(c.count_before)} / {_count(c.count_after)}",
                _dus(c.wait_ns_change),
                _dus(c.transfer_ns_change),
                _dus(c.time_ns_change),
            ]
            for c in doc.collectives
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


def _dilation_words(d: ShortfallAppliedBaseline) -> str:
    if d.factor is None:
        return "unknown"
    text = f"{d.factor:.2f}x"
    if d.interval:
        text += f" [{d.interval[0]:.2f}-{d.interval[1]:.2f}]"
    return text


def _dilation_lines(doc: Diff) -> list[str]:
    dil = doc.dilation
    return [
        "Profiler dilation D applied (profiled / unprofiled per-token time as the capture measured it; 95% "
        f"interval): before {_dilation_words(dil.before)}, after {_dilation_words(dil.after)}"
    ]


def _notes(doc: Diff) -> list[str]:
    dq = doc.data_quality
    return [f"{k}: {v}" for k, v in dq.counts.items()] + list(dq.notes)


def table(doc: Diff, width: int | None = None, color: bool = True) -> str:
    """The terminal form: the summary, the warning, every section as a table, the dilation, notes."""
    console = text_console(width, color, default_width=140)
    console.print(f"[bold]{escape(doc.summary or '')}[/bold]")
    warning = doc.dilation.warning
    if warning:
        console.print(f"[bold]Warning:[/bold] {escape(warning)}")
    console.print()
    for title, header, rows in sections(doc):
        t = titled_table(escape(title), [escape(h) for h in header], left=[escape(h) for h in header[:1]])
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
    return console_text(console, color)


def markdown(doc: Diff) -> str:
    """The Markdown form: the same sections as Markdown tables (number columns right-aligned)."""
    lines = [f"# tracekit diff: {doc.runs.before.path} -> {doc.runs.after.path}", ""]
    lines += [f"**{doc.summary}**", ""]
    if doc.dilation.warning:
        lines += [f"> Warning: {doc.dilation.warning}", ""]
    for title, header, rows in sections(doc):
        lines += [f"### {title}", "", *markdown_table(header, rows), ""]
    lines += [*_dilation_lines(doc), ""]
    notes = _notes(doc)
    if notes:
        lines += ["Data quality:", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)
