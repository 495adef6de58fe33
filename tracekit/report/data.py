"""The report's plain data: one JSON-able document built only from what the analyses return.

`build_report_data(...)` takes the breakdown / shortfall / compare-links dicts (docs/JSON.md) and
the capture manifests, never raw events, and returns a `ReportData` (kind `tracekit.report`,
schema 1.3, documented in docs/JSON.md#report). The renderers (`html.py`, `markdown.py`) read
only this; the JSON output *is* this. Figures are not built here.

Times stay integer nanoseconds; formatting to milliseconds happens in `fmt_ms`, which both
renderers share so the page and the Markdown carry the same printed numbers.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from tracekit._version import __version__
from tracekit.analyse.prose import chance_clause as _chance_clause
from tracekit.model import units
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.model.documents import Shortfall, convert, given, to_builtins
from tracekit.model.documents.shortfall import ShortfallBaselineByRankValue, ShortfallByRankValue
from tracekit.model.parts import (
    COORDINATION,
    MAIN_TERMS,
    PARTS,
    PATH_PARTS,
    TERM_WORDS,
    term_words,
)
from tracekit.read.manifests import typed_manifest

if TYPE_CHECKING:
    from tracekit.report.extras import ExtraSection

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
# formatting shared by the renderers


def fmt_ms(ns: float | int | None, digits: int = 3) -> str:
    """Nanoseconds as milliseconds with `digits` decimals ("12.345 ms"); "n/a" when missing."""
    return units.ms(ns, digits, unit=True, missing="n/a")


def fmt_us(ns: float | int | None, digits: int = 1) -> str:
    return units.us(ns, digits, unit=True, missing="n/a")


def fmt_pct(share: float | None, digits: int = 1) -> str:
    return units.pct(share, digits, missing="n/a")


def fmt_x(ratio: float | None) -> str:
    return units.times(ratio, missing="n/a")


def fmt_interval(interval: Any) -> str:
    """A ratio interval as "[1.27-1.48]" (the shortfall verdict's form); "" when missing."""
    if not isinstance(interval, list | tuple) or len(interval) != 2:
        return ""
    lo, hi = _num(interval[0]), _num(interval[1])
    if lo is None or hi is None:
        return ""
    return f"[{lo:.2f}-{hi:.2f}]"


def fmt_x_interval(ratio: float | None, interval: Any) -> str:
    """A dilation with its interval: "1.37x [1.27-1.48]" (just "1.37x" without an interval)."""
    iv = fmt_interval(interval)
    return fmt_x(ratio) + (f" {iv}" if iv and ratio is not None else "")


def prose(text: Any) -> str:
    """A sentence for a reader: code spans (`name`) lose their backticks, which would show
    literally on the page and in the Markdown (`md_esc` escapes them)."""
    return re.sub(r"`([^`\n]+)`", r"\1", "" if text is None else str(text))


def short_words(words: str) -> str:
    """A term's words without the parenthesis (for figure axes): "gloo's exchange after ..."."""
    return words.split(" (", 1)[0]


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
    per_rank: list[dict[str, Any]] | None = None
    critical_path: dict[str, Any] | None = None
    straggler: dict[str, Any] | None = None
    term_words: dict[str, str] = field(default_factory=dict)
    headline: str = ""
    per_token_label: str = ""
    extras: list[ExtraSection] = field(default_factory=list)
    title: str = "tracekit report"
    created: str = ""
    generator: str = f"tracekit {__version__}"
    kind: str = KIND
    schema_version: str = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The document as a dict, `kind` and `schema_version` first."""
        d = asdict(self)
        head = {
            "kind": d.pop("kind"),
            "schema_version": d.pop("schema_version"),
            "headline": d.pop("headline"),
        }
        d.pop("extras")
        extras = {"extras": [e.to_json() for e in self.extras]} if self.extras else {}
        # the extras (when given) after the report's own sections, before title/created/generator
        tail = {k: d.pop(k) for k in ("title", "created", "generator")}
        return {**head, **d, **extras, **tail}


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


#: the workload fields a report shows, in this order (those the manifest has)
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


def _manifest_summary(
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
        "capture_dilation": _num(given(m.dilation)),
        "command": given(m.command),
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
            "traced_mean_ns": _int_or_none(app.get("traced_mean_ns")),
            "corrected_mean_ns": _int_or_none(app.get("corrected_mean_ns")),
            "unprofiled_mean_ns": _int_or_none(app.get("unprofiled_mean_ns")),
            "unprofiled_median_ns": _int_or_none((det.get("unprofiled") or {}).get("median_ns")),
            "profiled_median_ns": _int_or_none((det.get("profiled") or {}).get("median_ns")),
            "host_clock": None,
        }
        if applied_src and det:
            hc_iv = det.get("interval")
            entry["host_clock"] = {
                "dilation": _num(det.get("dilation")),
                "interval": [float(x) for x in hc_iv]
                if isinstance(hc_iv, list | tuple) and len(hc_iv) == 2
                else None,
                "definition": det.get("definition"),
                "unprofiled_mean_ns": _int_or_none((det.get("unprofiled") or {}).get("mean_ns")),
                "profiled_mean_ns": _int_or_none((det.get("profiled") or {}).get("mean_ns")),
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


def _waterfall(
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


def _attach_intervals(attribution: dict[str, Any]) -> None:
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


def _term_words(shortfall: dict[str, Any], timeline: str | None) -> dict[str, str]:
    """The shortfall's `term_words`, completed from the defaults; without them the transfer is
    named by the run's timeline (a link only on a GPU timeline)."""
    words = term_words(timeline)
    given = shortfall.get("term_words")
    if isinstance(given, dict):
        words.update({str(k): str(v) for k, v in given.items() if v})
    return words


def _per_rank_section(sf: Shortfall, s_ns: int) -> list[dict[str, Any]] | None:
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


def _path_rank(
    d: ShortfallByRankValue | ShortfallBaselineByRankValue, step: int | None = None
) -> dict[str, Any]:
    """One rank's parts on the path; `total_ns` the document's, else their sum (the baseline's
    rows carry none); `share_of_step` of the per-token time `step` when given."""
    row: dict[str, Any] = {f"{p}_ns": int(getattr(d, f"{p}_ns")) for p in PATH_PARTS}
    row["total_ns"] = d.total_ns if isinstance(d, ShortfallByRankValue) else sum(row.values())
    if step is not None:
        row["share_of_step"] = row["total_ns"] / step if step else None
    return row


def _critical_path_section(sf: Shortfall) -> dict[str, Any] | None:
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


def _straggler_section(sf: Shortfall) -> dict[str, Any] | None:
    st = given(sf.straggler)
    if st is None:
        return None
    return {
        "rank": st.rank,
        "is_straggler": st.is_straggler,
        "last_share": _num(given(st.last_share)),
        "last_share_p_value": _num(given(st.last_share_p_value)),
        "lateness_ns_median": given(st.lateness_ns_median),
        "threshold_ns": given(st.threshold_ns),
    }


def chance_clause(st: dict[str, Any]) -> str:
    """`tracekit.analyse.prose.chance_clause` of the straggler test's p-value."""
    return _chance_clause(_num(st.get("last_share_p_value")))


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


def _cell(ns: int | None, share: float | None) -> str:
    return f"{fmt_ms(ns)} ({fmt_pct(share)})"


def per_rank_rows(data: ReportData) -> tuple[list[str], list[list[str]]]:
    """The "Per rank" table both renderers print: headers and text rows, each rank's own terms and
    wait / sync / idle (per token, share of S), then the aggregate (the mean over ranks)."""
    a = data.attribution
    if not data.per_rank or a is None:
        return [], []
    s_ns = a["shortfall_ns"]
    words = data.term_words or TERM_WORDS
    terms = list(a["terms_ns"])
    for r in data.per_rank:
        terms += [t for t in r["terms_ns"] if t not in terms]
    label = {t: t for t in terms}
    label["transfer"] = f"transfer ({short_words(words.get('transfer', 'transfer'))})"
    headers = ["rank"] + [label[t] for t in terms] + [f"coordination: {p}" for p in COORDINATION]
    headers += ["own window", "pad (idle to the step time)"]

    def share(ns: int | None) -> float | None:
        return ns / s_ns if (s_ns and ns is not None) else None

    rows = []
    for r in data.per_rank:
        row = [f"rank {r['rank']}"]
        row += [_cell(r["terms_ns"].get(t, 0), share(r["terms_ns"].get(t, 0))) for t in terms]
        row += [_cell(r["coordination_ns"][p], share(r["coordination_ns"][p])) for p in COORDINATION]
        row += [fmt_ms(r.get("own_window_ns")), fmt_ms(r.get("pad_ns"))]
        rows.append(row)
    agg = ["mean over ranks (aggregate)"]
    agg += [_cell(a["terms_ns"].get(t, 0), share(a["terms_ns"].get(t, 0))) for t in terms]
    agg += [_cell(a["coordination_ns"][p], share(a["coordination_ns"][p])) for p in COORDINATION]
    rows.append(agg + ["", ""])
    return headers, rows


#: kernel names longer than this are shortened in the tables (the HTML keeps the whole name as the
#: cell's title)
NAME_CHARS = 96


def short_name(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def top_kernel_rows(run: dict[str, Any]) -> list[tuple[str, str, str, str, str, str, bool]]:
    """The top-kernels table of one run as text rows (class, name, count, total, mean, share,
    is_class_row), for both renderers: per class a row with its totals, then its kernels, then how
    many more names it has."""
    tk = run.get("top_kernels") or {}
    out: list[tuple[str, str, str, str, str, str, bool]] = []
    for c, v in (tk.get("classes") or {}).items():
        out.append((c, f"all {c}", _count(v["count"]), fmt_ms(v["total_ns"]), "", fmt_pct(v["share"]), True))
        for k in v["kernels"]:
            out.append(
                (
                    "",
                    k["name"],
                    _count(k["count"]),
                    fmt_ms(k["total_ns"]),
                    fmt_us(k["mean_ns"]),
                    fmt_pct(k["share"]),
                    False,
                )
            )
        if v.get("more"):
            out.append(("", f"... and {v['more']} more names", "", "", "", "", False))
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


def top_kernels_caption(run: dict[str, Any]) -> str:
    return f"{run['role']} run: top kernels per class"


def top_kernels_note(run: dict[str, Any]) -> str:
    tk = run.get("top_kernels") or {}
    return (
        f"Count and time per token per rank over {tk.get('windows', 0)} steady step windows (traced "
        f"durations); share of the mean traced step, {fmt_ms(tk.get('step_ns_mean'))}; kernels on "
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
    step = cp["step_ns"]
    label = {p: p for p in PATH_PARTS}
    label["transfer"] = f"transfer ({short_words(words.get('transfer', 'transfer'))})"
    gpu = (data.runs[-1].get("timeline") if data.runs else None) == "gpu"
    label["host"] = "host (launch gaps, host work)" if gpu else "host (time between its ops)"
    headers = ["rank"] + [label[p] for p in PATH_PARTS] + ["on the path", "share of the token"]
    blank = [""] * len(PATH_PARTS)
    rows = []
    for rank, r in cp["by_rank"].items():
        rows.append(
            [f"rank {rank}"]
            + [fmt_ms(r[f"{p}_ns"]) for p in PATH_PARTS]
            + [fmt_ms(r["total_ns"]), fmt_pct(r.get("share_of_step"))]
        )
    rows.append(
        ["offset (step windows open at different times)"]
        + blank
        + [fmt_ms(cp["offset_ns"]), fmt_pct(cp["offset_ns"] / step if step else None)]
    )
    rows.append([f"per-token time T{data.n_ranks}"] + blank + [fmt_ms(step), fmt_pct(1.0 if step else None)])
    base = cp.get("baseline") or {}
    for rank, r in (base.get("by_rank") or {}).items():
        rows.append(
            [f"TP=1 baseline, rank {rank} (a whole token)"]
            + [fmt_ms(r[f"{p}_ns"]) for p in PATH_PARTS]
            + [fmt_ms(r["total_ns"]), ""]
        )
    return headers, rows


def path_note(cp: dict[str, Any]) -> str:
    """The sentence under the critical-path table (what it is, and that it adds up)."""
    return (
        "Per rank, the time of each kind on the critical path of a token (rendezvous model: a collective "
        "starts when its last rank arrives, so waiting is not on the path, it is the consequence). The ranks' "
        f"totals plus the offset {fmt_ms(cp['offset_ns'])} (ranks opening their step windows at different "
        f"times) make the per-token time {fmt_ms(cp['step_ns'])} exactly."
    )


def build_report_data(
    *,
    breakdown: dict[str, Any],
    baseline_breakdown: dict[str, Any] | None = None,
    shortfall: dict[str, Any] | None = None,
    links: dict[str, Any] | list[dict[str, Any]] | None = None,
    manifest: ManifestDoc | Mapping[str, Any] | None = None,
    baseline_manifest: ManifestDoc | Mapping[str, Any] | None = None,
    top_kernels: dict[str, Any] | None = None,
    baseline_top_kernels: dict[str, Any] | None = None,
    run_path: str | None = None,
    baseline_path: str | None = None,
    links_note: str | None = None,
    dilation_threshold: float = DEFAULT_DILATION_THRESHOLD,
    title: str | None = None,
    created: str | None = None,
    extras: list[ExtraSection] | None = None,
) -> ReportData:
    """Build the report document from the analyses' JSON dicts and the manifests.

    `breakdown` is the run reported (the sharded run when there is a baseline); `shortfall` is
    the result of shortfall(baseline, run); `links` a compare-links result dict (with `rows`) or
    a bare list of probe rows; `extras` the sections of other commands' JSON
    (`tracekit.report.extras.extra_sections`). Missing inputs make their sections empty and add a note.
    """
    notes: list[str] = []
    # the shortfall decoded once into its typed document (docs/JSON.md#shortfall); the sections read it
    sf = convert(shortfall, Shortfall) if shortfall is not None else None
    role = "sharded" if (shortfall is not None or baseline_breakdown is not None) else "run"

    # dilation: with a shortfall, only the factor it applied (null when it applied none: a host-clock
    # figure must not stand in for it); without one, the breakdown's, then the manifest's
    sf_dil = (shortfall or {}).get("dilation") or {}
    run_dil = _num(sf_dil.get("sharded")) if sf_dil else None
    if run_dil is None and not sf_dil:
        run_dil = _num(breakdown.get("dilation"))
    if run_dil is None and not sf_dil and manifest:
        run_dil = _num(given(manifest_doc(manifest).dilation))
    base_dil = None
    if shortfall is not None or baseline_breakdown is not None:
        base_dil = _num(sf_dil.get("baseline")) if sf_dil else None
        if base_dil is None and not sf_dil and baseline_breakdown is not None:
            base_dil = _num(baseline_breakdown.get("dilation"))
        if base_dil is None and not sf_dil and baseline_manifest:
            base_dil = _num(given(manifest_doc(baseline_manifest).dilation))
    threshold = _num(sf_dil.get("threshold")) if sf_dil else None
    threshold = dilation_threshold if threshold is None else threshold

    runs: list[dict[str, Any]] = []
    if baseline_breakdown is not None:
        runs.append(_run_section("baseline", baseline_path, baseline_breakdown, base_dil))
    runs.append(_run_section(role, run_path, breakdown, run_dil))
    main = runs[-1]
    main["top_kernels"] = _top_kernels_section(top_kernels)
    if baseline_breakdown is not None:
        runs[0]["top_kernels"] = _top_kernels_section(baseline_top_kernels)
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
        sf_dil=sf_dil if isinstance(sf_dil, dict) and sf_dil else None,
        corrected=(shortfall or {}).get("per_token_source") == "unprofiled",
    )
    term_words = _term_words(shortfall or {}, main.get("timeline"))
    per_rank: list[dict[str, Any]] | None = None
    critical_path: dict[str, Any] | None = None
    straggler: dict[str, Any] | None = None

    # per-token times and the attribution
    attribution: dict[str, Any] | None = None
    if sf is not None and shortfall is not None:
        pt = shortfall.get("per_token_ns") or {}
        per_token_ns = {k: _int_or_none(pt.get(k)) for k in ("baseline", "sharded", "ideal")}
        n_ranks = int(shortfall.get("n_ranks") or main["n_ranks"])
        sf_terms = shortfall.get("terms_ns") or {}
        terms = {t: int(sf_terms.get(t, 0)) for t in MAIN_TERMS}
        if _num(sf_terms.get("unknown")):  # only when not zero (shortfall schema); it is part of S
            terms["unknown"] = int(sf_terms["unknown"])
        coord = {p: int((shortfall.get("coordination_ns") or {}).get(p, 0)) for p in COORDINATION}
        s_ns = int(shortfall.get("shortfall_ns", sum(terms.values())))
        waterfall = _waterfall(terms, shortfall.get("coordination_ns") or {}, term_words)
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
            "aggregate": shortfall.get("aggregate"),
            "per_token_source": shortfall.get("per_token_source"),
            "uncorrected": shortfall.get("uncorrected"),
            "clock": shortfall.get("clock"),
            "intervals": _intervals_section(sf),
            "noise": shortfall.get("noise") if isinstance(shortfall.get("noise"), dict) else None,
        }
        _attach_intervals(attribution)
        verdict = str(shortfall.get("verdict") or "")
        diagnosis = str(shortfall.get("diagnosis") or "")
        per_rank = _per_rank_section(sf, s_ns)
        critical_path = _critical_path_section(sf)
        straggler = _straggler_section(sf)
        if per_rank is not None:
            for r in per_rank:
                if sum(r["terms_ns"].values()) != s_ns:
                    notes.append(
                        f"rank {r['rank']}'s terms sum to {sum(r['terms_ns'].values())} ns, not S = {s_ns} ns (analysis bug)"
                    )
        if critical_path is not None:
            total = sum(r["total_ns"] for r in critical_path["by_rank"].values()) + critical_path["offset_ns"]
            if total != critical_path["step_ns"]:
                notes.append(
                    f"the critical path sums to {total} ns, not the per-token time {critical_path['step_ns']} ns (analysis bug)"
                )
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
        per_rank=per_rank,
        critical_path=critical_path,
        straggler=straggler,
        term_words=term_words,
        extras=list(extras or []),
        title=title or "tracekit report",
        created=created or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    data.key_figures = key_figures(data)
    data.headline = headline_line(data, shortfall)
    data.per_token_label = per_token_label(data)
    return data


def _top_kernels_section(tk: dict[str, Any] | None) -> dict[str, Any] | None:
    """`tracekit.analyse.kernels.top_kernels`' result, its numbers as plain floats (None without one)."""
    if not isinstance(tk, dict) or not tk.get("classes"):
        return None
    classes = {}
    for c, v in tk["classes"].items():
        classes[str(c)] = {
            "count": _num(v.get("count")),
            "total_ns": _num(v.get("total_ns")),
            "share": _num(v.get("share")),
            "more": int(v.get("more", 0) or 0),
            "kernels": [
                {
                    "name": str(k.get("name", "")),
                    "subclass": str(k.get("subclass", "")),
                    "count": _num(k.get("count")),
                    "total_ns": _num(k.get("total_ns")),
                    "mean_ns": _num(k.get("mean_ns")),
                    "share": _num(k.get("share")),
                }
                for k in v.get("kernels") or []
            ],
        }
    return {
        "windows": int(tk.get("windows", 0) or 0),
        "step_ns_mean": _num(tk.get("step_ns_mean")),
        "classes": classes,
    }


#: the critical path's components in words, for the headline (host depends on the timeline)
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
    if not cp or not cp.get("by_rank"):
        return ""
    best = max(
        ((int(r), p, row[f"{p}_ns"]) for r, row in cp["by_rank"].items() for p in PATH_PARTS),
        key=lambda t: (t[2], -t[0]),
    )
    rank, part, ns = best
    if ns <= 0:
        return ""
    gpu = (data.runs[-1].get("timeline") if data.runs else None) == "gpu"
    if part == "host":
        what = "host time (launch gaps)" if gpu else "host time between its ops"
    elif part == "transfer":
        what = short_words(data.term_words.get("transfer", "transfer"))
    else:
        what = _PATH_WORDS.get(part, part)
    where = f" on rank {rank}" if data.n_ranks > 1 else ""
    return f"{what}{where}, {ns / 1e6:.2f} of {fmt_ms(cp['step_ns'], 2)}"


def _pair(v: Any) -> tuple[float, float] | None:
    """[lo, hi] as two numbers, or None."""
    if isinstance(v, list | tuple) and len(v) == 2:
        lo, hi = _num(v[0]), _num(v[1])
        if lo is not None and hi is not None:
            return lo, hi
    return None


def fmt_ms_interval(v: Any, digits: int = 2) -> str:
    """An interval of ns as "6.83-9.77 ms" ("" without one)."""
    iv = _pair(v)
    return "" if iv is None else f"{iv[0] / 1e6:.{digits}f}-{fmt_ms(iv[1], digits)}"


def reading_of(interval: Any) -> str | None:
    """ "finding" when a 95% interval lies above zero, "negative" below it, "within_noise" when it
    holds zero; None without an interval (the noise section's readings, for the coordination parts)."""
    iv = _pair(interval)
    if iv is None:
        return None
    return "finding" if iv[0] > 0 else ("negative" if iv[1] < 0 else "within_noise")


def _intervals_section(sf: Shortfall) -> dict[str, Any] | None:
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
            "baseline": _pair(pt.baseline),
            "sharded": _pair(pt.sharded),
            "ideal": _pair(pt.ideal),
        },
        "shortfall_ns": _pair(iv.shortfall_ns),
        "terms_ns": {k: _pair(v) for k, v in iv.terms_ns.items()},
        "coordination_ns": {k: _pair(v) for k, v in iv.coordination_ns.items()},
    }


def _interval_text(data: ReportData) -> str:
    """S's interval for the headline: the shortfall's own 95% interval when it has one, else the
    p10-p90 spread over steps (labelled as such)."""
    a = data.attribution or {}
    iv = (a.get("intervals") or {}).get("shortfall_ns")
    if iv is not None:
        return f" [95% {fmt_ms_interval(iv)}]"
    sp = (a.get("spread_ns") or {}).get("shortfall") or {}
    if sp.get("p10") is not None and sp.get("p90") is not None:
        return f" [p10-p90 over steps {sp['p10'] / 1e6:.2f}-{fmt_ms(sp['p90'], 2)}]"
    return ""


def headline_line(data: ReportData, shortfall: dict[str, Any] | None = None) -> str:
    """The one line on top of every report: TN against the ideal, S with its interval, the term
    that holds the run back with its share (the shortfall's noise reading decides whether a term is
    a finding: docs/METHOD.md section Noise and the profiler correction), and the cause on the
    critical path."""
    a = data.attribution
    n = data.n_ranks
    pt = data.per_token_ns
    if a is None or pt.get("sharded") is None or pt.get("ideal") is None:
        return prose(data.verdict).split("; ", 1)[0].rstrip(".") + "."
    s_ns = a["shortfall_ns"]
    ivs = a.get("intervals") or {}
    tn_iv = (ivs.get("per_token_ns") or {}).get("sharded")
    tn = fmt_ms(pt["sharded"], 2) + (f" [95% {fmt_ms_interval(tn_iv)}]" if tn_iv else "")
    head = f"TP={n}: {tn} per token vs ideal {fmt_ms(pt['ideal'], 2)}"
    noise = a.get("noise") or {}
    status = noise.get("status")
    if s_ns <= 0 or status == "beats_ideal":
        return f"{head}: no shortfall (S = {fmt_ms(s_ns, 2)}{_interval_text(data)})."
    line = f"{head}; S = {fmt_ms(s_ns, 2)}{_interval_text(data)}"
    terms = a["terms_ns"]
    gpu = data.runs[-1].get("timeline") == "gpu"
    words = {"transfer": "link transfer" if gpu else "gloo exchange"}
    if status == "too_noisy":
        line += ", too noisy to attribute (S's interval holds zero)"
    elif status == "unattributed":
        line += ", no term clear of the noise"
    else:
        named = noise.get("cause")
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
    if a.get("per_token_source") == "unprofiled":
        return "Per-token time, dilation-corrected (traced / dilation; mean over steady steps)"
    return "Per-token time (traced, mean over steady steps; no unprofiled timing to correct it)"


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
        for t in a["terms_ns"]:
            add(f"terms.{t}", f"term: {t}", a["terms_ns"][t], "ns")
        for p in COORDINATION:
            add(f"coordination.{p}", f"coordination: {p}", a["coordination_ns"][p], "ns")
        for t in a["terms_ns"]:
            add(f"shares.{t}", f"share: {t}", a["shares"].get(t), "share")
    else:
        main = data.runs[-1]
        for p in PARTS:
            add(f"parts.{p}", f"median part: {p}", main["parts_ns_median"].get(p), "ns")
    if data.per_rank:
        for r in data.per_rank:
            add(
                f"per_rank.{r['rank']}.wait",
                f"rank {r['rank']}: collective wait",
                r["coordination_ns"]["wait"],
                "ns",
            )
    cp = data.critical_path
    if cp:
        for rank, row in cp["by_rank"].items():
            add(f"critical_path.{rank}.host", f"critical path: rank {rank}'s host time", row["host_ns"], "ns")
    for d in data.dilation["runs"]:
        label = "profiler dilation" if d["run"] == "run" else f"profiler dilation, {d['run']} run"
        if d.get("source") == "applied":
            label += " (applied)"
        add(f"dilation.{d['run']}", label, d["dilation"], "ratio")
    return rows
