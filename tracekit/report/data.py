"""The report's plain data: one JSON-able document built only from what the analyses return.

`build_report_data(...)` takes the breakdown / shortfall / compare-links dicts (docs/JSON.md) and
the capture manifests, never raw events, and returns a `ReportData` (kind `tracekit.report`,
schema 1.2, documented in docs/JSON.md#report). The renderers (`html.py`, `markdown.py`) read
only this; the JSON output *is* this. Figures are not built here.

Times stay integer nanoseconds; formatting to milliseconds happens in `fmt_ms`, which both
renderers share so the page and the Markdown carry the same printed numbers.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tracekit import __version__

KIND = "tracekit.report"
#: 1.1: diagnosis; 1.2: collectives.by_op[].wait_ns_median is the shortfall's (schema 1.4): the median
#: over instances of the per-instance max wait, i.e. the wait of the rank(s) that waited
SCHEMA_VERSION = "1.2"
#: dilation above 1 + this (10%) means the coordination share is inflated by the profiler
DEFAULT_DILATION_THRESHOLD = 0.10

#: order of the breakdown parts (the partition's priority order, METHOD.md section 4)
PARTS = ("compute", "memory", "collective", "unknown", "sync", "idle")
#: order of the shortfall terms (METHOD.md section 6); coordination is split into its three parts
TERMS = ("compute", "memory", "transfer", "coordination")
COORDINATION_PARTS = ("wait", "sync", "idle")


# ----------------------------------------------------------------------------------------------
# formatting shared by the renderers


def fmt_ms(ns: float | int | None, digits: int = 3) -> str:
    """Nanoseconds as milliseconds with `digits` decimals ("12.345 ms"); "n/a" when missing."""
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return "n/a"
    return f"{ns / 1e6:.{digits}f} ms"


def fmt_us(ns: float | int | None, digits: int = 1) -> str:
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return "n/a"
    return f"{ns / 1e3:.{digits}f} us"


def fmt_pct(share: float | None, digits: int = 1) -> str:
    if share is None or not math.isfinite(share):
        return "n/a"
    return f"{share * 100:.{digits}f}%"


def fmt_x(ratio: float | None) -> str:
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    return f"{ratio:.2f}x"


def fmt_gbps(gbps: float | None) -> str:
    if gbps is None or not math.isfinite(gbps):
        return "n/a"
    return f"{gbps:.3f} GB/s"


def fmt_bytes(n: int | None) -> str:
    if n is None or n < 0:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % (size // 1024 or 1) == 0:
            return f"{n / size:g} {unit}"
    return f"{n} B"


# ----------------------------------------------------------------------------------------------
# the document


@dataclass
class ReportData:
    """Everything a report shows, as plain JSON-able values (see docs/JSON.md#report).

    - `verdict`: the one sentence on top (from the shortfall, or built from the breakdown alone).
    - `diagnosis`: what to look at next (the shortfall's `diagnosis`), or "" without a baseline.
    - `dilation`: per run profiled/unprofiled per-token time, the threshold, whether it is exceeded,
      the sentence to print beside the verdict and the warning line (None when within threshold).
    - `key_figures`: ordered rows {key, label, value, unit, text}: the numbers every format prints.
    - `per_token_ns`: {baseline, sharded, ideal} (baseline/ideal None without a baseline).
    - `attribution`: None without a baseline, else shortfall_ns, terms_ns, coordination_ns, shares,
      spread_ns and `waterfall` (ordered {label, ns}, summing to shortfall_ns exactly).
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
    """

    verdict: str
    dilation: dict[str, Any]
    key_figures: list[dict[str, Any]]
    per_token_ns: dict[str, int | None]
    n_ranks: int
    attribution: dict[str, Any] | None
    runs: list[dict[str, Any]]
    collectives: dict[str, Any] | None
    stragglers: list[dict[str, Any]]
    busbw: dict[str, Any]
    links: dict[str, Any] | None
    manifests: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    diagnosis: str = ""
    title: str = "tracekit report"
    created: str = ""
    generator: str = f"tracekit {__version__}"
    kind: str = KIND
    schema_version: str = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The document as a dict, `kind` and `schema_version` first."""
        d = asdict(self)
        head = {"kind": d.pop("kind"), "schema_version": d.pop("schema_version")}
        return {**head, **d}


# ----------------------------------------------------------------------------------------------
# builders


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _int_or_none(x: Any) -> int | None:
    v = _num(x)
    return None if v is None else int(round(v))


def _manifest_summary(role: str, path: str | None, manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest fields a reader needs to know what ran, where and with which versions."""
    if not manifest:
        return {"role": role, "path": path, "present": False}
    workload = manifest.get("workload") or {}
    host = manifest.get("host") or {}
    devices = manifest.get("devices") or []
    return {
        "role": role,
        "path": path,
        "present": True,
        "complete": manifest.get("complete"),
        "errors": [
            {"rank": e.get("rank"), "message": str(e.get("message", ""))}
            for e in manifest.get("errors") or []
        ],
        "created": manifest.get("created"),
        "workload": {
            k: workload.get(k)
            for k in (
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
            if k in workload
        },
        "host": {k: host.get(k) for k in ("hostname", "cpu", "cpu_count") if k in host},
        "devices": [
            {"index": d.get("index"), "name": d.get("name"), "memory_bytes": d.get("memory_bytes")}
            for d in devices
        ],
        "versions": dict(manifest.get("versions") or {}),
        "nccl_env": dict(manifest.get("nccl_env") or {}),
        "dilation": _num(manifest.get("dilation")),
        "command": manifest.get("command"),
    }


def _run_section(
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
        "step_ns": {k: _int_or_none(step_stats.get(k)) for k in ("median", "p10", "p90")}
        | {"n": int(step_stats.get("n", len({s["step"] for s in steps})) or 0)},
        "parts_ns_median": {p: _int_or_none((parts_stats.get(p) or {}).get("median")) for p in PARTS},
        "steps": steps,
        "per_rank": [
            {
                "rank": int(r["rank"]),
                "steps": int(r.get("steps", 0)),
                "step_ns_median": _int_or_none(r.get("step_ns_median")),
                "parts_ns_median": {p: _int_or_none((r.get("parts_ns_median") or {}).get(p)) for p in PARTS},
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


def _dilation_section(
    runs: list[tuple[str, float | None]],
    threshold: float,
    reconciliation: str | None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    per_run: list[dict[str, Any]] = [{"run": role, "dilation": d} for role, d in runs]
    for entry in per_run:
        det = (details or {}).get(entry["run"]) or {}
        entry["unprofiled_median_ns"] = _int_or_none((det.get("unprofiled") or {}).get("median_ns"))
        entry["profiled_median_ns"] = _int_or_none((det.get("profiled") or {}).get("median_ns"))
    known = [(role, d) for role, d in runs if d is not None]
    over = [(role, d) for role, d in known if d > 1.0 + threshold]
    if known:
        parts = ", ".join(f"{role} {fmt_x(d)}" for role, d in known)
        sentence = f"Profiler dilation (profiled / unprofiled per-token time): {parts}; threshold {fmt_pct(threshold, 0)}."
    else:
        sentence = "Profiler dilation unknown: no unprofiled timing in the manifests, so the profiler's own cost is not accounted for."
    warning = None
    if over:
        which = ", ".join(f"{role} {fmt_x(d)}" for role, d in over)
        warning = (
            f"Warning: dilation above {fmt_pct(threshold, 0)} ({which}): the profiler added host time that lands "
            "in idle/coordination, so the coordination share is inflated by it."
        )
    under = [(role, d) for role, d in known if d < 1.0 - threshold]
    caution = None
    if under:
        which = ", ".join(f"{role} {fmt_x(d)}" for role, d in under)
        caution = (
            f"Caution: dilation below 1 ({which}): the unprofiled pass was slower than the profiled one, "
            "so the host was noisy and the per-token times are uncertain; capture again on a quiet machine."
        )
    return {
        "runs": per_run,
        "threshold": threshold,
        "inflated": bool(over),
        "caution": caution,
        "sentence": sentence,
        "warning": warning,
        "reconciliation": reconciliation,
    }


def _waterfall(terms: dict[str, int], coordination: dict[str, int]) -> list[dict[str, Any]]:
    """Ordered waterfall steps, coordination split into wait/sync/idle; sums to S exactly."""
    rows: list[dict[str, Any]] = [
        {"label": "compute that did not scale", "term": "compute", "ns": int(terms.get("compute", 0))},
        {"label": "memory that did not scale", "term": "memory", "ns": int(terms.get("memory", 0))},
        {"label": "collective transfer (link)", "term": "transfer", "ns": int(terms.get("transfer", 0))},
    ]
    coord_total = int(terms.get("coordination", 0))
    split = {p: int(coordination.get(p, 0)) for p in COORDINATION_PARTS}
    if coordination and sum(split.values()) == coord_total:
        rows += [
            {"label": "coordination: collective wait", "term": "coordination.wait", "ns": split["wait"]},
            {"label": "coordination: sync", "term": "coordination.sync", "ns": split["sync"]},
            {"label": "coordination: idle", "term": "coordination.idle", "ns": split["idle"]},
        ]
    else:
        rows.append({"label": "coordination", "term": "coordination", "ns": coord_total})
    return rows


def _probe_curves(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, bool, int], dict[str, Any]] = {}
    for r in rows:
        busbw = _num(r.get("busbw_gbps"))
        nbytes = _int_or_none(r.get("bytes"))
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


def _transport_summary(v: Any) -> str:
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


def _verdict_from_breakdown(run: dict[str, Any]) -> str:
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


def build_report_data(
    *,
    breakdown: dict[str, Any],
    baseline_breakdown: dict[str, Any] | None = None,
    shortfall: dict[str, Any] | None = None,
    links: dict[str, Any] | list[dict[str, Any]] | None = None,
    manifest: dict[str, Any] | None = None,
    baseline_manifest: dict[str, Any] | None = None,
    run_path: str | None = None,
    baseline_path: str | None = None,
    links_note: str | None = None,
    dilation_threshold: float = DEFAULT_DILATION_THRESHOLD,
    title: str | None = None,
    created: str | None = None,
) -> ReportData:
    """Build the report document from the analyses' JSON dicts and the manifests.

    `breakdown` is the run reported (the sharded run when there is a baseline); `shortfall` is
    the result of shortfall(baseline, run); `links` a compare-links result dict (with `rows`) or
    a bare list of probe rows. Missing inputs make their sections empty and add a note.
    """
    notes: list[str] = []
    role = "sharded" if (shortfall is not None or baseline_breakdown is not None) else "run"

    # dilation: the shortfall's figures win, then the breakdown's, then the manifest's
    sf_dil = (shortfall or {}).get("dilation") or {}
    run_dil = _num(sf_dil.get("sharded")) if sf_dil else None
    if run_dil is None:
        run_dil = _num(breakdown.get("dilation"))
    if run_dil is None and manifest:
        run_dil = _num(manifest.get("dilation"))
    base_dil = None
    if shortfall is not None or baseline_breakdown is not None:
        base_dil = _num(sf_dil.get("baseline")) if sf_dil else None
        if base_dil is None and baseline_breakdown is not None:
            base_dil = _num(baseline_breakdown.get("dilation"))
        if base_dil is None and baseline_manifest:
            base_dil = _num(baseline_manifest.get("dilation"))
    threshold = _num(sf_dil.get("threshold")) if sf_dil else None
    threshold = dilation_threshold if threshold is None else threshold

    runs: list[dict[str, Any]] = []
    if baseline_breakdown is not None:
        runs.append(_run_section("baseline", baseline_path, baseline_breakdown, base_dil))
    runs.append(_run_section(role, run_path, breakdown, run_dil))
    main = runs[-1]
    for r in runs:
        notes += [f"{r['role']}: {n}" for n in r["data_quality_notes"]]

    dil_runs: list[tuple[str, float | None]] = []
    if shortfall is not None or baseline_breakdown is not None:
        dil_runs.append(("baseline", base_dil))
    dil_runs.append((role, run_dil))
    dilation = _dilation_section(
        dil_runs,
        threshold,
        sf_dil.get("reconciliation") if sf_dil else None,
        sf_dil.get("runs") if isinstance(sf_dil.get("runs"), dict) else None,
    )

    # per-token times and the attribution
    attribution: dict[str, Any] | None = None
    if shortfall is not None:
        pt = shortfall.get("per_token_ns") or {}
        per_token_ns = {k: _int_or_none(pt.get(k)) for k in ("baseline", "sharded", "ideal")}
        n_ranks = int(shortfall.get("n_ranks") or main["n_ranks"])
        terms = {t: int((shortfall.get("terms_ns") or {}).get(t, 0)) for t in TERMS}
        coord = {p: int((shortfall.get("coordination_ns") or {}).get(p, 0)) for p in COORDINATION_PARTS}
        s_ns = int(shortfall.get("shortfall_ns", sum(terms.values())))
        waterfall = _waterfall(terms, shortfall.get("coordination_ns") or {})
        if sum(w["ns"] for w in waterfall) != s_ns:
            notes.append(
                f"the shortfall terms sum to {sum(w['ns'] for w in waterfall)} ns, not S = {s_ns} ns (analysis bug)"
            )
        shares = {k: _num(v) for k, v in (shortfall.get("shares") or {}).items()}
        attribution = {
            "shortfall_ns": s_ns,
            "terms_ns": terms,
            "coordination_ns": coord,
            "shares": shares,
            "spread_ns": {
                k: {"p10": _int_or_none((v or {}).get("p10")), "p90": _int_or_none((v or {}).get("p90"))}
                for k, v in (shortfall.get("spread_ns") or {}).items()
            },
            "waterfall": waterfall,
            "per_token_source": shortfall.get("per_token_source"),
            "uncorrected": shortfall.get("uncorrected"),
            "clock": shortfall.get("clock"),
        }
        verdict = str(shortfall.get("verdict") or "")
        diagnosis = str(shortfall.get("diagnosis") or "")
    else:
        diagnosis = ""
        per_token_ns = {"baseline": None, "sharded": main["step_ns"].get("median"), "ideal": None}
        n_ranks = main["n_ranks"]
        verdict = _verdict_from_breakdown(main)
        if baseline_breakdown is None:
            notes.append(
                "no baseline run given (--baseline): the shortfall and its attribution are not computed."
            )
    if baseline_breakdown is not None and shortfall is not None and per_token_ns["baseline"] is None:
        per_token_ns["baseline"] = runs[0]["step_ns"].get("median")

    # collectives and stragglers (from the shortfall)
    collectives = None
    stragglers: list[dict[str, Any]] = []
    trace_points: list[dict[str, Any]] = []
    if shortfall is not None:
        coll = shortfall.get("collectives") or {}
        by_op = []
        for c in coll.get("by_op") or []:
            entry = {
                "op": str(c.get("op", "")),
                "bytes": _int_or_none(c.get("bytes")),
                "count": int(c.get("count", 0) or 0),
                # median over instances of the per-instance max wait (shortfall schema >= 1.4)
                "wait_ns_median": _int_or_none(c.get("wait_ns_median")),
                "transfer_ns_median": _int_or_none(c.get("transfer_ns_median")),
                "skew_ns_median": _int_or_none(c.get("skew_ns_median")),
                "busbw_gbps_median": _num(c.get("busbw_gbps_median")),
            }
            by_op.append(entry)
            if entry["busbw_gbps_median"] is not None and entry["bytes"]:
                trace_points.append(
                    {
                        "op": entry["op"],
                        "bytes": entry["bytes"],
                        "busbw_gbps": entry["busbw_gbps_median"],
                        "count": entry["count"],
                    }
                )
        collectives = {
            "instances": int(coll.get("instances", 0) or 0),
            "per_token": _num(coll.get("per_token")),
            "by_op": by_op,
        }
        stragglers = [
            {
                "rank": int(s.get("rank", -1)),
                "last_count": int(s.get("last_count", 0) or 0),
                "instances": int(s.get("instances", 0) or 0),
                "share": _num(s.get("share")),
            }
            for s in shortfall.get("stragglers") or []
        ]

    # probes / link comparison
    links_section: dict[str, Any] | None = None
    probe_rows: list[dict[str, Any]] = []
    if isinstance(links, list):
        probe_rows = links
        links_section = {
            "modes": sorted({str(r.get("mode") or "default") for r in links}),
            "transports": {},
            "verdict": None,
        }
    elif isinstance(links, dict):
        probe_rows = list(links.get("rows") or [])
        links_section = {
            "modes": [
                str(m.get("mode")) if isinstance(m, dict) else str(m) for m in links.get("modes") or []
            ],
            "transports": {str(k): _transport_summary(v) for k, v in (links.get("transports") or {}).items()},
            "verdict": links.get("verdict"),
            "notes": [str(n) for n in links.get("notes") or []],
        }
        # the realised busbw compare-links measured in the decode trace, where the shortfall had none
        have = {(p["op"], p["bytes"]) for p in trace_points}
        for z in (links.get("trace") or {}).get("sizes") or []:
            op = str(z.get("coll_op") or z.get("op") or "")
            nbytes, busbw_z = _int_or_none(z.get("bytes")), _num(z.get("busbw_gbps"))
            if busbw_z is not None and nbytes and (op, nbytes) not in have:
                trace_points.append(
                    {"op": op, "bytes": nbytes, "busbw_gbps": busbw_z, "count": int(z.get("count", 0) or 0)}
                )
    if links_section is not None:
        links_section["note"] = links_note
    elif links_note:
        notes.append(links_note)
    busbw = {"trace": trace_points, "probes": _probe_curves(probe_rows)}

    manifests = []
    if baseline_breakdown is not None or baseline_manifest is not None:
        manifests.append(_manifest_summary("baseline", baseline_path, baseline_manifest))
    manifests.append(_manifest_summary(role, run_path, manifest))
    for m in manifests:
        if not m["present"]:
            notes.append(f"{m['role']}: no manifest.json beside the traces: what ran and where is unknown.")
        elif m.get("complete") is False:
            notes.append(f"{m['role']}: the capture is incomplete (a rank failed): {m.get('errors')}")

    data = ReportData(
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
        title=title or "tracekit report",
        created=created or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    data.key_figures = key_figures(data)
    return data


def key_figures(data: ReportData) -> list[dict[str, Any]]:
    """The numbers every format prints, in order: {key, label, value, unit, text}.

    `value` is the raw number (ns, ratio or share); `text` its printed form. The HTML marks each
    with `data-key`, the Markdown lists them in a table, so tests can compare the three formats.
    """
    rows: list[dict[str, Any]] = []

    def add(key: str, label: str, value: float | int | None, unit: str) -> None:
        if value is None:
            return
        if unit == "ns":
            text = fmt_ms(value)
        elif unit == "ratio":
            text = fmt_x(float(value))
        else:
            text = fmt_pct(float(value))
        rows.append({"key": key, "label": label, "value": value, "unit": unit, "text": text})

    n = data.n_ranks
    pt = data.per_token_ns
    add("per_token.baseline", "per-token time, TP=1 (T1)", pt.get("baseline"), "ns")
    add("per_token.sharded", f"per-token time, TP={n} (T{n})", pt.get("sharded"), "ns")
    add("per_token.ideal", f"ideal T1/{n}", pt.get("ideal"), "ns")
    if data.attribution is not None:
        a = data.attribution
        add("shortfall", "shortfall S", a["shortfall_ns"], "ns")
        for t in TERMS:
            add(f"terms.{t}", f"term: {t}", a["terms_ns"][t], "ns")
        for p in COORDINATION_PARTS:
            add(f"coordination.{p}", f"coordination: {p}", a["coordination_ns"][p], "ns")
        for t in TERMS:
            add(f"shares.{t}", f"share: {t}", a["shares"].get(t), "share")
    else:
        main = data.runs[-1]
        for p in PARTS:
            add(f"parts.{p}", f"median part: {p}", main["parts_ns_median"].get(p), "ns")
    for d in data.dilation["runs"]:
        label = "profiler dilation" if d["run"] == "run" else f"profiler dilation, {d['run']} run"
        add(f"dilation.{d['run']}", label, d["dilation"], "ratio")
    return rows
