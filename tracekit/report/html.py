"""The HTML report: one self-contained page rendered from a `ReportData`.

The plotly figures are built here and only here. Every string that came from a trace or a
manifest is HTML-escaped before it reaches the page or a figure (plotly renders entities in its
labels and hover text back to the characters, so a kernel named `<script>` shows as text); the
figures' JSON is embedded in a `<script type="application/json">` block with `<`, `>` and `&`
written as `\\u003c`, `\\u003e`, `\\u0026`, so no name can close the script element.

plotly.js is inlined by default, so the page opens anywhere, an air-gapped cluster included: the
basic bundle (bar and scatter traces, all the report draws; `plotly_js`), about 1.2 MB of a ~1.3 MB
page; `offline=False` (`--cdn`) links plotly.py's full bundle from the CDN instead, with its
subresource-integrity hash. Answer first: the headline line and the waterfall fill the first
screen (tests/test_browser.py measures it in Chromium), dilation and reconciliation are folded.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from tracekit.model.parts import PARTS, PATH_PARTS
from tracekit.report.data import ReportData
from tracekit.report.sections.fmt import (
    fmt_bytes,
    fmt_gbps,
    fmt_ms,
    fmt_ms_interval,
    fmt_pct,
    fmt_us,
    fmt_x,
    fmt_x_interval,
    prose,
    short_words,
)
from tracekit.report.sections.rows import (
    TOP_KERNEL_HEADERS,
    path_note,
    path_rows,
    per_rank_rows,
    short_name,
    top_kernel_rows,
    top_kernels_caption,
    top_kernels_note,
)
from tracekit.report.sections.shortfall import share_text, straggler_sentence

#: colours per part, shared by every figure so a part has one colour on the page
#: compute is blue, the link orange, coordination (wait, sync, idle, and host time on the critical
#: path) in reds, browns and greys: one colour per class in every chart of the page
PART_COLOURS = {
    "compute": "#4C78A8",
    "matrix": "#4C78A8",
    "vector": "#9ECAE9",
    "memory": "#72B7B2",
    "collective": "#F58518",
    "transfer": "#F58518",
    "coordination": "#E45756",
    "wait": "#E45756",
    "unknown": "#B279A2",
    "sync": "#9D755D",
    "idle": "#BAB0AC",
    "host": "#EECA3B",
    "host ops": "#4C78A8",
    "offset": "#D8D8D8",
    "shortfall": "#333333",
}

#: the per-token chart's bars: runs, not classes
RUN_COLOURS = {"baseline": "#8C8C8C", "sharded": "#333333", "ideal": "#54A24B"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1100px;padding:1em 2em;color:#222}
h1{font-size:1.35em;margin:.2em 0 .3em} h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
.headline{font-size:1.15em;font-weight:650;background:#f3f6fa;border-left:5px solid #4C78A8;padding:.5em 1em;margin:.4em 0}
.verdict{background:#f8f9fb;border-left:5px solid #c9d3df;padding:.5em 1em;margin:.6em 0 .3em}
div.fig-first{min-height:360px} details{margin:.6em 0;padding:.3em .8em;border:1px solid #e4e4e4;border-radius:4px}
summary{cursor:pointer;font-weight:600;color:#333} .swatch{display:inline-block;width:.8em;height:.8em;margin-right:.4em;border-radius:2px;vertical-align:-.05em}
.dilation{margin:.2em 0 .2em 1.2em;color:#444}
.warning{margin:.3em 0;padding:.4em 1em;background:#fff3cd;border-left:5px solid #e0a800;font-weight:600}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em;display:block;overflow-x:auto;max-width:100%} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap} table.top-kernels td:first-child{white-space:nowrap} th{background:#f6f6f6}
.fig{width:100%;min-height:300px} .note{color:#555;font-size:.92em} code{background:#f4f4f4;padding:0 .2em}
.meta{color:#666;font-size:.85em} .verdict-sub{background:#f3f6fa;border-left:5px solid #EECA3B;padding:.4em 1em}
"""


def esc(value: Any) -> str:
    """HTML-escape any value (quotes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def safe_json(obj: Any) -> str:
    """JSON for embedding inside a <script> element: `<`, `>`, `&` and U+2028/9 escaped."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_json_default)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o)}")


def _clean(obj: Any) -> Any:
    """Replace non-finite floats (not valid JSON) by None, recursively."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------
# figures


def _layout(title: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "title": {"text": title},
        "template": "plotly_white",
        "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
        "height": 400,
    }
    base.update(kw)
    return base


def fig_per_token(data: ReportData) -> go.Figure | None:
    pt = data.per_token_ns
    n = data.n_ranks
    bars: list[tuple[str, int, str]] = []
    # runs in neutral tones and the ideal in green: no bar here takes a class's colour
    if pt.get("baseline") is not None:
        bars.append(("TP=1 (T1)", int(pt["baseline"] or 0), RUN_COLOURS["baseline"]))
    if pt.get("sharded") is not None:
        bars.append((f"TP={n} (T{n})", int(pt["sharded"] or 0), RUN_COLOURS["sharded"]))
    if pt.get("ideal") is not None:
        bars.append((f"ideal T1/{n}", int(pt["ideal"] or 0), RUN_COLOURS["ideal"]))
    if not bars:
        return None
    fig = go.Figure(
        go.Bar(
            x=[b[0] for b in bars],
            y=[b[1] / 1e6 for b in bars],
            marker_color=[b[2] for b in bars],
            text=[fmt_ms(b[1]) for b in bars],
            textposition="outside",
            cliponaxis=False,
            hovertemplate="%{x}: %{text}<extra></extra>",
        )
    )
    title = data.per_token_label or "Per-token time"
    fig.update_layout(**_layout(esc(title), yaxis_title="ms per token", showlegend=False, height=340))
    return fig


def _term_colour(term: str) -> str:
    """A waterfall term's colour: its class's (coordination.wait -> wait, ...)."""
    leaf = term.split(".")[-1]
    return PART_COLOURS.get(leaf, PART_COLOURS.get(term.split(".")[0], "#999999"))


def fig_waterfall(data: ReportData) -> go.Figure | None:
    """The shortfall's terms as floating bars, each in its class's colour, then S: a waterfall drawn
    with bars on a base (plotly's own waterfall trace colours bars only by sign, so compute and
    coordination would look alike; bars also keep the page's plotly.js to the basic bundle)."""
    a = data.attribution
    if a is None:
        return None
    steps = a["waterfall"]
    s_ns = a["shortfall_ns"]
    labels, bases, heights, colours, texts, words = [], [], [], [], [], []
    at = 0
    for w in steps:
        labels.append(_WATERFALL_LABELS.get(w["term"], esc(w["term"])))
        words.append(esc(short_words(w["label"])))
        bases.append(at / 1e6)
        heights.append(w["ns"] / 1e6)
        colours.append(_term_colour(w["term"]))
        if w.get("reading") in ("within_noise", "negative"):
            share = " (within noise)" if w["reading"] == "within_noise" else ""
        else:
            share = f" ({fmt_pct(w['ns'] / s_ns, 0)})" if s_ns else ""
        texts.append(fmt_ms(w["ns"]) + share)
        at += w["ns"]
    labels.append("shortfall S")
    words.append(f"S = T{data.n_ranks} - T1/{data.n_ranks}")
    bases.append(0.0)
    heights.append(s_ns / 1e6)
    colours.append(PART_COLOURS["shortfall"])
    texts.append(fmt_ms(s_ns))
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=heights,
            base=bases,
            marker_color=colours,
            text=texts,
            customdata=words,
            textposition="outside",
            cliponaxis=False,
            hovertemplate="%{customdata}: %{text}<extra></extra>",
        )
    )
    fig.update_layout(
        **_layout(
            f"Where the shortfall S = T{data.n_ranks} - T1/{data.n_ranks} goes, per token (terms sum to S)",
            yaxis_title="ms per token",
            showlegend=False,
            height=360,
            margin={"l": 60, "r": 20, "t": 40, "b": 40},
        )
    )
    return fig


#: the waterfall's axis labels (short, so they stay horizontal; the hover gives the full words)
_WATERFALL_LABELS = {
    "compute": "compute not scaled",
    "memory": "memory not scaled",
    "transfer": "transfer",
    "unknown": "unknown kernels",
    "coordination": "coordination",
    "coordination.wait": "coordination: wait",
    "coordination.sync": "coordination: sync",
    "coordination.idle": "coordination: idle",
}

#: ranks drawn in the per-step chart of one run (more would make each row too thin to read)
STEP_CHART_RANKS = 8


def fig_steps(run: dict[str, Any]) -> go.Figure | None:
    """Per-step parts, one row per rank (up to STEP_CHART_RANKS), steps on a numeric axis so the
    ticks thin out by themselves: readable at 200 steps as at 8."""
    steps = sorted(run["steps"], key=lambda s: (s["rank"], s["step"]))
    if not steps:
        return None
    ranks = sorted({s["rank"] for s in steps})
    if len(ranks) > STEP_CHART_RANKS:  # first, last and evenly spaced between
        idx = sorted({round(i * (len(ranks) - 1) / (STEP_CHART_RANKS - 1)) for i in range(STEP_CHART_RANKS)})
        ranks = [ranks[i] for i in idx]
    rows = len(ranks)
    gap = 0.06 if rows > 1 else 0.0
    h = (1.0 - gap * (rows - 1)) / rows
    fig = go.Figure()
    layout_axes: dict[str, Any] = {}
    shown: set[str] = set()
    for i, rank in enumerate(ranks):
        mine = [s for s in steps if s["rank"] == rank]
        ax = "" if i == 0 else str(i + 1)
        top = 1.0 - i * (h + gap)
        layout_axes[f"yaxis{ax}"] = {
            "domain": [max(top - h, 0.0), top],
            "title": {"text": f"rank {rank}<br>ms"},
            "rangemode": "tozero",
        }
        layout_axes[f"xaxis{ax}"] = {
            "anchor": f"y{ax}",
            "matches": "x" if i else None,
            "showticklabels": i == rows - 1,
            "title": {"text": "step" if i == rows - 1 else ""},
        }
        for part in PARTS:
            ys = [s["parts_ns"].get(part, 0) / 1e6 for s in mine]
            if not any(ys):
                continue
            fig.add_trace(
                go.Bar(
                    name=part,
                    legendgroup=part,
                    showlegend=part not in shown,
                    x=[s["step"] for s in mine],
                    y=ys,
                    xaxis=f"x{ax}",
                    yaxis=f"y{ax}",
                    marker={"color": PART_COLOURS.get(part), "line": {"width": 0}},
                    customdata=[esc(s["name"]) for s in mine],
                    hovertemplate=f"rank {rank} step %{{x}}<br>{part} %{{y:.3f}} ms<br>%{{customdata}}<extra></extra>",
                )
            )
            shown.add(part)
    for v in layout_axes.values():
        if v.get("matches") is None:
            v.pop("matches", None)
    n_steps = len({s["step"] for s in steps})
    fig.update_layout(
        **_layout(
            f"Per-step parts, {esc(run['role'])} run ({n_steps} steps"
            + (f"; {rows} of {len(run['ranks'])} ranks" if rows < len(run.get("ranks") or ranks) else "")
            + ")",
            barmode="stack",
            bargap=0.1 if n_steps < 60 else 0.0,
            legend={"orientation": "h", "y": -0.12 if rows > 2 else -0.25},
            height=150 * rows + 150,
            **layout_axes,
        )
    )
    return fig


def fig_critical_path(data: ReportData) -> go.Figure | None:
    """Per rank, a stacked bar of what of it lies on the critical path of a token (compute, host,
    sync, transfer, ...), then the offset, and the TP=1 token beside them for comparison."""
    cp = data.critical_path
    if cp is None or not cp["by_rank"]:
        return None
    words = data.term_words
    x = [f"rank {r}" for r in cp["by_rank"]]
    rows = list(cp["by_rank"].values())
    base = (cp.get("baseline") or {}).get("by_rank") or {}
    x += [f"TP=1 token (rank {r})" for r in base]
    rows += list(base.values())
    name = {p: p for p in PATH_PARTS}
    name["transfer"] = esc(short_words(words.get("transfer", "transfer")))
    fig = go.Figure()
    for part in PATH_PARTS:
        ys = [row[f"{part}_ns"] / 1e6 for row in rows]
        if not any(ys):
            continue
        fig.add_trace(
            go.Bar(
                name=name[part],
                x=x,
                y=ys,
                marker_color=PART_COLOURS.get(part, "#999999"),
                hovertemplate=name[part] + " %{y:.3f} ms<br>%{x}<extra></extra>",
            )
        )
    fig.add_trace(
        go.Bar(
            name="offset (step windows open at different times)",
            x=["offset"],
            y=[cp["offset_ns"] / 1e6],
            marker_color=PART_COLOURS["offset"],
            hovertemplate="offset %{y:.3f} ms<extra></extra>",
        )
    )
    fig.update_layout(
        **_layout(
            f"Critical path of a token, per rank (ranks + offset = T{data.n_ranks} = {fmt_ms(cp['step_ns'])})",
            barmode="stack",
            yaxis_title="ms per token",
            legend={"orientation": "h", "y": -0.2},
        )
    )
    return fig


def fig_collectives(data: ReportData) -> go.Figure | None:
    c = data.collectives
    if not c or not c["by_op"]:
        return None
    labels = [f"{esc(o['op'])} {fmt_bytes(o['bytes'])}" for o in c["by_op"]]
    fig = go.Figure()
    for key, name in (("wait_ns_median", "wait"), ("transfer_ns_median", "transfer")):
        ys = [(o[key] or 0) / 1e3 for o in c["by_op"]]
        fig.add_trace(
            go.Bar(
                name=name,
                x=labels,
                y=ys,
                marker_color=PART_COLOURS[name],
                hovertemplate=name + " %{y:.1f} us<br>%{x}<extra></extra>",
            )
        )
    fig.update_layout(
        **_layout(
            "Per collective (op, message size): wait of the rank that waited vs transfer (medians)",
            barmode="stack",
            yaxis_title="us per instance",
            legend={"orientation": "h", "y": -0.2},
        )
    )
    return fig


def fig_busbw(data: ReportData) -> go.Figure | None:
    b = data.busbw
    if not b["probes"]:  # trace points alone are the collectives table's: no empty log-log grid
        return None
    fig = go.Figure()
    for curve in b["probes"]:
        pts = curve["points"]
        label = esc(curve["label"]) + (f" via {esc(curve['transport'])}" if curve.get("transport") else "")
        fig.add_trace(
            go.Scatter(
                name=label,
                x=[p["bytes"] for p in pts],
                y=[p["busbw_gbps"] for p in pts],
                mode="lines+markers",
                line={"dash": "dot" if curve.get("in_place") else "solid"},
                hovertemplate=label + "<br>%{x} B: %{y:.3f} GB/s<extra></extra>",
            )
        )
    if b["trace"]:
        ops = sorted({p["op"] for p in b["trace"]})
        for op in ops:
            pts = [p for p in b["trace"] if p["op"] == op]
            fig.add_trace(
                go.Scatter(
                    name=f"trace {esc(op)} (realised)",
                    x=[p["bytes"] for p in pts],
                    y=[p["busbw_gbps"] for p in pts],
                    mode="markers",
                    marker={"size": 13, "symbol": "diamond", "line": {"width": 1, "color": "#000"}},
                    hovertemplate="trace " + esc(op) + "<br>%{x} B: %{y:.3f} GB/s<extra></extra>",
                )
            )
    fig.update_layout(
        **_layout(
            "Realised bus bandwidth vs message size (trace collectives over probe curves)",
            xaxis={"type": "log", "title": {"text": "message size (bytes, nccl-tests' size)"}},
            yaxis={"type": "log", "title": {"text": "busbw (GB/s)"}},
            legend={"orientation": "h", "y": -0.25},
            height=440,
        )
    )
    return fig


# ----------------------------------------------------------------------------------------------
# tables


def _table(headers: list[str], rows: list[list[tuple[str, bool]]], attrs: str = "") -> str:
    """rows: cells as (escaped html, numeric?)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if num else ''}>{cell}</td>" for cell, num in row) + "</tr>"
        for row in rows
    )
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _key_figures_table(data: ReportData) -> str:
    rows = "".join(
        f'<tr><td>{esc(k["label"])}</td><td class=num data-key="{esc(k["key"])}">{esc(k["text"])}</td></tr>'
        for k in data.key_figures
    )
    return f'<table id="key-figures"><thead><tr><th>figure</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>'


def _dilation_table(data: ReportData) -> str:
    applied = [
        d for d in data.dilation["runs"] if d.get("source") == "applied" and d.get("dilation") is not None
    ]
    if applied:
        rows_a = [
            [
                (esc(d["run"]), False),
                (esc(fmt_x_interval(d["dilation"], d.get("interval"))), True),
                (esc(fmt_ms(d.get("traced_mean_ns"))), True),
                (esc(fmt_ms(d.get("unprofiled_mean_ns"))), True),
                (
                    esc(
                        fmt_x_interval(
                            (d.get("host_clock") or {}).get("dilation"),
                            (d.get("host_clock") or {}).get("interval"),
                        )
                    ),
                    True,
                ),
            ]
            for d in applied
        ]
        return _table(
            [
                "run",
                "dilation applied (95% interval)",
                "per token, traced (mean)",
                "per token, unprofiled (mean)",
                "cross-check: capture host clock",
            ],
            rows_a,
            ' id="dilation-table"',
        )
    runs = [d for d in data.dilation["runs"] if d.get("unprofiled_median_ns") is not None]
    if not runs:
        return ""
    rows = [
        [
            (esc(d["run"]), False),
            (esc(fmt_ms(d["unprofiled_median_ns"])), True),
            (esc(fmt_ms(d.get("profiled_median_ns"))), True),
            (esc(fmt_x(d["dilation"])), True),
        ]
        for d in runs
    ]
    return _table(
        ["run", "per token, unprofiled (median)", "per token, profiled (median)", "dilation (host clock)"],
        rows,
    )


def _attribution_table(data: ReportData) -> str:
    """The terms of S with their 95% intervals (when the shortfall has them) and shares; a share
    only where the term is clear of the noise."""
    a = data.attribution
    if a is None:
        return ""
    s_ns = a["shortfall_ns"]
    has_iv = bool(a.get("intervals"))
    rows = []
    for w in a["waterfall"]:
        term = w["term"]
        spread = a["spread_ns"].get(term.split(".")[-1] if term.startswith("coordination.") else term) or {}
        row = [(esc(w["label"]), False), (esc(fmt_ms(w["ns"])), True)]
        if has_iv:
            row.append((esc(fmt_ms_interval(w.get("interval_ns"), 3)), True))
        row.append((esc(share_text(w, s_ns)), True))
        row.append(
            (esc(f"{fmt_ms(spread.get('p10'))} .. {fmt_ms(spread.get('p90'))}") if spread else "", True)
        )
        rows.append(row)
    total = [("<b>shortfall S</b>", False), (f"<b>{esc(fmt_ms(s_ns))}</b>", True)]
    if has_iv:
        total.append((esc(fmt_ms_interval((a.get("intervals") or {}).get("shortfall_ns"), 3)), True))
    rows.append([*total, ("100.0%", True), ("", True)])
    headers = [
        "term",
        "per token",
        *(["95% interval"] if has_iv else []),
        "share of S",
        "spread over steps (p10 .. p90)",
    ]
    table = _table(headers, rows, ' id="attribution"')
    method = (a.get("intervals") or {}).get("method")
    return table + (f'<p class="note">Intervals: {esc(prose(method))}.</p>' if method else "")


def _text_table(headers: list[str], rows: list[list[str]], attrs: str = "") -> str:
    """A table of text rows (first column a label, the rest numbers), escaped."""
    return _table(
        [esc(h) for h in headers],
        [[(esc(c), i > 0) for i, c in enumerate(r)] for r in rows],
        attrs,
    )


def _per_rank_section(data: ReportData) -> str:
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


def _critical_path_section(data: ReportData, fig_div: str) -> str:
    cp = data.critical_path
    if cp is None:
        return ""
    headers, rows = path_rows(data)
    out = ["<h2>Critical path</h2>"]
    if cp.get("cause"):
        out.append(f'<p class="verdict-sub" id="critical-path-cause"><b>{esc(prose(cp["cause"]))}</b></p>')
    out += [
        fig_div,
        _text_table(headers, rows, ' id="critical-path"'),
        f'<p class="note">{esc(path_note(cp))}</p>',
    ]
    return "\n".join(o for o in out if o)


def _collectives_tables(data: ReportData) -> str:
    out = []
    c = data.collectives
    if c and c["by_op"]:
        rows = [
            [
                (esc(o["op"]), False),
                (esc(fmt_bytes(o["bytes"])), True),
                (esc(o["count"]), True),
                (esc(fmt_us(o["wait_ns_median"])), True),
                (esc(fmt_us(o["transfer_ns_median"])), True),
                (esc(fmt_us(o["skew_ns_median"])), True),
                (esc(fmt_gbps(o["busbw_gbps_median"])), True),
            ]
            for o in c["by_op"]
        ]
        out.append(
            f"<p>{esc(c['instances'])} collective instances matched across ranks"
            + (f", {esc(round(c['per_token'], 2))} per token" if c.get("per_token") is not None else "")
            + ".</p>"
        )
        out.append(
            _table(
                [
                    "op",
                    "message",
                    "count",
                    "wait (median of per-collective max)",
                    "transfer (median)",
                    "skew (median)",
                    "busbw (median)",
                ],
                rows,
            )
        )
    st_line = straggler_sentence(data.straggler)
    if st_line:
        out.append(f'<p id="straggler">{esc(st_line)}</p>')
    if data.stragglers:
        rows = [
            [
                (esc(s["rank"]), True),
                (esc(s["last_count"]), True),
                (esc(s["instances"]), True),
                (esc(fmt_pct(s["share"])), True),
            ]
            for s in data.stragglers
        ]
        out.append("<h3>Stragglers: how often each rank arrives last</h3>")
        out.append(_table(["rank", "last", "of instances", "share"], rows, ' id="stragglers"'))
    return "\n".join(out)


def _kernels_tables(data: ReportData) -> str:
    out = []
    for run in data.runs:
        if any(v["count"] for v in run["kernels_by_class"].values()):
            rows = [
                [(esc(k), False), (esc(v["count"]), True), (esc(fmt_ms(v["total_ns"])), True)]
                for k, v in run["kernels_by_class"].items()
            ]
            out.append(f"<h3>{esc(run['role'])} run: GPU activity by class</h3>")
            out.append(_table(["class", "count", "total"], rows))
        if run["unknown_kernels"]:
            rows = [
                [
                    (f"<code>{esc(k['name'])}</code>", False),
                    (esc(k["count"]), True),
                    (esc(fmt_ms(k["total_ns"])), True),
                ]
                for k in run["unknown_kernels"]
            ]
            out.append(f"<h3>{esc(run['role'])} run: unclassified kernels (top by time)</h3>")
            out.append(_table(["name", "count", "total"], rows, ' class="unknown-kernels"'))
    return "\n".join(out)


def _top_kernels_html(data: ReportData) -> str:
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


def _links_section(data: ReportData) -> str:
    L = data.links
    if L is None:
        return ""
    out = []
    if L.get("verdict"):
        out.append(f'<p class="links-verdict"><b>{esc(prose(L["verdict"]))}</b></p>')
    if L.get("modes"):
        out.append(f"<p>Modes: {esc(', '.join(str(m) for m in L['modes']))}</p>")
    transports = L.get("transports") or {}
    if isinstance(transports, dict) and transports:
        rows = [
            [(esc(k), False), (esc(v if isinstance(v, str) else json.dumps(v)), False)]
            for k, v in transports.items()
        ]
        out.append(_table(["mode", "what the run used"], rows))
    for n in L.get("notes") or []:
        out.append(f'<p class="note">{esc(n)}</p>')
    if L.get("note"):
        out.append(f'<p class="note">{esc(L["note"])}</p>')
    return "\n".join(out)


def _indented(cell: str) -> str:
    """A cell escaped, its leading spaces (a sub-row's indent) kept as non-breaking spaces."""
    stripped = cell.lstrip(" ")
    return "&nbsp;&nbsp;" * (len(cell) - len(stripped)) + esc(stripped)


def _extras_section(data: ReportData) -> str:
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
                f'<tr><td>{esc(f["label"])}</td><td class=num data-key="{esc(f["key"])}">{esc(f["text"])}</td></tr>'
                for f in x.figures
            )
            out.append(
                f"<table><thead><tr><th>figure</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"
            )
        for t in x.tables:
            out.append(f"<h3>{esc(t.caption)}</h3>")
            out.append(
                _table(
                    [esc(h) for h in t.headers],
                    [[(_indented(c), i not in t.text_columns) for i, c in enumerate(r)] for r in t.rows],
                )
            )
        out += [f'<p class="note">{esc(prose(line))}</p>' for line in x.lines]
        if x.notes:
            out.append("<ul>" + "".join(f'<li class="note">{esc(prose(n))}</li>' for n in x.notes) + "</ul>")
        out.append("</section>")
    return "\n".join(out)


def _manifest_section(data: ReportData) -> str:
    out = []
    for m in data.manifests:
        out.append(
            f"<h3>{esc(m['role'])} run{(': <code>' + esc(m['path']) + '</code>') if m.get('path') else ''}</h3>"
        )
        if not m["present"]:
            out.append('<p class="note">No manifest.json: what ran and where is unknown.</p>')
            continue
        rows: list[list[tuple[str, bool]]] = []

        def add(k: str, v: Any, rows: list[list[tuple[str, bool]]] = rows) -> None:
            if v is None or v == {} or v == []:
                return
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            rows.append([(esc(k), False), (esc(text), False)])

        for k, v in m["workload"].items():
            add(k, v)
        add("complete", m.get("complete"))
        add("errors", m.get("errors"))
        add("created", m.get("created"))
        for k, v in m["host"].items():
            add(f"host.{k}", v)
        for d in m["devices"]:
            add(f"device {d.get('index')}", f"{d.get('name')} ({fmt_bytes(d.get('memory_bytes'))})")
        for k, v in m["versions"].items():
            add(f"version.{k}", v)
        add("nccl_env", m.get("nccl_env"))
        add(
            "capture's host-clock dilation (cross-check, not the factor applied)",
            fmt_x(m.get("capture_dilation")) if m.get("capture_dilation") is not None else None,
        )
        add("command", m.get("command"))
        out.append(_table(["field", "value"], rows, ' class="manifest"'))
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# the page


#: the plotly.js build inlined in the page when it is in the asset cache: plotly.js-basic-dist-min
#: (npm, MIT; bar, pie and scatter traces: every chart of the report is a bar or a scatter), 1.2 MB
#: against 4.8 MB for the full bundle plotly.py ships. It is another project's code, so it is not in
#: the repository: `scripts/fetch_plotly_basic.sh` fetches it from the npm registry (sha256-checked)
#: into `basic_bundle_path()`; without it the page inlines plotly.py's full bundle.
BASIC_VERSION = "4.1.1"
#: TRACEKIT_PLOTLYJS=/path/to/plotly.min.js inlines another build (a full one for custom figures)
PLOTLYJS_ENV = "TRACEKIT_PLOTLYJS"


def basic_bundle_path() -> Path:
    """Where `scripts/fetch_plotly_basic.sh` puts the basic bundle: $XDG_CACHE_HOME/tracekit/assets
    (else ~/.cache/tracekit/assets), whatever --cache-dir says (that one holds parsed traces)."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracekit" / "assets" / f"plotly-basic-{BASIC_VERSION}.min.js"


def plotly_js() -> tuple[str, str]:
    """The plotly.js inlined in the page and which one it is: $TRACEKIT_PLOTLYJS when set, else the
    basic bundle from the asset cache when plotly.py's own plotly.js is of the same major version
    (the figures' JSON is plotly.py's), else plotly.py's full bundle."""
    import os

    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    override = os.environ.get(PLOTLYJS_ENV)
    if override:
        return Path(override).read_text(encoding="utf-8"), override
    basic = basic_bundle_path()
    if basic.is_file() and get_plotlyjs_version().split(".")[0] == BASIC_VERSION.split(".")[0]:
        return basic.read_text(encoding="utf-8"), f"plotly.js-basic-dist-min {BASIC_VERSION}"
    return get_plotlyjs(), f"plotly.js {get_plotlyjs_version()} (full bundle of plotly.py)"


def _plotly_script(offline: bool) -> str:
    if offline:
        js, _ = plotly_js()
        return f'<script charset="utf-8">{js}</script>'
    from plotly.io._utils import plotly_cdn_url
    from plotly.offline import get_plotlyjs

    # the CDN serves plotly.py's own full bundle: the integrity hash is that file's
    sri = "sha384-" + base64.b64encode(hashlib.sha384(get_plotlyjs().encode("utf-8")).digest()).decode()
    return f'<script charset="utf-8" src="{esc(plotly_cdn_url())}" integrity="{sri}" crossorigin="anonymous"></script>'


_BOOT = """
(function(){
  var figs = JSON.parse(document.getElementById('tk-figures').textContent);
  if (typeof Plotly === 'undefined') {
    var els = document.querySelectorAll('.fig');
    for (var i = 0; i < els.length; i++) { els[i].textContent = 'plotly.js could not be loaded (no internet?): re-render without --cdn.'; }
    return;
  }
  Object.keys(figs).forEach(function(id){
    var f = figs[id];
    Plotly.newPlot(id, f.data, f.layout, {responsive: true, displaylogo: false});
  });
})();
"""


def _dilation_details(data: ReportData) -> str:
    """The profiler's dilation, the cross-check and the reconciliation: collapsed under one line
    (the figures are on the page; the reader opens it for how the traced parts were corrected)."""
    d = data.dilation
    known = [r for r in d["runs"] if r.get("dilation") is not None]
    figures = ", ".join(f"{r['run']} {fmt_x_interval(r['dilation'], r.get('interval'))}" for r in known)
    if known:
        corrected = (data.attribution or {}).get("per_token_source") == "unprofiled"
        how = "removed from the per-token times" if corrected else "not removed"
        summary = f"Profiler dilation {figures} ({how}){'; above the threshold' if d.get('inflated') else ''}: how the traced parts were reconciled"
    else:
        summary = "Profiler dilation unknown (no unprofiled timing)"
    inner = [f'<p class="dilation" id="dilation">{esc(prose(d["sentence"]))}</p>']
    if d.get("cross_check"):
        inner.append(f'<p class="dilation" id="dilation-cross-check">{esc(prose(d["cross_check"]))}</p>')
    if d.get("warning"):
        inner.append(f'<p class="warning" id="dilation-warning">{esc(prose(d["warning"]))}</p>')
    if d.get("reconciliation"):
        inner.append(
            f'<p class="dilation" id="reconciliation">Reconciliation: {esc(prose(d["reconciliation"]))}</p>'
        )
    a = data.attribution
    if a is not None:
        unc = a.get("uncorrected")
        if isinstance(unc, dict) and unc.get("shortfall_ns") is not None:
            inner.append(
                f'<p class="note">Uncorrected (trace-only) shortfall: {esc(fmt_ms(unc.get("shortfall_ns")))} per token.</p>'
            )
    inner.append(_dilation_table(data))
    caution = (
        f'<p class="warning" id="dilation-caution">{esc(prose(d["caution"]))}</p>' if d.get("caution") else ""
    )
    return (
        f'{caution}<details id="dilation-details"><summary>{esc(summary)}</summary>'
        + "\n".join(x for x in inner if x)
        + "</details>"
    )


def render_html(data: ReportData, *, offline: bool = True) -> str:
    """The whole page as a string; `offline` (the default) inlines plotly.js, False links the CDN.

    Answer first: the headline line and the waterfall fill the first screen; the verdict's
    sentences, the attribution table and the critical path follow; dilation and reconciliation
    sit in a collapsed section; the per-step charts, collectives, top kernels, probes, the
    other commands' sections and the manifest come after."""
    figures: dict[str, go.Figure | None] = {
        "fig-waterfall": fig_waterfall(data),
        "fig-per-token": fig_per_token(data),
    }
    for i, run in enumerate(data.runs):
        figures[f"fig-steps-{i}"] = fig_steps(run)
    figures["fig-critical-path"] = fig_critical_path(data)
    figures["fig-collectives"] = fig_collectives(data)
    figures["fig-busbw"] = fig_busbw(data)
    fig_json = {k: _clean(f.to_plotly_json()) for k, f in figures.items() if f is not None}

    def div(fid: str, cls: str = "fig") -> str:
        return f'<div id="{fid}" class="{cls}"></div>' if fid in fig_json else ""

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(data.title)}</title><style>{_CSS}</style>",
        _plotly_script(offline),
        "</head><body>",
        f"<h1>{esc(data.title)}</h1>",
        f'<p class="headline" id="headline">{esc(prose(data.headline or data.verdict))}</p>',
    ]
    if data.attribution is not None:
        parts.append(div("fig-waterfall", "fig fig-first"))
    parts += [
        f'<p class="verdict" id="verdict">{esc(prose(data.verdict))}</p>',
        (
            f'<p class="diagnosis" id="diagnosis">Next: {esc(prose(data.diagnosis))}</p>'
            if data.diagnosis
            else ""
        ),
        _dilation_details(data),
    ]
    if data.attribution is not None:
        parts += ["<h2>Shortfall attribution</h2>", _attribution_table(data)]
        if data.attribution.get("aggregate"):
            parts.append(
                f'<p class="note">Aggregate over ranks: {esc(prose(data.attribution["aggregate"]))}.</p>'
            )
        parts.append(_per_rank_section(data))
    parts.append(_critical_path_section(data, div("fig-critical-path")))
    parts += ["<h2>Per-token time</h2>", div("fig-per-token")]
    parts += [
        f'<details id="key-figures-details"><summary>All key figures ({len(data.key_figures)})</summary>',
        _key_figures_table(data),
        "</details>",
    ]
    parts.append("<h2>Per-step parts per rank</h2>")
    for i, _run in enumerate(data.runs):
        parts.append(div(f"fig-steps-{i}"))
    if data.collectives is not None:
        parts += ["<h2>Collectives: wait vs transfer</h2>", div("fig-collectives"), _collectives_tables(data)]
    top = _top_kernels_html(data)
    kern = _kernels_tables(data)
    if top or kern:
        parts += ["<h2>Kernels</h2>", top, kern]
    if "fig-busbw" in fig_json or data.links is not None:
        parts += ["<h2>Realised bandwidth and link probes</h2>", div("fig-busbw"), _links_section(data)]
    parts.append(_extras_section(data))
    parts += ["<h2>What ran, where (manifest)</h2>", _manifest_section(data)]
    if data.notes:
        parts.append(
            "<h2>Notes</h2><ul>"
            + "".join(f'<li class="note">{esc(prose(n))}</li>' for n in data.notes)
            + "</ul>"
        )
    parts.append(
        f'<p class="meta">{esc(data.generator)}, {esc(data.created)}; report schema {esc(data.kind)} {esc(data.schema_version)}</p>'
    )
    parts.append(f'<script type="application/json" id="tk-figures">{safe_json(fig_json)}</script>')
    parts.append(f"<script>{_BOOT}</script>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)
