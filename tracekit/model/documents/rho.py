"""The `Rho` document: tracekit rho --format json (docs/JSON.md#rho)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, Header


class RhoDevice(Doc, kw_only=True):
    type: str | None
    name: str | None
    capability: str | None | UnsetType = UNSET
    multiprocessors: int | None | UnsetType = UNSET
    threads: int | None | UnsetType = UNSET
    torch: str | None
    cuda: str | None | UnsetType = UNSET


class RhoMatrixItem(Doc, kw_only=True):
    kind: str
    dtype: str | None
    method: str | None
    shape: str | None
    operations: int | None
    tops: float | None
    tops_max: float | None
    iterations: int | None
    repeats: int | None
    datasheet_tops: float | None
    anchor_tops: float | None
    skipped: str | None
    sm_clock_mhz: float | None | UnsetType = UNSET
    peak_at_clock_tops: float | None | UnsetType = UNSET


class RhoRhoItem(Doc, kw_only=True):
    dtype: str | None
    rho: float | None
    datasheet_rho: float | None
    anchor_rho: float | None


class Rho(Header, kw_only=True):
    r"""`tracekit rho --format json` (`tracekit.probe.rho.Rho.to_json`). Throughputs in 1e12 operations/s
    (TFLOP/s; TOPS for int8, int32).
    ```
    { "schema_version": "1.0", "kind": "tracekit.rho",
      "device": {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0", "multiprocessors": 132,
                 "torch": "2.11.0+cu130", "cuda": "13.0"} | {"type": "cpu", "name": "...", "threads": 2, "torch": "..."},
      "matrix": [{"kind": "matrix", "dtype": "bf16" | "fp16" | "fp8" | "int8" | "fp32" (CPU only),
                  "method": "torch.mm" | "torch._scaled_mm e4m3 -> bf16" | "torch._int_mm int8 -> int32",
                  "shape": "8192x8192x8192", "operations": 1099511627776,   # per call: 2 M N K
                  "tops": 748.5 | null,             # median of `repeats` batches of `iterations` calls
                  "tops_max": 795.3, "iterations": 10, "repeats": 5,
                  "datasheet_tops": 989.4 | null,   # dense, by device name (tracekit.probe.rho.DATASHEETS)
                  "anchor_tops": 777.0 | null,      # this project's earlier H200 measurement
                  "skipped": null | "RuntimeError: ..."}],   # a dtype the device / build cannot run
      "vector": [{"kind": "vector", "dtype": "fp32" | "int32", "method": "NVRTC kernel (CuPy): 8 independent
                  FMA chains per thread, 4096 rounds" | "torch jiterator: ..." | "torch addcmul_ in cache (CPU...)",
                  ... same fields ...}],            # 2 operations per fused multiply-add
      "rho": [{"dtype": "bf16", "rho": 13.07, "datasheet_rho": 14.79, "anchor_rho": 12.14}],
                                                    # matrix tops / fp32 FMA tops (null when either is missing)
      "notes": ["CPU fallback: ..." , "matrix int8 skipped: ..."] }
    ```
    """

    device: RhoDevice
    matrix: list[RhoMatrixItem]
    vector: list[RhoMatrixItem]
    rho: list[RhoRhoItem]
    notes: list[str]
