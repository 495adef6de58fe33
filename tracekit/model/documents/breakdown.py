"""The `Breakdown` document: tracekit breakdown --format json (docs/JSON.md#breakdown)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, Header


class BreakdownUnknownKernel(Doc, kw_only=True):
    name: str
    count: int
    total_ns: int
    hint: str | UnsetType = UNSET


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


class BreakdownPartsNsValue(Doc, kw_only=True):
    """Statistics over steps, integer ns (null when there is no step)."""

    median: int | None
    p10: int | None
    p90: int | None
    mean: int | None


class BreakdownStepNs(BreakdownPartsNsValue, kw_only=True):
    n: int


class BreakdownStepsUsed(Doc, kw_only=True):
    """Which steps the per-token figures use when the step names carry kinds."""

    kind: str
    batch: int
    steps: int
    rule: str


class BreakdownStepKind(Doc, kw_only=True):
    kind: str
    batch: int
    tokens: int | None
    steps: int
    step_ns_mean: int
    step_ns_median: int
    parts_ns_mean: dict[str, int]


class BreakdownPerToken(Doc, kw_only=True):
    step_ns: BreakdownStepNs
    parts_ns: dict[str, BreakdownPartsNsValue]
    overlapped_collective_ns: BreakdownPartsNsValue
    slowest_rank_counts: dict[str, int]
    parts_rule: str | UnsetType = UNSET
    steps_used: BreakdownStepsUsed | UnsetType = UNSET


class BreakdownPerRankItem(Doc, kw_only=True):
    rank: int
    steps: int
    timeline: str
    step_ns_median: int | None
    parts_ns_median: dict[str, int | None]
    overlapped_collective_ns_median: int | None


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


class BreakdownTraceTotals(BreakdownRanksValue, kw_only=True):
    """The run's GPU totals (the sums of `ranks`), each rank's, and how they were counted."""

    ranks: dict[str, BreakdownRanksValue]
    rule: str
    differences_from_tracelens: str | UnsetType = UNSET


class BreakdownDataQuality(Doc, kw_only=True):
    counts: dict[str, int]
    notes: list[str]


class Breakdown(Header, kw_only=True):
    r"""`tracekit breakdown --format json` (`tracekit.analyse.timeline.breakdown.Breakdown.to_json`).
    ```
    { "schema_version": "1.0", "kind": "tracekit.breakdown",
      "source": {"paths": [...], "ranks": [0, 1], "step_pattern": "decode_step",   # the regex used ("whole": one window)
                 "step_rule": "decode_step" | "profiler_step" | "serving_engine" | "cuda_graph_launch"
                            | "repeated_range" | "whole_trace" | "pattern",   # which rule chose the steps
                                             # (--steps auto, the default, tries them in this order; "pattern":
                                             # a --steps REGEX; a data_quality note says the same in words)
                 "timeline": "gpu" | "host" | "mixed",   # host: ranks without GPU activity (CPU/gloo runs)
                 "skipped_steps_per_rank": 0},            # --skip-first (warm-up steps left out)
      "steps": [ {"rank": 0, "step": 0, "name": "decode_step#0", "start_ns": ..., "window_ns": ...,
                  "parts_ns": {"compute": ..., "memory": ..., "collective": ..., "unknown": ..., "sync": ..., "idle": ...},
                  "compute_split_ns": {"matrix": ..., "vector": ...},   # the compute part split exactly: time
                                             # under a matrix kernel (GEMM, attention; on a host timeline aten
                                             # matrix ops) and the rest (tracekit/analyse/timeline/compute_split.py)
                  "overlapped_collective_ns": ...,       # collective time hidden under compute/memory
                  "timeline": "gpu" | "host"} ],
                                             # invariant: sum(parts_ns) == window_ns, exactly
                                             # step: the number in the name (decode_step#3, decode_step 3,
                                             # ProfilerStep#12) when all names have one, else the order per rank
                                             # window: the annotation, extended to the end of the last GPU op
                                             # launched inside it
      "per_token": {"step_ns": {"median": ..., "p10": ..., "p90": ..., "mean": ..., "n": ...},
                    "parts_ns": {"compute": {"median": ..., "p10": ..., "p90": ..., "mean": ...}, ...},
                    "overlapped_collective_ns": {"median": ..., "p10": ..., "p90": ..., "mean": ...},
                    "slowest_rank_counts": {"1": 4},    # how often each rank had the longest window (information)
                    "parts_rule": "mean over ranks, each rank's window padded to the step time with idle"},
                                             # step_ns: per step the longest window; parts_ns: per step the
                                             # mean over ranks of each rank's part (idle padded), never the
                                             # parts of whichever rank was longest
                                             # per step index: the slowest rank's window and its parts;
                                             # statistics over step indices, rounded to integer ns
      "per_rank": [ {"rank": 0, "steps": 5, "timeline": "gpu", "step_ns_median": ..., "parts_ns_median": {...},
                     "overlapped_collective_ns_median": ...} ],
      "kernels_by_class": {"compute": {"count": ..., "total_ns": ...}, "memory": {...}, "collective": {...}, "unknown": {...}},
                                             # GPU activity (kernel, memcpy, memset) of the whole trace; total_ns
                                             # sums durations (not a union); all four classes always present
      "kernels_by_subclass": {"matrix": {"count": ..., "total_ns": ...}, ...},
      "collectives_by_source": {"launch_op": {"count": ..., "total_ns": ...}, "name": {...}},
                                             # GPU collectives by what classified them: the launching op (an
                                             # all-reduce op, c10d ops) or the name rules (docs/METHOD.md,
                                             # Serving engines); sources with no collective left out
      "step_kinds": [ {"kind": "decode" | "prefill" | "mixed" | ..., "batch": 1, "tokens": 128 | null,
                       "steps": 5, "step_ns_mean": ..., "step_ns_median": ..., "parts_ns_mean": {"compute": ...}} ],
                                             # only when the step names say their kind (SGLang step[DECODE bs=1],
                                             # vLLM execute_..._context_.._generation_..); then per_token is over
                                             # the decode steps of one batch size and has
                                             # "steps_used": {"kind": "decode", "batch": 1, "steps": 5, "rule": "..."}
      "unknown_kernels": [ {"name": "...", "count": ..., "total_ns": ..., "hint": "..."} ],    # top 20 by time
                                             # only kernels whose names look like communication (allreduce,
                                             # all_gather, a2a, MoE dispatch/combine...) but match no rule; any
                                             # other unnamed kernel is compute, subclass "other"
      "trace_totals": {"span_ns": ..., "busy_ns": ..., "exposed_memcpy_ns": ..., "idle_ns": ...,
                       "exposed_collective_ns": ..., "kernels": ..., "memcpy_memset": ...,
                       "tracelens_gpu_timeline": {"linked_only": {T}, "include_unlinked_kernels": {T}},
                       "ranks": {"0": {same keys}}, "rule": "...", "differences_from_tracelens": "..."},
                                             # the whole trace, independent of steps, tracekit's definitions:
                                             # per rank, span = first to last GPU op (kernel, memcpy, memset);
                                             # busy = union of kernel intervals; exposed_memcpy = memcpy/memset
                                             # outside it; idle = span - busy - exposed_memcpy (exactly);
                                             # exposed_collective = collective kernels outside the other kernels
                                             # (a part of busy). Top level: sums over ranks (zeros, ranks {}, without GPU ops)
                                             # (1.x, issue 25) tracelens_gpu_timeline: TraceLens's gpu_timeline
                                             # (TreePerf.get_df_gpu_timeline), both variants; {T} = computation_ns,
                                             # exposed_comm_ns, exposed_memcpy_ns, busy_ns, idle_ns, total_ns,
                                             # total_comm_ns, total_memcpy_ns (integer ns; computation + exposed_comm
                                             # + exposed_memcpy + idle = total exactly). Its definitions differ from
                                             # tracekit's: a memset is computation (communication when its name holds
                                             # 'nccl'), memcpy means memcpys only, busy_time is the union of ALL GPU
                                             # ops, and TraceLens's default (linked_only) keeps only GPU ops linked to
                                             # a host call: here one per runtime/driver call of the same correlation
                                             # id, the last-ending (TraceLens follows ac2g flows, which tracekit does
                                             # not keep: for a CUDA-graph launch its pick may differ);
                                             # include_unlinked_kernels (its --include_unlinked_kernels) is exact.
                                             # differences_from_tracelens says this in the JSON itself
      "data_quality": {"counts": {"events_without_ts": 0, ...}, "notes": ["..."]},
                                             # keys include events_without_ts/dur, skipped_*_events, unknown kernels,
                                             # duplicate_step_numbers, step_windows_clipped, step_window_spill_ns,
                                             # manifest_not_an_object, manifest_dilation_not_a_number, rank_overridden
                                             # the reader's counts plus the breakdown's: unknown_kernel_events,
                                             # nested_step_annotations, skipped_warmup_steps,
                                             # ranks_with_different_step_counts, steps_missing_on_some_ranks,
                                             # ranks_on_host_timeline; readers of user layouts (issue 15):
                                             # rank_assumed, ranks_from_file_order, nsys_sessions_aligned
      "dilation": 1.93 | null }             # from the manifest when there is one
    ```
    `--format csv`: one row per rank and step: `rank, step, name, start_ns, end_ns, window_ns, compute_ns,
    memory_ns, collective_ns, unknown_ns, sync_ns, idle_ns, overlapped_collective_ns, timeline`.
    """

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
    dilation: float | None
    step_kinds: list[BreakdownStepKind] | UnsetType = UNSET
