"""The report's sections from its inputs other than the shortfall: the manifests, each run's
breakdown, the dilation stated, the probe curves and transports, the top kernels."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from tracekit.model.documents import (
    Breakdown,
    Dilation,
    LinksTransportsValue,
    ProbeRow,
    TopKernels,
    given,
    to_builtins,
)
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.documents.shortfall import ShortfallAppliedBaseline, ShortfallDilation
from tracekit.model.parts import (
    PARTS,
)
from tracekit.model.units import fmt_ms, fmt_pct, fmt_x
from tracekit.report.sections.fmt import fmt_x_interval, to_float, to_int

MANIFEST_WORKLOAD_FIELDS = (
    "preset",
    "tp",
    "tokens",
    "prompt",
    "batch",
    "layers",
    "backend",
    "device",
    "dtype",
    "mode",
    "seed",
    "step_pattern",
    "inject_delay",
    "inject_sync",
)


def manifest_summary(role: str, path: str | None, manifest: ManifestDoc | None) -> dict[str, Any]:
    """The manifest fields a reader needs to know what ran, where and with which versions."""
    if manifest is None:
        return {"role": role, "path": path, "present": False}
    m = manifest
    wl = given(m.workload)
    host = given(m.host)
    return {
        "role": role,
        "path": path,
        "present": True,
        "complete": given(m.complete),
        "errors": [
            {"rank": given(e.rank), "message": str(given(e.message) or "")} for e in given(m.errors) or []
        ],
        "created": given(m.created),
        "workload": {}
        if wl is None
        else {
            k: to_builtins(getattr(wl, k)) for k in MANIFEST_WORKLOAD_FIELDS if getattr(wl, k) is not UNSET
        },
        "host": {}
        if host is None
        else {k: getattr(host, k) for k in ("hostname", "cpu", "cpu_count") if getattr(host, k) is not UNSET},
        "devices": [
            {"index": given(d.index), "name": given(d.name), "memory_bytes": given(d.memory_bytes)}
            for d in given(m.devices) or []
        ],
        "versions": dict(given(m.versions) or {}),
        "nccl_env": dict(given(m.nccl_env) or {}),
        # the capture's own host-clock figure (a cross-check; the dilation stated is the shortfall's)
        "capture_dilation": to_float(given(m.dilation)),
        "command": given(m.command),
    }


def run_section(role: str, path: str | None, breakdown: Breakdown, dilation: float | None) -> dict[str, Any]:
    src = breakdown.source
    step_stats = breakdown.per_token.step_ns
    parts_stats = breakdown.per_token.parts_ns
    steps = [
        {
            "rank": s.rank,
            "step": s.step,
            "name": s.name,
            "window_ns": s.window_ns,
            "parts_ns": {p: s.parts_ns.get(p, 0) for p in PARTS},
            "overlapped_collective_ns": s.overlapped_collective_ns,
        }
        for s in breakdown.steps
    ]
    ranks = list(src.ranks) or sorted({s.rank for s in breakdown.steps})
    unknown = [{"name": k.name, "count": k.count, "total_ns": k.total_ns} for k in breakdown.unknown_kernels]
    return {
        "role": role,
        "path": path,
        "n_ranks": len(ranks) or 1,
        "ranks": ranks,
        "timeline": src.timeline,
        "step_pattern": src.step_pattern,
        "step_ns": {
            "median": step_stats.median,
            "p10": step_stats.p10,
            "p90": step_stats.p90,
            "n": step_stats.n,
        },
        "parts_ns_median": {p: parts_stats[p].median if p in parts_stats else None for p in PARTS},
        "steps": steps,
        "per_rank": [
            {
                "rank": r.rank,
                "steps": r.steps,
                "step_ns_median": r.step_ns_median,
                "parts_ns_median": {p: r.parts_ns_median.get(p) for p in PARTS},
            }
            for r in breakdown.per_rank
        ],
        "kernels_by_class": {
            k: {"count": v.count, "total_ns": v.total_ns} for k, v in breakdown.kernels_by_class.items()
        },
        "unknown_kernels": unknown,
        "data_quality_notes": list(breakdown.data_quality.notes),
        "dilation": dilation,
    }


def dilation_section(
    runs: list[tuple[str, float | None]],
    threshold: float,
    reconciliation: str | None,
    *,
    sf_dil: ShortfallDilation | None = None,
    corrected: bool = False,
) -> dict[str, Any]:
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
    per_run: list[dict[str, Any]] = []
    for role, d in runs:
        det: Dilation | None = getattr(details, role, None)
        app: ShortfallAppliedBaseline | None = getattr(applied, role, None)
        interval = getattr(intervals, role, None)
        iv = [float(x) for x in interval] if interval is not None and len(interval) == 2 else None
        unprofiled = det.unprofiled if det is not None else None
        profiled = det.profiled if det is not None else None
        entry: dict[str, Any] = {
            "run": role,
            "dilation": d,
            "interval": iv,
            "source": "applied" if applied_src else "host_clock",
            "traced_mean_ns": to_int(app.traced_mean_ns) if app is not None else None,
            "corrected_mean_ns": to_int(app.corrected_mean_ns) if app is not None else None,
            "unprofiled_mean_ns": to_int(app.unprofiled_mean_ns) if app is not None else None,
            "unprofiled_median_ns": to_int(unprofiled.median_ns) if unprofiled is not None else None,
            "profiled_median_ns": to_int(profiled.median_ns) if profiled is not None else None,
            "host_clock": None,
        }
        if applied_src and det is not None:
            hc_iv = given(det.interval)
            entry["host_clock"] = {
                "dilation": to_float(det.dilation),
                "interval": [float(x) for x in hc_iv] if hc_iv is not None and len(hc_iv) == 2 else None,
                "definition": given(det.definition),
                "unprofiled_mean_ns": to_int(unprofiled.mean_ns) if unprofiled is not None else None,
                "profiled_mean_ns": to_int(profiled.mean_ns) if profiled is not None else None,
            }
        per_run.append(entry)
    known = [e for e in per_run if e["dilation"] is not None]
    over = [e for e in known if e["dilation"] > 1.0 + threshold]
    if known:
        parts = ", ".join(f"{e['run']} {fmt_x_interval(e['dilation'], e['interval'])}" for e in known)
        what = (
            "profiled / unprofiled per-token time from the capture's rounds; the shortfall divides the traced "
            "per-token time by exactly this factor"
            if applied_src
            else "the capture's host-clock figure: profiled / unprofiled per-token time"
        )
        sentence = f"Profiler dilation ({what}): {parts}; threshold {fmt_pct(threshold, 0)}."
    else:
        sentence = "Profiler dilation unknown: no unprofiled timing in the manifests, so the profiler's own cost is not accounted for."
    cross = [e for e in per_run if e.get("corrected_mean_ns") and e.get("unprofiled_mean_ns")]
    cross_check = None
    if cross:
        cross_check = (
            "Cross-check, the corrected per-token time (traced / dilation) against the unprofiled rounds' own "
            "mean: "
            + ", ".join(
                f"{e['run']} {e['corrected_mean_ns'] / 1e6:.3f} vs {e['unprofiled_mean_ns'] / 1e6:.3f} ms "
                f"({e['corrected_mean_ns'] / e['unprofiled_mean_ns'] - 1:+.1%})"
                for e in cross
            )
            + " (a gap: the host's speed moved between rounds; the corrected time is the traced pass's)."
        )
    warning = None
    if over:
        which = ", ".join(f"{e['run']} {fmt_x(e['dilation'])}" for e in over)
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
    under = [e for e in known if e["dilation"] < 1.0 - threshold]
    caution = None
    if under:
        which = ", ".join(f"{e['run']} {fmt_x(e['dilation'])}" for e in under)
        caution = (
            f"Caution: dilation below 1 ({which}): the unprofiled pass was slower than the profiled one, "
            "so the host was noisy and the per-token times are uncertain; capture again on a quiet machine."
        )
    return {
        "runs": per_run,
        "definition": (given(sf_dil.definition) if sf_dil is not None else None)
        or "the capture's host-clock figure: profiled / unprofiled per-token time",
        "threshold": threshold,
        "inflated": bool(over),
        "caution": caution,
        "sentence": sentence,
        "cross_check": cross_check,
        "warning": warning,
        "reconciliation": reconciliation,
    }


def probe_curves(rows: list[ProbeRow]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, bool, int], dict[str, Any]] = {}
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
            {
                "label": f"probe {op} {mode}{' in-place' if in_place else ''} ({ranks} ranks)",
                "mode": mode,
                "op": op,
                "in_place": in_place,
                "ranks": ranks,
                "backend": r.backend,
                "transport": r.transport,
                "points": [],
            },
        )
        g["points"].append({"bytes": nbytes, "busbw_gbps": busbw, "correct": r.correct})
    for g in groups.values():
        g["points"].sort(key=lambda p: p["bytes"])
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


def verdict_from_breakdown(run: dict[str, Any]) -> str:
    med = run["step_ns"].get("median")
    parts = {p: v for p, v in run["parts_ns_median"].items() if v is not None}
    if med is None or not parts:
        return "No steps were found, so no per-token time can be given."
    total = sum(parts.values()) or 1
    top = max(parts, key=lambda p: parts[p])
    return (
        f"Per token {fmt_ms(med)} on {run['n_ranks']} rank(s) (median over {run['step_ns'].get('n', 0)} steps); "
        f"the largest part is {top} at {fmt_pct(parts[top] / total)} of the step."
    )


def top_kernels_section(tk: TopKernels | None) -> dict[str, Any] | None:
    """`tracekit.analyse.compute.kernels.top_kernels`' result as the report's section (None
    without one, or without a class)."""
    if tk is None or not tk.classes:
        return None
    classes = {
        c: {
            "count": to_float(v.count),
            "total_ns": to_float(v.total_ns),
            "share": to_float(v.share),
            "more": v.more,
            "kernels": [
                {
                    "name": k.name,
                    "subclass": k.subclass,
                    "count": to_float(k.count),
                    "total_ns": to_float(k.total_ns),
                    "mean_ns": to_float(k.mean_ns),
                    "share": to_float(k.share),
                }
                for k in v.kernels
            ],
        }
        for c, v in tk.classes.items()
    }
    return {"windows": tk.windows, "step_ns_mean": to_float(tk.step_ns_mean), "classes": classes}


#: the critical path's components in words, for the headline (host depends on the timeline)
