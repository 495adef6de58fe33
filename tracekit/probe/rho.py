"""rho: the device's tensor-core matrix throughput over its CUDA-core vector throughput (docs/METHOD.md section Intra-SM balance).

Micro-benchmarks, each timed between CUDA events after a warm-up (host clock on a CPU):

- **matrix**: an M x N x K product on random data, 2 M N K operations per product:
  bf16 / fp16 `torch.mm`, fp8 (e4m3) `torch._scaled_mm` with unit scales and a bf16 output,
  int8 `torch._int_mm` (int32 output). A dtype the device or the torch build cannot run is skipped
  and the reason recorded.
- **vector**: a CUDA kernel in which every thread runs 8 independent chains of fused multiply-adds
  (`fmaf` for fp32, `a * b + c` for int32: IMAD) for `iters` rounds (the loop unrolled
  `FMA_UNROLL` times, so the loop's own instructions cost ~1% of the issue slots), 2 operations per FMA, over
  enough blocks to fill every multiprocessor many times; built with NVRTC through CuPy, else torch's
  jiterator (one chain per element; each element needs its load and store, so this is the lower
  bound of the two). An ordinary elementwise op is memory-bound and would measure the memory, not the
  cores: that is why a kernel of our own.
- **clock**: after each figure the same call is queued for ~0.6 s and the SM clock read while it runs
  (NVML through torch, else nvidia-smi): the fp32 FMA figure is also given as a share of the FMA
  peak at that clock (SMs x 128 lanes x 2 on Hopper), which tells a slow kernel from a low clock.
  TF32 does not enter: the FMA kernel is our own CUDA code, not a matrix product.
- **int8 layout**: `_int_mm` gets A row-major and B column-major (`int8_operands`, checked by
  `int8_layout_problem`); `int8-rowb` measures a row-major B on request, for comparison.
- **rho** per matrix dtype = its throughput / the fp32 FMA throughput (the tensor core to CUDA core
  balance: how many vector operations fit in the time of one matrix operation's worth of work).

On a CPU (no CUDA device) the same names run small and say so: the matrix figures are `torch.mm`
(fp32, bf16) on one host, the vector figures an in-cache `addcmul_` / int32 multiply-add loop, which
include torch's per-op dispatch: the figures make `--help`, CI and a laptop run, and are not a
statement about tensor cores.

Datasheet figures (dense, no sparsity) are given beside the measured ones when the device name is
known (`DATASHEETS`); the H200 figures measured earlier in this project are `ANCHORS`.

The micro-benchmarks themselves (matrix, FMA kernel, clock, int8 layout) are in `rho_kernels.py`;
here the figures, rho and the JSON (the table: `tracekit.render.rho`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tracekit.errors import ProbeError
from tracekit.model.documents.base import Documented
from tracekit.model.documents.rho import Rho as RhoDoc
from tracekit.model.documents.rho import RhoDevice, RhoRhoItem
from tracekit.probe.rho_kernels import (
    FMA_UNROLL,
    Measurement,
    measure_matrix,
    measure_vector_cpu,
    measure_vector_cuda,
)

SCHEMA_VERSION = "1.0"


MATRIX_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8")


#: Measured only when asked for (`--matrix int8-rowb`): int8 with a row-major B, the layout the
#: first H200 run used by mistake, kept to show what the layout costs.
MATRIX_EXTRA: tuple[str, ...] = ("int8-rowb",)


VECTOR_DTYPES: tuple[str, ...] = ("fp32", "int32")


#: Dense datasheet throughput (TFLOP/s, TOPS for int) by a substring of the device name, first
#: match wins. NVIDIA H100/H200 SXM datasheet (the H200 has the H100's compute), H100 PCIe, A100.
DATASHEETS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "int8": 1978.9, "fp32": 66.9}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "int8": 1513.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "int8": 1978.9, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "fp32": 19.5}),
)


#: What this project measured on one H200 before the probe existed (issue 17): bf16 GEMM 772-782
#: TFLOP/s, fp8 ~1227, int8 `_int_mm` ~907 TOPS, fp32 FMA ~64 TFLOP/s.
ANCHORS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 777.0, "fp8": 1227.0, "int8": 907.0, "fp32": 64.0},
}


def datasheet_for(device_name: str) -> dict[str, float]:
    for key, figures in DATASHEETS:
        if key in device_name:
            return dict(figures)
    return {}


def anchors_for(device_name: str) -> dict[str, float]:
    for key, figures in ANCHORS.items():
        if key in device_name:
            return dict(figures)
    return {}


@dataclass
class Rho(Documented):
    """The probe's result; `to_json()` per docs/JSON.md#rho."""

    device: RhoDevice
    matrix: list[Measurement]
    vector: list[Measurement]
    notes: list[str] = field(default_factory=list)

    def vector_tops(self, dtype: str = "fp32") -> float | None:
        for v in self.vector:
            if v.dtype == dtype and v.tops:
                return v.tops
        return None

    def rho(self) -> list[RhoRhoItem]:
        """Per matrix dtype: measured rho (matrix / fp32 FMA), datasheet rho, anchor rho."""
        fma = self.vector_tops("fp32")
        ds_fma = next((v.datasheet_tops for v in self.vector if v.dtype == "fp32"), None)
        an_fma = next((v.anchor_tops for v in self.vector if v.dtype == "fp32"), None)
        out = []
        for m in self.matrix:
            out.append(
                RhoRhoItem(
                    dtype=m.dtype,
                    rho=(m.tops / fma) if (m.tops and fma) else None,
                    datasheet_rho=(m.datasheet_tops / ds_fma) if (m.datasheet_tops and ds_fma) else None,
                    anchor_rho=(m.anchor_tops / an_fma) if (m.anchor_tops and an_fma) else None,
                )
            )
        return out

    def document(self) -> RhoDoc:
        """The result as its document (docs/JSON.md#rho)."""
        return RhoDoc(
            schema_version=SCHEMA_VERSION,
            kind="tracekit.rho",
            device=self.device,
            matrix=[m.document() for m in self.matrix],
            vector=[v.document() for v in self.vector],
            rho=self.rho(),
            notes=list(self.notes),
        )


def run_rho(
    *,
    device: str = "auto",
    size: int | None = None,
    matrix_dtypes: Sequence[str] = MATRIX_DTYPES,
    vector_dtypes: Sequence[str] = VECTOR_DTYPES,
    iterations: int | None = None,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
    fma_unroll: int = FMA_UNROLL,
) -> Rho:
    """Measure every requested dtype on `device` ("auto": CUDA when available, else CPU)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeError("--device cuda: torch sees no CUDA device")
    say = progress or (lambda _s: None)
    notes: list[str] = []
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        name = str(props.name)
        dev = RhoDevice(
            type="cuda",
            name=name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=int(props.multi_processor_count),
            torch=str(torch.__version__),
            cuda=torch.version.cuda,
        )
        size = size or 8192
        iterations = iterations or 10
        warmup = 3
    else:
        import platform

        name = platform.processor() or platform.machine()
        dev = RhoDevice(type="cpu", name=name, threads=torch.get_num_threads(), torch=str(torch.__version__))
        size = size or 256
        iterations = iterations or 5
        warmup = 1
        notes.append(
            "CPU fallback: small sizes, torch.mm for the matrix figures and in-cache elementwise ops for the "
            "vector ones (per-op dispatch included); this is no tensor-core measurement"
        )
        matrix_dtypes = [d for d in matrix_dtypes if d in ("bf16", "fp16")] or ["bf16"]
        matrix_dtypes = ["fp32", *matrix_dtypes]
    sheet = datasheet_for(name) if device == "cuda" else {}
    anchor = anchors_for(name) if device == "cuda" else {}
    matrix = []
    for d in matrix_dtypes:
        say(f"matrix {d} {size}^3")
        m = measure_matrix(d, size, device=device, iterations=iterations, repeats=repeats, warmup=warmup)
        base = d.split("-")[0]  # int8-rowb: int8's figures
        m.datasheet_tops, m.anchor_tops = sheet.get(base), anchor.get(base)
        if m.skipped:
            notes.append(f"matrix {d} skipped: {m.skipped}")
        matrix.append(m)
    vector = []
    for d in vector_dtypes:
        say(f"vector {d}")
        if device == "cuda":
            v = measure_vector_cuda(
                d, iterations=iterations, repeats=repeats, warmup=warmup, unroll=fma_unroll
            )
        else:
            v = measure_vector_cpu(d, elements=1 << 14, iterations=20, repeats=repeats, warmup=2)
        v.datasheet_tops, v.anchor_tops = sheet.get(d), anchor.get(d)
        if v.skipped:
            notes.append(f"vector {d} skipped: {v.skipped}")
        vector.append(v)
    return Rho(dev, matrix, vector, notes)
