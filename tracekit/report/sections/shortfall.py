"""The report's sections from the typed shortfall (docs/JSON.md#shortfall): the waterfall of S,
the per-rank attribution, the critical path, the straggler test and the 95% intervals."""

from __future__ import annotations

from tracekit.analyse.prose import chance_clause
from tracekit.model.documents import Shortfall, given
from tracekit.model.documents.report import (
    ReportAttribution,
    ReportBaseline,
    ReportByRankValue,
    ReportCriticalPath,
    ReportIntervals,
    ReportIntervalsPerTokenNs,
    ReportPerRankItem_,
    ReportStraggler_,
    ReportWaterfallItem,
)
from tracekit.model.documents.shortfall import ShortfallByRankValue, ShortfallPathParts
from tracekit.model.parts import (
    COORDINATION,
    PATH_PARTS,
    term_words,
)
from tracekit.model.units import fmt_ms, fmt_pct
from tracekit.report.sections.fmt import as_pair, reading_of, to_float


def waterfall_of(
    terms: dict[str, int], coordination: dict[str, int], words: dict[str, str]
) -> list[ReportWaterfallItem]:
    """Ordered waterfall steps, coordination split into wait/sync/idle; sums to S exactly.

    The transfer step is labelled with what it is for this run (`words`, the shortfall's
    `term_words`): bytes on the link on a GPU run, gloo's exchange on a CPU run."""
    W = ReportWaterfallItem
    rows = [
        W(label="compute that did not scale", term="compute", ns=int(terms.get("compute", 0))),
        W(label="memory that did not scale", term="memory", ns=int(terms.get("memory", 0))),
        W(label=f"transfer: {words['transfer']}", term="transfer", ns=int(terms.get("transfer", 0))),
    ]
    if "unknown" in terms:
        label = f"unknown: {words.get('unknown', 'unclassified kernels')}"
        rows.append(W(label=label, term="unknown", ns=int(terms["unknown"])))
    coord_total = int(terms.get("coordination", 0))
    split = {p: int(coordination.get(p, 0)) for p in COORDINATION}
    if coordination and sum(split.values()) == coord_total:
        rows += [
            W(label="coordination: collective wait", term="coordination.wait", ns=split["wait"]),
            W(label="coordination: sync", term="coordination.sync", ns=split["sync"]),
            W(label="coordination: idle", term="coordination.idle", ns=split["idle"]),
        ]
    else:
        rows.append(W(label="coordination", term="coordination", ns=coord_total))
    return rows


def attach_intervals(attribution: ReportAttribution) -> None:
    """Each waterfall step's 95% interval and reading (finding / within_noise / negative): a term's
    from the shortfall's `noise`, a coordination part's from its own interval."""
    ivs = attribution.intervals
    noise = attribution.noise
    readings = {t: v.reading for t, v in noise.terms.items()} if noise is not None else {}
    for w in attribution.waterfall:
        term = w.term
        if term.startswith("coordination."):
            iv = ivs.coordination_ns.get(term.split(".", 1)[1]) if ivs is not None else None
            w.interval_ns, w.reading = iv, reading_of(iv)
        else:
            iv = ivs.terms_ns.get(term) if ivs is not None else None
            w.interval_ns, w.reading = iv, readings.get(term) or reading_of(iv)


def share_text(w: ReportWaterfallItem, s_ns: int) -> str:
    """A waterfall step's share of S, only where its interval makes it a finding (docs/METHOD.md
    section Noise and the profiler correction); "within noise" / "below zero" otherwise."""
    if w.reading == "within_noise":
        return "within noise"
    if w.reading == "negative":
        return "below zero"
    return fmt_pct(w.ns / s_ns if s_ns else None)


def term_words_of(sf: Shortfall | None, timeline: str | None) -> dict[str, str]:
    """The shortfall's `term_words`, completed from the defaults; without them (or without a
    shortfall) the transfer is named by the run's timeline (a link only on a GPU timeline)."""
    words = term_words(timeline)
    if sf is not None:
        words.update({k: v for k, v in (given(sf.term_words) or {}).items() if v})
    return words


def per_rank_section(sf: Shortfall, s_ns: int) -> list[ReportPerRankItem_] | None:
    """Each sharded rank's own attribution of S, with shares of S (None when the shortfall has none)."""
    rows = given(sf.per_rank)
    if not rows:
        return None
    out = []
    for r in rows:
        terms = dict(r.terms_ns)
        coord = {p: r.coordination_ns.get(p, 0) for p in COORDINATION}
        shares = {k: (v / s_ns if s_ns else None) for k, v in {**terms, **coord}.items()}
        out.append(
            ReportPerRankItem_(
                rank=r.rank,
                terms_ns=terms,
                coordination_ns=coord,
                shares=shares,
                own_window_ns=r.own_window_ns,
                pad_ns=r.pad_ns,
            )
        )
    return sorted(out, key=lambda r: r.rank)


def _path_parts(d: ShortfallPathParts) -> dict[str, int]:
    return {f"{p}_ns": int(getattr(d, f"{p}_ns")) for p in PATH_PARTS}


def _path_rank(d: ShortfallByRankValue, step: int) -> ReportByRankValue:
    """One rank's parts on the path, its `total_ns` and its `share_of_step` of the per-token time."""
    parts = _path_parts(d)
    return ReportByRankValue(**parts, total_ns=d.total_ns, share_of_step=d.total_ns / step if step else None)


def _baseline_rank(d: ShortfallPathParts) -> ShortfallByRankValue:
    """A baseline rank's parts on the path with their sum as `total_ns` (the document carries none)."""
    parts = _path_parts(d)
    return ShortfallByRankValue(**parts, total_ns=sum(parts.values()))


def critical_path_section(sf: Shortfall) -> ReportCriticalPath | None:
    """The shortfall's per-token critical path across ranks (None when it has none): per rank its
    compute / memory / transfer / host / sync / unknown on the path, the offset (ranks opening their
    step windows at different times), the cause sentence; by_rank totals + offset == step_ns."""
    cp = given(sf.critical_path)
    if cp is None:
        return None
    step = cp.step_ns
    by_rank = {r: _path_rank(d, step) for r, d in sorted(cp.by_rank.items(), key=lambda kv: int(kv[0]))}
    return ReportCriticalPath(
        step_ns=step,
        offset_ns=cp.offset_ns,
        by_rank=by_rank,
        cause=cp.cause or "",
        hops_per_step_median=float(cp.hops_per_step_median),
        baseline=ReportBaseline(
            step_ns=cp.baseline.step_ns,
            by_rank={r: _baseline_rank(d) for r, d in cp.baseline.by_rank.items()},
        ),
        uncorrected_step_ns=cp.uncorrected.step_ns,
    )


def straggler_section(sf: Shortfall) -> ReportStraggler_ | None:
    st = given(sf.straggler)
    if st is None:
        return None
    return ReportStraggler_(
        rank=st.rank,
        is_straggler=st.is_straggler,
        last_share=to_float(given(st.last_share)),
        last_share_p_value=to_float(given(st.last_share_p_value)),
        lateness_ns_median=given(st.lateness_ns_median),
        threshold_ns=given(st.threshold_ns),
    )


def straggler_sentence(st: ReportStraggler_ | None) -> str:
    """One sentence on the straggler test, for both renderers ("" without one)."""
    if st is None or st.rank is None:
        return ""
    verdict = "a straggler" if st.is_straggler else "not a straggler"
    return (
        f"Straggler test: rank {st.rank} arrives last at {fmt_pct(st.last_share, 0)} of the collectives"
        f"{chance_clause(st.last_share_p_value)}, "
        f"{fmt_ms(st.lateness_ns_median)} after the others on median, against "
        f"{fmt_ms(st.threshold_ns)} that symmetric launch-bound hosts explain: {verdict}."
    )


def intervals_section(sf: Shortfall) -> ReportIntervals | None:
    """The shortfall's 95% intervals (`intervals`) and readings (`noise`), as the report needs them."""
    iv = given(sf.intervals)
    if iv is None:
        return None
    pt = iv.per_token_ns
    return ReportIntervals(
        level=float(iv.level),
        basis=iv.basis,
        method=iv.method,
        per_token_ns=ReportIntervalsPerTokenNs(
            baseline=as_pair(pt.baseline), sharded=as_pair(pt.sharded), ideal=as_pair(pt.ideal)
        ),
        shortfall_ns=as_pair(iv.shortfall_ns),
        terms_ns={k: as_pair(v) for k, v in iv.terms_ns.items()},
        coordination_ns={k: as_pair(v) for k, v in iv.coordination_ns.items()},
    )
