"""The `CaptureModes` document: benchmarks/bench_capture_modes.py (docs/JSON.md#capture-modes)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class CaptureModesSetup(Doc, kw_only=True):
    preset: str
    layers: int
    tokens: int
    prompt: int
    batch: int
    tp: int
    device: str
    torch: str
    cuda: str
    host: str
    lead_steps: int
    tail_steps: int
    nsys: str


class CaptureModesRow(Doc, kw_only=True):
    mode: str
    unprofiled_ns: list[int]
    profiled_ns: list[int] | None
    unprofiled_under_nsys: bool | UnsetType = UNSET
    pass_and_export_s: float | UnsetType = UNSET
    trace_bytes: int | UnsetType = UNSET
    trace_steps: int | UnsetType = UNSET
    unprofiled_median_ms: float
    profiled_median_ms: float | UnsetType = UNSET
    dilation: float | UnsetType = UNSET
    dilation_vs_all_unprofiled: float | UnsetType = UNSET


class CaptureModes(Doc, kw_only=True):
    """`benchmarks/bench_capture_modes.py --out X.json`: the per-token time unprofiled and under each
    capture mode in one process at TP=1 (the profiler's dilation per mode): `setup` the workload
    and machine, `rows` per mode its own unprofiled and profiled medians and their ratio,
    `unprofiled_passes_ns` every unprofiled pass's per-token times, `total_s` the wall time."""

    kind: str
    schema_version: str
    setup: CaptureModesSetup
    unprofiled_median_ms_all_passes: float
    unprofiled_passes_ns: list[list[int]]
    rows: list[CaptureModesRow]
    total_s: float


class AdviseCheckFittedOn(Doc, kw_only=True):
    run: str
    batch: int
    per_token_ns: int
    cuda_graphs: bool
    device: str
    what: str


class AdviseCheckRow(Doc, kw_only=True):
    batch: int
    predicted_per_token_ns: int | None
    measured_per_token_ns: int | None
    ratio: float | None
    predicted_no_overlap_per_token_ns: int | None
    ratio_no_overlap: float | None
    within_15_percent: bool | None
    predicted_tokens_per_s: float | None
    measured_tokens_per_s: float | None
    status: str
    measured_from: str


class AdviseCheck(Doc, kw_only=True):
    """`benchmarks/advise_batches.py`: `tracekit advise`'s predictions for other batch sizes set
    against runs captured at those sizes: `fitted_on` the run the model was fitted on, `rows` per
    batch the predicted and measured per-token times and tokens/s, their ratio (with and without
    the overlap model) and whether it lies within 15%."""

    kind: str
    fitted_on: AdviseCheckFittedOn
    same_process: bool
    round_order: str
    rows: list[AdviseCheckRow]
