"""The HTML tables and folded sections of the report: key figures, the dilation, the attribution, per
rank, the critical path, the collectives, the kernels, the links, the extras (`--extra`) and the
manifests; every cell escaped (`tracekit.report.html_escape`)."""

from __future__ import annotations

import json

from tracekit.model.documents import given, to_builtins
from tracekit.model.units import fmt_ms, fmt_pct, fmt_us, fmt_x
from tracekit.report.data import ReportData
from tracekit.report.html_escape import esc
from tracekit.report.html_figures import PART_COLOURS
from tracekit.report.sections.fmt import (
    fmt_bytes,
    fmt_gbps,
    fmt_ms_interval,
    fmt_x_interval,
    present_fields,
    prose,
)
from tracekit.report.sections.rows import (
    COLLECTIVE_HEADERS,
    DILATION_APPLIED_HEADERS,
    DILATION_HOST_CLOCK_HEADERS,
    STRAGGLER_HEADERS,
    TOP_KERNEL_HEADERS,
    attribution_headers,
    corrected,
    dilation_figures,
    host_clock_text,
    path_note,
    path_rows,
    per_rank_rows,
    short_name,
    spread_text,
    top_kernel_rows,
    top_kernels_caption,
    top_kernels_note,
)
from tracekit.report.sections.shortfall import share_text, straggler_sentence


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


def _dilation_table(data: ReportData) -> str:
    applied = [d for d in data.dilation.runs if d.source == "applied" and d.dilation is not None]
    if applied:
        rows_a = [
            [
                (esc(d.run), False),
                (esc(fmt_x_interval(d.dilation, d.interval)), True),
                (esc(fmt_ms(d.traced_mean_ns)), True),
                (esc(fmt_ms(d.unprofiled_mean_ns)), True),
                (esc(host_clock_text(d)), True),
            ]
            for d in applied
        ]
        return _table(
            list(DILATION_APPLIED_HEADERS),
            rows_a,
            ' id="dilation-table"',
        )
    runs = [d for d in data.dilation.runs if d.unprofiled_median_ns is not None]
    if not runs:
        return ""
    rows = [
        [
            (esc(d.run), False),
            (esc(fmt_ms(d.unprofiled_median_ns)), True),
            (esc(fmt_ms(d.profiled_median_ns)), True),
            (esc(fmt_x(d.dilation)), True),
        ]
        for d in runs
    ]
    return _table(
        list(DILATION_HOST_CLOCK_HEADERS),
        rows,
    )


def attribution_table(data: ReportData) -> str:
    """The terms of S with their 95% intervals (when the shortfall has them) and shares; a share
    only where the term is clear of the noise."""
    a = data.attribution
    if a is None:
        return ""
    s_ns = a.shortfall_ns
    ivs = a.intervals
    rows = []
    for w in a.waterfall:
        spread = spread_text(a, w)
        row = [(esc(w.label), False), (esc(fmt_ms(w.ns)), True)]
        if ivs is not None:
            row.append((esc(fmt_ms_interval(w.interval_ns, 3)), True))
        row.append((esc(share_text(w, s_ns)), True))
        row.append((esc(spread), True))
        rows.append(row)
    total = [("<b>shortfall S</b>", False), (f"<b>{esc(fmt_ms(s_ns))}</b>", True)]
    if ivs is not None:
        total.append((esc(fmt_ms_interval(ivs.shortfall_ns, 3)), True))
    rows.append([*total, ("100.0%", True), ("", True)])
    headers = attribution_headers(ivs is not None)
    table = _table(headers, rows, ' id="attribution"')
    method = ivs.method if ivs is not None else None
    return table + (f'<p class="note">Intervals: {esc(prose(method))}.</p>' if method else "")


def _text_table(headers: list[str], rows: list[list[str]], attrs: str = "") -> str:
    """A table of text rows (first column a label, the rest numbers), escaped."""
    return _table(
        [esc(h) for h in headers],
        [[(esc(c), i > 0) for i, c in enumerate(r)] for r in rows],
        attrs,
    )


def per_rank_section(data: ReportData) -> str:
    headers, rows = per_rank_rows(data)
    if not rows:
        return ""
    return "\n".join(
        [
            "<h3>Per rank</h3>",
            "<p class=\"note\">Each rank's own parts minus the baseline's, each summing to S; the aggregate is "
            "their mean. Cells: per token (share of S).</p>",
            _text_table(headers, rows, ' id="per-rank"'),
        ]
    )


def critical_path_section(data: ReportData, fig_div: str) -> str:
    cp = data.critical_path
    if cp is None:
        return ""
    headers, rows = path_rows(data)
    out = ["<h2>Critical path</h2>"]
    if cp.cause:
        out.append(f'<p class="verdict-sub" id="critical-path-cause"><b>{esc(prose(cp.cause))}</b></p>')
    out += [
        fig_div,
        _text_table(headers, rows, ' id="critical-path"'),
        f'<p class="note">{esc(path_note(cp))}</p>',
    ]
    return "\n".join(o for o in out if o)


def collectives_tables(data: ReportData) -> str:
    out = []
    c = data.collectives
    if c and c.by_op:
        rows = [
            [
                (esc(o.op), False),
                (esc(fmt_bytes(o.bytes)), True),
                (esc(o.count), True),
                (esc(fmt_us(o.wait_ns_median)), True),
                (esc(fmt_us(o.transfer_ns_median)), True),
                (esc(fmt_us(o.skew_ns_median)), True),
                (esc(fmt_gbps(o.busbw_gbps_median)), True),
            ]
            for o in c.by_op
        ]
        out.append(
            f"<p>{esc(c.instances)} collective instances matched across ranks"
            + (f", {esc(round(c.per_token, 2))} per token" if c.per_token is not None else "")
            + ".</p>"
        )
        out.append(
            _table(
                list(COLLECTIVE_HEADERS),
                rows,
            )
        )
    st_line = straggler_sentence(data.straggler)
    if st_line:
        out.append(f'<p id="straggler">{esc(st_line)}</p>')
    if data.stragglers:
        rows = [
            [
                (esc(s.rank), True),
                (esc(s.last_count), True),
                (esc(s.instances), True),
                (esc(fmt_pct(s.share)), True),
            ]
            for s in data.stragglers
        ]
        out.append("<h3>Stragglers: how often each rank arrives last</h3>")
        out.append(_table(list(STRAGGLER_HEADERS), rows, ' id="stragglers"'))
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
    for run in data.runs:
        rows = top_kernel_rows(run)
        if not rows:
            continue
        cells = []
        for c, name, cnt, tot, mean, share, is_class in rows:
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
        out.append(f"<h3>{esc(top_kernels_caption(run))}</h3>")
        out.append(f'<p class="note">{esc(top_kernels_note(run))}</p>')
        out.append(_table([esc(h) for h in TOP_KERNEL_HEADERS], cells, ' class="top-kernels"'))
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
        rows = [[(esc(k), False), (esc(v), False)] for k, v in L.transports.items()]
        out.append(_table(["mode", "what the run used"], rows))
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
    figures = dilation_figures(d)
    if figures:
        how = "removed from the per-token times" if corrected(data) else "not removed"
        summary = f"Profiler dilation {figures} ({how}){'; above the threshold' if d.inflated else ''}: how the traced parts were reconciled"
    else:
        summary = "Profiler dilation unknown (no unprofiled timing)"
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
    inner.append(_dilation_table(data))
    caution = f'<p class="warning" id="dilation-caution">{esc(prose(d.caution))}</p>' if d.caution else ""
    return (
        f'{caution}<details id="dilation-details"><summary>{esc(summary)}</summary>'
        + "\n".join(x for x in inner if x)
        + "</details>"
    )
