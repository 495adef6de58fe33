"""The `Report` document: tracekit report -o report.json (docs/JSON.md#report)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class ReportError(Doc, kw_only=True):
    rank: int | None
    message: str
    how: str | UnsetType = UNSET


class ReportUnknownKernel(Doc, kw_only=True):
    name: str
    count: int
    total_ns: int


class ReportHostClock(Doc, kw_only=True):
    dilation: float
    interval: list[float]
    definition: str
    unprofiled_mean_ns: int
    profiled_mean_ns: int


class ReportRun(Doc, kw_only=True):
    run: str
    dilation: float
    interval: list[float]
    source: str
    traced_mean_ns: int
    corrected_mean_ns: int
    unprofiled_mean_ns: int
    unprofiled_median_ns: int
    profiled_median_ns: int
    host_clock: ReportHostClock


class ReportDilation(Doc, kw_only=True):
    runs: list[ReportRun]
    definition: str
    threshold: float
    inflated: bool
    caution: str | None
    sentence: str
    cross_check: str
    warning: str
    reconciliation: str


class ReportKeyFigure(Doc, kw_only=True):
    key: str
    label: str
    value: int | float
    unit: str
    text: str


class ReportPerTokenNs(Doc, kw_only=True):
    baseline: int
    sharded: int
    ideal: int


class ReportTermsNs(Doc, kw_only=True):
    compute: int
    memory: int
    transfer: int
    coordination: int


class ReportCoordinationNs(Doc, kw_only=True):
    wait: int
    sync: int
    idle: int


class ReportShares(Doc, kw_only=True):
    compute: float
    memory: float
    transfer: float
    coordination: float


class ReportCompute(Doc, kw_only=True):
    p10: int
    p90: int


class ReportSpreadNs(Doc, kw_only=True):
    compute: ReportCompute
    memory: ReportCompute
    transfer: ReportCompute
    coordination: ReportCompute
    wait: ReportCompute
    sync: ReportCompute
    idle: ReportCompute
    unknown: ReportCompute
    shortfall: ReportCompute


class ReportWaterfallItem(Doc, kw_only=True):
    label: str
    term: str
    ns: int
    interval_ns: list[float]
    reading: str


class ReportPerRankItem(Doc, kw_only=True):
    rank: int
    terms_ns: ReportTermsNs
    coordination_ns: ReportCoordinationNs
    own_window_ns: int
    pad_ns: int


class ReportUncorrected(Doc, kw_only=True):
    per_token_ns: ReportPerTokenNs
    shortfall_ns: int
    terms_ns: ReportTermsNs
    coordination_ns: ReportCoordinationNs
    shares: ReportShares
    per_rank: list[ReportPerRankItem]


class ReportResidualNsValue(Doc, kw_only=True):
    instances: int
    median: int
    max: int


class ReportWorst(Doc, kw_only=True):
    instance: int
    op: str
    group: str
    spread_ns: int
    first_rank: int
    last_rank: int


class ReportCheck(Doc, kw_only=True):
    level: str
    threshold_ns: int
    instances: int
    instances_over: int
    median_ns: int
    p99_ns: int
    max_ns: int
    worst: ReportWorst


class ReportClock(Doc, kw_only=True):
    aligned: bool
    estimated: bool
    offsets_applied: bool
    offsets_ns: dict[str, int]
    residual_ns: dict[str, ReportResidualNsValue]
    raw_instances_over: int
    method: str
    refusal: str | None
    hosts: dict[str, str]
    check: ReportCheck


class ReportIntervalsPerTokenNs(Doc, kw_only=True):
    baseline: list[float]
    sharded: list[float]
    ideal: list[float]


class ReportIntervalsTermsNs(Doc, kw_only=True):
    compute: list[float]
    memory: list[float]
    transfer: list[float]
    coordination: list[float]


class ReportIntervalsCoordinationNs(Doc, kw_only=True):
    wait: list[float]
    sync: list[float]
    idle: list[float]


class ReportIntervals(Doc, kw_only=True):
    level: float
    basis: str
    method: str
    per_token_ns: ReportIntervalsPerTokenNs
    shortfall_ns: list[float]
    terms_ns: ReportIntervalsTermsNs
    coordination_ns: ReportIntervalsCoordinationNs


class ReportShortfall(Doc, kw_only=True):
    ns: int
    interval: list[int]
    reading: str


class ReportTerms(Doc, kw_only=True):
    compute: ReportShortfall
    memory: ReportShortfall
    transfer: ReportShortfall
    coordination: ReportShortfall


class ReportNoise(Doc, kw_only=True):
    status: str
    cause: str
    shortfall: ReportShortfall
    terms: ReportTerms


class ReportAttribution(Doc, kw_only=True):
    shortfall_ns: int
    terms_ns: ReportTermsNs
    coordination_ns: ReportCoordinationNs
    shares: ReportShares
    spread_ns: ReportSpreadNs
    waterfall: list[ReportWaterfallItem]
    aggregate: str
    per_token_source: str
    uncorrected: ReportUncorrected
    clock: ReportClock
    intervals: ReportIntervals
    noise: ReportNoise


class ReportStepNs(Doc, kw_only=True):
    median: int
    p10: int
    p90: int
    n: int


class ReportPartsNsMedian(Doc, kw_only=True):
    compute: int
    memory: int
    collective: int
    unknown: int
    sync: int
    idle: int


class ReportStep(Doc, kw_only=True):
    rank: int
    step: int
    name: str
    window_ns: int
    parts_ns: ReportPartsNsMedian
    overlapped_collective_ns: int


class ReportRunPerRankItem(Doc, kw_only=True):
    rank: int
    steps: int
    step_ns_median: int
    parts_ns_median: ReportPartsNsMedian


class ReportKernelsByClassCompute(Doc, kw_only=True):
    count: int
    total_ns: int


class ReportKernelsByClass(Doc, kw_only=True):
    compute: ReportKernelsByClassCompute
    memory: ReportKernelsByClassCompute
    collective: ReportKernelsByClassCompute
    unknown: ReportKernelsByClassCompute


class ReportKernel(Doc, kw_only=True):
    name: str
    subclass: str
    count: float
    total_ns: float
    mean_ns: float
    share: float


class ReportClassesValue(Doc, kw_only=True):
    count: float
    total_ns: float
    share: float
    more: int
    kernels: list[ReportKernel]


class ReportTopKernels(Doc, kw_only=True):
    windows: int
    step_ns_mean: float
    classes: dict[str, ReportClassesValue]


class ReportRun_(Doc, kw_only=True):
    role: str
    path: str
    n_ranks: int
    ranks: list[int]
    timeline: str
    step_pattern: str
    step_ns: ReportStepNs
    parts_ns_median: ReportPartsNsMedian
    steps: list[ReportStep]
    per_rank: list[ReportRunPerRankItem]
    kernels_by_class: ReportKernelsByClass
    unknown_kernels: list[ReportUnknownKernel]
    data_quality_notes: list[str]
    dilation: float
    top_kernels: ReportTopKernels


class ReportByOpItem(Doc, kw_only=True):
    op: str
    bytes: int
    count: int
    wait_ns_median: int
    transfer_ns_median: int
    skew_ns_median: int
    busbw_gbps_median: float


class ReportCollectives(Doc, kw_only=True):
    instances: int
    per_token: float
    by_op: list[ReportByOpItem]


class ReportStraggler(Doc, kw_only=True):
    rank: int
    last_count: int
    instances: int
    share: float


class ReportTraceItem(Doc, kw_only=True):
    op: str
    bytes: int
    busbw_gbps: float
    count: int


class ReportPoint(Doc, kw_only=True):
    bytes: int
    busbw_gbps: float
    correct: bool


class ReportProbe(Doc, kw_only=True):
    label: str
    mode: str
    op: str
    in_place: bool
    ranks: int
    backend: str
    transport: str
    points: list[ReportPoint]


class ReportBusbw(Doc, kw_only=True):
    trace: list[ReportTraceItem]
    probes: list[ReportProbe]


class ReportTransports(Doc, kw_only=True):
    nvlink: str
    pcie: str


class ReportLinks(Doc, kw_only=True):
    modes: list[str]
    transports: ReportTransports
    verdict: str
    notes: list[str]
    note: str | None


class ReportInjectDelay(Doc, kw_only=True):
    rank: int
    ms: float


class ReportWorkload(Doc, kw_only=True):
    preset: str
    tp: int
    tokens: int
    prompt: int
    batch: int
    layers: int
    backend: str
    device: str
    dtype: str
    mode: str
    seed: int
    step_pattern: str
    inject_delay: ReportInjectDelay | None
    inject_sync: bool


class ReportHost(Doc, kw_only=True):
    hostname: str
    cpu: str
    cpu_count: int


class ReportDevice(Doc, kw_only=True):
    index: int
    name: str
    memory_bytes: int


class ReportVersions(Doc, kw_only=True):
    tracekit: str
    python: str
    torch: str
    cuda: str | None
    nccl: str | None


class ReportManifest(Doc, kw_only=True):
    role: str
    path: str
    present: bool
    complete: bool
    errors: list[ReportError]
    created: str
    workload: ReportWorkload
    host: ReportHost
    devices: list[ReportDevice]
    versions: ReportVersions
    nccl_env: dict[str, str]
    capture_dilation: float
    command: str


class ReportPerRankItemShares(Doc, kw_only=True):
    compute: float
    memory: float
    transfer: float
    coordination: float
    wait: float
    sync: float
    idle: float


class ReportPerRankItem_(Doc, kw_only=True):
    rank: int
    terms_ns: ReportTermsNs
    coordination_ns: ReportCoordinationNs
    shares: ReportPerRankItemShares
    own_window_ns: int
    pad_ns: int


class ReportByRankValue(Doc, kw_only=True):
    compute_ns: int
    memory_ns: int
    transfer_ns: int
    host_ns: int
    sync_ns: int
    unknown_ns: int
    total_ns: int
    share_of_step: float


class ReportBaselineByRankValue(Doc, kw_only=True):
    compute_ns: int
    memory_ns: int
    transfer_ns: int
    host_ns: int
    sync_ns: int
    unknown_ns: int
    total_ns: int


class ReportBaseline(Doc, kw_only=True):
    step_ns: int
    by_rank: dict[str, ReportBaselineByRankValue]


class ReportCriticalPath(Doc, kw_only=True):
    step_ns: int
    offset_ns: int
    by_rank: dict[str, ReportByRankValue]
    cause: str
    hops_per_step_median: float
    baseline: ReportBaseline
    uncorrected_step_ns: int


class ReportStraggler_(Doc, kw_only=True):
    rank: int
    is_straggler: bool
    last_share: float
    last_share_p_value: float
    lateness_ns_median: int
    threshold_ns: int


class ReportTermWords(Doc, kw_only=True):
    compute: str
    memory: str
    transfer: str
    coordination: str
    unknown: str


class ReportFigure(Doc, kw_only=True):
    key: str
    label: str
    value: float
    unit: str
    text: str


class ReportTable(Doc, kw_only=True):
    caption: str
    headers: list[str]
    rows: list[list[str]]


class ReportExtra(Doc, kw_only=True):
    key: str
    kind: str
    command: str
    title: str
    path: str
    answer: str
    figures: list[ReportFigure]
    tables: list[ReportTable]
    lines: list[str]
    notes: list[str]


class Report(Doc, kw_only=True):
    kind: str
    schema_version: str
    headline: str
    verdict: str
    dilation: ReportDilation
    key_figures: list[ReportKeyFigure]
    per_token_ns: ReportPerTokenNs
    n_ranks: int
    attribution: ReportAttribution
    runs: list[ReportRun_]
    collectives: ReportCollectives
    stragglers: list[ReportStraggler]
    busbw: ReportBusbw
    links: ReportLinks | None
    manifests: list[ReportManifest]
    notes: list[str]
    diagnosis: str
    per_rank: list[ReportPerRankItem_]
    critical_path: ReportCriticalPath
    straggler: ReportStraggler_
    term_words: ReportTermWords
    per_token_label: str
    extras: list[ReportExtra] | UnsetType = UNSET
    title: str
    created: str
    generator: str
