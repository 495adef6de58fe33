"""The view of a link comparison (`tracekit compare-links`' text): its typed document
(`tracekit.model.documents.Links`, docs/JSON.md#compare_links) as the side-by-side table of the
probe's modes, the decode trace and shortfall it was judged against, the per-size figures and the
verdict."""

from __future__ import annotations

import math

from msgspec import UNSET

from tracekit.analyse.links.words import fmt_gbps
from tracekit.model.documents import Links, given
from tracekit.model.documents.links import LinksTopology
from tracekit.model.units import ms_or_us as fmt_ns


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def table(doc: Links) -> str:
    """Side-by-side table: busbw per mode and the ratio per size; decode sizes marked with *.

    On the CPU (every mode a gloo sweep) the modes are the same path: they are shown as "run 1",
    "run 2", without their NCCL names, per-mode transport notes or a ratio column (issue 24)."""
    modes = [m.mode or "" for m in doc.modes]
    cpu_only = bool(doc.modes) and all(m.device == "cpu" for m in doc.modes)
    label = {m: (f"run {i + 1}" if cpu_only else m) for i, m in enumerate(modes)}
    out = ["# tracekit compare-links"]
    loaded_from = given(doc.loaded_from)
    if loaded_from:
        out.append(f"# probe results from {loaded_from}")
    mode_notes = {n for mode in doc.modes for n in mode.notes}
    for mode in doc.modes:
        env = " ".join(f"{k}={v}" for k, v in mode.env.items())
        where = f"{mode.backend} on {mode.device} {mode.devices or ''} ranks {mode.ranks}"
        out.append(
            f"# {label[mode.mode or '']}: {where} (the same sweep in every run)"
            if cpu_only
            else f"# mode {mode.mode}: {where}; env {env}"
        )
    for note in doc.notes:
        if not (cpu_only and note in mode_notes):
            out.append(f"# note: {note}")
    head = f"# {'op':<15} {'form':<4} {'size(B)':>12}" + "".join(
        f" {label[m] + ' busbw':>14} {label[m] + ' us':>11}" for m in modes
    )
    head += "  decode" if cpu_only else f" {'ratio':>7}  decode"
    out.append(head)
    for e in doc.side_by_side:
        line = f"  {e.op:<15} {'in' if e.in_place else 'out':<4} {e.bytes:>12}"
        for m in modes:
            bw, t = e.busbw_gbps.get(m), e.time_us.get(m)
            line += f" {bw:>14.2f}" if bw is not None and _finite(bw) else f" {'-':>14}"
            line += f" {t:>11.2f}" if t is not None and _finite(t) else f" {'-':>11}"
        if not cpu_only:
            line += f" {e.ratio:>7.2f}" if e.ratio is not None else f" {'-':>7}"
        line += "  *" if e.decode else ""
        out.append(line)
    tr = doc.trace
    if tr:
        trace_mode = f", mode {tr.mode}" if tr.mode else ""
        out.append(
            f"# decode trace {tr.path}: ranks {tr.ranks}, steps {tr.steps}, source {tr.source}{trace_mode}"
        )
    sf = doc.shortfall
    if sf:
        pt = sf.per_token_ns
        out.append(
            f"# shortfall vs {sf.baseline}: S = {fmt_ns(sf.shortfall_ns or 0)} per token "
            f"(TP={sf.n_ranks} {fmt_ns(pt.sharded or 0)} vs ideal {fmt_ns(pt.ideal or 0)}, {sf.per_token_source}); "
            f"transfer term {fmt_ns(sf.transfer_ns or 0)}"
        )
    per_size = doc.verdict_details.per_size
    if tr and per_size and per_size[0].transfer_weight is not UNSET:
        for ps in per_size:
            bw = given(ps.realised_busbw_gbps)
            per_token = given(ps.per_token)
            n = f"{per_token:.3g}/token" if per_token is not None else str(given(ps.count))
            line = f"#   {ps.op:<15} {ps.bytes:>12} B x{n}: realised {fmt_gbps(bw if bw is not None else math.nan)} GB/s"
            if given(ps.swept):
                probe = ", ".join(
                    f"{label.get(m, m)} {fmt_gbps(v if v is not None else math.nan)}"
                    for m, v in (given(ps.probe_busbw_gbps) or {}).items()
                )
                k = given(ps.k)
                kk = f", k {k:.2f}" if k is not None and math.isfinite(k) else ""
                line += f"; probe {probe} GB/s ({given(ps.regime)}-bound{kk})"
            tpt = given(ps.transfer_ns_per_token)
            if tpt is not None:
                line += f"; transfer {fmt_ns(tpt)}/token"
                bound = given(ps.bound_ns_per_token)
                if bound is not None:
                    line += f", bound {fmt_ns(bound)}"
            out.append(line)
    out.append(f"# verdict: {doc.verdict}")
    return "\n".join(out) + "\n"


def topology_text(doc: LinksTopology) -> str:
    """`tracekit probe --links`: the machine's link per GPU pair (where it was read from, its
    notes, then a row per pair: link, NVLink count, NVLink P2P, NVSwitch, PCIe path, PCIe P2P;
    `?` where it is not known)."""
    lines = [f"# links per GPU pair (source: {doc.source or 'none'})"]
    lines += [f"# note: {n}" for n in doc.notes]
    lines.append(
        f"# {'pair':<8} {'link':<7} {'nvlinks':>7} {'nvlink_p2p':>10} {'nvswitch':>8} {'pcie_path':>10} {'pcie_p2p':>8}"
    )
    for x in doc.links:
        nvlinks = given(x.nvlinks)
        lines.append(
            f"  {given(x.gpu_a)}-{given(x.gpu_b):<6} {given(x.link):<7} {nvlinks if nvlinks is not None else '?':>7} "
            f"{str(given(x.nvlink_p2p)):>10} {str(given(x.nvswitch)):>8} {given(x.pcie_path) or '?':>10} "
            f"{str(given(x.pcie_p2p)):>8}"
        )
    return "\n".join(lines) + "\n"
