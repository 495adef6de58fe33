"""The `Diff` document: tracekit diff --format json (docs/JSON.md#diff)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class DiffBefore(Doc, kw_only=True):
    path: str
    n_ranks: int
    timeline: str
    steady_steps: int
    tokens: int
    rounds: int
    reconciliation: str


class DiffRuns(Doc, kw_only=True):
    before: DiffBefore
    after: DiffBefore


class DiffPerTokenNs(Doc, kw_only=True):
    before: int
    after: int


class DiffPerTokenIntervalNs(Doc, kw_only=True):
    before: list[int]
    after: list[int]


class DiffInterval(Doc, kw_only=True):
    level: float
    resamples: int
    change_ns: list[int]
    relative: list[float]


class DiffCompute(Doc, kw_only=True):
    before_ns: int
    after_ns: int
    change_ns: int
    interval_ns: list[int]


class DiffTerms(Doc, kw_only=True):
    compute: DiffCompute
    memory: DiffCompute
    transfer: DiffCompute
    coordination: DiffCompute


class DiffLeaves(Doc, kw_only=True):
    matrix: DiffCompute
    vector: DiffCompute
    wait: DiffCompute
    sync: DiffCompute
    idle: DiffCompute


class DiffByPart(Doc, kw_only=True):
    terms: DiffTerms
    leaves: DiffLeaves


class DiffChangeNs(Doc, kw_only=True):
    compute: int
    memory: int
    transfer: int
    coordination: int
    unknown: int


class DiffCoordinationNs(Doc, kw_only=True):
    wait: int
    sync: int
    idle: int


class DiffPerRankItem(Doc, kw_only=True):
    rank: int
    change_ns: DiffChangeNs
    coordination_ns: DiffCoordinationNs
    before_ns: DiffChangeNs
    after_ns: DiffChangeNs


class DiffByRankValue(Doc, kw_only=True):
    compute_ns: int
    memory_ns: int
    transfer_ns: int
    host_ns: int
    sync_ns: int
    unknown_ns: int


class DiffCriticalPathBefore(Doc, kw_only=True):
    by_rank: dict[str, DiffByRankValue]
    offset_ns: int
    step_ns: int


class DiffByComponentNs(Doc, kw_only=True):
    compute: int
    memory: int
    transfer: int
    host: int
    sync: int
    unknown: int


class DiffChange(Doc, kw_only=True):
    by_rank: dict[str, DiffByRankValue]
    offset_ns: int
    by_component_ns: DiffByComponentNs
    step_ns: int


class DiffCriticalPath(Doc, kw_only=True):
    before: DiffCriticalPathBefore
    after: DiffCriticalPathBefore
    change: DiffChange


class DiffCause(Doc, kw_only=True):
    component: str
    component_change_ns: int
    rank: int
    rank_change_ns: int
    by_rank_ns: dict[str, int]
    offset_change_ns: int | UnsetType = UNSET
    wait_change_ns: dict[str, int]
    sentence: str


class DiffKernel(Doc, kw_only=True):
    kind: str
    name: str
    cls: str
    status: str
    count_before: float
    count_after: float
    count_change: float
    time_ns_before: int
    time_ns_after: int
    time_ns_change: int


class DiffCollective(Doc, kw_only=True):
    op: str
    bytes: int
    status: str
    count_before: float
    count_after: float
    count_change: float
    wait_ns_before: int
    wait_ns_after: int
    wait_ns_change: int
    transfer_ns_before: int
    transfer_ns_after: int
    transfer_ns_change: int
    time_ns_before: int
    time_ns_after: int
    time_ns_change: int


class DiffDilationBefore(Doc, kw_only=True):
    factor: float
    interval: list[float]
    method: str
    traced_mean_ns: int
    corrected_mean_ns: int
    unprofiled_mean_ns: int
    drift: float
    unprofiled_rounds: int


class DiffDilation(Doc, kw_only=True):
    definition: str
    before: DiffDilationBefore
    after: DiffDilationBefore
    ratio: float
    traced_change: float
    unprofiled_change: float
    warning: str | None


class DiffDataQuality(Doc, kw_only=True):
    counts: dict[str, int]
    notes: list[str]


class Diff(Doc, kw_only=True):
    schema_version: str
    kind: str
    runs: DiffRuns
    per_token_source: str
    per_token_source_reason: str
    per_token_ns: DiffPerTokenNs
    per_token_interval_ns: DiffPerTokenIntervalNs
    change_ns: int
    relative_change: float
    interval: DiffInterval
    verdict: str
    summary: str
    matrix_vector: bool
    by_part: DiffByPart
    per_rank: list[DiffPerRankItem]
    critical_path: DiffCriticalPath
    cause: DiffCause
    kernels: list[DiffKernel]
    collectives: list[DiffCollective]
    dilation: DiffDilation
    data_quality: DiffDataQuality
