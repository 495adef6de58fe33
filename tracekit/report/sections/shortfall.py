"""The report's sections from the typed shortfall (docs/JSON.md#shortfall): the waterfall of S,
the per-rank attribution, the critical path, the straggler test and the 95% intervals."""

from __future__ import annotations

from typing import Any

from tracekit.analyse.prose import chance_clause as _chance_clause
from tracekit.model.documents import Shortfall, given
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
) -> list[dict[str, Any]]:
    """Ordered waterfall steps, coordination split into wait/sync/idle; sums to S exactly.

    The transfer step is labelled with what it is for this run (`words`, the shortfall's
    `term_words`): bytes on the link on a GPU run, gloo's exchange on a CPU run."""
    rows: list[dict[str, Any]] = [
        {"label": "compute that did not scale", "term": "compute", "ns": int(terms.get("compute", 0))},
        {"label": "memory that did not scale", "term": "memory", "ns": int(terms.get("memory", 0))},
        {"label": f"transfer: {words['transfer']}", "term": "transfer", "ns": int(terms.get("transfer", 0))},
    ]
    if "unknown" in terms:
        rows.append(
            {
                "label": f"unknown: {words.get('unknown', 'unclassified kernels')}",
                "term": "unknown",
                "ns": int(terms["unknown"]),
            }
        )
    coord_total = int(terms.get("coordination", 0))
    split = {p: int(coordination.get(p, 0)) for p in COORDINATION}
    if coordination and sum(split.values()) == coord_total:
        rows += [
            {"label": "coordination: collective wait", "term": "coordination.wait", "ns": split["wait"]},
            {"label": "coordination: sync", "term": "coordination.sync", "ns": split["sync"]},
            {"label": "coordination: idle", "term": "coordination.idle", "ns": split["idle"]},
        ]
    else:
        rows.append({"label": "coordination", "term": "coordination", "ns": coord_total})
    return rows


def attach_intervals(attribution: dict[str, Any]) -> None:
    """Each waterfall step's 95% interval and reading (finding / within_noise / negative): a term's
    from the shortfall's `noise`, a coordination part's from its own interval."""
    ivs = attribution.get("intervals") or {}
    readings = {
        t: (v or {}).get("reading") for t, v in ((attribution.get("noise") or {}).get("terms") or {}).items()
    }
    for w in attribution["waterfall"]:
        term = w["term"]
        if term.startswith("coordination."):
            iv = (ivs.get("coordination_ns") or {}).get(term.split(".", 1)[1])
            w["interval_ns"], w["reading"] = iv, reading_of(iv)
        else:
            iv = (ivs.get("terms_ns") or {}).get(term)
            w["interval_ns"], w["reading"] = iv, readings.get(term) or reading_of(iv)


def share_text(w: dict[str, Any], s_ns: int) -> str:
    """A waterfall step's share of S, only where its interval makes it a finding (docs/METHOD.md
    section Noise and the profiler correction); "within noise" / "below zero" otherwise."""
    reading = w.get("reading")
    if reading == "within_noise":
        return "within noise"
    if reading == "negative":
        return "below zero"
    return fmt_pct(w["ns"] / s_ns if s_ns else None)


def term_words_of(sf: Shortfall | None, timeline: str | None) -> dict[str, str]:
    """The shortfall's `term_words`, completed from the defaults; without them (or without a
    shortfall) the transfer is named by the run's timeline (a link only on a GPU timeline)."""
    words = term_words(timeline)
    if sf is not None:
        words.update({k: v for k, v in (given(sf.term_words) or {}).items() if v})
    return words


def per_rank_section(sf: Shortfall, s_ns: int) -> list[dict[str, Any]] | None:
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
            {
                "rank": r.rank,
                "terms_ns": terms,
                "coordination_ns": coord,
                "shares": shares,
                "own_window_ns": r.own_window_ns,
                "pad_ns": r.pad_ns,
            }
        )
    return sorted(out, key=lambda r: r["rank"])


def _path_rank(d: ShortfallPathParts, step: int | None = None) -> dict[str, Any]:
    """One rank's parts on the path; `total_ns` the document's, else their sum (the baseline's
    rows carry none); `share_of_step` of the per-token time `step` when given."""
    row: dict[str, Any] = {f"{p}_ns": int(getattr(d, f"{p}_ns")) for p in PATH_PARTS}
    row["total_ns"] = d.total_ns if isinstance(d, ShortfallByRankValue) else sum(row.values())
    if step is not None:
        row["share_of_step"] = row["total_ns"] / step if step else None
    return row


def critical_path_section(sf: Shortfall) -> dict[str, Any] | None:
    """The shortfall's per-token critical path across ranks (None when it has none): per rank its
    compute / memory / transfer / host / sync / unknown on the path, the offset (ranks opening their
    step windows at different times), the cause sentence; by_rank totals + offset == step_ns."""
    cp = given(sf.critical_path)
    if cp is None:
        return None
    step = cp.step_ns
    by_rank = {r: _path_rank(d, step) for r, d in sorted(cp.by_rank.items(), key=lambda kv: int(kv[0]))}
    return {
        "step_ns": step,
        "offset_ns": cp.offset_ns,
        "by_rank": by_rank,
        "cause": cp.cause or "",
        "hops_per_step_median": float(cp.hops_per_step_median),
        "baseline": {
            "step_ns": cp.baseline.step_ns,
            "by_rank": {r: _path_rank(d) for r, d in cp.baseline.by_rank.items()},
        },
        "uncorrected_step_ns": cp.uncorrected.step_ns,
    }


def straggler_section(sf: Shortfall) -> dict[str, Any] | None:
    st = given(sf.straggler)
    if st is None:
        return None
    return {
        "rank": st.rank,
        "is_straggler": st.is_straggler,
        "last_share": to_float(given(st.last_share)),
        "last_share_p_value": to_float(given(st.last_share_p_value)),
        "lateness_ns_median": given(st.lateness_ns_median),
        "threshold_ns": given(st.threshold_ns),
    }


def chance_clause(st: dict[str, Any]) -> str:
    """`tracekit.analyse.prose.chance_clause` of the straggler test's p-value."""
    return _chance_clause(to_float(st.get("last_share_p_value")))


def straggler_sentence(st: dict[str, Any] | None) -> str:
    """One sentence on the straggler test, for both renderers ("" without one)."""
    if not st or st.get("rank") is None:
        return ""
    verdict = "a straggler" if st["is_straggler"] else "not a straggler"
    return (
        f"Straggler test: rank {st['rank']} arrives last at {fmt_pct(st.get('last_share'), 0)} of the collectives"
        f"{chance_clause(st)}, "
        f"{fmt_ms(st.get('lateness_ns_median'))} after the others on median, against "
        f"{fmt_ms(st.get('threshold_ns'))} that symmetric launch-bound hosts explain: {verdict}."
    )


def intervals_section(sf: Shortfall) -> dict[str, Any] | None:
    """The shortfall's 95% intervals (`intervals`) and readings (`noise`), as the report needs them."""
    iv = given(sf.intervals)
    if iv is None:
        return None
    pt = iv.per_token_ns
    return {
        "level": float(iv.level),
        "basis": iv.basis,
        "method": iv.method,
        "per_token_ns": {
            "baseline": as_pair(pt.baseline),
            "sharded": as_pair(pt.sharded),
            "ideal": as_pair(pt.ideal),
        },
        "shortfall_ns": as_pair(iv.shortfall_ns),
        "terms_ns": {k: as_pair(v) for k, v in iv.terms_ns.items()},
        "coordination_ns": {k: as_pair(v) for k, v in iv.coordination_ns.items()},
    }
