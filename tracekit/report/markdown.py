"""The Markdown report, rendered from a `ReportData`: the same sentences and numbers as the HTML
page (both print through `data.fmt_*` and `data.key_figures`), in tables, without figures.

Names from traces are escaped for Markdown renderers that accept HTML: `<`, `>` and `&` become
entities, and Markdown's own markup characters are backslash-escaped.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from tracekit.model.documents import given, to_builtins
from tracekit.model.parts import PARTS
from tracekit.model.units import fmt_ms, fmt_x
from tracekit.report.data import ReportData
from tracekit.report.sections import tables
from tracekit.report.sections.fmt import fmt_bytes, fmt_gbps, present_fields, prose
from tracekit.report.sections.rows import dilation_summary, path_note, short_name, top_kernels_tables
from tracekit.report.sections.shortfall import straggler_sentence
from tracekit.report.sections.tables import Cell, Table

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#])")


def md_esc(value: Any) -> str:
    """Escape a value for a Markdown table cell or line."""
    text = html.escape("" if value is None else str(value), quote=False)
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return text.replace("\r", " ").replace("\n", " ")


def md_code(value: Any) -> str:
    """A value as a Markdown code span: shown literally (no markup, no HTML, no entity is
    interpreted inside one, so no escaping either: md_esc's backslashes would show). The fence is
    one backtick longer than the longest run of backticks in the value, so a name cannot close it."""
    text = ("" if value is None else str(value)).replace("\r", " ").replace("\n", " ")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_MD_SPECIAL_OURS = re.compile(r"([\\`*_|#])")


def md_ours(value: Any) -> str:
    """Escape a sentence tracekit wrote from numbers and fixed words (the dilation line): as
    `md_esc`, but brackets stay as they are, so an interval reads "[1.27-1.48]" (no link can form:
    there is no trace name in it and no "(" follows)."""
    text = html.escape("" if value is None else str(value), quote=False)
    text = _MD_SPECIAL_OURS.sub(r"\\\1", text)
    return text.replace("\r", " ").replace("\n", " ")


#: a cell that reads as a number: a signed figure, a percentage, a ratio, an interval, "n/a"
_NUMERIC = re.compile(r"^(\*\*)?[-+~]?(\d|\.\d|n/a\b|within noise|below zero)")


def _is_numeric(cells: list[str]) -> bool:
    filled = [c.strip() for c in cells if c.strip()]
    return bool(filled) and all(_NUMERIC.match(c) for c in filled)


def _indent(cell: str) -> str:
    """Leading spaces (a sub-row's indent) as non-breaking spaces: Markdown trims a cell's spaces."""
    stripped = cell.lstrip(" ")
    return "&nbsp;" * (len(cell) - len(stripped)) + stripped


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table: number columns right-aligned (every filled cell of the column reads as a
    number; the first column is a label), sub-rows' leading spaces kept."""
    align = ["---"] + [
        "---:" if _is_numeric([r[i] for r in rows if i < len(r)]) else "---" for i in range(1, len(headers))
    ]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align[: len(headers)]) + "|"]
    out += ["| " + " | ".join(_indent(c) for c in r) + " |" for r in rows]
    return out + [""]


def _md(t: Table | None) -> list[str]:
    """A table of the report's model (`sections.tables`) in Markdown: names escaped, numbers and
    fixed words as they are."""
    if t is None:
        return []

    def cell(c: Cell) -> str:
        text = md_esc(c.text) if c.name else c.text
        return f"**{text}**" if c.bold else text

    return _table([md_esc(h) for h in t.headers], [[cell(c) for c in r] for r in t.rows])


def _per_rank_md(data: ReportData) -> list[str]:
    """The "Per rank" table: each rank's own attribution of S beside the aggregate (mean over ranks)."""
    table = tables.per_rank_table(data)
    if table is None:
        return []
    out = ["### Per rank", ""]
    out += [
        "Each rank's own parts minus the baseline's, each summing to S; the aggregate is their mean. "
        "Cells: per token (share of S).",
        "",
    ]
    return out + _md(table)


def _critical_path_md(data: ReportData) -> list[str]:
    """The "Critical path" section: the cause sentence, per rank what lies on the path, the offset."""
    cp = data.critical_path
    if cp is None:
        return []
    out = ["## Critical path", ""]
    if cp.cause:
        out += [f"**{md_esc(prose(cp.cause))}**", ""]
    out += _md(tables.path_table(data))
    out += [md_esc(path_note(cp)), ""]
    return out


def _extras_md(data: ReportData) -> list[str]:
    """One section per --extra result: the answer in bold, its figures (same rows as Key figures,
    so the keys match the HTML's), its tables, lines and notes; every name escaped."""
    out: list[str] = []
    for x in data.extras:
        out += [f"## {md_esc(x.title)}", ""]
        if x.path:
            out += [f"From {md_code(x.path)}.", ""]
        out += [f"**{md_esc(prose(x.answer))}**", ""]
        if x.figures:
            out += _table(
                ["figure", "value", "key"],
                [[md_esc(f.label), md_ours(f.text), md_code(f.key)] for f in x.figures],
            )
        for t, text_columns in zip(x.tables, x.text_columns, strict=True):
            out += [f"### {md_esc(t.caption)}", ""]
            out += _table(
                [md_esc(h) for h in t.headers],
                [[md_esc(c) if i in text_columns else md_ours(c) for i, c in enumerate(r)] for r in t.rows],
            )
        for line in x.lines:
            out += [md_esc(prose(line)), ""]
        if x.notes:
            out += [f"- {md_esc(prose(n))}" for n in x.notes] + [""]
    return out


def _dilation_md(data: ReportData) -> list[str]:
    """The profiler's dilation, the cross-check, the warning and the reconciliation, collapsed under
    one line (<details>, which GitHub and most renderers fold)."""
    d = data.dilation
    summary = dilation_summary(data, threshold_note=False)
    out = ["<details>", f"<summary>{html.escape(summary, quote=False)}</summary>", ""]
    out += [md_ours(prose(d.sentence)), ""]
    if d.cross_check:
        out += [md_ours(prose(d.cross_check)), ""]
    if d.warning:
        out += [f"> **{md_esc(prose(d.warning))}**", ""]
    if d.reconciliation:
        out += [f"Reconciliation: {md_esc(prose(d.reconciliation))}", ""]
    a = data.attribution
    if a is not None:
        out += [f"Uncorrected (trace-only) shortfall: {fmt_ms(a.uncorrected.shortfall_ns)} per token.", ""]
    out += _md(tables.dilation_table(data))
    return out + ["</details>", ""]


def _attribution_md(data: ReportData) -> list[str]:
    """The shortfall's terms (the waterfall's numbers) with their 95% intervals when the shortfall
    has them; a share only where the term is clear of the noise."""
    a = data.attribution
    if a is None:
        return []
    method = a.intervals.method if a.intervals is not None else None
    return _md(tables.attribution_table(data)) + (
        [f"Intervals: {md_esc(prose(method))}.", ""] if method else []
    )


def _top_kernels_md(data: ReportData) -> list[str]:
    out: list[str] = []
    for tk in top_kernels_tables(data):
        out += [f"### {md_esc(tk.caption)}", "", md_esc(tk.note), ""]
        out += _table(
            list(tk.headers),
            [
                [
                    f"**{md_esc(c)}**" if is_class else "",
                    f"**{md_esc(name)}**" if is_class else md_esc(short_name(name)),
                    cnt,
                    tot,
                    mean,
                    share,
                ]
                for c, name, cnt, tot, mean, share, is_class in tk.rows
            ],
        )
    return out


def render_markdown(data: ReportData) -> str:
    """Answer first: the headline line, the attribution (the waterfall's numbers), the verdict's
    sentences; dilation and reconciliation folded; then the detail sections."""
    lines: list[str] = [f"# {md_esc(data.title)}", ""]
    lines += [f"**{md_ours(prose(data.headline or data.verdict))}**", ""]
    lines += _attribution_md(data)
    lines += [md_esc(prose(data.verdict)), ""]
    if data.diagnosis:
        lines += [f"Next: {md_esc(prose(data.diagnosis))}", ""]
    if data.dilation.caution:
        lines += [f"> **{md_esc(prose(data.dilation.caution))}**", ""]
    lines += _dilation_md(data)
    a = data.attribution
    if a is not None:
        if a.aggregate:
            lines += [f"Aggregate over ranks: {md_esc(prose(a.aggregate))}.", ""]
        lines += _per_rank_md(data)
    lines += _critical_path_md(data)

    lines += ["## Key figures", ""]
    lines += _table(
        ["figure", "value", "key"],
        [[md_esc(k.label), md_esc(k.text), f"`{k.key}`"] for k in data.key_figures],
    )

    lines += ["## Per-rank medians", ""]
    for run in data.runs:
        lines += [
            f"### {md_esc(run.role)} run ({run.n_ranks} rank(s), {run.step_ns.n} steps)",
            "",
        ]
        rows = [
            [str(r.rank), str(r.steps), fmt_ms(r.step_ns_median)]
            + [fmt_ms(r.parts_ns_median.get(p)) for p in PARTS]
            for r in run.per_rank or []
        ]
        lines += _table(["rank", "steps", "step (median)"] + list(PARTS), rows)

    c = data.collectives
    if c is not None:
        lines += ["## Collectives: wait vs transfer", ""]
        per_tok = f", {round(c.per_token, 2)} per token" if c.per_token is not None else ""
        lines += [f"{c.instances} collective instances matched across ranks{per_tok}.", ""]
        lines += _md(tables.collectives_table(data))
    st_line = straggler_sentence(data.straggler)
    if st_line:
        lines += [md_esc(st_line), ""]
    if data.stragglers:
        lines += ["### Stragglers: how often each rank arrives last", ""]
        lines += _md(tables.stragglers_table(data))

    b = data.busbw
    if b.probes or data.links is not None:
        lines += ["## Realised bandwidth and link probes", ""]
        L = data.links
        if L is not None:
            if L.verdict:
                lines += [f"**{md_esc(prose(L.verdict))}**", ""]
            notes = given(L.notes) or []
            lines += [f"- {md_esc(n)}" for n in notes] + ([""] if notes else [])
            if L.note:
                lines += [md_esc(L.note), ""]
            lines += _md(tables.transports_table(data))
        for curve in b.probes:
            lines += [f"### {md_esc(curve.label)}", ""]
            lines += _table(
                ["message", "busbw"], [[fmt_bytes(p.bytes), fmt_gbps(p.busbw_gbps)] for p in curve.points]
            )

    top = _top_kernels_md(data)
    if top:
        lines += ["## Top kernels per class", "", *top]
    lines += _extras_md(data)

    for run in data.runs:
        if run.unknown_kernels:
            lines += [f"## {md_esc(run.role)} run: unclassified kernels", ""]
            lines += _table(
                ["name", "count", "total"],
                [[md_esc(k.name), str(k.count), fmt_ms(k.total_ns)] for k in run.unknown_kernels],
            )

    lines += ["## What ran, where (manifest)", ""]
    for m in data.manifests:
        lines += [f"### {md_esc(m.role)} run" + (f": {md_code(m.path)}" if m.path else ""), ""]
        if not m.present:
            lines += ["No manifest.json: what ran and where is unknown.", ""]
            continue
        rows = []
        for k, v in present_fields(m.workload):
            rows.append([md_esc(k), md_esc(v if isinstance(v, str) else json.dumps(to_builtins(v)))])
        for k, v in present_fields(m.host):
            rows.append([f"host.{md_esc(k)}", md_esc(v)])
        for dev in given(m.devices) or []:
            rows.append([f"device {dev.index}", md_esc(f"{dev.name} ({fmt_bytes(dev.memory_bytes)})")])
        for k, v in (given(m.versions) or {}).items():
            rows.append([f"version.{md_esc(k)}", md_esc(v)])
        dil = given(m.capture_dilation)
        if dil is not None:
            rows.append(["capture's host-clock dilation (cross-check, not the factor applied)", fmt_x(dil)])
        command = given(m.command)
        if command:
            rows.append(["command", md_esc(command)])
        lines += _table(["field", "value"], rows)

    if data.notes:
        lines += ["## Notes", ""] + [f"- {md_esc(prose(n))}" for n in data.notes] + [""]
    lines += [
        f"_{md_esc(data.generator)}, {md_esc(data.created)}; schema {data.kind} {data.schema_version}_",
        "",
    ]
    return "\n".join(lines)
