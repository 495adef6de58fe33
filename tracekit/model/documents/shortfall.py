"""The `Shortfall` document: tracekit shortfall --format json (docs/JSON.md#shortfall)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import BaselineSharded, Doc, Header, PerTokenOf
from tracekit.model.documents.breakdown import BreakdownDataQuality, BreakdownStepKind, BreakdownStepsUsed
from tracekit.model.documents.dilation import Dilation


class ShortfallPerTokenNs(PerTokenOf[int], kw_only=True):
    """Per token, mean over the steady steps (`PerTokenOf`)."""


class ShortfallPerTokenMedianNs(BaselineSharded[int], kw_only=True):
    """Per token, median over the steady steps (`BaselineSharded`)."""


class ShortfallPerRankItem(Doc, kw_only=True):
    rank: int
    terms_ns: dict[str, int]
    coordination_ns: dict[str, int]
    own_window_ns: int
    pad_ns: int


class ShortfallPathParts(Doc, kw_only=True):
    """One rank's time on the critical path per token, by component (the baseline's path)."""

    compute_ns: int
    memory_ns: int
    transfer_ns: int
    host_ns: int
    sync_ns: int
    unknown_ns: int


class ShortfallByRankValue(ShortfallPathParts, kw_only=True):
    """The same with its total (the sharded run's path, corrected and uncorrected)."""

    total_ns: int


class ShortfallBaseline(Doc, kw_only=True):
    step_ns: int
    by_rank: dict[str, ShortfallPathParts]


class ShortfallUncorrected(Doc, kw_only=True):
    """The path's figures per token: every rank's time on it, and the offset (the path's time
    that no rank's component names) so that they sum to the step."""

    step_ns: int
    offset_ns: int
    by_rank: dict[str, ShortfallByRankValue]


class ShortfallCriticalPath(ShortfallUncorrected, kw_only=True):
    cause: str | None
    hops_per_step_median: float
    baseline: ShortfallBaseline
    uncorrected: ShortfallUncorrected


class ShortfallStraggler(Doc, kw_only=True):
    """The straggler test; `rank` null (and no figures) when the run cannot have one (one rank, no
    matched collectives)."""

    rank: int | None
    is_straggler: bool
    last_share: float | UnsetType = UNSET
    last_share_p_value: float | UnsetType = UNSET
    lateness_ns_median: int | UnsetType = UNSET
    threshold_ns: int | UnsetType = UNSET
    baseline_host_per_interval_ns: int | UnsetType = UNSET
    collectives_per_step: float | UnsetType = UNSET


class ShortfallScalingKernel(Doc, kw_only=True):
    name: str
    per_token: int
    baseline_ns: int
    sharded_ns: int
    lost_ns: int
    kernel_changed: bool | UnsetType = UNSET


class ShortfallScalingClass(Doc, kw_only=True):
    lost_ns: int
    kernels_per_token: int
    baseline_ns: int
    sharded_ns: int
    top: list[ShortfallScalingKernel]


class ShortfallClasses(Doc, kw_only=True):
    replicated: ShortfallScalingClass
    partly_shrank: ShortfallScalingClass
    shrank: ShortfallScalingClass
    added: ShortfallScalingClass
    removed: ShortfallScalingClass


class ShortfallSequencesBaseline(Doc, kw_only=True):
    units_per_step: int
    steps_following: int
    steps: int


class ShortfallSequences(BaselineSharded[ShortfallSequencesBaseline], kw_only=True):
    """Each run's kernel sequences per step (`BaselineSharded`)."""


class ShortfallComputeScaling(Doc, kw_only=True):
    available: bool
    definition: str | UnsetType = UNSET
    tolerance: float | UnsetType = UNSET
    compute_term_ns: int | UnsetType = UNSET
    classes: ShortfallClasses | UnsetType = UNSET
    residual_ns: int | UnsetType = UNSET
    sequences: ShortfallSequences | UnsetType = UNSET
    reason: str | UnsetType = UNSET


class ShortfallCompute(Doc, kw_only=True):
    p10: int
    median: int
    p90: int


class ShortfallIntervalsPerTokenNs(PerTokenOf[list[int]], kw_only=True):
    """The 95% interval [lo, hi] of each per-token time (`PerTokenOf`)."""


class ShortfallIntervals(Doc, kw_only=True):
    level: float
    resamples: int
    seed: int
    basis: str
    paired: bool
    rounds: dict[str, int]
    method: str
    per_token_ns: ShortfallIntervalsPerTokenNs
    shortfall_ns: list[int]
    terms_ns: dict[str, list[int]]
    coordination_ns: dict[str, list[int]]


class ShortfallShortfall(Doc, kw_only=True):
    ns: int
    interval: list[int]
    reading: str


class ShortfallCandidate(Doc, kw_only=True):
    term: str
    leads_share: float
    lead_ns: list[int] | None


class ShortfallNoise(Doc, kw_only=True):
    status: str
    cause: str | None
    named: bool
    stability: float | None
    stability_required: float
    candidates: list[ShortfallCandidate]
    shortfall: ShortfallShortfall
    terms: dict[str, ShortfallShortfall]


class ShortfallInterval(BaselineSharded[list[float] | None], kw_only=True):
    """Each run's 95% interval (`BaselineSharded`); null: no unprofiled rounds to bootstrap."""


class ShortfallAppliedBaseline(Doc, kw_only=True):
    """The dilation applied to one run; the figures are null where the manifest has no
    unprofiled timing (nothing applied)."""

    factor: float | None
    interval: list[float] | None
    method: str
    traced_mean_ns: int
    corrected_mean_ns: int | None
    unprofiled_mean_ns: int | None
    drift: float | None
    unprofiled_rounds: int


class ShortfallApplied(BaselineSharded[ShortfallAppliedBaseline], kw_only=True):
    """The dilation correction applied to each run (`BaselineSharded`)."""


class ShortfallRuns(BaselineSharded[Dilation], kw_only=True):
    """Each run's dilation (`BaselineSharded`)."""


class ShortfallCorrection(Doc, kw_only=True):
    """How one run's parts were corrected for the profiler (`tracekit.analyse.attribution.correction`):
    `replay` (the profiler's cost removed call by call through the replay of the dependency graph,
    wait / sync / idle read from the corrected timeline) or `proportional` (every host-side part
    shrunk by one factor: CPU host timelines, device-bound runs, parts without a graph)."""

    method: str
    cost_source: str | None | UnsetType = UNSET
    per_call_ns: float | None | UnsetType = UNSET
    per_collective_ns: float | None | UnsetType = UNSET
    host_scale: float | None | UnsetType = UNSET
    replayed_ns: int | None | UnsetType = UNSET
    #: false where a solved cost cannot say which rank paid it and the figures depend on it
    identified: bool | UnsetType = UNSET
    #: per figure ("wait", "sync", "idle": parts; "path_<part>"), rank or "mean" -> [lo, hi] ns per token
    ranges: dict[str, dict[str, list[int]]] | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    #: the same for the terms: wait, sync, idle less N1/N x the baseline's corrected part (written
    #: after the correction's own keys)
    term_ranges: dict[str, dict[str, list[int]]] | UnsetType = UNSET


class ShortfallDilation(Doc, kw_only=True):
    definition: str | UnsetType = UNSET
    baseline: float | None  # null: no unprofiled timing in the manifest
    sharded: float | None
    interval: ShortfallInterval | UnsetType = UNSET
    applied: ShortfallApplied | UnsetType = UNSET
    threshold: float
    inflated: bool | None  # null: no dilation known for either run
    reconciliation: str
    correction: dict[str, ShortfallCorrection | None] | UnsetType = UNSET
    runs: ShortfallRuns


class ShortfallUncorrected_(Doc, kw_only=True):
    per_token_ns: ShortfallPerTokenNs
    shortfall_ns: int
    terms_ns: dict[str, int]
    coordination_ns: dict[str, int]
    shares: dict[str, float | None]
    per_rank: list[ShortfallPerRankItem] | UnsetType = UNSET


class ShortfallStraggler_(Doc, kw_only=True):
    rank: int
    last_count: int
    instances: int
    share: float


class ShortfallByOpItem(Doc, kw_only=True):
    op: str
    bytes: int
    bytes_source: str
    count: int
    wait_ns_median: int
    transfer_ns_median: int
    skew_ns_median: int
    busbw_gbps_median: float | None


class ShortfallCollectives(Doc, kw_only=True):
    instances: int
    per_token: float
    level: str
    match_by: dict[str, str]  # process group -> how its collectives were matched (seq, step_order, order)
    by_op: list[ShortfallByOpItem]


class ShortfallResidualNsValue(Doc, kw_only=True):
    instances: int
    median: int
    max: int


class ShortfallWorst(Doc, kw_only=True):
    instance: int
    op: str
    group: str
    spread_ns: int
    first_rank: int
    last_rank: int


class ShortfallCheck(Doc, kw_only=True):
    """The end-spread check of the matched collectives (null figures: not checked, or no instance)."""

    level: str
    threshold_ns: int | None
    instances: int
    instances_over: int | None
    median_ns: int | None
    p99_ns: int | None
    max_ns: int | None
    worst: ShortfallWorst | None
    note: str | UnsetType = UNSET


class ShortfallClock(Doc, kw_only=True):
    aligned: bool
    estimated: bool | UnsetType = UNSET
    offsets_applied: bool
    offsets_ns: dict[str, int]
    residual_ns: dict[str, ShortfallResidualNsValue] | UnsetType = UNSET
    raw_instances_over: int | None | UnsetType = UNSET
    method: str
    refusal: str | None | UnsetType = UNSET
    hosts: dict[str, str]
    check: ShortfallCheck | None | UnsetType = UNSET  # null: not checked


class ShortfallPerTokenSteps(BreakdownStepsUsed, kw_only=True):
    """The steps used as tokens (the breakdown's `steps_used`) and how many of them are steady."""

    steady: int


class ShortfallStepsBaseline(Doc, kw_only=True):
    pattern: str
    total: int
    steady: int
    timeline: str
    slowest_rank_counts: dict[str, int]
    per_token_steps: ShortfallPerTokenSteps | UnsetType = UNSET
    kinds: list[BreakdownStepKind] | UnsetType = UNSET


class ShortfallSteps(BaselineSharded[ShortfallStepsBaseline], kw_only=True):
    """Each run's steps (`BaselineSharded`)."""


class Shortfall(Header, kw_only=True):
    r"""`tracekit shortfall --format json` (docs/METHOD.md sections "Wait and transfer", "Shortfall attribution" and "Dilation"; choices in docs/METHOD-NOTES.md).
    ```
    { "schema_version": "1.5", "kind": "tracekit.shortfall",   # 1.2: bytes_source; 1.3: diagnosis; 1.4: wait_ns_median
                                                       # 1.5: per_rank, critical_path, straggler, term_words,
                                                       #      aggregate; dilation stated = applied, with interval
      "n_ranks": 2,
      "baseline_ranks": 1,                             # ideal = T1 * baseline_ranks / n_ranks
      "per_token_ns": {"baseline": T1, "sharded": TN, "ideal": T1/N},   # means over steady steps (additive)
      "per_token_source": "unprofiled" | "trace",      # unprofiled when both manifests have it (and it is sane)
      "per_token_median_ns": {"baseline": ..., "sharded": ...},        # medians beside the means
      "shortfall_ns": S,                               # TN - T1/N  (== sharded - ideal, ints)
      "aggregate": "mean over ranks of each rank's parts (...)",   # (1.5) how terms_ns aggregates the ranks
      "terms_ns": {"compute": ..., "memory": ..., "transfer": ..., "coordination": ...},   # sum == S exactly
                                                       # + "unknown": UN - U1/N, only when not zero
      "coordination_ns": {"wait": ..., "sync": ..., "idle": ...},                        # sum == coordination
      "shares": {"compute": term/S, ...},              # not clipped; negative terms stay negative; null if S == 0
      "spread_ns": {"compute": {"p10": ..., "median": ..., "p90": ...}, ..., "wait": {...}, "sync": {...},
                    "idle": {...}, "shortfall": {...}},  # over the sharded run's steady steps (each step: PN - f*mean P1)
      "term_words": {"transfer": "bytes on the link (collective transfer)", ...},   # (1.5) on CPU (gloo) runs
                                                       # transfer is "gloo's exchange after the last rank arrives ..."
      "per_rank": [ {"rank": 0, "terms_ns": {...}, "coordination_ns": {"wait", "sync", "idle"},   # (1.5) each
                     "own_window_ns": ..., "pad_ns": ...} ],   # rank's own parts - f * baseline; each sums to S;
                                                       # pad_ns: step time - own window, counted as idle
      "critical_path": {"step_ns": TN, "offset_ns": ...,   # (1.5) per token, the path across ranks (rendezvous
                        "by_rank": {"1": {"compute_ns", "memory_ns", "transfer_ns", "host_ns", "sync_ns",
                                          "unknown_ns", "total_ns"}, ...},   # sum(total_ns) + offset_ns == step_ns
                        "cause": "On the critical path, rank 1's host time ... is 46.45 ms of ...",
                        "hops_per_step_median": 0.0,   # how often the path changes rank within a step
                        "baseline": {"step_ns", "by_rank"}, "uncorrected": {...}},   # the TP=1 path; the traced one
      "straggler": {"rank": 1, "is_straggler": true, "last_share": 1.0,
                    "last_share_p_value": 2.6e-82,   # chance of so high a share with n equal ranks; < 0.01 to be a straggler
                    "lateness_ns_median": ..., "threshold_ns": ..., "baseline_host_per_interval_ns": ..., "collectives_per_step": 17.0},
      "compute_scaling": {"available": true,          # the compute term split by kernel (docs/METHOD.md section Compute that did not shrink)
                          "compute_term_ns": ..., "residual_ns": ..., "tolerance": 0.15, "definition": "...",
                          "classes": {"replicated" | "partly_shrank" | "shrank" | "added" | "removed":
                                      {"lost_ns", "kernels_per_token", "baseline_ns", "sharded_ns",
                                       "top": [{"name", "per_token", "baseline_ns", "sharded_ns", "lost_ns",
                                                "kernel_changed"?}]}},   # sum(lost_ns) + residual_ns == compute_term_ns
                          "sequences": {"baseline": {"units_per_step", "steps_following", "steps"}, "sharded": {...}}},
                          # {"available": false, "reason": "..."} on a host timeline
      "verdict": "one paragraph",                      # the largest term whose interval excludes zero (METHOD.md
                                                       # "Noise and the profiler correction"), the others as findings,
                                                       # "within noise [lo, hi]" or a real negative term in words;
                                                       # "Too noisy to attribute ..." when S's interval spans zero
      "intervals": {"level": 0.95, "resamples": 2000, "seed": 0,
                    "basis": "paired rounds and steps" | "rounds and steps" | "steps",   # steps: no rounds
                    "paired": true, "rounds": {"baseline": 8, "sharded": 8}, "method": "...",
                    "per_token_ns": {"baseline": [lo, hi], "sharded": [lo, hi], "ideal": [lo, hi]},
                    "shortfall_ns": [lo, hi], "terms_ns": {"compute": [lo, hi], ...},
                    "coordination_ns": {"wait": [lo, hi], "sync": [...], "idle": [...]}},   # 95% bootstrap
      "noise": {"status": "attributed" | "unsettled" | "too_noisy" | "unattributed" | "beats_ideal",
                "cause": "coordination" | null,        # the term the verdict names (attributed only)
                "named": true,                         # whether the verdict names a cause
                "stability": 0.998,                    # share of resamples in which the largest finding is
                                                       # the largest term (null: no finding); named only at
                "stability_required": 0.95,            # >= this, else "unsettled" (too noisy to say which)
                "candidates": [{"term": "transfer", "leads_share": 0.61, "lead_ns": null},
                               {"term": "coordination", "leads_share": 0.39, "lead_ns": [lo, hi]}],
                                                       # unsettled: the terms largest in >= 5% of resamples;
                                                       # lead_ns: the largest finding minus this term
                "shortfall": {"ns", "interval", "reading"},
                "terms": {"compute": {"ns": ..., "interval": [lo, hi],
                                      "reading": "finding" | "within_noise" | "negative"}, ...}},
                                                       # render a share only where reading is "finding"
      "diagnosis": "one sentence: what to look at next (a straggler rank, a host-bound baseline, the link...)",   # 1.3
                                                       # too_noisy / unattributed: what to do to get a verdict
      "dilation": {"definition": "traced per-token time / unprofiled per-token time; ...",
                   "baseline": 1.37, "sharded": 1.46,  # (1.5) the factor APPLIED: traced mean step time of the
                                                       # trace / unprofiled mean token time (was: host-clock medians)
                   "interval": {"baseline": [1.27, 1.48], "sharded": [...]},   # 95% bootstrap (steps and tokens)
                   "applied": {"baseline": {"factor", "interval", "traced_mean_ns", "unprofiled_mean_ns",
                                            "unprofiled_rounds"}, "sharded": {...}},
                   "threshold": 0.10, "inflated": true,   # inflated: an applied factor above 1 + threshold
                   "reconciliation": "how traced parts were scaled to the unprofiled per-token times",
                   "runs": {"baseline": {"dilation": ..., "inflated": ..., "unprofiled": {"n", "skipped", "median_ns",
                            "mean_ns", "p10_ns", "p90_ns"}, "profiled": {...}, "manifest_dilation": ..., "source": ...,
                            "notes": ["manifest.json field 'unprofiled' ... treated as missing"]},   # (1.4) malformed
                                                       # unprofiled/profiled blocks are treated as missing, never fatal
                            "sharded": {...}}},   # runs: the capture's host-clock figures (a cross-check)
      "uncorrected": {"per_token_ns": {...}, "shortfall_ns": ..., "terms_ns": {...}, "coordination_ns": {...},
                      "shares": {...}, "per_rank": [...]},   # the trace-only attribution
      "stragglers": [ {"rank": 1, "last_count": 40, "instances": 48, "share": 0.83} ],
      "collectives": {"instances": 48, "per_token": 6, "level": "gpu_kernel" | "gloo" | "host_op" | "none",
                      "match_by": {"pg:0": "seq" | "step_order" | "order"},   # step_order: collective kernels without
                                                       # sequence numbers, by order within each step (Serving engines)
                      "by_op": [ {"op": "all_reduce", "bytes": 8192, "count": ...,     # bytes -1 when unknown
                      "bytes_source": "trace" | "manifest" | "unknown",  # (1.2) trace: the collective's own args/shapes
                                                       # or its enqueue's; manifest: workload.collectives (decoder shapes)
                      "wait_ns_median": ..., "transfer_ns_median": ..., "skew_ns_median": ..., "busbw_gbps_median": ... | null} ]},
                      # wait_ns_median (1.4): per instance the largest wait over its ranks (the rank(s) that waited;
                      #   the last arriver waits 0 by definition), then the median over the instances. Before 1.4 it
                      #   was the median over every (instance, rank) row, ~0 at TP=2. CLI column: "wait ms (median of
                      #   per-collective max)". transfer_ns_median stays the median over (instance, rank) rows.
      "clock": {"aligned": true, "estimated": true, "offsets_applied": true, "offsets_ns": {"0": 0, "1": ...},
                "residual_ns": {"1": {"instances": 544, "median": ..., "max": ...}},  # |end diff - offset|
                "raw_instances_over": 0,               # collectives the unaligned clocks put over the threshold
                "method": "...", "refusal": null,      # refusal: why the clocks could not be aligned (then the
                "hosts": {"0": "host-a", ...},         # shortfall refuses); offsets are always estimated from the
                                                       # collectives and applied, whatever the hosts
                                                       # (docs/METHOD.md section Clocks and step matching)
                "check": {"level": "gpu_kernel", "threshold_ns": 10000, "instances": 544, "instances_over": 0,
                          "median_ns": ..., "p99_ns": ..., "max_ns": ...,
                          "worst": {"instance", "op", "group", "spread_ns", "first_rank", "last_rank"}}},
                                                       # (1.5) matched collectives end together: end spread
                                                       # over threshold counted (data_quality collective_end_spread)
      "steps": {"baseline": {"pattern": "decode_step", "total": 8, "steady": 7, "timeline": "gpu" | "host",
                             "slowest_rank_counts": {"0": 7}}, "sharded": {...}},
                                                       # where the step names say their kind (serving engines) each
                                                       # run also has "per_token_steps": {"kind": "decode", "batch": 1,
                                                       # "steps": 5, "steady": 4, "rule": "..."} (the steady steps are
                                                       # the decode steps of that batch size) and "kinds": [ as the
                                                       # breakdown's step_kinds ]
      "data_quality": {...} }       # counts include ranks_without_kernels (a rank with GPU copies/sets but no
                                    # kernel) and manifest_field_malformed (a manifest field treated as missing)
    ```
    The manifest beside the traces must be a JSON object: a manifest that is not JSON (byte offset
    given) or whose top level is not an object is a one-line error naming the file. A sharded run of
    N > 1 ranks on the GPU timeline with no collectives is refused (kernels missing from the trace?);
    a TP=1 baseline needs none.
    """

    n_ranks: int
    baseline_ranks: int
    per_token_ns: ShortfallPerTokenNs
    per_token_source: str
    per_token_median_ns: ShortfallPerTokenMedianNs
    shortfall_ns: int
    terms_ns: dict[str, int]
    coordination_ns: dict[str, int]
    shares: dict[str, float | None]
    term_words: dict[str, str] | UnsetType = UNSET
    aggregate: str | UnsetType = UNSET
    per_rank: list[ShortfallPerRankItem] | UnsetType = UNSET
    critical_path: ShortfallCriticalPath | UnsetType = UNSET
    straggler: ShortfallStraggler | UnsetType = UNSET
    compute_scaling: ShortfallComputeScaling | UnsetType = UNSET
    spread_ns: dict[str, ShortfallCompute]
    verdict: str
    intervals: ShortfallIntervals | UnsetType = UNSET
    noise: ShortfallNoise | UnsetType = UNSET
    diagnosis: str
    dilation: ShortfallDilation
    uncorrected: ShortfallUncorrected_
    stragglers: list[ShortfallStraggler_]
    collectives: ShortfallCollectives
    clock: ShortfallClock
    steps: ShortfallSteps
    data_quality: BreakdownDataQuality
