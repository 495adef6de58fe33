"""rho's micro-benchmarks (`tracekit.probe.rho`; docs/METHOD.md section Intra-SM balance): the matrix
products per dtype (the int8 operands' layout checked), the fused multiply-add kernel of our own
(NVRTC through CuPy, else torch's jiterator; the CPU's in-cache loop), each timed in batches between
CUDA events after a warm-up, and the SM clock read under load beside the FMA peak at that clock.
torch is imported inside the functions that run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tracekit.model.documents.rho import RhoMatrixItem


@dataclass
class Measurement:
    """One micro-benchmark: `tops` is 1e12 operations per second (TFLOP/s or TOPS), the median of
    `repeats` timed batches of `iterations` calls; `tops_max` the best batch."""

    kind: str  # "matrix" | "vector"
    dtype: str
    method: str
    shape: str
    operations: int  # per call
    tops: float | None
    tops_max: float | None = None
    iterations: int = 0
    repeats: int = 0
    datasheet_tops: float | None = None
    anchor_tops: float | None = None
    skipped: str | None = None
    #: the SM clock read while a queue of these calls ran (MHz; None where it could not be read)
    sm_clock_mhz: float | None = None
    #: fp32 FMA only: the device's FMA peak at that clock (SMs x FP32_LANES_PER_SM x 2 x clock)
    peak_at_clock_tops: float | None = None

    def document(self) -> RhoMatrixItem:
        """The measurement as its `matrix[]` / `vector[]` entry (docs/JSON.md#rho)."""
        return RhoMatrixItem(**asdict(self))


def _time_batches(
    call: Callable[[], Any], *, iterations: int, repeats: int, warmup: int, cuda: bool
) -> list[float]:
    """Seconds per call for each of `repeats` batches of `iterations` calls."""
    import torch

    for _ in range(warmup):
        call()
    if cuda:
        torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                call()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / iterations)
        else:
            t0 = time.perf_counter()
            for _ in range(iterations):
                call()
            out.append((time.perf_counter() - t0) / iterations)
    return out


def _rates(ops: int, seconds: Sequence[float]) -> tuple[float, float]:
    per = [ops / s / 1e12 for s in seconds if s > 0]
    return statistics.median(per), max(per)


def read_sm_clock_mhz() -> float | None:
    """The current SM clock of CUDA device 0 (MHz): torch.cuda.clock_rate (NVML), else nvidia-smi;
    None when neither answers."""
    import torch

    try:
        mhz = torch.cuda.clock_rate(0)
        if mhz:
            return float(mhz)
    except Exception:  # no pynvml / amdsmi in this environment
        pass
    import os
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", visible],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return float(done.stdout.strip().splitlines()[0])
    except Exception:
        return None


def clock_under_load(call: Callable[[], Any], seconds_per_call: float, load_s: float = 0.6) -> float | None:
    """Queue about `load_s` seconds of `call` on the device, read the SM clock while it runs, wait."""
    import torch

    for _ in range(max(1, min(4000, int(load_s / max(seconds_per_call, 1e-6))))):
        call()
    mhz = read_sm_clock_mhz()
    torch.cuda.synchronize()
    return mhz


def fma_peak_at_clock(capability: str, multiprocessors: int, mhz: float | None) -> float | None:
    """fp32 FMA peak (TFLOP/s) of a device at an SM clock: SMs x lanes x 2 operations x clock."""
    lanes = FP32_LANES_PER_SM.get(capability)
    if lanes is None or not mhz:
        return None
    return multiprocessors * lanes * 2 * mhz * 1e6 / 1e12


#: `torch._int_mm` (cuBLASLt int8 tensor-core kernels, int32 accumulate) runs fast only in the "TN"
#: layout: A [m, k] row-major, B [k, n] column-major (B^T row-major), m above 16, k and n multiples
#: of 8. The first H200 run passed a row-major B and got 126 TOPS, below bf16 (reports/rho/README.md).
INT8_MIN_M = 17


INT8_MULTIPLE = 8


def int8_operands(
    m: int, n: int, k: int, *, device: str, generator: Any, layout: str = "col"
) -> tuple[Any, Any]:
    """Random int8 A [m, k] (row-major) and B [k, n]: column-major (`layout="col"`, built as an
    [n, k] row-major tensor, transposed: the storage is B^T's) or row-major (`"row"`)."""
    import torch

    a = torch.randint(-128, 128, (m, k), device=device, dtype=torch.int8, generator=generator)
    if layout == "col":
        b = torch.randint(-128, 128, (n, k), device=device, dtype=torch.int8, generator=generator).t()
    elif layout == "row":
        b = torch.randint(-128, 128, (k, n), device=device, dtype=torch.int8, generator=generator)
    else:
        raise ValueError(f"layout {layout!r}: col or row")
    return a, b


def int8_layout_problem(a: Any, b: Any) -> str | None:
    """Why `torch._int_mm(a, b)` would miss cuBLASLt's int8 tensor-core path, or None."""
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        return f"inner sizes differ ({k} vs {k2})"
    sa, sb = tuple(a.stride()), tuple(b.stride())
    if not (sa[1] == 1 and sa[0] >= k):  # row-major: unit stride along k, a leading dimension >= k
        return f"A is not row-major (strides {sa})"
    if not (sb[0] == 1 and sb[1] >= k):  # column-major: unit stride along k
        return f"B is not column-major (strides {sb}; want (1, {k}))"
    if m < INT8_MIN_M:
        return f"m = {m}: _int_mm wants m > 16"
    if k % INT8_MULTIPLE or n % INT8_MULTIPLE:
        return f"k = {k}, n = {n}: both must be multiples of {INT8_MULTIPLE}"
    return None


def _matrix_call(dtype: str, size: int, device: str) -> tuple[Callable[[], Any], str]:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    m = n = k = size
    if dtype in ("bf16", "fp16", "fp32"):
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        a = torch.randn(m, k, device=device, generator=gen).to(tdt)
        b = torch.randn(k, n, device=device, generator=gen).to(tdt)
        return (lambda: torch.mm(a, b)), "torch.mm"
    if dtype == "fp8":
        f8 = getattr(torch, "float8_e4m3fn", None)
        if f8 is None or not hasattr(torch, "_scaled_mm"):
            raise RuntimeError("this torch has no float8_e4m3fn / _scaled_mm")
        a8 = torch.randn(m, k, device=device, generator=gen).to(f8)
        b8 = torch.randn(n, k, device=device, generator=gen).to(f8).t()  # column-major, as cuBLASLt wants
        one = torch.ones((), device=device, dtype=torch.float32)
        torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # raises if unsupported
        return (
            lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        ), "torch._scaled_mm e4m3 -> bf16"
    if dtype in ("int8", "int8-rowb"):
        if not hasattr(torch, "_int_mm"):
            raise RuntimeError("this torch has no _int_mm")
        layout = "row" if dtype == "int8-rowb" else "col"
        ai, bi = int8_operands(m, n, k, device=device, generator=gen, layout=layout)
        if layout == "col":
            bad = int8_layout_problem(ai, bi)
            if bad:
                raise RuntimeError(f"int8 operands not in the cuBLASLt layout: {bad}")
        torch._int_mm(ai, bi)  # raises if unsupported
        where = "B column-major" if layout == "col" else "B row-major (the slow path, for comparison)"
        return (lambda: torch._int_mm(ai, bi)), f"torch._int_mm int8 -> int32, {where}"
    raise ValueError(f"unknown matrix dtype {dtype!r}")


def measure_matrix(
    dtype: str, size: int, *, device: str, iterations: int, repeats: int, warmup: int
) -> Measurement:
    ops = 2 * size**3
    shape = f"{size}x{size}x{size}"
    try:
        call, method = _matrix_call(dtype, size, device)
        secs = _time_batches(
            call, iterations=iterations, repeats=repeats, warmup=warmup, cuda=device == "cuda"
        )
    except Exception as exc:  # a dtype this device / build cannot run: skipped, with the reason
        return Measurement(
            "matrix", dtype, "-", shape, ops, None, skipped=f"{type(exc).__name__}: {exc}"[:300]
        )
    med, best = _rates(ops, secs)
    m = Measurement("matrix", dtype, method, shape, ops, med, best, iterations, repeats)
    if device == "cuda":
        m.sm_clock_mhz = clock_under_load(call, statistics.median(secs))
    return m


_FMA_SOURCE = r"""
extern "C" __global__ void fma_loop_{name}({t}* out, {t} a, {t} b, int iters) {{
    {t} x0 = a + ({t})threadIdx.x, x1 = x0 + ({t})1, x2 = x0 + ({t})2, x3 = x0 + ({t})3;
    {t} x4 = x0 + ({t})4, x5 = x0 + ({t})5, x6 = x0 + ({t})6, x7 = x0 + ({t})7;
    #pragma unroll {unroll}
    for (int i = 0; i < iters; ++i) {{
        x0 = {fma}(x0, b, a); x1 = {fma}(x1, b, a); x2 = {fma}(x2, b, a); x3 = {fma}(x3, b, a);
        x4 = {fma}(x4, b, a); x5 = {fma}(x5, b, a); x6 = {fma}(x6, b, a); x7 = {fma}(x7, b, a);
    }}
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}}
"""


_CHAINS = 8


#: The FMA loop's unroll factor. With 4 (the first H200 run) each iteration is 32 FFMA and ~3 loop
#: instructions (counter, compare, branch) issued from the same slots: at most 32/35 = 91% of the
#: FMA rate. With 32 the loop costs ~1%.
FMA_UNROLL = 32


#: fp32 FMA lanes per multiprocessor by compute capability (CUDA programming guide, arithmetic
#: instructions table): the peak at a clock is SMs x lanes x 2 x clock.
FP32_LANES_PER_SM: dict[str, int] = {"7.0": 64, "8.0": 64, "8.6": 128, "8.9": 128, "9.0": 128, "10.0": 128}


def fma_source(dtype: str, unroll: int = FMA_UNROLL) -> str:
    """The CUDA source of the FMA kernel for `dtype` (fp32: `fmaf`; int32: an unsigned multiply-add)."""
    if unroll < 1:
        raise ValueError(f"unroll {unroll}: at least 1")
    t = {"fp32": "float", "int32": "unsigned int"}[dtype]
    fma = "fmaf" if dtype == "fp32" else "imad"
    src = _FMA_SOURCE.format(name=dtype, t=t, fma=fma, unroll=unroll)
    if dtype == "int32":
        # unsigned: wrap-around is defined, so the compiler may not reason the loop away
        src = (
            "__device__ __forceinline__ unsigned int imad(unsigned int x, unsigned int b, unsigned int a) "
            "{ return x * b + a; }\n" + src
        )
    return src


def _cupy_fma(
    dtype: str, blocks: int, threads: int, iters: int, unroll: int = FMA_UNROLL
) -> Callable[[], Any]:
    import cupy as cp
    import torch

    src = fma_source(dtype, unroll)
    kern = cp.RawKernel(src, f"fma_loop_{dtype}")
    out = cp.empty(blocks * threads, dtype=cp.float32 if dtype == "fp32" else cp.uint32)
    a = cp.float32(0.5) if dtype == "fp32" else cp.uint32(3)
    b = cp.float32(0.999) if dtype == "fp32" else cp.uint32(7)
    # run on torch's current stream so torch.cuda.Event brackets it
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def call() -> None:
        with stream:
            kern((blocks,), (threads,), (out, a, b, cp.int32(iters)))

    call()
    return call


def _jiterator_fma(dtype: str, elements: int, iters: int) -> Callable[[], Any]:
    import torch

    code = (
        "template <typename T> T fma_chain(T x, T y) { T a = x; "
        f"for (int i = 0; i < {iters}; ++i) {{ a = a * y + x; }} return a; }}"
    )
    fn = torch.cuda.jiterator._create_jit_fn(code)
    tdt = torch.float32 if dtype == "fp32" else torch.int32
    x = torch.ones(elements, device="cuda", dtype=tdt)
    y = torch.ones(elements, device="cuda", dtype=tdt)
    fn(x, y)
    return lambda: fn(x, y)


def measure_vector_cuda(
    dtype: str, *, iterations: int, repeats: int, warmup: int, iters: int = 4096, unroll: int = FMA_UNROLL
) -> Measurement:
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    threads, blocks = 256, sms * 32
    errors = []
    try:
        call = _cupy_fma(dtype, blocks, threads, iters, unroll)
        ops = 2 * _CHAINS * iters * blocks * threads
        method = (
            f"NVRTC kernel (CuPy): {_CHAINS} independent FMA chains per thread, {iters} rounds, "
            f"unrolled {unroll}x"
        )
        shape = f"{blocks} blocks x {threads} threads"
    except Exception as exc:
        errors.append(f"CuPy: {type(exc).__name__}: {exc}"[:200])
        try:
            elements = blocks * threads * 4
            call = _jiterator_fma(dtype, elements, iters)
            ops = 2 * iters * elements
            method = f"torch jiterator: one FMA chain per element, {iters} rounds"
            shape = f"{elements} elements"
        except Exception as exc2:
            errors.append(f"jiterator: {type(exc2).__name__}: {exc2}"[:200])
            return Measurement("vector", dtype, "-", "-", 0, None, skipped="; ".join(errors))
    secs = _time_batches(call, iterations=iterations, repeats=repeats, warmup=warmup, cuda=True)
    med, best = _rates(ops, secs)
    m = Measurement("vector", dtype, method, shape, ops, med, best, iterations, repeats)
    m.sm_clock_mhz = clock_under_load(call, statistics.median(secs))
    if dtype == "fp32":
        props = torch.cuda.get_device_properties(0)
        m.peak_at_clock_tops = fma_peak_at_clock(
            f"{props.major}.{props.minor}", int(props.multi_processor_count), m.sm_clock_mhz
        )
    if errors:
        m.method += f" (CuPy unavailable: {errors[0]})"
    return m


def measure_vector_cpu(
    dtype: str, *, elements: int, iterations: int, repeats: int, warmup: int
) -> Measurement:
    import torch

    if dtype == "fp32":
        x = torch.ones(elements, dtype=torch.float32)
        y = torch.full((elements,), 0.999, dtype=torch.float32)
        z = torch.full((elements,), 0.5, dtype=torch.float32)

        def call() -> None:
            x.addcmul_(y, z)

        method = "torch addcmul_ in cache (CPU: includes per-op dispatch)"
    else:
        x = torch.ones(elements, dtype=torch.int32)
        y = torch.full((elements,), 3, dtype=torch.int32)

        def call() -> None:
            x.mul_(y).add_(y)

        method = "torch int32 mul_ + add_ in cache (CPU: includes per-op dispatch)"
    ops = 2 * elements
    secs = _time_batches(call, iterations=iterations, repeats=repeats, warmup=warmup, cuda=False)
    med, best = _rates(ops, secs)
    return Measurement("vector", dtype, method, f"{elements} elements", ops, med, best, iterations, repeats)
