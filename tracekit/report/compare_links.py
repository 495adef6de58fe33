"""`tracekit compare-links`' text output: the side-by-side table of the probe's modes, the decode
trace and shortfall it was judged against, the per-size figures and the verdict."""

from __future__ import annotations

import math
from typing import Any

from tracekit.analyse.links.verdict import fmt_gbps
from tracekit.model.units import ms_or_us as fmt_ns


def format_compare(result: dict[str, Any]) -> str:
    """Side-by-side table: busbw per mode and the ratio per size; decode sizes marked with *."""
    modes = [m["mode"] for m in result["modes"]]
    out = ["# tracekit compare-links"]
    if result.get("loaded_from"):
        out.append(f"# probe results from {result['loaded_from']}")
    for m in result["modes"]:
        env = " ".join(f"{k}={v}" for k, v in m["env"].items())
        out.append(
            f"# mode {m['mode']}: {m['backend']} on {m['device']} {m['devices'] or ''} ranks {m['ranks']}; env {env}"
        )
    for note in result["notes"]:
        out.append(f"# note: {note}")
    head = f"# {'op':<15} {'form':<4} {'size(B)':>12}" + "".join(
        f" {m + ' busbw':>14} {m + ' us':>11}" for m in modes
    )
    head += f" {'ratio':>7}  decode"
    out.append(head)
    for e in result["side_by_side"]:
        line = f"  {e['op']:<15} {'in' if e['in_place'] else 'out':<4} {e['bytes']:>12}"
        for m in modes:
            bw, t = e["busbw_gbps"].get(m), e["time_us"].get(m)
            line += f" {bw:>14.2f}" if bw is not None and math.isfinite(bw) else f" {'-':>14}"
            line += f" {t:>11.2f}" if t is not None and math.isfinite(t) else f" {'-':>11}"
        line += f" {e['ratio']:>7.2f}" if e["ratio"] is not None else f" {'-':>7}"
        line += "  *" if e["decode"] else ""
        out.append(line)
    tr = result.get("trace")
    if tr:
        mode = f", mode {tr['mode']}" if tr.get("mode") else ""
        out.append(
            f"# decode trace {tr['path']}: ranks {tr['ranks']}, steps {tr['steps']}, source {tr['source']}{mode}"
        )
    sf = result.get("shortfall")
    if sf:
        pt = sf["per_token_ns"]
        out.append(
            f"# shortfall vs {sf['baseline']}: S = {fmt_ns(sf['shortfall_ns'])} per token "
            f"(TP={sf['n_ranks']} {fmt_ns(pt['sharded'])} vs ideal {fmt_ns(pt['ideal'])}, {sf['per_token_source']}); "
            f"transfer term {fmt_ns(sf['transfer_ns'])}"
        )
    d = result.get("verdict_details") or {}
    if tr and d.get("per_size") and "transfer_weight" in d["per_size"][0]:
        for e in d["per_size"]:
            bw = e["realised_busbw_gbps"]
            n = f"{e['per_token']:.3g}/token" if e.get("per_token") is not None else str(e["count"])
            line = f"#   {e['op']:<15} {e['bytes']:>12} B x{n}: realised {fmt_gbps(bw)} GB/s"
            if e.get("swept"):
                probe = ", ".join(f"{m} {fmt_gbps(v)}" for m, v in e["probe_busbw_gbps"].items())
                k = f", k {e['k']:.2f}" if math.isfinite(e["k"]) else ""
                line += f"; probe {probe} GB/s ({e['regime']}-bound{k})"
            if e.get("transfer_ns_per_token") is not None:
                line += f"; transfer {fmt_ns(e['transfer_ns_per_token'])}/token"
                if e.get("bound_ns_per_token") is not None:
                    line += f", bound {fmt_ns(e['bound_ns_per_token'])}"
            out.append(line)
    out.append(f"# verdict: {result['verdict']}")
    return "\n".join(out) + "\n"
