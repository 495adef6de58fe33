"""The report's sections from its inputs other than the shortfall: the manifests, each run's
breakdown, the dilation stated, the probe curves and transports, the top kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec import UNSET

from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.documents import given, to_builtins
from tracekit.model.parts import (
    PARTS,
)
from tracekit.model.units import fmt_ms, fmt_pct, fmt_x
from tracekit.read.manifests import typed_manifest
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


def manifest_doc(manifest: ManifestDoc | Mapping[str, Any]) -> ManifestDoc:
    """A manifest as its typed document: the one `load_manifest` decoded (`Manifest.doc`), else
    decoded here (leniently, as the reader does)."""
    if isinstance(manifest, ManifestDoc):
        return manifest
    doc = getattr(manifest, "doc", None)
    return doc if isinstance(doc, ManifestDoc) else typed_manifest(manifest, "manifest.json")[0]


def manifest_summary(
    role: str, path: str | None, manifest: ManifestDoc | Mapping[str, Any] | None
) -> dict[str, Any]:
    """The manifest fields a reader needs to know what ran, where and with which versions."""
    if not manifest:
        return {"role": role, "path": path, "present": False}
    m = manifest_doc(manifest)
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


def run_section(
    role: str, path: str | None, breakdown: dict[str, Any], dilation: float | None
) -> dict[str, Any]:
    src = breakdown.get("source") or {}
    per_token = breakdown.get("per_token") or {}
    step_stats = per_token.get("step_ns") or {}
    parts_stats = per_token.get("parts_ns") or {}
    steps = [
        {
            "rank": int(s["rank"]),
            "step": int(s["step"]),
            "name": str(s.get("name", "")),
            "window_ns": int(s["window_ns"]),
            "parts_ns": {p: int((s.get("parts_ns") or {}).get(p, 0)) for p in PARTS},
            "overlapped_collective_ns": int(s.get("overlapped_collective_ns", 0) or 0),
        }
        for s in breakdown.get("steps") or []
    ]
    ranks = [int(r) for r in src.get("ranks") or sorted({s["rank"] for s in steps})]
    unknown = [
        {
            "name": str(k.get("name", "")),
            "count": int(k.get("count", 0)),
            "total_ns": int(k.get("total_ns", 0)),
        }
        for k in breakdown.get("unknown_kernels") or []
    ]
    return {
        "role": role,
        "path": path,
        "n_ranks": len(ranks) or 1,
        "ranks": ranks,
        "timeline": src.get("timeline"),
        "step_pattern": src.get("step_pattern"),
        "step_ns": {k: to_int(step_stats.get(k)) for k in ("median", "p10", "p90")}
        | {"n": int(step_stats.get("n", len({s["step"] for s in steps})) or 0)},
        "parts_ns_median": {p: to_int((parts_stats.get(p) or {}).get("median")) for p in PARTS},
        "steps": steps,
        "per_rank": [
            {
                "rank": int(r["rank"]),
                "steps": int(r.get("steps", 0)),
                "step_ns_median": to_int(r.get("step_ns_median")),
                "parts_ns_median": {p: to_int((r.get("parts_ns_median") or {}).get(p)) for p in PARTS},
            }
            for r in breakdown.get("per_rank") or []
        ],
        "kernels_by_class": {
            str(k): {"count": int(v.get("count", 0)), "total_ns": int(v.get("total_ns", 0))}
            for k, v in (breakdown.get("kernels_by_class") or {}).items()
        },
        "unknown_kernels": unknown,
        "data_quality_notes": [str(n) for n in (breakdown.get("data_quality") or {}).get("notes") or []],
        "dilation": dilation,
    }


def dilation_section(
    runs: list[tuple[str, float | None]],
    threshold: float,
    reconciliation: str | None,
    details: dict[str, Any] | None = None,
    *,
    sf_dil: dict[str, Any] | None = None,
    corrected: bool = False,
) -> dict[str, Any]:
    """The dilation stated beside the verdict.

    With a shortfall (`sf_dil` its `dilation`), the figure per run is the factor its correction
    applied (`dilation.baseline` / `dilation.sharded`: the capture's measured dilation, by which the
    traced per-token time is divided) with its interval; the capture's own record of it
    (`dilation.runs.<run>`) is carried as `host_clock`; the cross-check sentence sets the corrected
    per-token time against the unprofiled rounds' own mean. Without a shortfall the only
    figure is the capture's host-clock one, and the sentence says so."""
    applied_src = bool(sf_dil)
    intervals = (sf_dil or {}).get("interval") or {}
    applied = (sf_dil or {}).get("applied") or {}
    per_run: list[dict[str, Any]] = []
    for role, d in runs:
        det = (details or {}).get(role) or {}
        app = applied.get(role) or {}
        interval = intervals.get(role) if isinstance(intervals, dict) else None
        iv = (
            [float(x) for x in interval]
            if isinstance(interval, list | tuple) and len(interval) == 2
            else None
        )
        entry: dict[str, Any] = {
            "run": role,
            "dilation": d,
            "interval": iv,
            "source": "applied" if applied_src else "host_clock",
            "traced_mean_ns": to_int(app.get("traced_mean_ns")),
            "corrected_mean_ns": to_int(app.get("corrected_mean_ns")),
            "unprofiled_mean_ns": to_int(app.get("unprofiled_mean_ns")),
            "unprofiled_median_ns": to_int((det.get("unprofiled") or {}).get("median_ns")),
            "profiled_median_ns": to_int((det.get("profiled") or {}).get("median_ns")),
            "host_clock": None,
        }
        if applied_src and det:
            hc_iv = det.get("interval")
            entry["host_clock"] = {
                "dilation": to_float(det.get("dilation")),
                "interval": [float(x) for x in hc_iv]
                if isinstance(hc_iv, list | tuple) and len(hc_iv) == 2
                else None,
                "definition": det.get("definition"),
                "unprofiled_mean_ns": to_int((det.get("unprofiled") or {}).get("mean_ns")),
                "profiled_mean_ns": to_int((det.get("profiled") or {}).get("mean_ns")),
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
        "definition": (sf_dil or {}).get("definition")
        or "the capture's host-clock figure: profiled / unprofiled per-token time",
        "threshold": threshold,
        "inflated": bool(over),
        "caution": caution,
        "sentence": sentence,
        "cross_check": cross_check,
        "warning": warning,
        "reconciliation": reconciliation,
    }


def probe_curves(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, bool, int], dict[str, Any]] = {}
    for r in rows:
        busbw = to_float(r.get("busbw_gbps"))
        nbytes = to_int(r.get("bytes"))
        if busbw is None or nbytes is None:
            continue
        mode = str(r.get("mode") or "default")
        op = str(r.get("op", ""))
        in_place = bool(r.get("in_place", False))
        ranks = int(r.get("ranks", 0) or 0)
        key = (mode, op, in_place, ranks)
        g = groups.setdefault(
            key,
            {
                "label": f"probe {op} {mode}{' in-place' if in_place else ''} ({ranks} ranks)",
                "mode": mode,
                "op": op,
                "in_place": in_place,
                "ranks": ranks,
                "backend": r.get("backend"),
                "transport": r.get("transport"),
                "points": [],
            },
        )
        g["points"].append({"bytes": nbytes, "busbw_gbps": busbw, "correct": r.get("correct")})
    for g in groups.values():
        g["points"].sort(key=lambda p: p["bytes"])
    return [groups[k] for k in sorted(groups)]


def transport_summary(v: Any) -> str:
    """One line for what a mode's run really used (compare-links `transports[mode]`)."""
    if not isinstance(v, dict):
        return "" if v is None else str(v)
    parts = []
    if v.get("transport"):
        parts.append(f"transport {v['transport']}")
    if v.get("wire"):
        parts.append(f"wire {v['wire']}")
    if v.get("nvls_used") is not None:
        parts.append("NVLS used" if v["nvls_used"] else "NVLS off")
    if v.get("uses_nvlink") is not None:
        parts.append("uses NVLink" if v["uses_nvlink"] else "no NVLink")
    parts += [str(n) for n in v.get("notes") or []]
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


def top_kernels_section(tk: dict[str, Any] | None) -> dict[str, Any] | None:
    """`tracekit.analyse.kernels.top_kernels`' result, its numbers as plain floats (None without one)."""
    if not isinstance(tk, dict) or not tk.get("classes"):
        return None
    classes = {}
    for c, v in tk["classes"].items():
        classes[str(c)] = {
            "count": to_float(v.get("count")),
            "total_ns": to_float(v.get("total_ns")),
            "share": to_float(v.get("share")),
            "more": int(v.get("more", 0) or 0),
            "kernels": [
                {
                    "name": str(k.get("name", "")),
                    "subclass": str(k.get("subclass", "")),
                    "count": to_float(k.get("count")),
                    "total_ns": to_float(k.get("total_ns")),
                    "mean_ns": to_float(k.get("mean_ns")),
                    "share": to_float(k.get("share")),
                }
                for k in v.get("kernels") or []
            ],
        }
    return {
        "windows": int(tk.get("windows", 0) or 0),
        "step_ns_mean": to_float(tk.get("step_ns_mean")),
        "classes": classes,
    }


#: the critical path's components in words, for the headline (host depends on the timeline)
