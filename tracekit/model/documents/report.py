"""The `Report` document: tracekit report -o report.json (docs/JSON.md#report)."""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, PerTokenOf
from tracekit.model.documents.breakdown import BreakdownKernelsByClassValue, BreakdownUnknownKernel
from tracekit.model.documents.kernels import TopKernel
from tracekit.model.documents.links import LinksPerTokenNs
from tracekit.model.documents.manifest import ManifestInjectDelay
from tracekit.model.documents.shortfall import (
    ShortfallByRankValue,
    ShortfallClock,
    ShortfallNoise,
    ShortfallStraggler_,
    ShortfallUncorrected_,
)


class ReportError(Doc, kw_only=True):
    rank: int | None
    message: str
    how: str | UnsetType = UNSET


class ReportHostClock(Doc, kw_only=True):
    dilation: float | None
    interval: list[float] | None
    definition: str | None
    unprofiled_mean_ns: int | None
    profiled_mean_ns: int | None


class ReportRun(Doc, kw_only=True):
    run: str
    dilation: float | None
    interval: list[float] | None
    source: str
    traced_mean_ns: int | None
    corrected_mean_ns: int | None
    unprofiled_mean_ns: int | None
    unprofiled_median_ns: int | None
    profiled_median_ns: int | None
    host_clock: ReportHostClock | None = None


class ReportDilation(Doc, kw_only=True):
    runs: list[ReportRun]
    definition: str
    threshold: float
    inflated: bool
    caution: str | None
    sentence: str
    cross_check: str | None
    warning: str | None
    reconciliation: str | None


class ReportKeyFigure(Doc, kw_only=True):
    """A number every format prints: its raw `value` (ns, ratio or share) and its printed `text`;
    the HTML marks it with `data-key`, the Markdown lists it by `key` (the extras' figures too)."""

    key: str
    label: str
    value: int | float
    unit: str
    text: str


class ReportPerTokenNs(LinksPerTokenNs, kw_only=True):
    """Per token: the baseline, the sharded run and the ideal (compare-links' own figures)."""


class ReportCompute(Doc, kw_only=True):
    p10: int | None
    p90: int | None


class ReportWaterfallItem(Doc, kw_only=True):
    label: str
    term: str
    ns: int
    interval_ns: tuple[float, float] | None = None
    reading: str | None = None


class ReportIntervalsPerTokenNs(PerTokenOf[tuple[float, float] | None], kw_only=True):
    """The 95% interval of each per-token time (`PerTokenOf`)."""


class ReportIntervals(Doc, kw_only=True):
    level: float
    basis: str
    method: str
    per_token_ns: ReportIntervalsPerTokenNs
    shortfall_ns: tuple[float, float] | None
    terms_ns: dict[str, tuple[float, float] | None]
    coordination_ns: dict[str, tuple[float, float] | None]


class ReportAttribution(Doc, kw_only=True):
    shortfall_ns: int
    terms_ns: dict[str, int]
    coordination_ns: dict[str, int]
    shares: dict[str, float | None]
    spread_ns: dict[str, ReportCompute]
    waterfall: list[ReportWaterfallItem]
    aggregate: str | None
    per_token_source: str
    uncorrected: ShortfallUncorrected_
    clock: ShortfallClock
    intervals: ReportIntervals | None
    noise: ShortfallNoise | None


class ReportStepNs(Doc, kw_only=True):
    median: int | None
    p10: int | None
    p90: int | None
    n: int


class ReportStep(Doc, kw_only=True):
    rank: int
    step: int
    name: str
    window_ns: int
    parts_ns: dict[str, int]
    overlapped_collective_ns: int


class ReportRunPerRankItem(Doc, kw_only=True):
    rank: int
    steps: int
    step_ns_median: int | None
    parts_ns_median: dict[str, int | None]


class ReportTopKernelsClass(Doc, kw_only=True):
    """A class's top kernels as the report holds them: `more` before `kernels` (the analysis'
    own `TopKernelsClass` has them the other way round)."""

    count: float
    total_ns: float
    share: float | None
    more: int
    kernels: list[TopKernel]


class ReportTopKernels(Doc, kw_only=True):
    windows: int
    step_ns_mean: float | None
    classes: dict[str, ReportTopKernelsClass]


class ReportRun_(Doc, kw_only=True):
    role: str
    path: str | None
    n_ranks: int
    ranks: list[int]
    timeline: str
    step_pattern: str
    step_ns: ReportStepNs
    parts_ns_median: dict[str, int | None]
    steps: list[ReportStep]
    per_rank: list[ReportRunPerRankItem] | None
    kernels_by_class: dict[str, BreakdownKernelsByClassValue]
    unknown_kernels: list[BreakdownUnknownKernel]
    data_quality_notes: list[str]
    dilation: float | None
    top_kernels: ReportTopKernels | None = None


class ReportByOpItem(Doc, kw_only=True):
    op: str
    bytes: int | None
    count: int
    wait_ns_median: int | None
    transfer_ns_median: int | None
    skew_ns_median: int | None
    busbw_gbps_median: float | None


class ReportCollectives(Doc, kw_only=True):
    instances: int
    per_token: float | None
    by_op: list[ReportByOpItem]


class ReportTraceItem(Doc, kw_only=True):
    op: str
    bytes: int
    busbw_gbps: float
    count: int


class ReportPoint(Doc, kw_only=True):
    bytes: int
    busbw_gbps: float
    correct: bool | None


class ReportProbe(Doc, kw_only=True):
    label: str
    mode: str
    op: str
    in_place: bool
    ranks: int
    backend: str | None
    transport: str | None
    points: list[ReportPoint]


class ReportBusbw(Doc, kw_only=True):
    trace: list[ReportTraceItem]
    probes: list[ReportProbe]


class ReportLinks(Doc, kw_only=True):
    modes: list[str]
    #: per mode, what its run really used (one line); {} for a bare list of probe rows
    transports: dict[str, str]
    verdict: str | None
    notes: list[str] | UnsetType = UNSET  # absent for a bare list of probe rows
    note: str | None = None


class ReportWorkload(Doc, kw_only=True):
    """The manifest's workload fields a report shows, in this order (those the manifest has)."""

    preset: str | UnsetType = UNSET
    tp: int | UnsetType = UNSET
    tokens: int | UnsetType = UNSET
    prompt: int | UnsetType = UNSET
    batch: int | UnsetType = UNSET
    layers: int | UnsetType = UNSET
    backend: str | UnsetType = UNSET
    device: str | UnsetType = UNSET
    dtype: str | UnsetType = UNSET
    mode: str | list[str] | UnsetType = UNSET  # as the manifest's workload.mode
    seed: int | UnsetType = UNSET
    step_pattern: str | UnsetType = UNSET
    inject_delay: ManifestInjectDelay | None | UnsetType = UNSET
    inject_sync: bool | UnsetType = UNSET


class ReportHost(Doc, kw_only=True):
    hostname: str | UnsetType = UNSET
    cpu: str | UnsetType = UNSET
    cpu_count: int | None | UnsetType = UNSET


class ReportDevice(Doc, kw_only=True):
    index: int | None
    name: str | None
    memory_bytes: int | None


class ReportManifest(Doc, kw_only=True):
    """A run's manifest as the report shows it; without one only role, path and present (false)."""

    role: str
    path: str | None
    present: bool
    complete: bool | None | UnsetType = UNSET
    errors: list[ReportError] | UnsetType = UNSET
    created: str | None | UnsetType = UNSET
    workload: ReportWorkload | UnsetType = UNSET
    host: ReportHost | UnsetType = UNSET
    devices: list[ReportDevice] | UnsetType = UNSET
    versions: dict[str, str | None] | UnsetType = UNSET
    nccl_env: dict[str, str] | UnsetType = UNSET
    capture_dilation: float | None | UnsetType = UNSET
    command: str | None | UnsetType = UNSET


class ReportPerRankItem_(Doc, kw_only=True):
    """The shortfall's per-rank item, with each term's share of S."""

    rank: int
    terms_ns: dict[str, int]
    coordination_ns: dict[str, int]
    shares: dict[str, float | None]
    own_window_ns: int
    pad_ns: int


class ReportByRankValue(ShortfallByRankValue, kw_only=True):
    """The shortfall's path-by-rank value, with its share of the step."""

    share_of_step: float | None


class ReportBaseline(Doc, kw_only=True):
    step_ns: int
    by_rank: dict[str, ShortfallByRankValue]


class ReportCriticalPath(Doc, kw_only=True):
    step_ns: int
    offset_ns: int
    by_rank: dict[str, ReportByRankValue]
    cause: str
    hops_per_step_median: float
    baseline: ReportBaseline | None
    uncorrected_step_ns: int


class ReportStraggler_(Doc, kw_only=True):
    rank: int | None
    is_straggler: bool
    last_share: float | None
    last_share_p_value: float | None
    lateness_ns_median: int | None
    threshold_ns: int | None


class ReportTable(Doc, kw_only=True):
    caption: str
    headers: list[str]
    rows: list[list[str]]


class ReportExtra(Doc, kw_only=True):
    key: str
    kind: str
    command: str
    title: str
    path: str | None
    answer: str
    figures: list[ReportKeyFigure]
    tables: list[ReportTable]
    lines: list[str]
    notes: list[str]


class Report(Doc, kw_only=True):
    r"""`tracekit report -o X.json` / `tracekit study` (`report.json`). Built by `tracekit/report/data.py`
    only from the documents above (never raw events); the HTML and Markdown are rendered from it.
    Names taken from traces are raw here (this is data); the renderers escape them.
    ```
    { "kind": "tracekit.report", "schema_version": "1.4",   # 1.2: collectives.by_op[].wait_ns_median as shortfall 1.4
                                                 # 1.3: per_rank, critical_path, straggler, term_words (shortfall 1.5);
                                                 #      dilation stated = the factor applied, with its interval;
                                                 #      manifests[].dilation renamed capture_dilation (a cross-check)
                                                 # 1.4: headline, per_token_label, runs[].top_kernels
      "headline": "TP=2: 12.02 ms per token vs ideal 3.76 ms; S = 8.25 ms [p10-p90 over steps 3.23-12.51 ms], 94%
                   coordination; cause on the critical path: host time (launch gaps) on rank 1, 8.10 of 12.02 ms.",
                                                 # (1.4) the one line on top of every format: TN vs ideal, S with the
                                                 # shortfall's 95% interval when it has one (intervals.shortfall_ns),
                                                 # else the p10-p90 spread over steps, the largest term's share, the
                                                 # largest component of the critical path and its rank
      "per_token_label": "Per-token time, dilation-corrected (traced / dilation; mean over steady steps)",   # (1.4)
                                                 # (1.4) attribution.intervals {level, basis, method, per_token_ns,
                                                 # shortfall_ns, terms_ns, coordination_ns: [lo, hi]} and
                                                 # attribution.noise: the shortfall's; waterfall[].interval_ns and
                                                 # .reading (finding | within_noise | negative): a share is printed
                                                 # only for a finding
      "verdict": "one sentence",                 # the shortfall's verdict; without a baseline, built from the breakdown
      "diagnosis": "..." ,                       # 1.1: the shortfall's diagnosis ("" without a baseline)
      "dilation": {"runs": [{"run": "baseline"|"sharded"|"run",
                             "dilation": 1.05 | null,   # THE dilation: with a shortfall its applied factor
                                                        # (shortfall dilation.baseline / .sharded), else the
                                                        # capture's host-clock figure (breakdown / manifest)
                             "interval": [lo, hi] | null,          # (1.3) the shortfall's 95% interval
                             "source": "applied" | "host_clock",   # (1.3) which of the two `dilation` is
                             "traced_mean_ns": ..., "unprofiled_mean_ns": ...,   # (1.3) the applied ratio's parts
                             "unprofiled_median_ns": ... | null, "profiled_median_ns": ... | null,
                             "host_clock": null | {"dilation", "interval", "definition", "unprofiled_mean_ns",
                                                   "profiled_mean_ns"}}],   # (1.3) shortfall dilation.runs.<run>:
                                                        # the capture's figure, a labelled cross-check only
                   "definition": "traced per-token time / unprofiled per-token time; ...",   # (1.3)
                   "threshold": 0.10, "inflated": false,   # inflated: a stated `dilation` above 1 + threshold
                   "sentence": "Profiler dilation (traced / unprofiled per-token mean, the factor the shortfall
                                applies): baseline 1.37x [1.27-1.48], sharded 1.09x [1.08-1.11]; threshold 10%.",
                   "cross_check": "Cross-check, the capture's host-clock figure (...): baseline 1.37x [...], ..." | null,
                   "warning": "Warning: dilation above 10% ..." | null,   # printed under the verdict
                   "caution": "Caution: dilation below 1 ..." | null,     # unprofiled slower than profiled: noisy host
                   "reconciliation": "..." | null},
      "key_figures": [ {"key": "per_token.baseline", "label": "...", "value": 10000000, "unit": "ns"|"ratio"|"share",
                        "text": "10.000 ms"} ],  # the numbers every format prints (HTML: data-key, Markdown: key column)
                                                 # (1.3) + per_rank.<r>.wait, critical_path.<r>.host
      "per_token_ns": {"baseline": T1 | null, "sharded": TN, "ideal": T1/N | null},
      "n_ranks": 2,
      "attribution": null | {                    # null without --baseline
          "shortfall_ns": S, "terms_ns": {"compute", "memory", "transfer", "coordination"[, "unknown"]},
                                                 # the mean over ranks (shortfall 1.5); unknown only when not zero
          "coordination_ns": {"wait", "sync", "idle"}, "shares": {...}, "spread_ns": {term: {"p10", "p90"}},
          "waterfall": [ {"label": "...", "term": "compute"|"memory"|"transfer"|"coordination.wait"|..., "ns": ...} ],
                                                 # invariant: sum(waterfall.ns) == shortfall_ns, exactly
                                                 # the transfer step's label: "transfer: " + term_words.transfer
          "aggregate": "mean over ranks of each rank's parts (...)" | null,   # (1.3) the shortfall's
          "per_token_source": "unprofiled"|"trace", "uncorrected": {...} | null, "clock": {...} | null},
      "term_words": {"compute": "...", "memory": "...", "transfer": "...", "coordination": "..."},   # (1.3) what each
                                                 # term is for this run: the shortfall's; on a CPU (gloo) run transfer
                                                 # is "gloo's exchange after the last rank arrives (...)", never a link
      "per_rank": null | [ {"rank": 0, "terms_ns": {...}, "coordination_ns": {"wait", "sync", "idle"},   # (1.3) each
                            "shares": {"compute": ns/S, ..., "wait": ns/S, ...},   # sharded rank's own attribution
                            "own_window_ns": ..., "pad_ns": ...} ],   # (shortfall per_rank); each sums to S
      "critical_path": null | {"step_ns": TN, "offset_ns": ...,   # (1.3) shortfall critical_path, per token
                               "by_rank": {"1": {"compute_ns", "memory_ns", "transfer_ns", "host_ns", "sync_ns",
                                                 "unknown_ns", "total_ns", "share_of_step"}},
                                                 # invariant: sum(by_rank.total_ns) + offset_ns == step_ns
                               "cause": "On the critical path, rank 1's host time ...", "hops_per_step_median": ...,
                               "baseline": {"step_ns", "by_rank"} | null,   # the TP=1 token, for comparison
                               "uncorrected_step_ns": ...},
      "straggler": null | {"rank": 1, "is_straggler": true, "last_share": 1.0, "last_share_p_value": ..., "lateness_ns_median": ...,
                           "threshold_ns": ...},   # (1.3) the shortfall's straggler test
      "runs": [ {"role": "baseline"|"sharded"|"run", "path": "...", "n_ranks": 2, "ranks": [0, 1],
                 "timeline": "gpu"|"host", "step_pattern": "...",
                 "step_ns": {"median", "p10", "p90", "n"}, "parts_ns_median": {part: ns},
                 "steps": [ {"rank", "step", "name", "window_ns", "parts_ns": {part: ns}, "overlapped_collective_ns"} ],
                 "per_rank": [ {"rank", "steps", "step_ns_median", "parts_ns_median"} ],
                 "kernels_by_class": {...}, "unknown_kernels": [ {"name", "count", "total_ns"} ],
                 "top_kernels": null | {"windows": 62, "step_ns_mean": ...,   # (1.4) tracekit.analyse.compute.kernels:
                     "classes": {"compute" | "memory" | "collective" | "unknown" | "host ops": {
                         "count", "total_ns", "share", "more",   # per token per rank over the steady windows;
                         "kernels": [ {"name", "subclass", "count", "total_ns", "mean_ns", "share"} ]}}},
                                                 # share: of the mean traced step; mean_ns per call; top 10 per class
                 "data_quality_notes": [...], "dilation": 1.05 | null } ],        # baseline first; dilation: as
                                                                         # dilation.runs[].dilation (the applied one)
      "collectives": null | {"instances": 48, "per_token": 6,
                             "by_op": [ {"op", "bytes", "count", "wait_ns_median", "transfer_ns_median",   # wait: median of per-instance max (shortfall 1.4)
                                         "skew_ns_median", "busbw_gbps_median"} ]},
      "stragglers": [ {"rank", "last_count", "instances", "share"} ],
      "busbw": {"trace":  [ {"op", "bytes", "busbw_gbps", "count"} ],        # realised in the trace
                "probes": [ {"label", "mode", "op", "in_place", "ranks", "backend", "transport",
                             "points": [ {"bytes", "busbw_gbps", "correct"} ]} ]},   # one curve per (mode, op, in_place, ranks)
      "links": null | {"modes": [...], "transports": {mode: transport}, "verdict": "..." | null, "note": "..." | null},
      "manifests": [ {"role", "path", "present": true, "complete", "errors", "created", "workload": {...},
                      "host": {...}, "devices": [...], "versions": {...}, "nccl_env": {...},
                      "capture_dilation", "command"} ],   # capture_dilation (1.3, was `dilation`): the manifest's own
                                                 # figure, printed only as the capture's host-clock cross-check
      "notes": ["what is missing or was skipped"],
      "extras": [ {"key": "whatif" | "whatif-2" | ..., "kind": "tracekit.whatif", "command": "whatif",   # only with
                   "title": "...", "path": "reports/whatif/h200-tp2.json" | null,   # --extra FILE.json (absent
                   "answer": "the one sentence",          # otherwise: the report's bytes do not change)
                   "figures": [ {"key": "extra.whatif.shortfall", "label", "value", "unit", "text"} ],
                   "tables": [ {"caption", "headers": [...], "rows": [[printed cells]]} ],
                   "lines": ["further sentences"], "notes": [...]} ],
      "title": "...", "created": "2026-11-29T16:00:00Z", "generator": "tracekit 0.1.0" }
    ```
    `extras`: one section per `--extra` file, told apart by its `kind` (decompose, advise, rho, whatif,
    diff; `tracekit/report/extras.py`). The answer: decompose's `verdict`, diff's `summary`, advise's
    recommendation texts; for rho and whatif a sentence built from the numbers (rho per dtype; the
    largest Shapley terms of S and the check's error). The figures print in the HTML (`data-key`) and
    the Markdown (the `key` column) alike, as `key_figures` do.
    """

    kind: str
    schema_version: str
    headline: str
    verdict: str | None
    dilation: ReportDilation | None
    key_figures: list[ReportKeyFigure]
    per_token_ns: ReportPerTokenNs
    n_ranks: int
    attribution: ReportAttribution | None
    runs: list[ReportRun_]
    collectives: ReportCollectives | None
    stragglers: list[ShortfallStraggler_]
    busbw: ReportBusbw
    links: ReportLinks | None
    manifests: list[ReportManifest]
    notes: list[str]
    diagnosis: str
    per_rank: list[ReportPerRankItem_] | None
    critical_path: ReportCriticalPath | None
    straggler: ReportStraggler_ | None
    term_words: dict[str, str]
    per_token_label: str
    #: a Sequence so that the report's own builder (`tracekit.report.data.ReportData`, a subclass)
    #: holds its sections (`ReportExtra` with the renderers' text columns) here; read back as a list
    extras: Sequence[ReportExtra] | UnsetType = UNSET
    title: str
    created: str
    generator: str
