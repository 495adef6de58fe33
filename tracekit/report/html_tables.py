"""The HTML tables and folded sections of the report: key figures, the dilation, the attribution, per
rank, the critical path, the collectives, the kernels, the links, the extras (`--extra`) and the
manifests; every cell escaped (`tracekit.report.html_escape`)."""

from __future__ import annotations

import json

from tracekit.model.documents import given, to_builtins
from tracekit.model.units import fmt_ms, fmt_x
from tracekit.report.data import ReportData
from tracekit.report.html_escape import esc
from tracekit.report.html_figures import PART_COLOURS
from tracekit.report.sections import tables
from tracekit.report.sections.fmt import fmt_bytes, present_fields, prose
from tracekit.report.sections.rows import dilation_summary, path_note, short_name, top_kernels_tables
from tracekit.report.sections.shortfall import straggler_sentence
from tracekit.report.sections.tables import Table


def _table(headers: list[str], rows: list[list[tuple[str, bool]]], attrs: str = "") -> str:
    """rows: cells as (escaped html, numeric?)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if num else ''}>{cell}</td>" for cell, num in row) + "</tr>"
        for row in rows
    )
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def key_figures_table(data: ReportData) -> str:
    rows = "".join(
        f'<tr><td>{esc(k.label)}</td><td class=num data-key="{esc(k.key)}">{esc(k.text)}</td></tr>'
        for k in data.key_figures
    )
    return f'<table id="key-figures"><thead><tr><th>figure</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>'


def _html(t: Table | None) -> str:
    """A table of the report's model (`sections.tables`) as HTML: every cell escaped."""
    if t is None:
        return ""
    rows = [[(f"<b>{esc(c.text)}</b>" if c.bold else esc(c.text), c.num) for c in r] for r in t.rows]
    return _table([esc(h) for h in t.headers], rows, f' id="{t.id}"' if t.id else "")


def attribution_table(data: ReportData) -> str:
    """The terms of S with their 95% intervals (when the shortfall has them) and shares; a share
    only where the term is clear of the noise."""
    a = data.attribution
    if a is None:
        return ""
    method = a.intervals.method if a.intervals is not None else None
    return _html(tables.attribution_table(data)) + (
        f'<p class="note">Intervals: {esc(prose(method))}.</p>' if method else ""
    )


def per_rank_section(data: ReportData) -> str:
    table = tables.per_rank_table(data)
    if table is None:
        return ""
    return "\n".join(
        [
            "<h3>Per rank</h3>",
            "<p class=\"note\">Each rank's own parts minus the baseline's, each summing to S; the aggregate is "
            "their mean. Cells: per token (share of S).</p>",
            _html(table),
        ]
    )


def critical_path_section(data: ReportData, fig_div: str) -> str:
    cp = data.critical_path
    if cp is None:
        return ""
    out = ["<h2>Critical path</h2>"]
    if cp.cause:
        out.append(f'<p class="verdict-sub" id="critical-path-cause"><b>{esc(prose(cp.cause))}</b></p>')
    out += [
        fig_div,
        _html(tables.path_table(data)),
        f'<p class="note">{esc(path_note(cp))}</p>',
    ]
    return "\n".join(o for o in out if o)


def collectives_tables(data: ReportData) -> str:
    out = []
    c = data.collectives
    if c and c.by_op:
        out.append(
            f"<p>{esc(c.instances)} collective instances matched across ranks"
            + (f", {esc(round(c.per_token, 2))} per token" if c.per_token is not None else "")
            + ".</p>"
        )
        out.append(_html(tables.collectives_table(data)))
    st_line = straggler_sentence(data.straggler)
    if st_line:
        out.append(f'<p id="straggler">{esc(st_line)}</p>')
    if data.stragglers:
        out.append("<h3>Stragglers: how often each rank arrives last</h3>")
        out.append(_html(tables.stragglers_table(data)))
    return "\n".join(out)


def kernels_tables(data: ReportData) -> str:
    out = []
    for run in data.runs:
        if any(v.count for v in run.kernels_by_class.values()):
            rows = [
                [(esc(k), False), (esc(v.count), True), (esc(fmt_ms(v.total_ns)), True)]
                for k, v in run.kernels_by_class.items()
            ]
            out.append(f"<h3>{esc(run.role)} run: GPU activity by class</h3>")
            out.append(_table(["class", "count", "total"], rows))
        if run.unknown_kernels:
            rows = [
                [
                    (f"<code>{esc(k.name)}</code>", False),
                    (esc(k.count), True),
                    (esc(fmt_ms(k.total_ns)), True),
                ]
                for k in run.unknown_kernels
            ]
            out.append(f"<h3>{esc(run.role)} run: unclassified kernels (top by time)</h3>")
            out.append(_table(["name", "count", "total"], rows, ' class="unknown-kernels"'))
    return "\n".join(out)


def top_kernels_html(data: ReportData) -> str:
    out = []
    for tk in top_kernels_tables(data):
        cells = []
        for c, name, cnt, tot, mean, share, is_class in tk.rows:
            shown = esc(short_name(name))
            label = f"<b>{shown}</b>" if is_class else f'<span title="{esc(name)}">{shown}</span>'
            swatch = (
                f'<span class="swatch" style="background:{PART_COLOURS.get(c, "#999")}"></span>{esc(c)}'
                if c
                else ""
            )
            cells.append(
                [
                    (swatch, False),
                    (label, False),
                    (esc(cnt), True),
                    (esc(tot), True),
                    (esc(mean), True),
                    (esc(share), True),
                ]
            )
        out.append(f"<h3>{esc(tk.caption)}</h3>")
        out.append(f'<p class="note">{esc(tk.note)}</p>')
        out.append(_table([esc(h) for h in tk.headers], cells, ' class="top-kernels"'))
    return "\n".join(out)


def links_section(data: ReportData) -> str:
    L = data.links
    if L is None:
        return ""
    out = []
    if L.verdict:
        out.append(f'<p class="links-verdict"><b>{esc(prose(L.verdict))}</b></p>')
    if L.modes:
        out.append(f"<p>Modes: {esc(', '.join(L.modes))}</p>")
    if L.transports:
        out.append(_html(tables.transports_table(data)))
    for n in given(L.notes) or []:
        out.append(f'<p class="note">{esc(n)}</p>')
    if L.note:
        out.append(f'<p class="note">{esc(L.note)}</p>')
    return "\n".join(out)


def _indented(cell: str) -> str:
    """A cell escaped, its leading spaces (a sub-row's indent) kept as non-breaking spaces."""
    stripped = cell.lstrip(" ")
    return "&nbsp;&nbsp;" * (len(cell) - len(stripped)) + esc(stripped)


def extras_section(data: ReportData) -> str:
    """One section per --extra result (answer, figures with data-key, tables, lines, notes)."""
    out = []
    for x in data.extras:
        sid = esc(f"extra-{x.key}")
        out.append(f'<section class="extra" id="{sid}"><h2>{esc(x.title)}</h2>')
        if x.path:
            out.append(f'<p class="meta">From <code>{esc(x.path)}</code>.</p>')
        out.append(f'<p class="verdict">{esc(prose(x.answer))}</p>')
        if x.figures:
            rows = "".join(
                f'<tr><td>{esc(f.label)}</td><td class=num data-key="{esc(f.key)}">{esc(f.text)}</td></tr>'
                for f in x.figures
            )
            out.append(
                f"<table><thead><tr><th>figure</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"
            )
        for t, text_columns in zip(x.tables, x.text_columns, strict=True):
            out.append(f"<h3>{esc(t.caption)}</h3>")
            out.append(
                _table(
                    [esc(h) for h in t.headers],
                    [[(_indented(c), i not in text_columns) for i, c in enumerate(r)] for r in t.rows],
                )
            )
        out += [f'<p class="note">{esc(prose(line))}</p>' for line in x.lines]
        if x.notes:
            out.append("<ul>" + "".join(f'<li class="note">{esc(prose(n))}</li>' for n in x.notes) + "</ul>")
        out.append("</section>")
    return "\n".join(out)


def manifest_section(data: ReportData) -> str:
    out = []
    for m in data.manifests:
        out.append(f"<h3>{esc(m.role)} run{(': <code>' + esc(m.path) + '</code>') if m.path else ''}</h3>")
        if not m.present:
            out.append('<p class="note">No manifest.json: what ran and where is unknown.</p>')
            continue
        rows: list[list[tuple[str, bool]]] = []

        def add(k: str, v: object, rows: list[list[tuple[str, bool]]] = rows) -> None:
            v = to_builtins(given(v))
            if v is None or v == {} or v == []:
                return
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            rows.append([(esc(k), False), (esc(text), False)])

        for k, v in present_fields(m.workload):
            add(k, v)
        add("complete", m.complete)
        add("errors", m.errors)
        add("created", m.created)
        for k, v in present_fields(m.host):
            add(f"host.{k}", v)
        for d in given(m.devices) or []:
            add(f"device {d.index}", f"{d.name} ({fmt_bytes(d.memory_bytes)})")
        for k, v in (given(m.versions) or {}).items():
            add(f"version.{k}", v)
        add("nccl_env", m.nccl_env)
        dil = given(m.capture_dilation)
        add(
            "capture's host-clock dilation (cross-check, not the factor applied)",
            fmt_x(dil) if dil is not None else None,
        )
        add("command", m.command)
        out.append(_table(["field", "value"], rows, ' class="manifest"'))
    return "\n".join(out)


def dilation_details(data: ReportData) -> str:
    """The profiler's dilation, the cross-check and the reconciliation: collapsed under one line
    (the figures are on the page; the reader opens it for how the traced parts were corrected)."""
    d = data.dilation
    summary = dilation_summary(data, threshold_note=True)
    inner = [f'<p class="dilation" id="dilation">{esc(prose(d.sentence))}</p>']
    if d.cross_check:
        inner.append(f'<p class="dilation" id="dilation-cross-check">{esc(prose(d.cross_check))}</p>')
    if d.warning:
        inner.append(f'<p class="warning" id="dilation-warning">{esc(prose(d.warning))}</p>')
    if d.reconciliation:
        inner.append(
            f'<p class="dilation" id="reconciliation">Reconciliation: {esc(prose(d.reconciliation))}</p>'
        )
    a = data.attribution
    if a is not None:
        inner.append(
            f'<p class="note">Uncorrected (trace-only) shortfall: {esc(fmt_ms(a.uncorrected.shortfall_ns))} per token.</p>'
        )
    inner.append(_html(tables.dilation_table(data)))
    caution = f'<p class="warning" id="dilation-caution">{esc(prose(d.caution))}</p>' if d.caution else ""
    return (
        f'{caution}<details id="dilation-details"><summary>{esc(summary)}</summary>'
        + "\n".join(x for x in inner if x)
        + "</details>"
    )
