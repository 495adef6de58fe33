"""How the result objects show in a notebook: a short `repr` (one line, the answer) and
`_repr_html_` (the verdict and a table), for `Shortfall` and `Breakdown`. The dataclasses' own
generated repr printed every field (33,642 characters for one Shortfall).

Every string from a trace (paths, names) is HTML-escaped.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from tracekit.model.units import fmt_ms, fmt_pct

if TYPE_CHECKING:
    from tracekit.analyse.attribution.result import Shortfall
    from tracekit.analyse.timeline.breakdown import Breakdown

_STYLE = (
    "<style>.tk-result table{border-collapse:collapse}.tk-result td,.tk-result th{padding:2px 10px;"
    "border-bottom:1px solid #ddd}.tk-result td.num{text-align:right;font-variant-numeric:tabular-nums}"
    ".tk-result td.sub{padding-left:2em}</style>"
)


def _esc(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _table(headers: list[str], rows: list[tuple[str, list[str], bool]]) -> str:
    """rows: (label, number cells, is a sub-row)."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join(
        f"<tr><td{' class=sub' if sub else ''}>{_esc(label)}</td>"
        + "".join(f"<td class=num>{_esc(c)}</td>" for c in cells)
        + "</tr>"
        for label, cells, sub in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def shortfall_repr(sf: Shortfall) -> str:
    ints = sf.corrected.integers()
    pt, s, terms = ints["per_token_ns"], ints["shortfall_ns"], ints["terms_ns"]
    parts = ", ".join(f"{t} {v / 1e6:.3f}" for t, v in terms.items())
    src = "dilation-corrected" if sf.per_token_source == "unprofiled" else "traced"
    return (
        f"Shortfall(TP={sf.n_ranks}: {fmt_ms(pt['sharded'])} vs ideal {fmt_ms(pt['ideal'])}, "
        f"S = {fmt_ms(s)} per token = {parts} ms; {src})"
    )


def _iv(v: Any) -> str:
    if isinstance(v, list | tuple) and len(v) == 2 and None not in v:
        return f"{v[0] / 1e6:.3f}-{v[1] / 1e6:.3f} ms"
    return ""


def shortfall_html(sf: Shortfall) -> str:
    ints = sf.corrected.integers()
    s = ints["shortfall_ns"]
    share = {k: (v / s if s else None) for k, v in ints["terms_ns"].items()}
    ivs = sf.intervals.document()  # the 95% intervals
    t_iv, c_iv = ivs.terms_ns, ivs.coordination_ns
    rows: list[tuple[str, list[str], bool]] = []
    for term, ns in ints["terms_ns"].items():
        rows.append((term, [fmt_ms(ns), _iv(t_iv.get(term)), fmt_pct(share[term])], False))
        if term == "coordination":
            for part, v in ints["coordination_ns"].items():
                rows.append((part, [fmt_ms(v), _iv(c_iv.get(part)), fmt_pct(v / s if s else None)], True))
    rows.append(("S", [fmt_ms(s), _iv(ivs.shortfall_ns), fmt_pct(1.0 if s else None)], False))
    pt = ints["per_token_ns"]
    src = (
        "per-token times dilation-corrected (traced / dilation)"
        if sf.per_token_source == "unprofiled"
        else "per-token times traced (no unprofiled timing)"
    )
    return (
        f'{_STYLE}<div class="tk-result"><p><b>{_esc(sf.verdict())}</b></p>'
        + _table(["term", "per token", "95% interval", "share of S"], rows)
        + f"<p>T1 {_esc(fmt_ms(pt['baseline']))}, T{sf.n_ranks} {_esc(fmt_ms(pt['sharded']))}, ideal "
        f"{_esc(fmt_ms(pt['ideal']))}; {_esc(src)}. <code>.to_frame()</code> for the table, "
        "<code>.to_json()</code> for everything.</p></div>"
    )


def _breakdown_medians(b: Breakdown) -> tuple[int | None, dict[str, int | None]]:
    pt = b.per_token
    return pt.step_ns.median, {p: v.median for p, v in pt.parts_ns.items()}


def _where(paths: list[str]) -> str:
    """The run's paths in a few characters: one path, or the folder its rank files share."""
    import os

    if not paths:
        return "run"
    if len(paths) == 1:
        return paths[0]
    try:
        return os.path.commonpath(paths) + f" ({len(paths)} files)"
    except ValueError:
        return f"{paths[0]} and {len(paths) - 1} more"


def breakdown_repr(b: Breakdown) -> str:
    step, parts = _breakdown_medians(b)
    where = _where(b.paths)
    shown = ", ".join(f"{p} {v / 1e6:.3f}" for p, v in parts.items() if v)
    return (
        f"Breakdown({where}: {len(b.ranks)} rank(s), {len(b.steps)} step windows ({b.step_rule}), "
        f"median step {fmt_ms(step)} = {shown} ms)"
    )


def breakdown_html(b: Breakdown) -> str:
    step, parts = _breakdown_medians(b)
    rows = [
        (p, [fmt_ms(v), fmt_pct(v / step if (v is not None and step) else None)], False)
        for p, v in parts.items()
    ]
    where = _where(b.paths)
    return (
        f'{_STYLE}<div class="tk-result"><p><b>{_esc(where)}: median step {_esc(fmt_ms(step))} on '
        f"{len(b.ranks)} rank(s), {len(b.steps)} step windows (rule {_esc(b.step_rule)}, "
        f"{_esc(b.timeline)} timeline)</b></p>"
        + _table(["part", "median per step", "share of the step"], rows)
        + "<p>Medians over steps of the mean over ranks; <code>.to_frame()</code> for every (rank, step).</p></div>"
    )
