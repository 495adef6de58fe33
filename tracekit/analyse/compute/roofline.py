"""Roofline of a decode step (docs/METHOD.md section Roofline of a decode).

A decode token must read every weight once (batch-1 decode is memory-bound) and its attention
must read the KV cache. With the device's measured memory bandwidth `BW` and matrix rate `P`,
the floor of one piece of work moving `B` bytes and doing `F` FLOPs is `max(B / BW, F / P)`; the
per-token floor is the sum over the matrix work of the step (weights + KV cache); everything
else a decode step does (norms, rotary, residual adds, casts, copies, sampling) moves
activation-sized data (a few KiB at batch 1) and has a floor below a microsecond: its whole time
is lost against the roofline.

**Shapes.** A trace taken in the default `cuda` mode records no shapes and a CUDA-graph replay has
no launching op, so the bytes and FLOPs come from the capture manifest's model shape
(`workload.shape`: hidden, heads, kv_heads, intermediate, layers, vocab; `tp`, `batch`, `dtype`)
matched to the step's matrix work by order: the reference decoder's step runs, per layer, the QKV
projection, attention, the output projection, the gate/up projection and the down projection, then
the LM head (`DECODER_ROLES`); consecutive GEMM kernels are one unit (a GEMM and its split-K
reduce), consecutive attention kernels too (`kernel_scaling.canonical`). When the step's GEMM and
attention units are not the decoder's `5 x layers + 1` in that order, the roles are not assigned and only the measured times are given (`shapes.source` says so). The KV
length of attention is the static cache (`KV_STATIC_LEN`, the reference decoder's `max_len`) for a
serving-style decode (`--cuda-graphs` / `--compile`) and the prompt plus the mean decode position
otherwise.

**Peaks** (`Peaks`): the memory bandwidth is the best read + write rate of a local copy measured
by `tracekit probe --op copy` (its `rw_gbps`); the matrix rate is `tracekit rho`'s measured figure
for the run's dtype. Each is stated with its file; without them there is no floor (the bytes and
FLOPs are still given).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.compute.kernel_scaling import ATTENTION, GEMM, Canonical, canonical, kernel_table
from tracekit.analyse.dilation import dilation_of
from tracekit.errors import TracekitError
from tracekit.model.documents import Copy, DocumentError, Rho, convert, to_builtins
from tracekit.model.documents import roofline as rd
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import ManifestShape, ManifestWorkload
from tracekit.model.dtypes import SHORT_NAME, sizes_of
from tracekit.model.events import Run
from tracekit.model.fields import copy_fields
from tracekit.model.shape import DIMENSIONS

SCHEMA_VERSION = "1.0"
#: The matrix work of one decoder layer, in launch order, then the LM head once.
DECODER_ROLES: tuple[str, ...] = ("qkv", "attention", "o", "gate_up", "down")
#: The static KV cache length of the reference decoder's serving-style decode (`decoder.max_len`).
KV_STATIC_LEN = 512
#: the weight dtypes the roofline knows, and their sizes (`model.dtypes`)
DTYPE_BYTES: dict[str, int] = sizes_of("bfloat16", "float16", "float32", "fp8", "int8")
#: rho's dtype names for the manifest's.
RHO_DTYPE: dict[str, str] = SHORT_NAME
#: Kernels listed as losing the most time against their roofline.
TOP = 10


class RooflineError(TracekitError):
    """A roofline input that cannot be used (one line, exit 2)."""


@dataclass(frozen=True)
class Peaks:
    """The device's measured peaks and where each came from (None: not given)."""

    bw_gbps: float | None = None
    bw_source: str = "not given (pass --copy FILE from tracekit probe --op copy)"
    matrix_tflops: float | None = None
    matrix_source: str = "not given (pass --rho FILE from tracekit rho)"

    def document(self) -> rd.RooflinePeaks:
        return copy_fields(rd.RooflinePeaks, self, memory_gbps=self.bw_gbps, memory_source=self.bw_source)


T = TypeVar("T")


def _load_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise RooflineError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        pos = getattr(exc, "pos", getattr(exc, "start", 0))
        raise RooflineError(f"{path} at byte {pos}: not JSON ({exc})") from None


def _typed(path: str | Path, obj: Any, type_: type[T]) -> T:
    """A decoded peaks file as its document Struct; RooflineError saying where it does not fit."""
    try:
        return convert(obj, type_)
    except DocumentError as exc:
        at = f" at {exc.where}" if exc.where else ""
        raise RooflineError(f"{path}{at}: not a tracekit probe/rho document ({exc})") from None


def load_peaks(copy: str | Path | None, rho: str | Path | None, dtype: str) -> Peaks:
    """Peaks from a copy probe JSON (best local `rw_gbps`) and a rho JSON (measured matrix rate of
    `dtype`)."""
    bw, bw_src = None, Peaks.bw_source
    if copy is not None:
        obj = _load_json(copy)
        copy_rows = _typed(copy, obj.get("results", obj) if isinstance(obj, dict) else obj, list[Copy])
        local = [float(r.rw_gbps) for r in copy_rows if r.kind == "local" and r.rw_gbps is not None]
        if not local:
            raise RooflineError(
                f"{copy}: no local copy rows with rw_gbps (a `tracekit probe --op copy` JSON?)"
            )
        bw = max(local)
        bw_src = f"{copy}: best local copy read + write rate of {len(local)} rows (tracekit probe --op copy)"
    peak, peak_src = None, Peaks.matrix_source
    if rho is not None:
        obj = _load_json(rho)
        want = RHO_DTYPE.get(dtype, dtype)
        matrix = _typed(rho, obj, Rho).matrix if isinstance(obj, dict) else []
        vals = [float(r.tops) for r in matrix if r.dtype == want and r.tops is not None and r.tops > 0]
        if not vals:
            raise RooflineError(f"{rho}: no measured matrix rate for {want} (a `tracekit rho` JSON?)")
        peak = vals[0]
        peak_src = f"{rho}: measured {want} matrix rate (tracekit rho)"
    return Peaks(bw, bw_src, peak, peak_src)


@dataclass(frozen=True)
class Work:
    """The bytes a piece of matrix work must move and the FLOPs it must do, per token."""

    role: str
    layer: int | None
    bytes: int
    flops: int

    @property
    def kind(self) -> str:
        """The kernel unit it runs as (`kernel_scaling.GEMM` or `ATTENTION`)."""
        return ATTENTION if self.role == "attention" else GEMM


#: The GEMMs of the reference decoder's step (`DECODER_ROLES` without attention, then the LM head).
GEMM_ROLES: tuple[str, ...] = ("qkv", "o", "gate_up", "down", "lm_head")


def gemm_shapes(shape: Mapping[str, Any], tp: int) -> dict[str, tuple[int, int]]:
    """(K, N) of each GEMM role on one of `tp` ranks (the weight is K x N; a batch of M sequences
    makes it an M x K x N product)."""
    h, nh, nkv = int(shape["hidden"]), int(shape["heads"]), int(shape["kv_heads"])
    inter, vocab = int(shape["intermediate"]), int(shape["vocab"])
    hd = h // nh
    lh, lkv = nh // tp, nkv // tp
    return {
        "qkv": (h, (lh + 2 * lkv) * hd),
        "o": (lh * hd, h),
        "gate_up": (h, 2 * inter // tp),
        "down": (inter // tp, h),
        "lm_head": (h, vocab // tp),
    }


def decoder_work(shape: Mapping[str, Any], tp: int, batch: int, kv_len: int, dtype_bytes: int) -> list[Work]:
    """The matrix work of one decode step of the reference decoder on one of `tp` ranks, in
    launch order (`DECODER_ROLES` per layer, then the LM head): weights read once, activations in
    and out, the KV cache read by attention."""
    h, nh, nkv = int(shape["hidden"]), int(shape["heads"]), int(shape["kv_heads"])
    hd = h // nh
    lh, lkv = nh // tp, nkv // tp
    b = batch
    kn = gemm_shapes(shape, tp)

    def gemm(role: str, layer: int | None) -> Work:
        k, n = kn[role]
        return Work(role, layer, dtype_bytes * (k * n + b * (k + n)), 2 * b * k * n)

    out: list[Work] = []
    for i in range(int(shape["layers"])):
        out.append(gemm("qkv", i))
        kv = 2 * b * lkv * kv_len * hd * dtype_bytes  # keys and values of this rank's KV heads
        out.append(Work("attention", i, kv + 2 * b * lh * hd * dtype_bytes, 4 * b * lh * hd * kv_len))
        out.append(gemm("o", i))
        out.append(gemm("gate_up", i))
        out.append(gemm("down", i))
    out.append(gemm("lm_head", None))
    return out


def unit_floor_ns(w: Work, peaks: Peaks) -> float | None:
    if peaks.bw_gbps is None and peaks.matrix_tflops is None:
        return None
    t_mem = w.bytes / peaks.bw_gbps if peaks.bw_gbps else 0.0  # bytes / (GB/s) = ns
    t_flop = (
        w.flops / (peaks.matrix_tflops * 1e3) if peaks.matrix_tflops else 0.0
    )  # FLOP / (TFLOP/s) = ps -> ns
    return max(t_mem, t_flop)


def _workload(run: Run) -> ManifestWorkload:
    wl = given(run.manifest.workload) if run.manifest is not None else None
    if wl is None or given(wl.shape) is None:
        raise RooflineError(
            f"{_name(run)}: no model shape in its manifest (workload.shape): the roofline needs the "
            "capture manifest of a `tracekit capture` run"
        )
    return wl


def _name(run: Run) -> str:
    src = sorted(set(run.sources.values()))
    return str(Path(src[0]).parent) if src else "run"


def _bounded_int(wl: ManifestWorkload | ManifestShape, key: str, default: int, hi: int = 1 << 40) -> int:
    v = given(getattr(wl, key))
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, int) or not (0 < v <= hi):
        raise RooflineError(f"manifest workload.{key} = {v!r}: expected a positive integer")
    return v


def _static_kv_len(wl: ManifestWorkload) -> tuple[int, str]:
    """The positions a serving-style decode's attention reads: the manifest's `kv_cache_len`; else
    (manifests before it was recorded) the runner's decoder length, prompt + warm-up steps + 1; else
    `KV_STATIC_LEN`."""
    if given(wl.kv_cache_len) is not None:
        n = _bounded_int(wl, "kv_cache_len", 1)
        return n, f"the static KV cache of the serving-style decode (workload.kv_cache_len, {n})"
    if given(wl.prompt) is not None and given(wl.warmup_tokens) is not None:
        n = _bounded_int(wl, "prompt", 1) + _bounded_int(wl, "warmup_tokens", 1) + 1
        return n, f"the static KV cache of the serving-style decode (prompt + warm-up steps + 1, {n})"
    return KV_STATIC_LEN, f"the static cache of the serving-style decode (default {KV_STATIC_LEN})"


@dataclass(frozen=True)
class DecodeUnits:
    """One run's decode step as the roofline sees it: the workload read from the manifest, the
    reference decoder's matrix work at the run's batch (`work`, launch order), the steady steps'
    canonical kernel sequence (`canon`) and whether its GEMM / attention units are that work in
    role and order (`assigned`)."""

    name: str
    shape: Mapping[str, Any]
    tp: int
    batch: int
    dtype: str
    static: bool
    kv_len: int
    kv_source: str
    work: list[Work]
    canon: Canonical
    steady: list[int]
    steps: pd.DataFrame
    shard_of: int | None

    @property
    def assigned(self) -> bool:
        return [u for u in self.canon.units if u] == [w.kind for w in self.work]

    def work_at(self, batch: int) -> list[Work]:
        """The same matrix work at another batch size (the same order as `work`)."""
        return decoder_work(self.shape, self.tp, batch, self.kv_len, DTYPE_BYTES[self.dtype])


def decode_units(
    run: Run | AnalysedRun, *, step_pattern: str | None = None, skip_first: int = 1
) -> DecodeUnits:
    """The run's decode step read for the roofline (`DecodeUnits`); RooflineError when the manifest
    has no model shape or the trace no GPU kernels."""
    ar = AnalysedRun.of(run)
    wl = _workload(ar.run)
    sh = given(wl.shape)
    assert sh is not None  # _workload
    shape = {k: _bounded_int(sh, k, 0) for k in DIMENSIONS}
    tp = _bounded_int(wl, "tp", 1, 1 << 16)
    if given(wl.shard_of) is not None:  # `capture --shard-of N`: one rank's shard of TP=N in one process
        tp = _bounded_int(wl, "shard_of", 2, 1 << 16)
    batch = _bounded_int(wl, "batch", 1, 1 << 24)
    dtype = wl.dtype if isinstance(wl.dtype, str) else "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise RooflineError(f"manifest workload.dtype = {dtype!r}: one of {', '.join(DTYPE_BYTES)} expected")
    static = bool(given(wl.cuda_graphs)) or bool(given(wl.compile))
    if static:
        kv_len, kv_source = _static_kv_len(wl)
    else:
        prompt = _bounded_int(wl, "prompt", 1)
        tokens = _bounded_int(wl, "tokens", 1)
        kv_len, kv_source = prompt + tokens // 2, "prompt + the mean decode position"
    work = decoder_work(shape, tp, batch, kv_len, DTYPE_BYTES[dtype])

    found = ar.steps(step_pattern)
    steps = found.steps
    events = ar.events
    tables = [
        kernel_table(events[events["rank"] == r], int(r), steps[steps["rank"] == r])
        for r in sorted(steps["rank"].unique())
    ]
    kernels = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    order = sorted(int(s) for s in steps["step"].unique())
    steady = order[min(skip_first, max(len(order) - 1, 0)) :]
    canon = canonical(kernels, steady) if len(kernels) else None
    if canon is None:
        raise RooflineError(
            f"{_name(ar.run)}: no GPU compute kernels in its steps: a roofline needs a GPU trace"
        )
    return DecodeUnits(
        _name(ar.run), shape, tp, batch, dtype, static, kv_len, kv_source, work, canon, steady, steps,
        given(wl.shard_of),
    )  # fmt: skip


def roofline(
    run: Run | AnalysedRun, peaks: Peaks, *, step_pattern: str | None = None, skip_first: int = 1
) -> dict[str, object]:
    """The roofline of one run's decode step over every rank's steady steps (see the module doc):
    the JSON document of `tracekit roofline` as plain JSON values (`roofline_document`)."""
    out: dict[str, object] = to_builtins(
        roofline_document(run, peaks, step_pattern=step_pattern, skip_first=skip_first)
    )
    return out


def roofline_document(
    run: Run | AnalysedRun, peaks: Peaks, *, step_pattern: str | None = None, skip_first: int = 1
) -> rd.Roofline:
    """The roofline of one run's decode step over every rank's steady steps (see the module doc):
    the document of `tracekit roofline`."""
    ar = AnalysedRun.of(run)
    du = decode_units(ar, step_pattern=step_pattern, skip_first=skip_first)
    tp, batch, dtype, static, kv_len, kv_source = (
        du.tp,
        du.batch,
        du.dtype,
        du.static,
        du.kv_len,
        du.kv_source,
    )
    shape, work, canon, steady, steps = du.shape, du.work, du.canon, du.steady, du.steps
    units = _units(canon, work, peaks)
    kinds = [u for u in canon.units if u]
    assigned = kinds == [w.kind for w in work]
    matrix_units = len(kinds)
    kernel_ns = float(sum(canon.mean_ns))
    step_ns = float(
        np.mean(
            (
                steps[steps["step"].isin(steady)].groupby("step")["end_ns"].max()
                - steps[steps["step"].isin(steady)].groupby("step")["start_ns"].min()
            ).to_numpy()
        )
    )
    floor = sum(w.bytes for w in work), sum(w.flops for w in work)
    floor_ns = (
        sum(unit_floor_ns(w, peaks) or 0.0 for w in work) if (peaks.bw_gbps or peaks.matrix_tflops) else None
    )
    unprofiled = _unprofiled_mean_ns(ar.run)
    achieved = unprofiled if unprofiled is not None else step_ns
    by_role = _by_role(units) if assigned else []
    return rd.Roofline(
        schema_version=SCHEMA_VERSION,
        kind="tracekit.roofline",
        definition="floor = sum over the step's matrix work of max(bytes / memory bandwidth, FLOPs / matrix rate); "
        "other kernels move activation-sized data (floor ~0); docs/METHOD.md section Roofline of a decode",
        workload=rd.RooflineWorkload(
            tp=tp,
            shard_of=du.shard_of,
            batch=batch,
            dtype=dtype,
            layers=int(shape["layers"]),
            kv_len=kv_len,
            kv_len_source=kv_source,
            cuda_graphs=static,
        ),
        shapes=rd.RooflineShapes(
            source="manifest model shape (workload.shape), matched to the step's matrix units by order"
            if assigned
            else f"not matched: the step's {matrix_units} matrix units (GEMM / attention) are not the reference "
            f"decoder's {len(work)} in its order (another program): bytes and FLOPs per unit not assigned",
            matched=assigned,
        ),
        peaks=peaks.document(),
        per_token=rd.RooflinePerToken(
            bytes=floor[0],
            flops=floor[1],
            floor_ns=None if floor_ns is None else round(floor_ns),
            achieved_ns=round(achieved),
            achieved_source="unprofiled per-token time (manifest)"
            if unprofiled is not None
            else "traced step time",
            kernel_ns=round(kernel_ns),
            matrix_kernel_ns=round(
                float(sum(t for t, u in zip(canon.mean_ns, canon.units, strict=True) if u))
            ),
            efficiency=None if floor_ns is None or not achieved else floor_ns / achieved,
            kernels_per_token=len(canon.names),
        ),
        by_role=by_role,
        verdict=_verdict(by_role, kernel_ns, achieved, floor_ns),
        top_lost=_top_lost(units),
        steps=rd.RooflineSteps(used=len(steady), following_sequence=canon.followed, of=canon.of),
    )


@dataclass(frozen=True)
class _Unit:
    name: str
    role: str  # a DECODER_ROLES name, "lm_head", or "other" (non-matrix)
    time_ns: Fraction
    bytes: int | None
    flops: int | None
    floor_ns: float | None


def _units(canon: Canonical, work: list[Work], peaks: Peaks) -> list[_Unit]:
    assign = [u for u in canon.units if u] == [w.kind for w in work]
    it = iter(work)
    out = []
    for name, m, t in zip(canon.names, canon.units, canon.mean_ns, strict=True):
        if m and assign:
            w = next(it)
            out.append(_Unit(name, w.role, t, w.bytes, w.flops, unit_floor_ns(w, peaks)))
        else:
            out.append(_Unit(name, "matrix" if m else "other", t, None, None, 0.0 if not m else None))
    return out


def _by_role(units: list[_Unit]) -> list[rd.RooflineByRoleItem]:
    roles: dict[str, list[_Unit]] = {}
    for u in units:
        roles.setdefault(u.role, []).append(u)
    out = []
    for role, us in roles.items():
        t = float(sum(u.time_ns for u in us))
        b = sum(u.bytes or 0 for u in us) if all(u.bytes is not None for u in us) else None
        f = sum(u.flops or 0 for u in us) if all(u.flops is not None for u in us) else None
        fl = (
            sum(u.floor_ns for u in us if u.floor_ns is not None)
            if all(u.floor_ns is not None for u in us)
            else None
        )
        out.append(
            rd.RooflineByRoleItem(
                role=role,
                units_per_token=len(us),
                time_ns=round(t),
                bytes=b,
                flops=f,
                achieved_gbps=None if b is None or not t else b / t,
                achieved_tflops=None if f is None or not t else f / t / 1e3,
                floor_ns=None if fl is None else round(fl),
                lost_ns=None if fl is None else round(t - fl),
                efficiency=None if fl is None or not t else fl / t,
            )
        )
    return sorted(out, key=lambda r: -(r.lost_ns if r.lost_ns is not None else r.time_ns))


def _verdict(
    by_role: list[rd.RooflineByRoleItem], kernel_ns: float, achieved_ns: float, floor_ns: float | None
) -> str:
    """One sentence: what keeps the step from its floor, with the numbers."""
    if floor_ns is None or not by_role:
        return "No floor: the device's peaks (--copy, --rho) or the step's shapes are missing."
    worst = by_role[0]
    matrix = [r for r in by_role if r.role != "other" and r.floor_ns is not None]
    m_t = sum(r.time_ns for r in matrix)
    m_f = sum(r.floor_ns or 0 for r in matrix)
    what = (
        f"{worst.units_per_token} non-matrix kernels (norms, rotary, casts, copies: floor ~0) take "
        f"{worst.time_ns / 1e6:.3f} ms"
        if worst.role == "other"
        else f"the {worst.role} work loses {(worst.lost_ns or 0) / 1e6:.3f} ms against its roofline"
    )
    return (
        f"The step runs at {floor_ns / achieved_ns:.0%} of its roofline ({floor_ns / 1e6:.3f} ms floor vs "
        f"{achieved_ns / 1e6:.3f} ms): {what} of the {kernel_ns / 1e6:.3f} ms of kernel time per token, while the "
        f"matrix work runs at {m_f / m_t:.0%} of its own roofline"
        + (
            f"; {(achieved_ns - kernel_ns) / 1e6:.3f} ms of the token has no kernel running."
            if achieved_ns > kernel_ns
            else "."
        )
    )


def _top_lost(units: list[_Unit]) -> list[rd.RooflineTopLostItem]:
    """Kernels (by name and role) that lose the most time against their own roofline."""
    agg: dict[tuple[str, str], list[_Unit]] = {}
    for u in units:
        agg.setdefault((u.role, u.name), []).append(u)
    rows: list[rd.RooflineTopLostItem] = []
    for (role, name), us in agg.items():
        t = float(sum(u.time_ns for u in us))
        fl = (
            sum(u.floor_ns for u in us if u.floor_ns is not None)
            if all(u.floor_ns is not None for u in us)
            else None
        )
        b = sum(u.bytes or 0 for u in us) if all(u.bytes is not None for u in us) else None
        rows.append(
            rd.RooflineTopLostItem(
                name=name[:160],
                role=role,
                per_token=len(us),
                time_ns=round(t),
                floor_ns=None if fl is None else round(fl),
                lost_ns=round(t - fl) if fl is not None else None,
                achieved_gbps=None if b is None or not t else b / t,
            )
        )
    rows.sort(key=lambda r: -(r.lost_ns if r.lost_ns is not None else r.time_ns))
    return rows[:TOP]


def _unprofiled_mean_ns(run: Run) -> float | None:
    """The manifest's unprofiled mean per-token time, through the dilation reader (bounded there)."""

    d = dilation_of(run.manifest)
    return None if d.unprofiled is None else float(d.unprofiled.mean_ns)
