"""The HTML report: one self-contained page rendered from a `ReportData`.

The plotly figures are built here and only here. Every string that came from a trace or a
manifest is HTML-escaped before it reaches the page or a figure (plotly renders entities in its
labels and hover text back to the characters, so a kernel named `<script>` shows as text); the
figures' JSON is embedded in a `<script type="application/json">` block with `<`, `>` and `&`
written as `\u003c`, `\u003e`, `\u0026`, so no name can close the script element.

plotly.js is inlined by default, so the page opens anywhere, an air-gapped cluster included: the
basic bundle (bar and scatter traces, all the report draws; `plotly_js`), about 1.2 MB of a ~1.3 MB
page; `offline=False` (`--cdn`) links plotly.py's full bundle from the CDN instead, with its
subresource-integrity hash. Answer first: the headline line and the waterfall fill the first
screen (tests/test_browser.py measures it in Chromium), dilation and reconciliation are folded.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from pathlib import Path

import plotly.graph_objects as go

from tracekit.report.data import ReportData
from tracekit.report.html_escape import esc, safe_json
from tracekit.report.html_figures import (
    fig_busbw,
    fig_collectives,
    fig_critical_path,
    fig_per_token,
    fig_steps,
    fig_waterfall,
    figure_json,
)
from tracekit.report.html_tables import (
    attribution_table,
    collectives_tables,
    critical_path_section,
    dilation_details,
    extras_section,
    kernels_tables,
    key_figures_table,
    links_section,
    manifest_section,
    per_rank_section,
    top_kernels_html,
)
from tracekit.report.sections.fmt import prose

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


def _clean(obj: object) -> object:
    """Replace non-finite floats (not valid JSON) by None, recursively."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


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
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracekit" / "assets" / f"plotly-basic-{BASIC_VERSION}.min.js"


def plotly_js() -> tuple[str, str]:
    """The plotly.js inlined in the page and which one it is: $TRACEKIT_PLOTLYJS when set, else the
    basic bundle from the asset cache when plotly.py's own plotly.js is of the same major version
    (the figures' JSON is plotly.py's), else plotly.py's full bundle."""
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
    fig_json = {k: _clean(figure_json(f)) for k, f in figures.items() if f is not None}

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
        dilation_details(data),
    ]
    if data.attribution is not None:
        parts += ["<h2>Shortfall attribution</h2>", attribution_table(data)]
        if data.attribution.aggregate:
            parts.append(
                f'<p class="note">Aggregate over ranks: {esc(prose(data.attribution.aggregate))}.</p>'
            )
        parts.append(per_rank_section(data))
    parts.append(critical_path_section(data, div("fig-critical-path")))
    parts += ["<h2>Per-token time</h2>", div("fig-per-token")]
    parts += [
        f'<details id="key-figures-details"><summary>All key figures ({len(data.key_figures)})</summary>',
        key_figures_table(data),
        "</details>",
    ]
    parts.append("<h2>Per-step parts per rank</h2>")
    for i, _run in enumerate(data.runs):
        parts.append(div(f"fig-steps-{i}"))
    if data.collectives is not None:
        parts += ["<h2>Collectives: wait vs transfer</h2>", div("fig-collectives"), collectives_tables(data)]
    top = top_kernels_html(data)
    kern = kernels_tables(data)
    if top or kern:
        parts += ["<h2>Kernels</h2>", top, kern]
    if "fig-busbw" in fig_json or data.links is not None:
        parts += ["<h2>Realised bandwidth and link probes</h2>", div("fig-busbw"), links_section(data)]
    parts.append(extras_section(data))
    parts += ["<h2>What ran, where (manifest)</h2>", manifest_section(data)]
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
