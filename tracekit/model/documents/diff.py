"""The `Diff` document: tracekit diff --format json (docs/JSON.md#diff)."""

from __future__ import annotations

from typing import Generic, TypeVar

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, Header
from tracekit.model.documents.breakdown import BreakdownDataQuality
from tracekit.model.documents.shortfall import ShortfallAppliedBaseline, ShortfallPathParts

T = TypeVar("T")


class BeforeAfter(Doc, Generic[T], kw_only=True):
    """A figure of the run before and of the run after, of one type (the diff compares them all so)."""

    before: T
    after: T


class DiffBefore(Doc, kw_only=True):
    path: str | None
    n_ranks: int | None
    timeline: str | None
    steady_steps: int | None
    tokens: int | None
    rounds: int | None
    reconciliation: str | None


class DiffRuns(BeforeAfter[DiffBefore], kw_only=True):
    """Each run's summary."""


class DiffPerTokenNs(BeforeAfter[int], kw_only=True):
    """Each run's per-token time."""


class DiffPerTokenIntervalNs(BeforeAfter[list[int]], kw_only=True):
    """Each run's per-token interval [lo, hi]."""


class DiffInterval(Doc, kw_only=True):
    level: float | None
    resamples: int | None
    change_ns: list[int | None] | None
    relative: list[float | None] | None


class DiffCompute(Doc, kw_only=True):
    before_ns: int
    after_ns: int
    change_ns: int
    interval_ns: list[int | None] | None


class DiffByPart(Doc, kw_only=True):
    terms: dict[str, DiffCompute]
    leaves: dict[str, DiffCompute]


class DiffPerRankItem(Doc, kw_only=True):
    rank: int
    change_ns: dict[str, int]
    coordination_ns: dict[str, int]
    before_ns: dict[str, int]
    after_ns: dict[str, int]


class DiffByRankValue(ShortfallPathParts, kw_only=True):
    """One rank's critical-path time per token by component (before, after, or their change):
    the shortfall's parts (`ShortfallPathParts`)."""


class DiffCriticalPathBefore(Doc, kw_only=True):
    by_rank: dict[str, DiffByRankValue]
    offset_ns: int
    step_ns: int


class DiffChange(Doc, kw_only=True):
    by_rank: dict[str, DiffByRankValue]
    offset_ns: int
    by_component_ns: dict[str, int]
    step_ns: int


class DiffCriticalPath(BeforeAfter[DiffCriticalPathBefore], kw_only=True):
    change: DiffChange


class DiffCause(Doc, kw_only=True):
    component: str | None
    component_change_ns: int
    rank: int | None
    rank_change_ns: int
    by_rank_ns: dict[str, int]
    offset_change_ns: int | UnsetType = UNSET
    wait_change_ns: dict[str, int]
    sentence: str | None


class DiffKernel(Doc, kw_only=True):
    kind: str
    name: str | None
    cls: str | None
    status: str | None
    count_before: float | None
    count_after: float | None
    count_change: float | None
    time_ns_before: int | None
    time_ns_after: int | None
    time_ns_change: int | None


class DiffCollective(Doc, kw_only=True):
    op: str | None
    bytes: int | None
    status: str | None
    count_before: float | None
    count_after: float | None
    count_change: float | None
    wait_ns_before: int | None
    wait_ns_after: int | None
    wait_ns_change: int | None
    transfer_ns_before: int | None
    transfer_ns_after: int | None
    transfer_ns_change: int | None
    time_ns_before: int | None
    time_ns_after: int | None
    time_ns_change: int | None


class DiffDilation(Doc, kw_only=True):
    definition: str | None
    before: ShortfallAppliedBaseline
    after: ShortfallAppliedBaseline
    ratio: float | None
    traced_change: float | None
    unprofiled_change: float | None
    warning: str | None


class Diff(Header, kw_only=True):
    r"""`tracekit diff BEFORE AFTER --format json` (issue 20; `tracekit/analyse/compare/diff.py`): two runs of the
    same workload, any input and any TP, each attributed as the shortfall does (`attribute_run`).
    ```
    { "schema_version": "1.0", "kind": "tracekit.diff",
      "runs": {"before": {"path": "traces/h200-tp2", "n_ranks": 2, "timeline": "gpu" | "host",
                          "steady_steps": 31, "tokens": 31, "rounds": 1,   # tokens/rounds: the bootstrap's samples
                          "reconciliation": "how the traced parts were scaled to T"}, "after": {...}},
      "per_token_source": "unprofiled" | "trace",      # unprofiled: BOTH captures measured their dilation D (and
      "per_token_source_reason": "...",                # neither profiled pass is clearly faster): T = traced / D,
                                                       # as the shortfall corrects it; else both traced (like with like)
      "per_token_ns": {"before": T_before, "after": T_after},   # per-token means (additive)
      "per_token_interval_ns": {"before": [lo, hi], "after": [lo, hi]},   # each mean's 95% bootstrap interval
      "change_ns": T_after - T_before,                 # ints: after - before exactly
      "relative_change": 2.958,                        # change / before
      "interval": {"level": 0.95, "resamples": 2000,   # percentile bootstrap, seeded: each run's unprofiled rounds
                                                       # (or traced steps) drawn with replacement, then tokens within,
                                                       # each resampled mean carried onto T in proportion;
                   "change_ns": [lo, hi], "relative": [lo, hi]},   # runs independent;
                                                       # null when a run has fewer than 4 tokens or the runs' per-token
                                                       # steps are not alike (decode of another batch size)
      "verdict": "slower" | "faster" | "no significant change" | "cannot judge",
                                                       # relative interval above / below / around 0; no interval:
                                                       # cannot judge (docs/METHOD.md, Serving engines)
      "summary": "Slower: 47.65 ms per token after vs 12.02 ms before (...). What moved: ... On the critical path ...",
      "matrix_vector": true,                           # compute split into matrix / vector (GPU timelines only)
      "by_part": {"terms": {"compute": {"before_ns", "after_ns", "change_ns", "interval_ns": [lo, hi]},
                            "memory": {...}, "transfer": {...}, "coordination": {...}},   # + "unknown" when not 0;
                                                       # sum(change_ns) == change_ns exactly (largest remainder)
                  "leaves": {"matrix": {...}, "vector": {...},   # only with matrix_vector; sum == compute
                             "wait": {...}, "sync": {...}, "idle": {...}}},   # sum == coordination
                                                       # parts: mean over ranks (each rank padded to the step time);
                                                       # interval_ns: bootstrap of the traced steady steps' per-step
                                                       # difference of means, shifted onto the reported change
      "per_rank": [ {"rank": 0, "change_ns": {"compute", "memory", "transfer", "coordination", "unknown"},
                     "coordination_ns": {"wait", "sync", "idle"},   # each rank's own parts; each sums to change_ns
                     "before_ns": {...}, "after_ns": {...}} ],      # ranks present in both runs only
      "critical_path": {"before": {"by_rank": {"0": {"compute_ns", "memory_ns", "transfer_ns", "host_ns",
                                                     "sync_ns", "unknown_ns"}}, "offset_ns", "step_ns"},
                        "after": {...},                # each: ranks + offset == step_ns == per_token_ns
                        "change": {"by_rank": {...}, "offset_ns", "by_component_ns": {"host": ..., ...}, "step_ns"}},
      "cause": {"component": "host", "component_change_ns": ...,   # the path component that moved most in the
                "rank": 1, "rank_change_ns": ...,      # direction of the change, the rank it moved most on,
                "by_rank_ns": {"0": ..., "1": ...},    # its change per rank; "offset" (rank null) when the path
                "offset_change_ns": ...,               # offset moved most; null when nothing on the path moved
                "wait_change_ns": {"0": ...},          # the other ranks' own wait change (the consequence)
                "sentence": "On the critical path, host time ... +35.70 ms per token, on rank 1 (...)"},
      "kernels": [ {"kind": "kernel", "name": "...", "cls": "compute",   # matched by (kind, name): the event table
                    "status": "both" | "new" | "vanished",   # has no shapes; CPU runs: host ops, inclusive times
                    "count_before", "count_after", "count_change",   # per token per rank (floats)
                    "time_ns_before", "time_ns_after", "time_ns_change"} ],   # traced durations; top |time change|
      "collectives": [ {"op": "all_reduce", "bytes": 8192, "status": ...,   # matched by (op, bytes); per token
                        "count_before", "count_after", "count_change", "wait_ns_before", ..., "wait_ns_change",
                        "transfer_ns_...", "time_ns_..."} ],   # per rank, traced; top |time change|
      "dilation": {"definition": "...", "before": {"factor", "interval", "method", "traced_mean_ns",
                                                   "corrected_mean_ns", "unprofiled_mean_ns", "drift",
                                                   "unprofiled_rounds"}, "after": {...},   # the shortfall's
                                                       # applied D (AppliedDilation.to_json)
                   "ratio": after / before,            # the profiler alone changes the traced time by ratio - 1
                   "traced_change": ...,               # traced per-token after / before - 1
                   "unprofiled_change": ...,           # the unprofiled passes' own means after / before - 1 (a
                                                       # cross-check of the corrected change; null without them)
                   "warning": null | "..."},           # when ratio - 1 is beyond noise (intervals apart or > 5%) and
                                                       # at least half the traced change; or a dilation is unknown
      "data_quality": {...} }                          # both runs' counts; rank_counts_differ, dilation_unknown,
                                                       # unprofiled_slower_than_profiled, host_drift_between_rounds,
                                                       # too_few_tokens_for_an_interval
    ```
    `--fail-if-slower PCT` exits 1 when `interval.relative[0] * 100 > PCT`, after writing the output,
    with one line on stderr: `tracekit: slower by +296.6% per token (...; 95% lower bound +287.6% >
    5%): coordination +35.64 ms (...); critical path: host time on rank 1 +38.28 ms`.
    """

    runs: DiffRuns
    per_token_source: str | None
    per_token_source_reason: str | None
    per_token_ns: DiffPerTokenNs
    per_token_interval_ns: DiffPerTokenIntervalNs
    change_ns: int | None
    relative_change: float | None
    interval: DiffInterval
    verdict: str | None
    summary: str | None
    matrix_vector: bool | None
    by_part: DiffByPart
    per_rank: list[DiffPerRankItem]
    critical_path: DiffCriticalPath
    cause: DiffCause
    kernels: list[DiffKernel]
    collectives: list[DiffCollective]
    dilation: DiffDilation
    data_quality: BreakdownDataQuality
