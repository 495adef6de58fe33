"""The `CaptureModes` document: benchmarks/bench_capture_modes.py (docs/JSON.md#capture-modes)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.advise import AdviseKindPart
from tracekit.model.documents.base import Doc
from tracekit.model.documents.roofline import RooflinePeaks


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
    #: the measured batch's unprofiled rounds, each round's mean (absent in older checks)
    measured_round_means_ns: list[int] | UnsetType = UNSET
    ratio: float | None
    #: predicted / the slowest and the fastest round's mean (absent in older checks)
    ratio_over_rounds: list[float] | None | UnsetType = UNSET
    within_15_percent: bool | None
    measured_tokens_per_s: float | None
    measured_from: str
    predicted_no_overlap_per_token_ns: int | None
    ratio_no_overlap: float | None
    #: the roofline band [overlap, no overlap] and whether the measured mean lies in it
    band_ns: list[int] | None | UnsetType = UNSET
    in_band: bool | None | UnsetType = UNSET
    predicted_tokens_per_s: float | None
    status: str
    model: str | None | UnsetType = UNSET


class AdviseCheckKind(AdviseKindPart, kw_only=True):
    """One kind of the check: the advisor's prediction of it (`AdviseKindPart`) and what was measured."""

    measured_ns: int | UnsetType = UNSET  # from a --compare traced run at the predicted batch
    measured_from: str | UnsetType = UNSET


class AdviseCheckPerKernelRow(Doc, kw_only=True):
    batch: int
    model: str | None
    fitted_on_batches: list[int]
    predicted_per_token_ns: int | None
    measured_per_token_ns: int | None
    measured_round_means_ns: list[int]
    ratio: float | None
    ratio_over_rounds: list[float] | None
    within_15_percent: bool | None
    measured_tokens_per_s: float | None
    measured_from: str
    status: str
    by_kind: list[AdviseCheckKind]
    detail: str | None


class AdviseCheckPeaks(RooflinePeaks, kw_only=True):
    """The peaks of the check's floors (`--copy` / `--rho`): the roofline's `Peaks`, as `RooflinePeaks`."""


class AdviseCheckPerKernel(Doc, kw_only=True):
    runs: list[str]
    gemm_table: str | None
    floors: AdviseCheckPeaks | None
    designed_after_the_miss: bool
    what: str
    rows: list[AdviseCheckPerKernelRow]


class AdviseCheck(Doc, kw_only=True):
    """`benchmarks/advise_batches.py check`: `tracekit advise`'s predictions for other batch sizes set
    against runs captured at those sizes: `fitted_on` the one run the roofline band was fitted on,
    `rows` per batch the band [overlap, no overlap], the measured per-token time (mean and each
    round's), their ratio and whether it lies within 15%; `per_kernel` (with `--kernels` /
    `--gemm-table`) the per-kernel batch model given only the traced runs listed, per predicted batch
    the same figures and per kernel kind its time at the base batch, predicted, and (from `--compare`
    runs) measured (docs/METHOD.md section Batch scaling of a decode)."""

    kind: str
    fitted_on: AdviseCheckFittedOn
    same_process: bool
    round_order: str
    rows: list[AdviseCheckRow]
    per_kernel: AdviseCheckPerKernel | UnsetType = UNSET
