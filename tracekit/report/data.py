"""The report's plain data: one JSON-able document built only from what the analyses return.

`build_report_data(...)` takes the breakdown / shortfall / compare-links / top-kernels documents
as their typed Structs (`tracekit.model.documents`, docs/JSON.md) and the capture manifests, never
raw events, and returns a `ReportData` (kind `tracekit.report`,
schema 1.3, documented in docs/JSON.md#report). The renderers (`html.py`, `markdown.py`) read
only this; the JSON output *is* this. Figures are not built here. The sections are built in
`tracekit.report.sections` (`inputs`: manifests, runs, dilation, probe; `shortfall`: waterfall,
per rank, critical path, straggler, intervals; `rows`: the tables and sentences of both renderers).

Times stay integer nanoseconds; formatting to milliseconds happens in `sections.fmt.fmt_ms`, which
both renderers share so the page and the Markdown carry the same printed numbers.
"""

from __future__ import annotations

import datetime as _dt

from tracekit._version import __version__
from tracekit.model.documents import Breakdown, Links, ProbeRow, Shortfall, TopKernels, given, to_builtins
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.documents.report import (
    Report,
    ReportAttribution,
    ReportBusbw,
    ReportByOpItem,
    ReportCollectives,
    ReportCompute,
    ReportCriticalPath,
    ReportDilation,
    ReportLinks,
    ReportPerRankItem_,
    ReportPerTokenNs,
    ReportRun_,
    ReportStraggler_,
    ReportTraceItem,
)
from tracekit.model.documents.shortfall import ShortfallStraggler_
from tracekit.model.parts import (
    COORDINATION,
    MAIN_TERMS,
)
from tracekit.report.extra_section import ExtraSection
from tracekit.report.sections.fmt import to_float, to_int
from tracekit.report.sections.inputs import (
    dilation_section,
    manifest_summary,
    probe_curves,
    run_section,
    top_kernels_section,
    transport_summary,
    verdict_from_breakdown,
)
from tracekit.report.sections.rows import headline_line, key_figures, per_token_label
from tracekit.report.sections.shortfall import (
    attach_intervals,
    critical_path_section,
    intervals_section,
    per_rank_section,
    straggler_section,
    term_words_of,
    waterfall_of,
)

KIND = "tracekit.report"
#: 1.1: diagnosis; 1.2: collectives.by_op[].wait_ns_median is the shortfall's (schema 1.4): the median
#: over instances of the per-instance max wait, i.e. the wait of the rank(s) that waited
#: 1.3: per_rank, critical_path, straggler, term_words (shortfall); the dilation stated is the
#: factor the shortfall applied, with its interval (the capture's host-clock figure only as a
#: labelled cross-check: dilation.runs[].host_clock; manifests[].capture_dilation, was `dilation`)
#: 1.4: headline (the one line on top), runs[].top_kernels (top kernels per class in the steady
#: steps), per_token_label (what the per-token chart plots)
SCHEMA_VERSION = "1.4"
#: dilation above 1 + this (10%) means the coordination share is inflated by the profiler
DEFAULT_DILATION_THRESHOLD = 0.10

# ----------------------------------------------------------------------------------------------
# the document


class ReportData(Report, kw_only=True):
    """Everything a report shows, typed: the `Report` document's sections
    (`tracekit.model.documents.report`, docs/JSON.md#report), fields in the JSON's order.

    - `headline`: the one line on top: TN vs ideal, S with its interval, the largest term's share, and
      the cause on the critical path (`headline_line`); attribution.intervals / .noise: the
      shortfall's 95% intervals and readings, each waterfall step's `interval_ns` and `reading`.
    - `verdict`: the shortfall's sentences (or one built from the breakdown alone).
    - `per_token_label`: what the per-token chart plots (dilation-corrected or traced).
    - `diagnosis`: what to look at next (the shortfall's `diagnosis`), or "" without a baseline.
    - `dilation`: per run the dilation stated, which with a shortfall is the factor its correction
      applied (traced / unprofiled per-token mean) with its interval, and the capture's host-clock
      figure only as a labelled cross-check (`host_clock`); the threshold, whether it is exceeded,
      the sentence to print beside the verdict and the warning line (None when within threshold).
    - `key_figures`: ordered rows {key, label, value, unit, text}: the numbers every format prints.
    - `per_token_ns`: {baseline, sharded, ideal} (baseline/ideal None without a baseline).
    - `attribution`: None without a baseline, else shortfall_ns, terms_ns, coordination_ns, shares,
      spread_ns and `waterfall` (ordered {label, ns}, summing to shortfall_ns exactly); the terms
      are the mean over ranks (`aggregate` says so).
    - `per_rank`: None without a shortfall, else each sharded rank's own attribution of S (terms,
      wait/sync/idle, each with its share of S).
    - `critical_path`: None without a shortfall, else per token which rank's compute / host / sync /
      transfer lie on the path across ranks (by_rank + offset_ns == step_ns), the cause sentence.
    - `straggler`: the shortfall's straggler test (rank, is_straggler, lateness vs threshold) or None.
    - `term_words`: what each term is for this run (transfer on a CPU run: gloo's exchange).
    - `runs`: per run (baseline first, then sharded): role, path, n_ranks, per-token step stats,
      per-step per-rank parts, per-rank medians, kernels by class, top unknown kernels, dilation.
    - `collectives`: per (op, bytes): the median over instances of the per-instance max wait (the
      rank that waited; the last arriver waits 0), the median transfer, skew, realised busbw;
      `stragglers`.
    - `busbw`: trace points {op, bytes, busbw_gbps} and probe curves {label, mode, op, in_place,
      transport, points [{bytes, busbw_gbps}]}.
    - `links`: the compare-links summary (modes, transports, verdict) or None, with `note`.
    - `manifests`: per run, a summary of what ran, where, with which versions.
    - `notes`: sentences about what is missing or was skipped.
    - `extras`: one section per other command's JSON given with `--extra` (decompose, advise, rho,
      whatif, diff; `tracekit.report.extras`); in the JSON only when there is one.

    The fields are the `Report` document's (one list, so the JSON's order is the document's);
    here `verdict` and `dilation` are always set and `extras` hold the renderers' sections.
    """

    verdict: str  # always a sentence here (the document allows null)
    dilation: ReportDilation  # always built here (the document allows null)
    extras: list[ExtraSection] = []  # the sections with their text columns; `to_json` writes documents

    def to_json(self) -> dict[str, object]:
        """The document as plain dicts and lists, in field order (`kind` and `schema_version`
        first); `extras` only when there is one, each as `ExtraSection.document()`."""
        d: dict[str, object] = to_builtins(self)
        if self.extras:
            d["extras"] = [to_builtins(e.document()) for e in self.extras]
        else:
            del d["extras"]
        return d


def build_report_data(
    *,
    breakdown: Breakdown,
    baseline_breakdown: Breakdown | None = None,
    shortfall: Shortfall | None = None,
    links: Links | list[ProbeRow] | None = None,
    manifest: ManifestDoc | None = None,
    baseline_manifest: ManifestDoc | None = None,
    top_kernels: TopKernels | None = None,
    baseline_top_kernels: TopKernels | None = None,
    run_path: str | None = None,
    baseline_path: str | None = None,
    links_note: str | None = None,
    dilation_threshold: float = DEFAULT_DILATION_THRESHOLD,
    title: str | None = None,
    created: str | None = None,
    extras: list[ExtraSection] | None = None,
) -> ReportData:
    """Build the report document from the analyses' typed documents and the manifests.

    `breakdown` is the run reported (the sharded run when there is a baseline); `shortfall` is
    the result of shortfall(baseline, run); `links` a compare-links result or a bare list of
    probe rows; `extras` the sections of other commands' JSON
    (`tracekit.report.extras.extra_sections`). Missing inputs make their sections empty and add a note.
    """
    notes: list[str] = []
    sf = shortfall
    role = "sharded" if (shortfall is not None or baseline_breakdown is not None) else "run"

    # dilation: with a shortfall, only the factor it applied (null when it applied none: a host-clock
    # figure must not stand in for it); without one, the breakdown's, then the manifest's
    sf_dil = sf.dilation if sf is not None else None
    run_dil = to_float(sf_dil.sharded) if sf_dil is not None else None
    if run_dil is None and sf_dil is None:
        run_dil = to_float(breakdown.dilation)
    if run_dil is None and sf_dil is None and manifest is not None:
        run_dil = to_float(given(manifest.dilation))
    base_dil = None
    if shortfall is not None or baseline_breakdown is not None:
        base_dil = to_float(sf_dil.baseline) if sf_dil is not None else None
        if base_dil is None and sf_dil is None and baseline_breakdown is not None:
            base_dil = to_float(baseline_breakdown.dilation)
        if base_dil is None and sf_dil is None and baseline_manifest is not None:
            base_dil = to_float(given(baseline_manifest.dilation))
    threshold = to_float(sf_dil.threshold) if sf_dil is not None else None
    threshold = dilation_threshold if threshold is None else threshold

    runs: list[ReportRun_] = []
    if baseline_breakdown is not None:
        runs.append(run_section("baseline", baseline_path, baseline_breakdown, base_dil))
    runs.append(run_section(role, run_path, breakdown, run_dil))
    main = runs[-1]
    main.top_kernels = top_kernels_section(top_kernels)
    if baseline_breakdown is not None:
        runs[0].top_kernels = top_kernels_section(baseline_top_kernels)
    for r in runs:
        notes += [f"{r.role}: {n}" for n in r.data_quality_notes]

    dil_runs: list[tuple[str, float | None]] = []
    if shortfall is not None or baseline_breakdown is not None:
        dil_runs.append(("baseline", base_dil))
    dil_runs.append((role, run_dil))
    dilation = dilation_section(
        dil_runs,
        threshold,
        sf_dil.reconciliation if sf_dil is not None else None,
        sf_dil=sf_dil,
        corrected=sf is not None and sf.per_token_source == "unprofiled",
    )
    term_words = term_words_of(sf, main.timeline)
    per_rank: list[ReportPerRankItem_] | None = None
    critical_path: ReportCriticalPath | None = None
    straggler: ReportStraggler_ | None = None

    # per-token times and the attribution
    attribution: ReportAttribution | None = None
    if sf is not None:
        pt = sf.per_token_ns
        per_token_ns = ReportPerTokenNs(baseline=pt.baseline, sharded=pt.sharded, ideal=pt.ideal)
        n_ranks = sf.n_ranks or main.n_ranks
        terms = {t: sf.terms_ns.get(t, 0) for t in MAIN_TERMS}
        if sf.terms_ns.get("unknown"):  # only when not zero (shortfall schema); it is part of S
            terms["unknown"] = sf.terms_ns["unknown"]
        coord = {p: sf.coordination_ns.get(p, 0) for p in COORDINATION}
        s_ns = sf.shortfall_ns
        waterfall = waterfall_of(terms, sf.coordination_ns, term_words)
        if sum(w.ns for w in waterfall) != s_ns:
            notes.append(
                f"the shortfall terms sum to {sum(w.ns for w in waterfall)} ns, not S = {s_ns} ns (analysis bug)"
            )
        shares = {k: to_float(v) for k, v in sf.shares.items()}
        attribution = ReportAttribution(
            shortfall_ns=s_ns,
            terms_ns=terms,
            coordination_ns=coord,
            shares=shares,
            spread_ns={k: ReportCompute(p10=v.p10, p90=v.p90) for k, v in sf.spread_ns.items()},
            waterfall=waterfall,
            aggregate=given(sf.aggregate),
            per_token_source=sf.per_token_source,
            uncorrected=sf.uncorrected,
            clock=sf.clock,
            intervals=intervals_section(sf),
            noise=given(sf.noise),
        )
        attach_intervals(attribution)
        verdict = sf.verdict
        diagnosis = sf.diagnosis
        per_rank = per_rank_section(sf, s_ns)
        critical_path = critical_path_section(sf)
        straggler = straggler_section(sf)
        if per_rank is not None:
            for pr in per_rank:
                if sum(pr.terms_ns.values()) != s_ns:
                    notes.append(
                        f"rank {pr.rank}'s terms sum to {sum(pr.terms_ns.values())} ns, not S = {s_ns} ns (analysis bug)"
                    )
        if critical_path is not None:
            total = sum(r.total_ns for r in critical_path.by_rank.values()) + critical_path.offset_ns
            if total != critical_path.step_ns:
                notes.append(
                    f"the critical path sums to {total} ns, not the per-token time {critical_path.step_ns} ns (analysis bug)"
                )
    else:
        diagnosis = ""
        per_token_ns = ReportPerTokenNs(baseline=None, sharded=main.step_ns.median, ideal=None)
        n_ranks = main.n_ranks
        verdict = verdict_from_breakdown(main)
        if baseline_breakdown is None:
            notes.append(
                "no baseline run given (--baseline): the shortfall and its attribution are not computed."
            )
    if baseline_breakdown is not None and shortfall is not None and per_token_ns.baseline is None:
        per_token_ns.baseline = runs[0].step_ns.median

    # collectives and stragglers (from the shortfall)
    collectives = None
    stragglers: list[ShortfallStraggler_] = []
    trace_points: list[ReportTraceItem] = []
    if sf is not None:
        coll = sf.collectives
        by_op = []
        for c in coll.by_op:
            entry = ReportByOpItem(
                op=c.op,
                bytes=to_int(c.bytes),
                count=c.count,
                # median over instances of the per-instance max wait (shortfall schema >= 1.4)
                wait_ns_median=to_int(c.wait_ns_median),
                transfer_ns_median=to_int(c.transfer_ns_median),
                skew_ns_median=to_int(c.skew_ns_median),
                busbw_gbps_median=to_float(c.busbw_gbps_median),
            )
            by_op.append(entry)
            if entry.busbw_gbps_median is not None and entry.bytes:
                trace_points.append(
                    ReportTraceItem(
                        op=entry.op, bytes=entry.bytes, busbw_gbps=entry.busbw_gbps_median, count=entry.count
                    )
                )
        collectives = ReportCollectives(
            instances=coll.instances, per_token=to_float(coll.per_token), by_op=by_op
        )
        # the document's own rows, copied (a share is a finite number in JSON: to_float is itself)
        stragglers = [
            ShortfallStraggler_(rank=s.rank, last_count=s.last_count, instances=s.instances, share=s.share)
            for s in sf.stragglers
        ]

    # probes / link comparison
    links_section: ReportLinks | None = None
    probe_rows: list[ProbeRow] = []
    if isinstance(links, list):
        probe_rows = links
        links_section = ReportLinks(
            modes=sorted({r.mode or "default" for r in links}), transports={}, verdict=None
        )
    elif links is not None:
        probe_rows = list(links.rows)
        links_section = ReportLinks(
            modes=[str(m.mode) for m in links.modes],
            transports={k: transport_summary(v) for k, v in links.transports.items()},
            verdict=links.verdict,
            notes=list(links.notes),
        )
        # the realised busbw compare-links measured in the decode trace, where the shortfall had none
        have = {(p.op, p.bytes) for p in trace_points}
        for z in links.trace.sizes if links.trace is not None else []:
            op = z.coll_op or z.op or ""
            nbytes, busbw_z = to_int(z.bytes), to_float(z.busbw_gbps)
            if busbw_z is not None and nbytes and (op, nbytes) not in have:
                trace_points.append(
                    ReportTraceItem(op=op, bytes=nbytes, busbw_gbps=busbw_z, count=z.count or 0)
                )
    if links_section is not None:
        links_section.note = links_note
    elif links_note:
        notes.append(links_note)
    busbw = ReportBusbw(trace=trace_points, probes=probe_curves(probe_rows))

    manifests = []
    if baseline_breakdown is not None or baseline_manifest is not None:
        manifests.append(manifest_summary("baseline", baseline_path, baseline_manifest))
    manifests.append(manifest_summary(role, run_path, manifest))
    for m in manifests:
        if not m.present:
            notes.append(f"{m.role}: no manifest.json beside the traces: what ran and where is unknown.")
        elif m.complete is False:
            notes.append(f"{m.role}: the capture is incomplete (a rank failed): {to_builtins(m.errors)}")

    data = ReportData(
        kind=KIND,
        schema_version=SCHEMA_VERSION,
        headline="",  # set below, from the data
        verdict=verdict,
        diagnosis=diagnosis,
        dilation=dilation,
        key_figures=[],
        per_token_ns=per_token_ns,
        n_ranks=n_ranks,
        attribution=attribution,
        runs=runs,
        collectives=collectives,
        stragglers=stragglers,
        busbw=busbw,
        links=links_section,
        manifests=manifests,
        notes=notes,
        per_rank=per_rank,
        critical_path=critical_path,
        straggler=straggler,
        term_words=term_words,
        extras=list(extras or []),
        title=title or "tracekit report",
        per_token_label="",  # set below, from the data
        created=created or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        generator=f"tracekit {__version__}",
    )
    data.key_figures = key_figures(data)
    data.headline = headline_line(data)
    data.per_token_label = per_token_label(data)
    return data
