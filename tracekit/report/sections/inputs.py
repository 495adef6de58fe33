"""The report's sections from its inputs other than the shortfall: the manifests, each run's
breakdown, the dilation stated, the probe curves and transports, the top kernels."""

from __future__ import annotations

from tracekit.model.documents import (
    Breakdown,
    Dilation,
    LinksTransportsValue,
    ProbeRow,
    TopKernel,
    TopKernels,
    given,
)
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.documents.breakdown import BreakdownKernelsByClassValue, BreakdownUnknownKernel
from tracekit.model.documents.report import (
    ReportDevice,
    ReportDilation,
    ReportError,
    ReportHost,
    ReportHostClock,
    ReportManifest,
    ReportPoint,
    ReportProbe,
    ReportRun,
    ReportRun_,
    ReportRunPerRankItem,
    ReportStep,
    ReportStepNs,
    ReportTopKernels,
    ReportTopKernelsClass,
    ReportWorkload,
)
from tracekit.model.documents.shortfall import ShortfallAppliedBaseline, ShortfallDilation
from tracekit.model.parts import (
    PARTS,
)
from tracekit.model.units import fmt_ms, fmt_pct, fmt_x
from tracekit.report.sections.fmt import fmt_x_interval, to_float, to_int


def manifest_summary(role: str, path: str | None, manifest: ManifestDoc | None) -> ReportManifest:
    """The manifest fields a reader needs to know what ran, where and with which versions."""
    if manifest is None:
        return ReportManifest(role=role, path=path, present=False)
    m = manifest
    wl = given(m.workload)
    host = given(m.host)
    return ReportManifest(
        role=role,
        path=path,
        present=True,
        complete=given(m.complete),
        errors=[
            ReportError(rank=given(e.rank), message=str(given(e.message) or ""))
            for e in given(m.errors) or []
        ],
        created=given(m.created),
        # the workload fields a report shows, in ReportWorkload's order (those the manifest has)
        workload=ReportWorkload()
        if wl is None
        else ReportWorkload(**{k: getattr(wl, k) for k in ReportWorkload.__struct_fields__}),
        host=ReportHost()
        if host is None
        else ReportHost(hostname=host.hostname, cpu=host.cpu, cpu_count=host.cpu_count),
        devices=[
            ReportDevice(index=given(d.index), name=given(d.name), memory_bytes=given(d.memory_bytes))
            for d in given(m.devices) or []
        ],
        versions=dict(given(m.versions) or {}),
        nccl_env=dict(given(m.nccl_env) or {}),
        # the capture's own host-clock figure (a cross-check; the dilation stated is the shortfall's)
        capture_dilation=to_float(given(m.dilation)),
        command=given(m.command),
    )


def run_section(role: str, path: str | None, breakdown: Breakdown, dilation: float | None) -> ReportRun_:
    src = breakdown.source
    step_stats = breakdown.per_token.step_ns
    parts_stats = breakdown.per_token.parts_ns
    steps = [
        ReportStep(
            rank=s.rank,
            step=s.step,
            name=s.name,
            window_ns=s.window_ns,
            parts_ns={p: s.parts_ns.get(p, 0) for p in PARTS},
            overlapped_collective_ns=s.overlapped_collective_ns,
        )
        for s in breakdown.steps
    ]
    ranks = list(src.ranks) or sorted({s.rank for s in breakdown.steps})
    unknown = [
        BreakdownUnknownKernel(name=k.name, count=k.count, total_ns=k.total_ns)
        for k in breakdown.unknown_kernels
    ]
    return ReportRun_(
        role=role,
        path=path,
        n_ranks=len(ranks) or 1,
        ranks=ranks,
        timeline=src.timeline,
        step_pattern=src.step_pattern,
        step_ns=ReportStepNs(
            median=step_stats.median, p10=step_stats.p10, p90=step_stats.p90, n=step_stats.n
        ),
        parts_ns_median={p: parts_stats[p].median if p in parts_stats else None for p in PARTS},
        steps=steps,
        per_rank=[
            ReportRunPerRankItem(
                rank=r.rank,
                steps=r.steps,
                step_ns_median=r.step_ns_median,
                parts_ns_median={p: r.parts_ns_median.get(p) for p in PARTS},
            )
            for r in breakdown.per_rank
        ],
        kernels_by_class={
            k: BreakdownKernelsByClassValue(count=v.count, total_ns=v.total_ns)
            for k, v in breakdown.kernels_by_class.items()
        },
        unknown_kernels=unknown,
        data_quality_notes=list(breakdown.data_quality.notes),
        dilation=dilation,
    )


def dilation_section(
    runs: list[tuple[str, float | None]],
    threshold: float,
    reconciliation: str | None,
    *,
    sf_dil: ShortfallDilation | None = None,
    corrected: bool = False,
) -> ReportDilation:
    """The dilation stated beside the verdict.

    With a shortfall (`sf_dil` its `dilation`), the figure per run is the factor its correction
    applied (`dilation.baseline` / `dilation.sharded`: the capture's measured dilation, by which the
    traced per-token time is divided) with its interval; the capture's own record of it
    (`dilation.runs.<run>`) is carried as `host_clock`; the cross-check sentence sets the corrected
    per-token time against the unprofiled rounds' own mean. Without a shortfall the only
    figure is the capture's host-clock one, and the sentence says so."""
    applied_src = sf_dil is not None
    intervals = given(sf_dil.interval) if sf_dil is not None else None
    applied = given(sf_dil.applied) if sf_dil is not None else None
    details = sf_dil.runs if sf_dil is not None else None
    per_run: list[ReportRun] = []
    for role, d in runs:
        det: Dilation | None = getattr(details, role, None)
        app: ShortfallAppliedBaseline | None = getattr(applied, role, None)
        interval = getattr(intervals, role, None)
        iv = [float(x) for x in interval] if interval is not None and len(interval) == 2 else None
        unprofiled = det.unprofiled if det is not None else None
        profiled = det.profiled if det is not None else None
        entry = ReportRun(
            run=role,
            dilation=d,
            interval=iv,
            source="applied" if applied_src else "host_clock",
            traced_mean_ns=to_int(app.traced_mean_ns) if app is not None else None,
            corrected_mean_ns=to_int(app.corrected_mean_ns) if app is not None else None,
            unprofiled_mean_ns=to_int(app.unprofiled_mean_ns) if app is not None else None,
            unprofiled_median_ns=to_int(unprofiled.median_ns) if unprofiled is not None else None,
            profiled_median_ns=to_int(profiled.median_ns) if profiled is not None else None,
        )
        if applied_src and det is not None:
            hc_iv = given(det.interval)
            entry.host_clock = ReportHostClock(
                dilation=to_float(det.dilation),
                interval=[float(x) for x in hc_iv] if hc_iv is not None and len(hc_iv) == 2 else None,
                definition=given(det.definition),
                unprofiled_mean_ns=to_int(unprofiled.mean_ns) if unprofiled is not None else None,
                profiled_mean_ns=to_int(profiled.mean_ns) if profiled is not None else None,
            )
        per_run.append(entry)
    known = [(e, e.dilation) for e in per_run if e.dilation is not None]
    over = [(e, x) for e, x in known if x > 1.0 + threshold]
    if known:
        parts = ", ".join(f"{e.run} {fmt_x_interval(x, e.interval)}" for e, x in known)
        what = (
            "profiled / unprofiled per-token time from the capture's rounds; the shortfall divides the traced "
            "per-token time by exactly this factor"
            if applied_src
            else "the capture's host-clock figure: profiled / unprofiled per-token time"
        )
        sentence = f"Profiler dilation ({what}): {parts}; threshold {fmt_pct(threshold, 0)}."
    else:
        sentence = "Profiler dilation unknown: no unprofiled timing in the manifests, so the profiler's own cost is not accounted for."
    cross = [
        (e.run, e.corrected_mean_ns, e.unprofiled_mean_ns)
        for e in per_run
        if e.corrected_mean_ns and e.unprofiled_mean_ns
    ]
    cross_check = None
    if cross:
        cross_check = (
            "Cross-check, the corrected per-token time (traced / dilation) against the unprofiled rounds' own "
            "mean: "
            + ", ".join(
                f"{run} {c / 1e6:.3f} vs {u / 1e6:.3f} ms ({c / u - 1:+.1%})"
                for run, c, u in cross
                if c and u
            )
            + " (a gap: the host's speed moved between rounds; the corrected time is the traced pass's)."
        )
    warning = None
    if over:
        which = ", ".join(f"{e.run} {fmt_x(x)}" for e, x in over)
        if corrected:
            warning = (
                f"Warning: dilation above {fmt_pct(threshold, 0)} ({which}): the profiler added host time to the "
                "trace; the attribution removes it (the per-token times are the traced ones divided by it), but in the "
                "traced figures (per-step parts, the uncorrected attribution) the coordination share is "
                "inflated by it."
            )
        else:
            warning = (
                f"Warning: dilation above {fmt_pct(threshold, 0)} ({which}): the profiler added host time that "
                "lands in idle/coordination, so the coordination share is inflated by it."
            )
    under = [(e, x) for e, x in known if x < 1.0 - threshold]
    caution = None
    if under:
        which = ", ".join(f"{e.run} {fmt_x(x)}" for e, x in under)
        caution = (
            f"Caution: dilation below 1 ({which}): the unprofiled pass was slower than the profiled one, "
            "so the host was noisy and the per-token times are uncertain; capture again on a quiet machine."
        )
    return ReportDilation(
        runs=per_run,
        definition=(given(sf_dil.definition) if sf_dil is not None else None)
        or "the capture's host-clock figure: profiled / unprofiled per-token time",
        threshold=threshold,
        inflated=bool(over),
        caution=caution,
        sentence=sentence,
        cross_check=cross_check,
        warning=warning,
        reconciliation=reconciliation,
    )


def probe_curves(rows: list[ProbeRow]) -> list[ReportProbe]:
    groups: dict[tuple[str, str, bool, int], ReportProbe] = {}
    for r in rows:
        busbw = to_float(r.busbw_gbps)
        nbytes = to_int(r.bytes)
        if busbw is None or nbytes is None:
            continue
        mode = r.mode or "default"
        op = str(r.op)
        in_place = bool(r.in_place)
        ranks = r.ranks or 0
        key = (mode, op, in_place, ranks)
        g = groups.setdefault(
            key,
            ReportProbe(
                label=f"probe {op} {mode}{' in-place' if in_place else ''} ({ranks} ranks)",
                mode=mode,
                op=op,
                in_place=in_place,
                ranks=ranks,
                backend=r.backend,
                transport=r.transport,
                points=[],
            ),
        )
        g.points.append(ReportPoint(bytes=nbytes, busbw_gbps=busbw, correct=r.correct))
    for g in groups.values():
        g.points.sort(key=lambda p: p.bytes)
    return [groups[k] for k in sorted(groups)]


def transport_summary(v: LinksTransportsValue) -> str:
    """One line for what a mode's run really used (compare-links `transports[mode]`)."""
    parts = []
    if given(v.transport):
        parts.append(f"transport {given(v.transport)}")
    if given(v.wire):
        parts.append(f"wire {given(v.wire)}")
    if given(v.nvls_used) is not None:
        parts.append("NVLS used" if given(v.nvls_used) else "NVLS off")
    if v.uses_nvlink is not None:
        parts.append("uses NVLink" if v.uses_nvlink else "no NVLink")
    parts += [str(n) for n in v.notes]
    return "; ".join(parts)


def verdict_from_breakdown(run: ReportRun_) -> str:
    med = run.step_ns.median
    parts = {p: v for p, v in run.parts_ns_median.items() if v is not None}
    if med is None or not parts:
        return "No steps were found, so no per-token time can be given."
    total = sum(parts.values()) or 1
    top = max(parts, key=lambda p: parts[p])
    return (
        f"Per token {fmt_ms(med)} on {run.n_ranks} rank(s) (median over {run.step_ns.n} steps); "
        f"the largest part is {top} at {fmt_pct(parts[top] / total)} of the step."
    )


def top_kernels_section(tk: TopKernels | None) -> ReportTopKernels | None:
    """`tracekit.analyse.compute.kernels.top_kernels`' result as the report's section (None
    without one, or without a class)."""
    if tk is None or not tk.classes:
        return None
    # counts and times as floats, as the report has always printed them
    classes = {
        c: ReportTopKernelsClass(
            count=float(v.count),
            total_ns=float(v.total_ns),
            share=to_float(v.share),
            more=v.more,
            kernels=[
                TopKernel(
                    name=k.name,
                    subclass=k.subclass,
                    count=float(k.count),
                    total_ns=float(k.total_ns),
                    mean_ns=float(k.mean_ns),
                    share=to_float(k.share),
                )
                for k in v.kernels
            ],
        )
        for c, v in tk.classes.items()
    }
    return ReportTopKernels(windows=tk.windows, step_ns_mean=to_float(tk.step_ns_mean), classes=classes)


#: the critical path's components in words, for the headline (host depends on the timeline)
