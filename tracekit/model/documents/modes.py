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
    kind: str
    schema_version: str
    setup: CaptureModesSetup
    unprofiled_median_ms_all_passes: float
    unprofiled_passes_ns: list[list[int]]
    rows: list[CaptureModesRow]
    total_s: float
