"""The `Shortfall` document: tracekit shortfall --format json (docs/JSON.md#shortfall)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class ShortfallPerTokenNs(Doc, kw_only=True):
    baseline: int
    sharded: int
    ideal: int


class ShortfallPerTokenMedianNs(Doc, kw_only=True):
    baseline: int
    sharded: int


class ShortfallTermsNs(Doc, kw_only=True):
    compute: int
    memory: int
    transfer: int
    coordination: int


class ShortfallCoordinationNs(Doc, kw_only=True):
    wait: int
    sync: int
    idle: int


class ShortfallShares(Doc, kw_only=True):
    compute: float
    memory: float
    transfer: float
    coordination: float


class ShortfallTermWords(Doc, kw_only=True):
    compute: str
    memory: str
    transfer: str
    coordination: str


class ShortfallPerRankItem(Doc, kw_only=True):
    rank: int
    terms_ns: ShortfallTermsNs
    coordination_ns: ShortfallCoordinationNs
    own_window_ns: int
    pad_ns: int


class ShortfallByRankValue(Doc, kw_only=True):
    compute_ns: int
    memory_ns: int
    transfer_ns: int
    host_ns: int
    sync_ns: int
    unknown_ns: int
    total_ns: int


class ShortfallBaselineByRankValue(Doc, kw_only=True):
    compute_ns: int
    memory_ns: int
    transfer_ns: int
    host_ns: int
    sync_ns: int
    unknown_ns: int


class ShortfallBaseline(Doc, kw_only=True):
    step_ns: int
    by_rank: dict[str, ShortfallBaselineByRankValue]


class ShortfallUncorrected(Doc, kw_only=True):
    step_ns: int
    offset_ns: int
    by_rank: dict[str, ShortfallByRankValue]


class ShortfallCriticalPath(Doc, kw_only=True):
    step_ns: int
    offset_ns: int
    by_rank: dict[str, ShortfallByRankValue]
    cause: str
    hops_per_step_median: float
    baseline: ShortfallBaseline
    uncorrected: ShortfallUncorrected


class ShortfallStraggler(Doc, kw_only=True):
    rank: int
    is_straggler: bool
    last_share: float
    last_share_p_value: float
    lateness_ns_median: int
    threshold_ns: int
    baseline_host_per_interval_ns: int
    collectives_per_step: float


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


class ShortfallSequences(Doc, kw_only=True):
    baseline: ShortfallSequencesBaseline
    sharded: ShortfallSequencesBaseline


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


class ShortfallSpreadNs(Doc, kw_only=True):
    compute: ShortfallCompute
    memory: ShortfallCompute
    transfer: ShortfallCompute
    coordination: ShortfallCompute
    wait: ShortfallCompute
    sync: ShortfallCompute
    idle: ShortfallCompute
    unknown: ShortfallCompute
    shortfall: ShortfallCompute


class ShortfallIntervalsPerTokenNs(Doc, kw_only=True):
    baseline: list[int]
    sharded: list[int]
    ideal: list[int]


class ShortfallIntervalsTermsNs(Doc, kw_only=True):
    compute: list[int]
    memory: list[int]
    transfer: list[int]
    coordination: list[int]


class ShortfallIntervalsCoordinationNs(Doc, kw_only=True):
    wait: list[int]
    sync: list[int]
    idle: list[int]


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
    terms_ns: ShortfallIntervalsTermsNs
    coordination_ns: ShortfallIntervalsCoordinationNs


class ShortfallShortfall(Doc, kw_only=True):
    ns: int
    interval: list[int]
    reading: str


class ShortfallTerms(Doc, kw_only=True):
    compute: ShortfallShortfall
    memory: ShortfallShortfall
    transfer: ShortfallShortfall
    coordination: ShortfallShortfall


class ShortfallNoise(Doc, kw_only=True):
    status: str
    cause: str
    shortfall: ShortfallShortfall
    terms: ShortfallTerms


class ShortfallInterval(Doc, kw_only=True):
    baseline: list[float]
    sharded: list[float]


class ShortfallAppliedBaseline(Doc, kw_only=True):
    factor: float
    interval: list[float]
    method: str
    traced_mean_ns: int
    corrected_mean_ns: int
    unprofiled_mean_ns: int
    drift: float
    unprofiled_rounds: int


class ShortfallApplied(Doc, kw_only=True):
    baseline: ShortfallAppliedBaseline
    sharded: ShortfallAppliedBaseline


class ShortfallUnprofiled(Doc, kw_only=True):
    n: int
    skipped: int
    rounds: int | UnsetType = UNSET
    median_ns: int
    mean_ns: int
    p10_ns: int
    p90_ns: int
    round_mean_ns: list[int] | UnsetType = UNSET


class ShortfallRunsBaseline(Doc, kw_only=True):
    dilation: float
    definition: str | UnsetType = UNSET
    interval: list[float] | UnsetType = UNSET
    rounds: dict[str, int] | UnsetType = UNSET
    threshold: float
    inflated: bool
    unprofiled: ShortfallUnprofiled
    profiled: ShortfallUnprofiled
    manifest_dilation: float
    source: str
    notes: list[str] | UnsetType = UNSET


class ShortfallRuns(Doc, kw_only=True):
    baseline: ShortfallRunsBaseline
    sharded: ShortfallRunsBaseline


class ShortfallDilation(Doc, kw_only=True):
    definition: str | UnsetType = UNSET
    baseline: float
    sharded: float
    interval: ShortfallInterval | UnsetType = UNSET
    applied: ShortfallApplied | UnsetType = UNSET
    threshold: float
    inflated: bool
    reconciliation: str
    runs: ShortfallRuns


class ShortfallUncorrected_(Doc, kw_only=True):
    per_token_ns: ShortfallPerTokenNs
    shortfall_ns: int
    terms_ns: ShortfallTermsNs
    coordination_ns: ShortfallCoordinationNs
    shares: ShortfallShares
    per_rank: list[ShortfallPerRankItem] | UnsetType = UNSET


class ShortfallStraggler_(Doc, kw_only=True):
    rank: int
    last_count: int
    instances: int
    share: float


class ShortfallMatchBy(Doc, kw_only=True):
    default: str


class ShortfallByOpItem(Doc, kw_only=True):
    op: str
    bytes: int
    bytes_source: str
    count: int
    wait_ns_median: int
    transfer_ns_median: int
    skew_ns_median: int
    busbw_gbps_median: float


class ShortfallCollectives(Doc, kw_only=True):
    instances: int
    per_token: float
    level: str
    match_by: ShortfallMatchBy
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
    level: str
    threshold_ns: int
    instances: int
    instances_over: int
    median_ns: int
    p99_ns: int
    max_ns: int
    worst: ShortfallWorst


class ShortfallClock(Doc, kw_only=True):
    aligned: bool
    estimated: bool | UnsetType = UNSET
    offsets_applied: bool
    offsets_ns: dict[str, int]
    residual_ns: dict[str, ShortfallResidualNsValue] | UnsetType = UNSET
    raw_instances_over: int | UnsetType = UNSET
    method: str
    refusal: str | None | UnsetType = UNSET
    hosts: dict[str, str]
    check: ShortfallCheck | UnsetType = UNSET


class ShortfallStepsBaseline(Doc, kw_only=True):
    pattern: str
    total: int
    steady: int
    timeline: str
    slowest_rank_counts: dict[str, int]


class ShortfallSteps(Doc, kw_only=True):
    baseline: ShortfallStepsBaseline
    sharded: ShortfallStepsBaseline


class ShortfallDataQuality(Doc, kw_only=True):
    counts: dict[str, int]
    notes: list[str]


class Shortfall(Doc, kw_only=True):
    schema_version: str
    kind: str
    n_ranks: int
    baseline_ranks: int
    per_token_ns: ShortfallPerTokenNs
    per_token_source: str
    per_token_median_ns: ShortfallPerTokenMedianNs
    shortfall_ns: int
    terms_ns: ShortfallTermsNs
    coordination_ns: ShortfallCoordinationNs
    shares: ShortfallShares
    term_words: ShortfallTermWords | UnsetType = UNSET
    aggregate: str | UnsetType = UNSET
    per_rank: list[ShortfallPerRankItem] | UnsetType = UNSET
    critical_path: ShortfallCriticalPath | UnsetType = UNSET
    straggler: ShortfallStraggler | UnsetType = UNSET
    compute_scaling: ShortfallComputeScaling | UnsetType = UNSET
    spread_ns: ShortfallSpreadNs
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
    data_quality: ShortfallDataQuality
