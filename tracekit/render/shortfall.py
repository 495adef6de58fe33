"""The view of a shortfall (`tracekit shortfall`'s table): its typed document
(`tracekit.model.documents.Shortfall`, docs/JSON.md#shortfall) as text, the verdict first, then
the figures."""

from __future__ import annotations

from tracekit.analyse.compute.kernel_scaling import short_kernel_name
from tracekit.analyse.prose import chance_clause
from tracekit.model import units
from tracekit.model.documents import Shortfall, given
from tracekit.model.documents.shortfall import ShortfallComputeScaling
from tracekit.model.parts import PATH_PARTS
from tracekit.render.writers import Console, Table, console_text, text_console, titled_table

_SCALING_WORDS = {
    "replicated": "replicated (did not shrink)",
    "partly_shrank": "shrank less than N-fold",
    "shrank": "shrank N-fold",
    "added": "only in the sharded run",
    "removed": "only in the baseline",
}


def dilation_words(ratio: float | None, interval: list[float] | None = None) -> str:
    """A dilation with its interval, as the verdict prints it: "1.37x [1.27-1.48]"."""
    if ratio is None:
        return "unknown"
    text = f"{ratio:.2f}x"
    if interval is not None and len(interval) == 2 and None not in interval:
        text += f" [{interval[0]:.2f}-{interval[1]:.2f}]"
    return text


def _short(words: str) -> str:
    return words.split(" (", 1)[0]


def compute_scaling_table(console: Console, cs: ShortfallComputeScaling | None, n: int) -> None:
    """The compute term split by kernel class, with each class's top kernel (JSON `compute_scaling`)."""
    classes = given(cs.classes) if cs is not None and cs.available else None
    if cs is None or classes is None:
        return
    t = titled_table(
        f"Compute that did not shrink, by kernel: {units.ms(given(cs.compute_term_ns))} ms per token = the "
        f"classes + residual (TP=1 -> TP={n}, per rank)",
        ("class", "lost ms", "kernels/token", "TP=1 ms", f"TP={n} ms", "top kernel (lost ms)"),
        left=("class", "top kernel (lost ms)"),
    )
    for c in ("replicated", "partly_shrank", "shrank", "added", "removed"):
        v = getattr(classes, c)
        if not v.kernels_per_token:
            continue
        top = v.top[0] if v.top else None
        t.add_row(
            _SCALING_WORDS[c],
            units.ms(v.lost_ns),
            str(v.kernels_per_token),
            units.ms(v.baseline_ns),
            units.ms(v.sharded_ns),
            f"{short_kernel_name(top.name)} ({units.ms(top.lost_ns)})" if top else "",
        )
    t.add_row("residual (overlap, steps off the sequence)", units.ms(given(cs.residual_ns)), "", "", "", "")
    console.print(t)


def _share_cell(iv: list[int] | None, share: float | None) -> str:
    # a share only for a term whose interval is above zero (docs/METHOD.md section "Noise and
    # the profiler correction"): within noise or below zero is said as such, not as a share
    if not iv or iv[0] > 0:
        return units.pct(share)
    if iv[0] == iv[1] == 0:
        return "none"
    return "below zero" if iv[1] < 0 else "within noise"


def _iv_cell(iv: list[int] | None) -> str:
    return f"[{units.ms(iv[0])}, {units.ms(iv[1])}]" if iv else ""


def table(doc: Shortfall, width: int | None = None, color: bool = True) -> str:
    """The human-readable report: verdict first, then the figures (rich tables) as text."""
    console = text_console(width, color)
    console.print(f"[bold]{doc.verdict}[/bold]")
    if doc.diagnosis:
        console.print(f"Next: {doc.diagnosis}")
    console.print()

    pt = doc.per_token_ns
    n = doc.n_ranks
    head = titled_table(
        f"Per-token time (ms; source: {doc.per_token_source}, mean over steady steps)",
        ("", "ms", "median ms"),
    )
    med = doc.per_token_median_ns
    head.add_row(f"T1 (baseline, {doc.baseline_ranks} rank)", units.ms(pt.baseline), units.ms(med.baseline))
    head.add_row(f"TN (sharded, N={n})", units.ms(pt.sharded), units.ms(med.sharded))
    head.add_row(f"ideal T1/{n}" if doc.baseline_ranks == 1 else "ideal", units.ms(pt.ideal), "")
    head.add_row("[bold]shortfall S[/bold]", f"[bold]{units.ms(doc.shortfall_ns)}[/bold]", "")
    console.print(head)

    words = given(doc.term_words) or {}
    transfer_label = f"transfer ({_short(words['transfer'])})" if words.get("transfer") else "transfer"
    label = {k: k for k in doc.terms_ns} | {"transfer": transfer_label}
    agg = given(doc.aggregate)
    terms = titled_table(
        "Attribution of S (terms sum to S exactly)" + (f"; aggregate: {agg}" if agg else ""),
        (
            "term",
            "ms",
            "95% interval ms",
            "share of S",
            "p10 ms",
            "median ms",
            "p90 ms",
            "uncorrected ms",
        ),
    )
    spread = doc.spread_ns
    unc = doc.uncorrected
    ivs = given(doc.intervals)
    term_ivs = ivs.terms_ns if ivs is not None else {}
    coord_ivs = ivs.coordination_ns if ivs is not None else {}

    def spread_cells(k: str) -> list[str]:
        sp = spread.get(k)
        return [units.ms(sp.p10), units.ms(sp.median), units.ms(sp.p90)] if sp else [units.ms(None)] * 3

    for k, v in doc.terms_ns.items():
        terms.add_row(
            label[k],
            units.ms(v),
            _iv_cell(term_ivs.get(k)),
            _share_cell(term_ivs.get(k), doc.shares[k]),
            *spread_cells(k),
            units.ms(unc.terms_ns.get(k)),
        )
    for k, v in doc.coordination_ns.items():
        share = v / doc.shortfall_ns if doc.shortfall_ns else None
        terms.add_row(
            f"  coordination: {k}",
            units.ms(v),
            _iv_cell(coord_ivs.get(k)),
            _share_cell(coord_ivs.get(k), share),
            *spread_cells(k),
            units.ms(unc.coordination_ns.get(k)),
        )
    terms.add_row(
        "S",
        units.ms(doc.shortfall_ns),
        _iv_cell(ivs.shortfall_ns if ivs is not None else None),
        "100.0%",
        "",
        "",
        "",
        units.ms(unc.shortfall_ns),
    )
    console.print(terms)
    if ivs is not None and ivs.method:
        console.print(f"Intervals: {ivs.method}.")
    if words:
        console.print("What the terms are in this run:")
        for k in doc.terms_ns:
            if words.get(k):
                console.print(f"  {k}: {words[k]}")

    s_ns = doc.shortfall_ns
    per_rank = given(doc.per_rank) or []
    if per_rank:
        pr = Table(
            title="Per rank: each rank's own attribution of S, ms (share of S); its parts minus the baseline's, "
            "each rank sums to S; the attribution above is their mean",
            title_justify="left",
        )
        pr.add_column("term", justify="right")
        for r in per_rank:
            pr.add_column(f"rank {r.rank}", justify="right")
        pr.add_column("mean", justify="right")

        def cell(ns: int | None) -> str:
            return f"{units.ms(ns)} ({units.pct(ns / s_ns if s_ns and ns is not None else None)})"

        for k in doc.terms_ns:
            pr.add_row(
                label.get(k, k), *[cell(r.terms_ns.get(k, 0)) for r in per_rank], cell(doc.terms_ns[k])
            )
        for c in ("wait", "sync", "idle"):
            pr.add_row(
                f"coordination: {c}",
                *[cell(r.coordination_ns.get(c, 0)) for r in per_rank],
                cell(doc.coordination_ns.get(c, 0)),
            )
        pr.add_row("pad (idle to the step time)", *[units.ms(r.pad_ns) for r in per_rank], "")
        console.print(pr)

    cp = given(doc.critical_path)
    if cp is not None and cp.by_rank:
        step = cp.step_ns
        path_label = {p: p for p in PATH_PARTS} | {"transfer": transfer_label}
        gpu = doc.steps.sharded.timeline == "gpu"
        path_label["host"] = "host (launch gaps, host work)" if gpu else "host (time between its ops)"
        ranks = sorted(cp.by_rank.items(), key=lambda kv: int(kv[0]))
        base = sorted(cp.baseline.by_rank.items())
        ct_path = Table(
            title=f"Critical path of a token, ms (rendezvous model: a collective starts when its last rank "
            f"arrives; waiting is not on the path): ranks + offset {units.ms(cp.offset_ns)} = T{n} {units.ms(step)}",
            title_justify="left",
        )
        ct_path.add_column("on the path", justify="right")
        for rank, _row in ranks:
            ct_path.add_column(f"rank {rank}", justify="right")
        ct_path.add_column("offset", justify="right")
        for base_rank, _base_row in base:
            ct_path.add_column(f"TP=1 token (rank {base_rank})", justify="right")
        for p in PATH_PARTS:
            ct_path.add_row(
                path_label[p],
                *[units.ms(getattr(row, f"{p}_ns")) for _, row in ranks],
                "",
                *[units.ms(getattr(row, f"{p}_ns")) for _, row in base],
            )
        ct_path.add_row(
            "total",
            *[units.ms(row.total_ns) for _, row in ranks],
            units.ms(cp.offset_ns),
            *[units.ms(sum(getattr(row, f"{p}_ns") for p in PATH_PARTS)) for _, row in base],
        )
        ct_path.add_row(
            "share of the token",
            *[units.pct(row.total_ns / step if step else None) for _, row in ranks],
            units.pct(cp.offset_ns / step if step else None),
            *["" for _ in base],
        )
        console.print(ct_path)
        if cp.cause:
            console.print(cp.cause)
    compute_scaling_table(console, given(doc.compute_scaling), n)
    st = given(doc.straggler)
    if st is not None and st.rank is not None:
        console.print(
            f"Straggler test: rank {st.rank} arrives last at {units.pct(given(st.last_share))} of the collectives"
            f"{chance_clause(given(st.last_share_p_value))}, "
            f"{units.ms(given(st.lateness_ns_median))} ms after the others on median (symmetric launch-bound hosts "
            f"explain {units.ms(given(st.threshold_ns))} ms): "
            + ("[bold]a straggler[/bold]" if st.is_straggler else "not a straggler")
        )

    stt = titled_table(
        "Stragglers (how often each rank arrived last at a collective)",
        ("rank", "last", "of", "share"),
    )
    for s in doc.stragglers:
        stt.add_row(str(s.rank), str(s.last_count), str(s.instances), units.pct(s.share))
    console.print(stt)

    coll = doc.collectives
    if coll.instances:
        ct = titled_table(
            f"Collectives: {coll.instances} instances, {coll.per_token:.1f} per token "
            f"({coll.level}, matched by {', '.join(sorted(set(coll.match_by.values())))})",
            (
                "op",
                "bytes",
                "count",
                "wait ms (median of per-collective max)",
                "transfer ms (median)",
                "skew ms (median)",
                "busbw GB/s",
            ),
        )
        for o in coll.by_op:
            ct.add_row(
                o.op,
                (str(o.bytes) if o.bytes >= 0 else "?")
                + (" (manifest)" if o.bytes_source == "manifest" else ""),
                str(o.count),
                units.ms(o.wait_ns_median),
                units.ms(o.transfer_ns_median),
                units.ms(o.skew_ns_median),
                "-" if o.busbw_gbps_median is None else f"{o.busbw_gbps_median:.3g}",
            )
        console.print(ct)
    else:
        console.print("Collectives: none in the sharded run")

    dil = doc.dilation
    iv = given(dil.interval)
    console.print(
        f"Profiler dilation applied (profiled / unprofiled per-token time from the capture's rounds; the traced "
        f"per-token time divided by it; 95% interval): "
        f"baseline {dilation_words(dil.baseline, iv.baseline if iv else None)}, "
        f"sharded {dilation_words(dil.sharded, iv.sharded if iv else None)}; "
        f"threshold {dil.threshold:.0%}" + ("  [bold]ABOVE THRESHOLD[/bold]" if dil.inflated else "")
    )
    app = given(dil.applied)
    rows = [
        (k, a.corrected_mean_ns, a.unprofiled_mean_ns)
        for k, a in (("baseline", app.baseline if app else None), ("sharded", app.sharded if app else None))
        if a is not None and a.corrected_mean_ns and a.unprofiled_mean_ns
    ]
    if rows:
        console.print(
            "Cross-check, corrected per-token time vs the unprofiled rounds' own mean: "
            + ", ".join(f"{k} {c / 1e6:.3f} vs {u / 1e6:.3f} ms ({c / u - 1:+.1%})" for k, c, u in rows)
        )
    console.print(f"Reconciliation: {dil.reconciliation}")
    clock = doc.clock
    console.print(
        f"Clock: {clock.method}" + (f"; offsets {clock.offsets_ns}" if clock.offsets_applied else "")
    )
    dq = doc.data_quality
    if dq.counts or dq.notes:
        console.print("[bold]Data quality[/bold]")
        for key, count in dq.counts.items():
            console.print(f"  {key}: {count}")
        for note in dq.notes:
            console.print(f"  - {note}")
    return console_text(console, color)
