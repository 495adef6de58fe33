"""Batch scaling of a decode step: the per-token time at a batch size not measured, kernel by kernel
(docs/METHOD.md section Batch scaling of a decode).

`tracekit advise --batch B` predicts B from the runs it is given at other batch sizes (same TP
degree, same model shape). Which model, the first whose inputs are there:

1. **per-kernel** (two or more runs at other batches, each with a GPU trace whose step is the
   reference decoder's matrix work in role and order, the roofline's matching:
   `roofline.decode_units`): each GEMM and attention unit's mean time per step is a function of the
   batch M drawn through its measured points, piecewise linear, extended beyond them by the line
   through the two nearest points; at B it is bounded below by the unit's own roofline
   (`roofline.unit_floor_ns` of its bytes and FLOPs at B, at the given peaks). All non-matrix
   kernels of the step together are one more such line (bounded below by 0; their floor is ~0).
   T(B) = T(b0) + sum over the units of (t_unit(B) - t_unit(b0)), b0 the nearest measured batch
   with a trace: the time outside kernels (graph launch, the per-token sync, host gaps) is held at
   b0's.
2. **GEMM table** (`--gemm-table FILE`, `benchmarks/advise_batches.py gemmsweep`: every GEMM role's
   K x N product timed alone at M = 1, 2, 4, ...): each GEMM unit moves by the table's change of its
   role from b0 to B (the same piecewise-linear reading of the table in M), bounded below by its
   roofline when the base run has a trace; attention and the non-matrix kernels by their lines
   when two or more traced runs are given, else attention by its roofline's change (the KV cache's
   bytes) and the non-matrix kernels held at b0's, which the output says.
3. **roofline band** (one run, no table: `advise.advise`): T(b0) + the change of the device
   roofline g, with g the larger of bytes / bandwidth and FLOPs / matrix rate (overlap) and their
   sum (no overlap), stated as the range [overlap, no overlap].

The prediction says its model, the runs and table it used, and per kernel kind (gemm, attention,
other) the time at b0 and at B with where each came from.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracekit.analyse.compute.kernel_scaling import ATTENTION, GEMM
from tracekit.analyse.compute.roofline import (
    DTYPE_BYTES,
    GEMM_ROLES,
    Peaks,
    RooflineError,
    Work,
    decode_units,
    decoder_work,
    gemm_shapes,
    unit_floor_ns,
)
from tracekit.errors import TracekitError
from tracekit.model.documents import DocumentError, GemmTable, convert
from tracekit.model.documents import advise as ad
from tracekit.model.documents.roofline import RooflinePeaks
from tracekit.model.fields import copy_fields

OTHER = "other"
#: kernel kinds in report order
KINDS: tuple[str, ...] = (GEMM, ATTENTION, OTHER)


class BatchModelError(TracekitError):
    """Runs or a table the batch model cannot use (one line, exit 2)."""


@dataclass(frozen=True)
class KernelProfile:
    """One traced run's decode step: its matrix units (role, layer) in launch order with their mean
    time per step, and all its non-matrix kernels' time together."""

    path: str
    tp: int
    batch: int
    roles: tuple[tuple[str, int | None], ...]
    times_ns: tuple[float, ...]
    other_ns: float
    shape: Mapping[str, Any]
    kv_len: int
    dtype: str
    static: bool = False  # a serving-style decode (CUDA graphs / compile) over a static KV cache
    #: the non-matrix kernels' names in launch order (the step's kernels that are no GEMM / attention unit)
    other_names: tuple[str, ...] = ()

    def work_at(self, batch: int) -> list[Work]:
        return decoder_work(self.shape, self.tp, batch, self.kv_len, DTYPE_BYTES[self.dtype])


def kernel_profile(run: Any, path: str) -> KernelProfile:
    """The profile of a traced run (`tracekit.read.read_run` result or an AnalysedRun)."""
    try:
        du = decode_units(run)
    except RooflineError as exc:
        raise BatchModelError(f"{path}: {exc}") from None
    if not du.assigned:
        n = sum(1 for u in du.canon.units if u)
        raise BatchModelError(
            f"{path} at its step's kernels: its {n} GEMM / attention units are not the reference decoder's "
            f"{len(du.work)} in role and order: no per-kernel batch model for it"
        )
    times = [float(t) for t, u in zip(du.canon.mean_ns, du.canon.units, strict=True) if u]
    other = float(sum(t for t, u in zip(du.canon.mean_ns, du.canon.units, strict=True) if not u))
    names = tuple(n for n, u in zip(du.canon.names, du.canon.units, strict=True) if not u)
    return KernelProfile(
        path, du.tp, du.batch, tuple((w.role, w.layer) for w in du.work), tuple(times), other,
        du.shape, du.kv_len, du.dtype, du.static, names,
    )  # fmt: skip


def line_at(points: Sequence[tuple[float, float]], x: float) -> float:
    """The piecewise-linear function through `points` (x distinct) at `x`; beyond the first or last
    point, the line through the two nearest. One point: its value."""
    pts = sorted(points)
    if len(pts) == 1:
        return pts[0][1]
    xs = [p[0] for p in pts]
    i = min(max(bisect.bisect_left(xs, x), 1), len(pts) - 1)
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# ------------------------------------------------------------------------------------------
# the GEMM table


def load_gemm_table(obj: Any, where: str) -> GemmTable:
    """A decoded `--gemm-table` JSON as its document; BatchModelError saying where it does not fit."""
    try:
        table = convert(obj, GemmTable)
    except DocumentError as exc:
        at = f" at {exc.where}" if exc.where else ""
        raise BatchModelError(f"{where}{at}: not a tracekit gemm table ({exc})") from None
    if table.kind != "tracekit.gemm-table":
        raise BatchModelError(f"{where} at $.kind: {table.kind!r}, not a tracekit.gemm-table")
    return table


def check_table(table: GemmTable, where: str, shape: Mapping[str, Any], tp: int, dtype: str) -> None:
    """The table must time this model shape's GEMMs at this TP degree and dtype, each role at two or
    more batch sizes."""
    want = gemm_shapes(shape, tp)
    for i, r in enumerate(table.rows):
        if r.role not in want:
            raise BatchModelError(
                f"{where} at $.rows[{i}].role: {r.role!r} is none of {', '.join(GEMM_ROLES)}"
            )
        if (r.k, r.n) != want[r.role]:
            k, n = want[r.role]
            raise BatchModelError(
                f"{where} at $.rows[{i}]: {r.role} is {r.k} x {r.n}, the run's model shape at TP={tp} has "
                f"{k} x {n} (a table of another model shape or TP degree)"
            )
        if r.m < 1 or r.time_ns <= 0:
            raise BatchModelError(f"{where} at $.rows[{i}]: m and time_ns must be positive")
    if table.dtype != dtype:
        raise BatchModelError(f"{where} at $.dtype: the table timed {table.dtype}, the run is {dtype}")
    for role in GEMM_ROLES:
        ms = {r.m for r in table.rows if r.role == role}
        if len(ms) < 2:
            raise BatchModelError(
                f"{where} at $.rows: {role} is timed at {len(ms)} batch size(s), two or more needed"
            )


def table_at(table: GemmTable, role: str, m: int) -> float:
    """One `role` GEMM's time at batch `m` from the table (piecewise linear in M, extended by the
    end segments)."""
    return line_at([(float(r.m), float(r.time_ns)) for r in table.rows if r.role == role], float(m))


def table_step_ns(table: GemmTable, shape: Mapping[str, Any], tp: int, batch: int) -> float:
    """The step's GEMM time per the table: every layer's qkv, o, gate_up and down and the LM head
    once, each read at `batch` (the per-rank GEMM time of a TP=`tp` shard when the table is that
    shard's)."""
    check_table(table, "the table", shape, tp, table.dtype)
    per_layer = sum(table_at(table, role, batch) for role in GEMM_ROLES if role != "lm_head")
    return int(shape["layers"]) * per_layer + table_at(table, "lm_head", batch)


def kernel_change(profiles: Sequence[KernelProfile], batch: int) -> str | None:
    """Where the two runs whose line `line_at` reads at `batch` do not run the same non-matrix
    kernels (names in order): what changed, else None. Across such a change the line through the
    two batches is a change of kernels (e.g. a vectorised elementwise kernel at batch 1 and a
    strided, non-vectorised one above it), not a slope in the batch."""
    ps = sorted(profiles, key=lambda p: p.batch)
    if len(ps) < 2:
        return None
    i = min(max(bisect.bisect_left([p.batch for p in ps], batch), 1), len(ps) - 1)
    a, b = ps[i - 1], ps[i]
    if not (a.other_names and b.other_names) or a.other_names == b.other_names:
        return None
    gone = len(set(a.other_names) - set(b.other_names))
    new = len(set(b.other_names) - set(a.other_names))
    return (
        f"the non-matrix kernels change between batch {a.batch} and {b.batch} ({len(a.other_names)} vs "
        f"{len(b.other_names)} per step; {gone} kernel name(s) only at {a.batch}, {new} only at {b.batch}): "
        "the line through them is a change of kernels, not a slope"
    )


def table_span(table: GemmTable) -> tuple[int, int]:
    ms = [r.m for r in table.rows]
    return min(ms), max(ms)


# ------------------------------------------------------------------------------------------
# the prediction


@dataclass
class KindPart:
    """One kernel kind's time per step at the base batch (None: the base run has no trace), the
    time the model adds at the predicted batch, and where it came from."""

    kind: str
    base_ns: float | None
    added_ns: float
    source: str

    @property
    def predicted_ns(self) -> float | None:
        return None if self.base_ns is None else self.base_ns + self.added_ns

    def document(self) -> ad.AdviseKindPart:
        p = self.predicted_ns
        return ad.AdviseKindPart(
            kind=self.kind,
            base_ns=None if self.base_ns is None else int(round(self.base_ns)),
            predicted_ns=None if p is None else int(round(p)),
            added_ns=int(round(self.added_ns)),
            source=self.source,
        )


@dataclass
class BatchPrediction:
    batch: int
    base_batch: int
    base_path: str
    per_token_ns: float
    model: str  # "per-kernel" | "gemm-table"
    detail: str
    parts: list[KindPart]
    floors: RooflinePeaks  # the peaks the floors were taken at

    def document(self) -> ad.AdviseBatchModel:
        return copy_fields(
            ad.AdviseBatchModel, self, base_run=self.base_path, by_kind=[p.document() for p in self.parts]
        )


def _floors(work: list[Work], peaks: Peaks) -> list[float]:
    return [unit_floor_ns(w, peaks) or 0.0 for w in work]


def per_kernel(
    profiles: Sequence[KernelProfile],
    base_ns: float,
    base: KernelProfile,
    batch: int,
    peaks: Peaks,
    table: GemmTable | None = None,
    table_name: str | None = None,
) -> BatchPrediction:
    """Model 1 (two or more profiles), with the GEMMs from `table` when given (model 2): `base` is
    the profile of the nearest measured batch, `base_ns` its run's per-token time."""
    first = profiles[0]
    for p in profiles[1:]:
        if p.roles != first.roles or p.tp != first.tp:
            raise BatchModelError(
                f"{p.path} at its step's kernels: batch {p.batch}'s {len(p.roles)} GEMM / attention units "
                f"(TP={p.tp}) do not match batch {first.batch}'s {len(first.roles)} (TP={first.tp}, "
                f"{first.path}) in role and order: the per-kernel model matches them across batches"
            )
        if (p.static, p.kv_len, p.dtype) != (first.static, first.kv_len, first.dtype):

            def what(x: KernelProfile) -> str:
                mode = "a serving-style (CUDA-graph / compiled) decode" if x.static else "an eager decode"
                return f"{mode} over {x.kv_len} KV positions in {x.dtype}"

            raise BatchModelError(
                f"{p.path} at its manifest's workload: batch {p.batch} is {what(p)}, batch {first.batch} "
                f"({first.path}) {what(first)}: the per-kernel model needs the same decode at each batch"
            )
    batches = sorted(p.batch for p in profiles)
    twice = next((b for b in batches if batches.count(b) > 1), None)
    if twice is not None:
        raise BatchModelError(
            f"two traced runs at batch {twice}: the per-kernel model takes one per batch size"
        )
    floors = _floors(base.work_at(batch), peaks)
    pred: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    had: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    bound: dict[str, int] = dict.fromkeys(KINDS, 0)
    for j, (role, _layer) in enumerate(base.roles):
        kind = ATTENTION if role == "attention" else GEMM
        if kind == GEMM and table is not None:
            t = base.times_ns[j] + table_at(table, role, batch) - table_at(table, role, base.batch)
        else:
            t = line_at([(float(p.batch), p.times_ns[j]) for p in profiles], float(batch))
        if floors[j] > t:
            t, bound[kind] = floors[j], bound[kind] + 1
        pred[kind] += t
        had[kind] += base.times_ns[j]
    pred[OTHER] = max(0.0, line_at([(float(p.batch), p.other_ns) for p in profiles], float(batch)))
    had[OTHER] = base.other_ns
    runs = ", ".join(str(b) for b in batches)
    change = kernel_change(profiles, batch)

    def src(kind: str) -> str:
        s = (
            f"the {table_name} table's change from M = {base.batch} to {batch}"
            if kind == GEMM and table is not None
            else f"per unit, piecewise linear in the batch through batches {runs}"
        )
        if kind == OTHER:
            s = f"all non-matrix kernels together, piecewise linear through batches {runs}"
            if change is not None:
                s += f"; {change}"
        if bound[kind]:
            s += f"; {bound[kind]} unit(s) at their roofline"
        return s

    parts = [KindPart(k, had[k], pred[k] - had[k], src(k)) for k in KINDS]
    total = base_ns + sum(p.added_ns for p in parts)
    model = "gemm-table" if table is not None else "per-kernel"
    detail = (
        f"per-kernel from the traced runs at batches {runs}"
        + (f", GEMMs from the table {table_name}" if table is not None else "")
        + f"; the time outside kernels held at batch {base.batch}'s"
    )
    return BatchPrediction(batch, base.batch, base.path, total, model, detail, parts, peaks.document())


def from_table(
    table: GemmTable,
    table_name: str,
    base_ns: float,
    base_batch: int,
    base_path: str,
    batch: int,
    shape: Mapping[str, Any],
    tp: int,
    kv_len: int,
    dtype: str,
    peaks: Peaks,
    base: KernelProfile | None = None,
) -> BatchPrediction:
    """Model 2 from one run (`base`: its profile when it has a trace, for the per-unit floors)."""
    work_b = decoder_work(shape, tp, batch, kv_len, DTYPE_BYTES[dtype])
    work_0 = decoder_work(shape, tp, base_batch, kv_len, DTYPE_BYTES[dtype])
    floors = _floors(work_b, peaks)
    floors0 = _floors(work_0, peaks)
    added = dict.fromkeys(KINDS, 0.0)
    had: dict[str, float | None] = dict.fromkeys(KINDS, None)
    if base is not None:
        had = dict.fromkeys(KINDS, 0.0)
        had[OTHER] = base.other_ns
    bound = 0
    for j, w in enumerate(work_b):
        t0 = base.times_ns[j] if base is not None else None
        if w.kind == GEMM:
            d = table_at(table, w.role, batch) - table_at(table, w.role, base_batch)
            if t0 is not None and floors[j] > t0 + d:
                d, bound = floors[j] - t0, bound + 1
            added[GEMM] += d
        else:
            added[ATTENTION] += max(0.0, floors[j] - floors0[j])
        if t0 is not None:
            had[w.kind] = (had[w.kind] or 0.0) + t0
    lo, hi = table_span(table)
    gemm_src = f"the {table_name} table's change from M = {base_batch} to {batch}" + (
        f"; {bound} unit(s) at their roofline" if bound else ""
    )
    if not (lo <= batch <= hi and lo <= base_batch <= hi):
        gemm_src += f" (the table spans M = {lo}..{hi}: extended by its end segment)"
    srcs = {
        GEMM: gemm_src,
        ATTENTION: "its roofline's change (the KV cache's bytes at the peaks): one run gives no attention curve",
        OTHER: f"held at batch {base_batch}'s: one run and the table give no curve for the non-matrix kernels",
    }
    parts = [KindPart(k, had[k], added[k], srcs[k]) for k in KINDS]
    total = base_ns + sum(added.values())
    detail = (
        f"GEMMs from the table {table_name} on the run at batch {base_batch}; attention by its roofline, the "
        "non-matrix kernels and the time outside kernels held"
    )
    return BatchPrediction(batch, base_batch, base_path, total, "gemm-table", detail, parts, peaks.document())
