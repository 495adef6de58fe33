"""The `Breakdown` document: tracekit breakdown --format json (docs/JSON.md#breakdown)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class BreakdownUnknownKernel(Doc, kw_only=True):
    name: str
    count: int
    total_ns: int


class BreakdownSource(Doc, kw_only=True):
    paths: list[str]
    ranks: list[int]
    step_pattern: str
    step_rule: str | UnsetType = UNSET
    timeline: str
    skipped_steps_per_rank: int


class BreakdownComputeSplitNs(Doc, kw_only=True):
    matrix: int
    vector: int


class BreakdownStep(Doc, kw_only=True):
    rank: int
    step: int
    name: str
    start_ns: int
    window_ns: int
    parts_ns: dict[str, int]
    compute_split_ns: BreakdownComputeSplitNs | UnsetType = UNSET
    overlapped_collective_ns: int
    timeline: str


class BreakdownStepNs(Doc, kw_only=True):
    median: int
    p10: int
    p90: int
    mean: int
    n: int


class BreakdownPartsNsValue(Doc, kw_only=True):
    median: int
    p10: int
    p90: int
    mean: int


class BreakdownPerToken(Doc, kw_only=True):
    step_ns: BreakdownStepNs
    parts_ns: dict[str, BreakdownPartsNsValue]
    overlapped_collective_ns: BreakdownPartsNsValue
    slowest_rank_counts: dict[str, int]
    parts_rule: str | UnsetType = UNSET


class BreakdownPerRankItem(Doc, kw_only=True):
    rank: int
    steps: int
    timeline: str
    step_ns_median: int
    parts_ns_median: dict[str, int]
    overlapped_collective_ns_median: int


class BreakdownKernelsByClassValue(Doc, kw_only=True):
    count: int
    total_ns: int


class BreakdownLinkedOnly(Doc, kw_only=True):
    computation_ns: int
    exposed_comm_ns: int
    exposed_memcpy_ns: int
    busy_ns: int
    idle_ns: int
    total_ns: int
    total_comm_ns: int
    total_memcpy_ns: int


class BreakdownTracelensGpuTimeline(Doc, kw_only=True):
    linked_only: BreakdownLinkedOnly
    include_unlinked_kernels: BreakdownLinkedOnly


class BreakdownRanksValue(Doc, kw_only=True):
    span_ns: int
    busy_ns: int
    exposed_memcpy_ns: int
    idle_ns: int
    exposed_collective_ns: int
    kernels: int
    memcpy_memset: int
    tracelens_gpu_timeline: BreakdownTracelensGpuTimeline | UnsetType = UNSET


class BreakdownTraceTotals(Doc, kw_only=True):
    span_ns: int
    busy_ns: int
    exposed_memcpy_ns: int
    idle_ns: int
    exposed_collective_ns: int
    kernels: int
    memcpy_memset: int
    tracelens_gpu_timeline: BreakdownTracelensGpuTimeline | UnsetType = UNSET
    ranks: dict[str, BreakdownRanksValue]
    rule: str
    differences_from_tracelens: str | UnsetType = UNSET


class BreakdownDataQuality(Doc, kw_only=True):
    counts: dict[str, int]
    notes: list[str]


class Breakdown(Doc, kw_only=True):
    schema_version: str
    kind: str
    source: BreakdownSource
    steps: list[BreakdownStep]
    per_token: BreakdownPerToken
    per_rank: list[BreakdownPerRankItem]
    kernels_by_class: dict[str, BreakdownKernelsByClassValue]
    kernels_by_subclass: dict[str, BreakdownKernelsByClassValue]
    collectives_by_source: dict[str, BreakdownKernelsByClassValue] | UnsetType = UNSET
    unknown_kernels: list[BreakdownUnknownKernel]
    trace_totals: BreakdownTraceTotals | UnsetType = UNSET
    data_quality: BreakdownDataQuality
    dilation: float
