"""The plotly figures of the HTML report (built here and only here): per-token times, the waterfall of
S, the steps, the critical path, the collectives, the bus bandwidth; one colour per part on the page
(`PART_COLOURS`). Labels and hover text are escaped (`tracekit.report.html_escape`)."""

from __future__ import annotations

import functools
from typing import Any

import plotly.graph_objects as go

from tracekit.model.documents.report import ReportRun_
from tracekit.model.documents.shortfall import ShortfallByRankValue
from tracekit.model.parts import PARTS, PATH_PARTS
from tracekit.model.units import fmt_ms, fmt_pct
from tracekit.report.data import ReportData
from tracekit.report.html_escape import esc
from tracekit.report.sections.fmt import fmt_bytes, short_words

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


#: the plotly template of every figure, set in its JSON (`figure_json`)
TEMPLATE = "plotly_white"


@functools.cache
def _template_json() -> dict[str, object]:
    """TEMPLATE as a figure's layout holds it once set (plotly's validation orders its keys)."""
    template: dict[str, object] = go.Figure(layout={"template": TEMPLATE}).to_plotly_json()["layout"][
        "template"
    ]
    return template


def figure_json(fig: go.Figure) -> dict[str, object]:
    """`fig.to_plotly_json()` with layout.template TEMPLATE's JSON, first in the layout as plotly puts
    it. Setting the template on each figure (`template="plotly_white"`) deep-copied and validated
    it, then copied it again into the JSON: ~25 ms a figure, half of rendering a report page. The
    template dict is shared between calls: copy the result before changing it (html.py's `_clean`
    rebuilds every dict and list)."""
    j: dict[str, object] = fig.to_plotly_json()  # plotly's JSON, not a tracekit document
    fig_layout = j["layout"]
    assert isinstance(fig_layout, dict)
    layout = {k: v for k, v in fig_layout.items() if k != "template"}
    j["layout"] = {"template": _template_json(), **layout}
    return j


def _figure(trace: Any = None) -> go.Figure:
    """A figure (of `trace`, or empty) with an empty template, not plotly's default (which
    `to_plotly_json` would copy): `figure_json` sets TEMPLATE."""
    return go.Figure(trace, layout={"template": {}})


def _layout(title: str, **kw: object) -> dict[str, object]:
    """plotly layout settings (plotly's own keywords) for a figure titled `title`; the template is
    set in the JSON (`figure_json`)."""
    base: dict[str, object] = {
        "title": {"text": title},
        "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
        "height": 400,
    }
    base.update(kw)
    return base


def _stacked_layout(title: str, yaxis_title: str) -> dict[str, object]:
    """The layout of a figure of stacked bars, the legend in a row below it."""
    return _layout(title, barmode="stack", yaxis_title=yaxis_title, legend={"orientation": "h", "y": -0.2})


def fig_per_token(data: ReportData) -> go.Figure | None:
    pt = data.per_token_ns
    n = data.n_ranks
    bars: list[tuple[str, int, str]] = []
    # runs in neutral tones and the ideal in green: no bar here takes a class's colour
    if pt.baseline is not None:
        bars.append(("TP=1 (T1)", int(pt.baseline), RUN_COLOURS["baseline"]))
    if pt.sharded is not None:
        bars.append((f"TP={n} (T{n})", int(pt.sharded), RUN_COLOURS["sharded"]))
    if pt.ideal is not None:
        bars.append((f"ideal T1/{n}", int(pt.ideal), RUN_COLOURS["ideal"]))
    if not bars:
        return None
    fig = _figure(
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
    steps = a.waterfall
    s_ns = a.shortfall_ns
    labels, bases, heights, colours, texts, words = [], [], [], [], [], []
    at = 0
    for w in steps:
        labels.append(_WATERFALL_LABELS.get(w.term, esc(w.term)))
        words.append(esc(short_words(w.label)))
        bases.append(at / 1e6)
        heights.append(w.ns / 1e6)
        colours.append(_term_colour(w.term))
        if w.reading in ("within_noise", "negative"):
            share = " (within noise)" if w.reading == "within_noise" else ""
        else:
            share = f" ({fmt_pct(w.ns / s_ns, 0)})" if s_ns else ""
        texts.append(fmt_ms(w.ns) + share)
        at += w.ns
    labels.append("shortfall S")
    words.append(f"S = T{data.n_ranks} - T1/{data.n_ranks}")
    bases.append(0.0)
    heights.append(s_ns / 1e6)
    colours.append(PART_COLOURS["shortfall"])
    texts.append(fmt_ms(s_ns))
    fig = _figure(
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


def fig_steps(run: ReportRun_) -> go.Figure | None:
    """Per-step parts, one row per rank (up to STEP_CHART_RANKS), steps on a numeric axis so the
    ticks thin out by themselves: readable at 200 steps as at 8."""
    steps = sorted(run.steps, key=lambda s: (s.rank, s.step))
    if not steps:
        return None
    ranks = sorted({s.rank for s in steps})
    if len(ranks) > STEP_CHART_RANKS:  # first, last and evenly spaced between
        idx = sorted({round(i * (len(ranks) - 1) / (STEP_CHART_RANKS - 1)) for i in range(STEP_CHART_RANKS)})
        ranks = [ranks[i] for i in idx]
    rows = len(ranks)
    gap = 0.06 if rows > 1 else 0.0
    h = (1.0 - gap * (rows - 1)) / rows
    fig = _figure()
    layout_axes: dict[str, dict[str, object]] = {}
    shown: set[str] = set()
    for i, rank in enumerate(ranks):
        mine = [s for s in steps if s.rank == rank]
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
            ys = [s.parts_ns.get(part, 0) / 1e6 for s in mine]
            if not any(ys):
                continue
            fig.add_trace(
                go.Bar(
                    name=part,
                    legendgroup=part,
                    showlegend=part not in shown,
                    x=[s.step for s in mine],
                    y=ys,
                    xaxis=f"x{ax}",
                    yaxis=f"y{ax}",
                    marker={"color": PART_COLOURS.get(part), "line": {"width": 0}},
                    customdata=[esc(s.name) for s in mine],
                    hovertemplate=f"rank {rank} step %{{x}}<br>{part} %{{y:.3f}} ms<br>%{{customdata}}<extra></extra>",
                )
            )
            shown.add(part)
    for v in layout_axes.values():
        if v.get("matches") is None:
            v.pop("matches", None)
    n_steps = len({s.step for s in steps})
    fig.update_layout(
        **_layout(
            f"Per-step parts, {esc(run.role)} run ({n_steps} steps"
            + (f"; {rows} of {len(run.ranks)} ranks" if rows < len(run.ranks or ranks) else "")
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
    if cp is None or not cp.by_rank:
        return None
    words = data.term_words
    x = [f"rank {r}" for r in cp.by_rank]
    rows: list[ShortfallByRankValue] = list(cp.by_rank.values())
    base = cp.baseline.by_rank if cp.baseline is not None else {}
    x += [f"TP=1 token (rank {r})" for r in base]
    rows += list(base.values())
    name = {p: p for p in PATH_PARTS}
    name["transfer"] = esc(short_words(words.get("transfer", "transfer")))
    fig = _figure()
    for part in PATH_PARTS:
        ys = [getattr(row, f"{part}_ns") / 1e6 for row in rows]
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
            y=[cp.offset_ns / 1e6],
            marker_color=PART_COLOURS["offset"],
            hovertemplate="offset %{y:.3f} ms<extra></extra>",
        )
    )
    fig.update_layout(
        **_stacked_layout(
            f"Critical path of a token, per rank (ranks + offset = T{data.n_ranks} = {fmt_ms(cp.step_ns)})",
            "ms per token",
        )
    )
    return fig


def fig_collectives(data: ReportData) -> go.Figure | None:
    c = data.collectives
    if not c or not c.by_op:
        return None
    labels = [f"{esc(o.op)} {fmt_bytes(o.bytes)}" for o in c.by_op]
    fig = _figure()
    for name, ys in (
        ("wait", [(o.wait_ns_median or 0) / 1e3 for o in c.by_op]),
        ("transfer", [(o.transfer_ns_median or 0) / 1e3 for o in c.by_op]),
    ):
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
        **_stacked_layout(
            "Per collective (op, message size): wait of the rank that waited vs transfer (medians)",
            "us per instance",
        )
    )
    return fig


def fig_busbw(data: ReportData) -> go.Figure | None:
    b = data.busbw
    if not b.probes:  # trace points alone are the collectives table's: no empty log-log grid
        return None
    fig = _figure()
    for curve in b.probes:
        pts = curve.points
        label = esc(curve.label) + (f" via {esc(curve.transport)}" if curve.transport else "")
        fig.add_trace(
            go.Scatter(
                name=label,
                x=[p.bytes for p in pts],
                y=[p.busbw_gbps for p in pts],
                mode="lines+markers",
                line={"dash": "dot" if curve.in_place else "solid"},
                hovertemplate=label + "<br>%{x} B: %{y:.3f} GB/s<extra></extra>",
            )
        )
    if b.trace:
        ops = sorted({p.op for p in b.trace})
        for op in ops:
            tps = [p for p in b.trace if p.op == op]
            fig.add_trace(
                go.Scatter(
                    name=f"trace {esc(op)} (realised)",
                    x=[p.bytes for p in tps],
                    y=[p.busbw_gbps for p in tps],
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
