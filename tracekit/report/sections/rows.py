"""The tables and sentences both renderers print from a `ReportData`: the per-rank and
critical-path rows, the top kernels, the headline, the key figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracekit.model.documents.report import (
    ReportAttribution,
    ReportCriticalPath,
    ReportDilation,
    ReportKeyFigure,
    ReportRun,
    ReportRun_,
    ReportWaterfallItem,
)
from tracekit.model.parts import (
    COORDINATION,
    PARTS,
    PATH_PARTS,
    TERM_WORDS,
)
from tracekit.model.units import fmt_ms, fmt_pct, fmt_us, fmt_x
from tracekit.report.sections.fmt import fmt_ms_interval, fmt_x_interval, prose, short_words

if TYPE_CHECKING:
    from tracekit.report.data import ReportData


def attribution_headers(with_intervals: bool) -> list[str]:
    """The attribution table's headers (the 95% interval column only when the shortfall has them)."""
    interval = ["95% interval"] if with_intervals else []
    return ["term", "per token", *interval, "share of S", "spread over steps (p10 .. p90)"]


def corrected(data: ReportData) -> bool:
    """Whether the per-token times are dilation-corrected (the shortfall's unprofiled source)."""
    return data.attribution is not None and data.attribution.per_token_source == "unprofiled"


def dilation_summary(data: ReportData, *, threshold_note: bool) -> str:
    """The line the folded dilation section shows: the dilation per run, whether it was removed
    and, with `threshold_note` (the page; the Markdown prints the caution line instead), that it is
    above the threshold."""
    d = data.dilation
    figures = dilation_figures(d)
    if not figures:
        return "Profiler dilation unknown (no unprofiled timing)"
    how = "removed from the per-token times" if corrected(data) else "not removed"
    above = "; above the threshold" if threshold_note and d.inflated else ""
    return f"Profiler dilation {figures} ({how}){above}: how the traced parts were reconciled"


def dilation_figures(d: ReportDilation) -> str:
    """The dilation stated per run with its interval ("baseline 1.37x [1.27-1.48], sharded 1.09x"),
    "" when no run has one: the folded dilation section's summary line."""
    return ", ".join(
        f"{r.run} {fmt_x_interval(r.dilation, r.interval)}" for r in d.runs if r.dilation is not None
    )


def host_clock_text(r: ReportRun) -> str:
    """A run's capture host-clock dilation with its interval (the cross-check column)."""
    hc = r.host_clock
    return fmt_x_interval(hc.dilation, hc.interval) if hc is not None else fmt_x_interval(None, None)


def spread_text(a: ReportAttribution, w: ReportWaterfallItem) -> str:
    """A waterfall step's p10 .. p90 spread over steps ("" without one)."""
    term = w.term
    spread = a.spread_ns.get(term.split(".")[-1] if term.startswith("coordination.") else term)
    return f"{fmt_ms(spread.p10)} .. {fmt_ms(spread.p90)}" if spread is not None else ""


def _cell(ns: int | None, share: float | None) -> str:
    return f"{fmt_ms(ns)} ({fmt_pct(share)})"


def per_rank_rows(data: ReportData) -> tuple[list[str], list[list[str]]]:
    """The "Per rank" table both renderers print: headers and text rows, each rank's own terms and
    wait / sync / idle (per token, share of S), then the aggregate (the mean over ranks)."""
    a = data.attribution
    if not data.per_rank or a is None:
        return [], []
    s_ns = a.shortfall_ns
    words = data.term_words or TERM_WORDS
    terms = list(a.terms_ns)
    for r in data.per_rank:
        terms += [t for t in r.terms_ns if t not in terms]
    label = {t: t for t in terms}
    label["transfer"] = f"transfer ({short_words(words.get('transfer', 'transfer'))})"
    headers = ["rank"] + [label[t] for t in terms] + [f"coordination: {p}" for p in COORDINATION]
    headers += ["own window", "pad (idle to the step time)"]

    def share(ns: int | None) -> float | None:
        return ns / s_ns if (s_ns and ns is not None) else None

    rows = []
    for r in data.per_rank:
        row = [f"rank {r.rank}"]
        row += [_cell(r.terms_ns.get(t, 0), share(r.terms_ns.get(t, 0))) for t in terms]
        row += [_cell(r.coordination_ns[p], share(r.coordination_ns[p])) for p in COORDINATION]
        row += [fmt_ms(r.own_window_ns), fmt_ms(r.pad_ns)]
        rows.append(row)
    agg = ["mean over ranks (aggregate)"]
    agg += [_cell(a.terms_ns.get(t, 0), share(a.terms_ns.get(t, 0))) for t in terms]
    agg += [_cell(a.coordination_ns[p], share(a.coordination_ns[p])) for p in COORDINATION]
    rows.append(agg + ["", ""])
    return headers, rows


#: kernel names longer than this are shortened in the tables (the HTML keeps the whole name as the
#: cell's title)
NAME_CHARS = 96


def short_name(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def top_kernel_rows(run: ReportRun_) -> list[tuple[str, str, str, str, str, str, bool]]:
    """The top-kernels table of one run as text rows (class, name, count, total, mean, share,
    is_class_row), for both renderers: per class a row with its totals, then its kernels, then how
    many more names it has."""
    tk = run.top_kernels
    out: list[tuple[str, str, str, str, str, str, bool]] = []
    for c, v in (tk.classes if tk is not None else {}).items():
        out.append((c, f"all {c}", _count(v.count), fmt_ms(v.total_ns), "", fmt_pct(v.share), True))
        for k in v.kernels:
            out.append(
                ("", k.name, _count(k.count), fmt_ms(k.total_ns), fmt_us(k.mean_ns), fmt_pct(k.share), False)
            )
        if v.more:
            out.append(("", f"... and {v.more} more names", "", "", "", "", False))
    return out


def _count(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.0f}" if abs(x - round(x)) < 0.005 else f"{x:.2f}"


TOP_KERNEL_HEADERS = [
    "class",
    "kernel",
    "count per token",
    "total per token",
    "mean per call",
    "share of the step",
]


@dataclass(frozen=True)
class TopKernelsTable:
    """One run's top kernels as both renderers print them: caption, note, then the rows."""

    caption: str
    note: str
    rows: list[tuple[str, str, str, str, str, str, bool]]
    headers: tuple[str, ...] = tuple(TOP_KERNEL_HEADERS)


def top_kernels_tables(data: ReportData) -> list[TopKernelsTable]:
    """Per run with top kernels, its table (`top_kernel_rows`)."""
    return [
        TopKernelsTable(top_kernels_caption(run), top_kernels_note(run), rows)
        for run in data.runs
        if (rows := top_kernel_rows(run))
    ]


def top_kernels_caption(run: ReportRun_) -> str:
    return f"{run.role} run: top kernels per class"


def top_kernels_note(run: ReportRun_) -> str:
    tk = run.top_kernels
    return (
        f"Count and time per token per rank over {tk.windows if tk else 0} steady step windows (traced "
        f"durations); share of the mean traced step, {fmt_ms(tk.step_ns_mean if tk else None)}; kernels on "
        "different streams may overlap, so a class's shares can exceed its exposed part."
    )


def path_rows(data: ReportData) -> tuple[list[str], list[list[str]]]:
    """The critical-path table both renderers print: per rank its compute / memory / transfer /
    host / sync / unknown on the path per token, its total and share of the token; then the offset,
    the per-token time (ranks + offset, exactly) and the TP=1 baseline's token for comparison."""
    cp = data.critical_path
    if cp is None:
        return [], []
    words = data.term_words or TERM_WORDS
    step = cp.step_ns
    label = {p: p for p in PATH_PARTS}
    label["transfer"] = f"transfer ({short_words(words.get('transfer', 'transfer'))})"
    gpu = (data.runs[-1].timeline if data.runs else None) == "gpu"
    label["host"] = "host (launch gaps, host work)" if gpu else "host (time between its ops)"
    headers = ["rank"] + [label[p] for p in PATH_PARTS] + ["on the path", "share of the token"]
    blank = [""] * len(PATH_PARTS)
    rows = []
    for rank, r in cp.by_rank.items():
        rows.append(
            [f"rank {rank}"]
            + [fmt_ms(getattr(r, f"{p}_ns")) for p in PATH_PARTS]
            + [fmt_ms(r.total_ns), fmt_pct(r.share_of_step)]
        )
    rows.append(
        ["offset (step windows open at different times)"]
        + blank
        + [fmt_ms(cp.offset_ns), fmt_pct(cp.offset_ns / step if step else None)]
    )
    rows.append([f"per-token time T{data.n_ranks}"] + blank + [fmt_ms(step), fmt_pct(1.0 if step else None)])
    for rank, b in (cp.baseline.by_rank if cp.baseline is not None else {}).items():
        rows.append(
            [f"TP=1 baseline, rank {rank} (a whole token)"]
            + [fmt_ms(getattr(b, f"{p}_ns")) for p in PATH_PARTS]
            + [fmt_ms(b.total_ns), ""]
        )
    return headers, rows


def path_note(cp: ReportCriticalPath) -> str:
    """The sentence under the critical-path table (what it is, and that it adds up)."""
    return (
        "Per rank, the time of each kind on the critical path of a token (rendezvous model: a collective "
        "starts when its last rank arrives, so waiting is not on the path, it is the consequence). The ranks' "
        f"totals plus the offset {fmt_ms(cp.offset_ns)} (ranks opening their step windows at different "
        f"times) make the per-token time {fmt_ms(cp.step_ns)} exactly."
    )


_PATH_WORDS = {
    "compute": "compute",
    "memory": "memory copies",
    "transfer": "transfer",
    "sync": "syncs",
    "unknown": "unclassified kernels",
}


def path_cause_short(data: ReportData) -> str:
    """The largest component of the critical path and its rank, in a few words ("host time (launch
    gaps) on rank 1, 8.10 of 12.02 ms"); "" without a path."""
    cp = data.critical_path
    if not cp or not cp.by_rank:
        return ""
    best = max(
        ((int(r), p, int(getattr(row, f"{p}_ns"))) for r, row in cp.by_rank.items() for p in PATH_PARTS),
        key=lambda t: (t[2], -t[0]),
    )
    rank, part, ns = best
    if ns <= 0:
        return ""
    gpu = (data.runs[-1].timeline if data.runs else None) == "gpu"
    if part == "host":
        what = "host time (launch gaps)" if gpu else "host time between its ops"
    elif part == "transfer":
        what = short_words(data.term_words.get("transfer", "transfer"))
    else:
        what = _PATH_WORDS.get(part, part)
    where = f" on rank {rank}" if data.n_ranks > 1 else ""
    return f"{what}{where}, {ns / 1e6:.2f} of {fmt_ms(cp.step_ns, 2)}"


def _interval_text(data: ReportData) -> str:
    """S's interval for the headline: the shortfall's own 95% interval when it has one, else the
    p10-p90 spread over steps (labelled as such)."""
    a = data.attribution
    if a is None:
        return ""
    iv = a.intervals.shortfall_ns if a.intervals is not None else None
    if iv is not None:
        return f" [95% {fmt_ms_interval(iv)}]"
    sp = a.spread_ns.get("shortfall")
    if sp is not None and sp.p10 is not None and sp.p90 is not None:
        return f" [p10-p90 over steps {sp.p10 / 1e6:.2f}-{fmt_ms(sp.p90, 2)}]"
    return ""


def headline_line(data: ReportData) -> str:
    """The one line on top of every report: TN against the ideal, S with its interval, the term
    that holds the run back with its share (the shortfall's noise reading decides whether a term is
    a finding: docs/METHOD.md section Noise and the profiler correction), and the cause on the
    critical path."""
    a = data.attribution
    n = data.n_ranks
    pt = data.per_token_ns
    if a is None or pt.sharded is None or pt.ideal is None:
        return prose(data.verdict).split("; ", 1)[0].rstrip(".") + "."
    s_ns = a.shortfall_ns
    tn_iv = a.intervals.per_token_ns.sharded if a.intervals is not None else None
    tn = fmt_ms(pt.sharded, 2) + (f" [95% {fmt_ms_interval(tn_iv)}]" if tn_iv else "")
    head = f"TP={n}: {tn} per token vs ideal {fmt_ms(pt.ideal, 2)}"
    noise = a.noise
    status = noise.status if noise is not None else None
    if s_ns <= 0 or status == "beats_ideal":
        return f"{head}: no shortfall (S = {fmt_ms(s_ns, 2)}{_interval_text(data)})."
    line = f"{head}; S = {fmt_ms(s_ns, 2)}{_interval_text(data)}"
    terms = a.terms_ns
    gpu = data.runs[-1].timeline == "gpu"
    words = {"transfer": "link transfer" if gpu else "gloo exchange"}
    if status == "too_noisy":
        line += ", too noisy to attribute (S's interval holds zero)"
    elif status == "unattributed":
        line += ", no term clear of the noise"
    elif status == "unsettled":
        line += ", too noisy to say which term (no term the largest in 95% of the resamples)"
    else:
        named = noise.cause if noise is not None else None
        top = str(named) if named in terms else max(terms, key=lambda t: terms[t])
        line += f", {fmt_pct(terms[top] / s_ns, 0)} {words.get(top, top)}"
    cause = path_cause_short(data)
    if cause:
        line += f"; cause on the critical path: {cause}"
    return line + "."


def per_token_label(data: ReportData) -> str:
    """What the per-token figures plot: dilation-corrected (traced / dilation) or traced."""
    a = data.attribution
    if a is None:
        return "Per-token time (traced, median over steps)"
    if a.per_token_source == "unprofiled":
        return "Per-token time, dilation-corrected (traced / dilation; mean over steady steps)"
    return "Per-token time (traced, mean over steady steps; no unprofiled timing to correct it)"


def key_figures(data: ReportData) -> list[ReportKeyFigure]:
    """The numbers every format prints, in order: {key, label, value, unit, text}.

    `value` is the raw number (ns, ratio or share); `text` its printed form. The HTML marks each
    with `data-key`, the Markdown lists them in a table, so tests can compare the three formats.
    """
    rows: list[ReportKeyFigure] = []

    def add(key: str, label: str, value: float | int | None, unit: str) -> None:
        if value is None:
            return
        if unit == "ns":
            text = fmt_ms(value)
        elif unit == "ratio":
            text = fmt_x(float(value))
        else:
            text = fmt_pct(float(value))
        rows.append(ReportKeyFigure(key=key, label=label, value=value, unit=unit, text=text))

    n = data.n_ranks
    pt = data.per_token_ns
    add("per_token.baseline", "per-token time, TP=1 (T1)", pt.baseline, "ns")
    add("per_token.sharded", f"per-token time, TP={n} (T{n})", pt.sharded, "ns")
    add("per_token.ideal", f"ideal T1/{n}", pt.ideal, "ns")
    if data.attribution is not None:
        a = data.attribution
        add("shortfall", "shortfall S", a.shortfall_ns, "ns")
        for t in a.terms_ns:
            add(f"terms.{t}", f"term: {t}", a.terms_ns[t], "ns")
        for p in COORDINATION:
            add(f"coordination.{p}", f"coordination: {p}", a.coordination_ns[p], "ns")
        for t in a.terms_ns:
            add(f"shares.{t}", f"share: {t}", a.shares.get(t), "share")
    else:
        main = data.runs[-1]
        for p in PARTS:
            add(f"parts.{p}", f"median part: {p}", main.parts_ns_median.get(p), "ns")
    if data.per_rank:
        for r in data.per_rank:
            add(f"per_rank.{r.rank}.wait", f"rank {r.rank}: collective wait", r.coordination_ns["wait"], "ns")
    cp = data.critical_path
    if cp:
        for rank, row in cp.by_rank.items():
            add(f"critical_path.{rank}.host", f"critical path: rank {rank}'s host time", row.host_ns, "ns")
    for d in data.dilation.runs:
        label = "profiler dilation" if d.run == "run" else f"profiler dilation, {d.run} run"
        if d.source == "applied":
            label += " (applied)"
        add(f"dilation.{d.run}", label, d.dilation, "ratio")
    return rows
