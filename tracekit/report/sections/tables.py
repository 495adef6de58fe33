"""The report's tables as one model that both writers lay out: the HTML page (`report.html_tables`)
and the Markdown (`report.markdown`) print the same headers and cells from the same `Table`, each
escaping and marking up a cell its own way.

A `Cell` says what its text is, not how it looks: `num` (a number column: right-aligned on the
page), `name` (words from a trace, a file or the analysis's vocabulary, which Markdown escapes; the
other cells are numbers and fixed words, which it prints as they are) and `bold`. The page
escapes every cell."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracekit.model.documents.report import ReportByOpItem, ReportRun
from tracekit.model.documents.shortfall import ShortfallStraggler_
from tracekit.model.units import fmt_ms, fmt_pct, fmt_us, fmt_x
from tracekit.report.sections.fmt import fmt_bytes, fmt_gbps, fmt_ms_interval, fmt_x_interval
from tracekit.report.sections.rows import (
    attribution_headers,
    host_clock_text,
    path_rows,
    per_rank_rows,
    spread_text,
)
from tracekit.report.sections.shortfall import share_text

if TYPE_CHECKING:
    from tracekit.report.data import ReportData


@dataclass(frozen=True)
class Cell:
    """One cell: its text, and what the text is (see the module)."""

    text: str
    num: bool = True
    name: bool = False
    bold: bool = False


def label(text: str, *, bold: bool = False) -> Cell:
    """A row's label: words, not a number."""
    return Cell(text, num=False, name=True, bold=bold)


@dataclass(frozen=True)
class Table:
    """Headers (escaped by both writers: they can hold a term's words) and rows of cells; `id`: the
    page's element id of the table (the Markdown has none)."""

    headers: list[str]
    rows: list[list[Cell]]
    id: str | None = None


def _text_rows(headers: list[str], rows: list[list[str]], id: str) -> Table:
    """Rows of printed text from `rows.py` (a label, then figures holding names: both escaped)."""
    return Table(headers, [[Cell(c, num=i > 0, name=True) for i, c in enumerate(r)] for r in rows], id)


def _columns_table(
    columns: Sequence[tuple[str, Callable[[Any], Cell]]], items: Iterable[Any], id: str | None = None
) -> Table:
    """A table of one row per item, each column a header and the cell it makes of the item."""
    return Table([h for h, _ in columns], [[cell(x) for _, cell in columns] for x in items], id)


#: per run, the dilation the shortfall applied and the capture's host-clock figure beside it
DILATION_APPLIED: tuple[tuple[str, Callable[[ReportRun], Cell]], ...] = (
    ("run", lambda d: label(d.run)),
    ("dilation applied (95% interval)", lambda d: Cell(fmt_x_interval(d.dilation, d.interval))),
    ("per token, traced (mean)", lambda d: Cell(fmt_ms(d.traced_mean_ns))),
    ("per token, unprofiled (mean)", lambda d: Cell(fmt_ms(d.unprofiled_mean_ns))),
    ("cross-check: capture host clock", lambda d: Cell(host_clock_text(d))),
)
#: per run, the capture's host-clock dilation alone (no shortfall applied one)
DILATION_HOST_CLOCK: tuple[tuple[str, Callable[[ReportRun], Cell]], ...] = (
    ("run", lambda d: label(d.run)),
    ("per token, unprofiled (median)", lambda d: Cell(fmt_ms(d.unprofiled_median_ns))),
    ("per token, profiled (median)", lambda d: Cell(fmt_ms(d.profiled_median_ns))),
    ("dilation (host clock)", lambda d: Cell(fmt_x(d.dilation))),
)
#: per (op, message size) of the matched collectives
COLLECTIVES: tuple[tuple[str, Callable[[ReportByOpItem], Cell]], ...] = (
    ("op", lambda o: label(o.op)),
    ("message", lambda o: Cell(fmt_bytes(o.bytes))),
    ("count", lambda o: Cell(str(o.count))),
    ("wait (median of per-collective max)", lambda o: Cell(fmt_us(o.wait_ns_median))),
    ("transfer (median)", lambda o: Cell(fmt_us(o.transfer_ns_median))),
    ("skew (median)", lambda o: Cell(fmt_us(o.skew_ns_median))),
    ("busbw (median)", lambda o: Cell(fmt_gbps(o.busbw_gbps_median))),
)
#: per rank, how often it arrived last
STRAGGLERS: tuple[tuple[str, Callable[[ShortfallStraggler_], Cell]], ...] = (
    ("rank", lambda s: Cell(str(s.rank))),
    ("last", lambda s: Cell(str(s.last_count))),
    ("of instances", lambda s: Cell(str(s.instances))),
    ("share", lambda s: Cell(fmt_pct(s.share))),
)


def dilation_table(data: ReportData) -> Table | None:
    """Per run the dilation applied (with a shortfall), else the capture's host-clock figures."""
    runs = data.dilation.runs
    applied = [d for d in runs if d.source == "applied" and d.dilation is not None]
    if applied:
        return _columns_table(DILATION_APPLIED, applied, "dilation-table")
    measured = [d for d in runs if d.unprofiled_median_ns is not None]
    return _columns_table(DILATION_HOST_CLOCK, measured) if measured else None


def attribution_table(data: ReportData) -> Table | None:
    """The terms of S (the waterfall's numbers) with their 95% intervals when the shortfall has
    them, a share only where the term is clear of the noise, and the total."""
    a = data.attribution
    if a is None:
        return None
    s_ns = a.shortfall_ns
    ivs = a.intervals
    rows = []
    for w in a.waterfall:
        row = [label(w.label), Cell(fmt_ms(w.ns))]
        if ivs is not None:
            row.append(Cell(fmt_ms_interval(w.interval_ns, 3)))
        rows.append([*row, Cell(share_text(w, s_ns)), Cell(spread_text(a, w))])
    total = [label("shortfall S", bold=True), Cell(fmt_ms(s_ns), bold=True)]
    if ivs is not None:
        total.append(Cell(fmt_ms_interval(ivs.shortfall_ns, 3)))
    rows.append([*total, Cell("100.0%"), Cell("")])
    return Table(attribution_headers(ivs is not None), rows, "attribution")


def per_rank_table(data: ReportData) -> Table | None:
    """Each rank's own attribution of S beside the aggregate."""
    headers, rows = per_rank_rows(data)
    return _text_rows(headers, rows, "per-rank") if rows else None


def path_table(data: ReportData) -> Table:
    """Per rank what lies on the critical path, and the offset."""
    return _text_rows(*path_rows(data), "critical-path")


def collectives_table(data: ReportData) -> Table | None:
    """Per (op, message size): count, wait, transfer, skew, realised busbw."""
    c = data.collectives
    return _columns_table(COLLECTIVES, c.by_op) if c and c.by_op else None


def stragglers_table(data: ReportData) -> Table | None:
    """How often each rank arrives last."""
    return _columns_table(STRAGGLERS, data.stragglers, "stragglers") if data.stragglers else None


def transports_table(data: ReportData) -> Table | None:
    """Per link mode, what its run really used."""
    L = data.links
    if L is None or not L.transports:
        return None
    return Table(
        ["mode", "what the run used"],
        [[label(k), Cell(v, num=False, name=True)] for k, v in L.transports.items()],
    )
