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

from tracekit.report.data import (
    PARTS,
    ReportData,
    fmt_bytes,
    fmt_gbps,
    fmt_ms,
    fmt_pct,
    fmt_us,
    fmt_x,
)

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#])")


def md_esc(value: Any) -> str:
    """Escape a value for a Markdown table cell or line."""
    text = html.escape("" if value is None else str(value), quote=False)
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return text.replace("\r", " ").replace("\n", " ")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def render_markdown(data: ReportData) -> str:
    lines: list[str] = [f"# {md_esc(data.title)}", ""]
    lines += [f"**{md_esc(data.verdict)}**", ""]
    if data.diagnosis:
        lines += [f"Next: {md_esc(data.diagnosis)}", ""]
    d = data.dilation
    lines += [md_esc(d["sentence"]), ""]
    if d.get("warning"):
        lines += [f"> **{md_esc(d['warning'])}**", ""]
    if d.get("caution"):
        lines += [f"> **{md_esc(d['caution'])}**", ""]
    if d.get("reconciliation"):
        lines += [f"Reconciliation: {md_esc(d['reconciliation'])}", ""]

    lines += ["## Key figures", ""]
    lines += _table(
        ["figure", "value", "key"],
        [[md_esc(k["label"]), md_esc(k["text"]), f"`{k['key']}`"] for k in data.key_figures],
    )

    dil_runs = [r for r in d["runs"] if r.get("unprofiled_median_ns") is not None]
    if dil_runs:
        lines += _table(
            ["run", "per token, unprofiled (median)", "per token, profiled (median)", "dilation"],
            [
                [
                    md_esc(r["run"]),
                    fmt_ms(r["unprofiled_median_ns"]),
                    fmt_ms(r.get("profiled_median_ns")),
                    fmt_x(r["dilation"]),
                ]
                for r in dil_runs
            ],
        )

    a = data.attribution
    if a is not None:
        lines += ["## Shortfall attribution", ""]
        rows = []
        for w in a["waterfall"]:
            term = w["term"]
            spread = (
                a["spread_ns"].get(term.split(".")[-1] if term.startswith("coordination.") else term) or {}
            )
            share = w["ns"] / a["shortfall_ns"] if a["shortfall_ns"] else None
            sp = f"{fmt_ms(spread.get('p10'))} .. {fmt_ms(spread.get('p90'))}" if spread else ""
            rows.append([md_esc(w["label"]), fmt_ms(w["ns"]), fmt_pct(share), sp])
        rows.append(["**shortfall S**", fmt_ms(a["shortfall_ns"]), "100.0%", ""])
        lines += _table(["term", "per token", "share of S", "spread over steps (p10 .. p90)"], rows)
        if a.get("per_token_source"):
            lines += [f"Per-token times from the {md_esc(a['per_token_source'])} pass.", ""]

    lines += ["## Per-rank medians", ""]
    for run in data.runs:
        lines += [
            f"### {md_esc(run['role'])} run ({run['n_ranks']} rank(s), {run['step_ns'].get('n', 0)} steps)",
            "",
        ]
        rows = [
            [str(r["rank"]), str(r["steps"]), fmt_ms(r["step_ns_median"])]
            + [fmt_ms(r["parts_ns_median"].get(p)) for p in PARTS]
            for r in run["per_rank"]
        ]
        lines += _table(["rank", "steps", "step (median)"] + list(PARTS), rows)

    c = data.collectives
    if c is not None:
        lines += ["## Collectives: wait vs transfer", ""]
        per_tok = f", {round(c['per_token'], 2)} per token" if c.get("per_token") is not None else ""
        lines += [f"{c['instances']} collective instances matched across ranks{per_tok}.", ""]
        if c["by_op"]:
            lines += _table(
                [
                    "op",
                    "message",
                    "count",
                    "wait (median of per-collective max)",
                    "transfer (median)",
                    "skew (median)",
                    "busbw (median)",
                ],
                [
                    [
                        md_esc(o["op"]),
                        fmt_bytes(o["bytes"]),
                        str(o["count"]),
                        fmt_us(o["wait_ns_median"]),
                        fmt_us(o["transfer_ns_median"]),
                        fmt_us(o["skew_ns_median"]),
                        fmt_gbps(o["busbw_gbps_median"]),
                    ]
                    for o in c["by_op"]
                ],
            )
    if data.stragglers:
        lines += ["### Stragglers: how often each rank arrives last", ""]
        lines += _table(
            ["rank", "last", "of instances", "share"],
            [
                [str(s["rank"]), str(s["last_count"]), str(s["instances"]), fmt_pct(s["share"])]
                for s in data.stragglers
            ],
        )

    b = data.busbw
    if b["probes"] or data.links is not None:
        lines += ["## Realised bandwidth and link probes", ""]
        L = data.links or {}
        if L.get("verdict"):
            lines += [f"**{md_esc(L['verdict'])}**", ""]
        for n in L.get("notes") or []:
            lines += [f"- {md_esc(n)}"]
        if L.get("notes"):
            lines += [""]
        if L.get("note"):
            lines += [md_esc(L["note"]), ""]
        transports = L.get("transports") or {}
        if isinstance(transports, dict) and transports:
            lines += _table(
                ["mode", "what the run used"],
                [
                    [md_esc(k), md_esc(v if isinstance(v, str) else json.dumps(v))]
                    for k, v in transports.items()
                ],
            )
        for curve in b["probes"]:
            lines += [f"### {md_esc(curve['label'])}", ""]
            lines += _table(
                ["message", "busbw"],
                [[fmt_bytes(p["bytes"]), fmt_gbps(p["busbw_gbps"])] for p in curve["points"]],
            )

    for run in data.runs:
        if run["unknown_kernels"]:
            lines += [f"## {md_esc(run['role'])} run: unclassified kernels", ""]
            lines += _table(
                ["name", "count", "total"],
                [[md_esc(k["name"]), str(k["count"]), fmt_ms(k["total_ns"])] for k in run["unknown_kernels"]],
            )

    lines += ["## What ran, where (manifest)", ""]
    for m in data.manifests:
        lines += [f"### {md_esc(m['role'])} run" + (f": `{md_esc(m['path'])}`" if m.get("path") else ""), ""]
        if not m["present"]:
            lines += ["No manifest.json: what ran and where is unknown.", ""]
            continue
        rows = []
        w = m["workload"]
        for k, v in w.items():
            rows.append([md_esc(k), md_esc(v if isinstance(v, str) else json.dumps(v))])
        for k, v in m["host"].items():
            rows.append([f"host.{md_esc(k)}", md_esc(v)])
        for dev in m["devices"]:
            rows.append(
                [
                    f"device {dev.get('index')}",
                    md_esc(f"{dev.get('name')} ({fmt_bytes(dev.get('memory_bytes'))})"),
                ]
            )
        for k, v in m["versions"].items():
            rows.append([f"version.{md_esc(k)}", md_esc(v)])
        if m.get("dilation") is not None:
            rows.append(["dilation", fmt_x(m["dilation"])])
        if m.get("command"):
            rows.append(["command", md_esc(m["command"])])
        lines += _table(["field", "value"], rows)

    if data.notes:
        lines += ["## Notes", ""] + [f"- {md_esc(n)}" for n in data.notes] + [""]
    lines += [
        f"_{md_esc(data.generator)}, {md_esc(data.created)}; schema {data.kind} {data.schema_version}_",
        "",
    ]
    return "\n".join(lines)
