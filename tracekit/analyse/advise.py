"""Shard or replicate: tokens/s, latency and memory of the ways to spend N GPUs on one model.

From measured runs of the same workload at TP=1 and TP=n (one or more batch sizes each), for N
GPUs (`gpus`, default n):

- **options**: every measured TP degree k that divides N, as N/k independent instances: N
  replicas of TP=1, N/n sharded instances of TP=n (one N-way instance when n = N), N/2 pairs when
  a TP=2 run is given and N >= 4. Per option and batch size b: per-token latency T_k(b) (the
  run's per-token time: the unprofiled mean when the manifest has it, as the shortfall takes it,
  else the traced steady-step mean) and tokens/s = (N/k) x b / T_k(b).
- **memory per GPU** of each option, from the manifest's workload (shape, dtype, batch, prompt +
  tokens = the context; `context` overrides), with the reference decoder's layout (Megatron TP:
  attention and MLP weights and the LM head split k ways, embedding and norms replicated, the KV
  cache split by KV heads): weights + KV cache at the context for the batch. `fits` against the
  GPU's memory (`memory_gib`, default the manifest's device) less `reserve_gib` for the CUDA context,
  workspace and activations.
- **low-bit weights** (`dtype` fp8 / int4): the linear layers' weights at 1 byte (fp8, per-channel
  scales negligible) or 0.5 byte + one fp16 scale per 128 weights (int4, group 128), the embedding,
  norms and KV cache staying in the run's dtype. The memory cliff: the most concurrent sequences
  whose KV cache fits beside the weights, per option, in the run's dtype and in `dtype`.
  Per-token times in a low-bit dtype are not measured here and are not predicted.
- **batch sizes not measured** (`batches`): predicted from the runs at other batch sizes of the
  same TP degree (`tracekit.analyse.batch_model`, docs/METHOD.md section Batch scaling of a decode),
  the row's `model` saying which: `per-kernel` from two or more traced runs (each GEMM / attention
  unit's time piecewise linear in the batch, bounded below by its roofline), `gemm-table` with a
  GEMM table, else the `roofline band` from the nearest run b0: T_k(B) = T_k(b0) + max(0, g(B) -
  g(b0)) with g(b) = max(bytes read / memory bandwidth, flops / matrix throughput) per rank per
  token (weights once, every sequence's KV cache; 2 flops per weight per sequence), and the same
  with g the sum of the two (no overlap): the range [overlap, no overlap] in
  `per_token_latency_range_ns`. The band needs device figures (`DEVICE_FIGURES`). On one H200 (CUDA
  graphs, 8-layer 8B shape) batch 1 alone gives bands that batch 16 and 64 measured above; batch 1
  with the GEMM table predicts 16 and 64 at 0.945x / 0.874x measured (reports/advise/check.json,
  README there, which also says what it misses at 128 and 256).
- **layers** (`layers`): the memory of a model of that many layers when the traces were cut to
  fewer (the 7b-shaped captures run 8 of its 32 layers); the per-token times and the batch
  extrapolation stay those of the traced layers.

A plain recommendation per batch size: the option with the most tokens/s among those that fit,
and the one with the lowest latency when they differ; an option that does not fit is said so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tracekit.analyse.advise_inputs import TORCH_DTYPE, WEIGHT_BYTES, AdviseError, Measured, weight_bytes
from tracekit.analyse.batch_model import (
    BatchModelError,
    BatchPrediction,
    check_table,
    from_table,
    load_gemm_table,
    per_kernel,
)
from tracekit.analyse.compute.roofline import Peaks, load_peaks
from tracekit.model.documents import Advise as AdviseDoc
from tracekit.model.documents import GemmTable, given
from tracekit.model.documents import advise as ad
from tracekit.model.documents.base import Documented
from tracekit.model.fields import copy_fields
from tracekit.model.units import GIB

SCHEMA_VERSION = "1.1"


#: Device figures for the batch extrapolation (datasheet: HBM bytes/s, dense bf16 FLOP/s), by a
#: substring of the device name, first match wins.
DEVICE_FIGURES: tuple[tuple[str, float, float], ...] = (
    ("H200", 4.8e12, 989.4e12),
    ("H100 PCIe", 2.0e12, 756.0e12),
    ("H100", 3.35e12, 989.4e12),
    ("A100", 2.0e12, 312.0e12),
)


def device_figures(name: str | None) -> tuple[float, float] | None:
    if not name:
        return None
    for key, bw, peak in DEVICE_FIGURES:
        if key in name:
            return bw, peak
    return None


def datasheet_peaks(name: str | None) -> Peaks:
    """The device's datasheet bandwidth and bf16 matrix rate as roofline peaks (no floors when the
    device is not in `DEVICE_FIGURES`)."""
    fig = device_figures(name)
    if fig is None:
        return Peaks()
    src = f"datasheet figure of the {name} (tracekit.analyse.advise.DEVICE_FIGURES; --copy / --rho for measured ones)"
    return Peaks(fig[0] / 1e9, src, fig[1] / 1e12, src)


def device_time_ns(m: Measured, k: int, batch: int, context: int, *, overlap: bool = True) -> float | None:
    """g(batch): the roofline time of one token's device work on one of k ranks (ns): the larger of
    its bytes' and its matrix work's time (`overlap`, the roofline), or their sum (`overlap=False`:
    no overlap of memory and matrix work)."""
    fig = device_figures(m.device_name)
    if fig is None:
        return None
    bw, peak = fig
    act = WEIGHT_BYTES.get(m.dtype, 2.0)
    bytes_read = weight_bytes(m.shape, k, m.dtype, act) + batch * m.shape.kv_bytes_per_sequence(
        k, context, act
    )
    flops = 2.0 * m.shape.linear_params(k) * batch
    if not overlap:
        return (bytes_read / bw + flops / peak) * 1e9
    return max(bytes_read / bw, flops / peak) * 1e9


def load_table_file(path: str | Path) -> GemmTable:
    """`--gemm-table FILE` read and typed (BatchModelError, one line, when it is not one)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BatchModelError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BatchModelError(f"{path} at byte {getattr(exc, 'pos', 0)}: not JSON ({exc})") from None
    return load_gemm_table(obj, str(path))


def run_peaks(copy: str | None, rho: str | None, m: Measured) -> Peaks | None:
    """The floors' peaks from `--copy` / `--rho` (measured); None when neither is given (then the
    device's datasheet figures, `datasheet_peaks`)."""
    if not (copy or rho):
        return None
    return load_peaks(copy, rho, TORCH_DTYPE.get(m.dtype, m.dtype))


def roofline_band(base: Measured, k: int, batch: int) -> tuple[float, float] | None:
    """Model 3 (one run): T(b0) + the roofline's change from b0 to `batch`, with memory and matrix
    work overlapping (max) and not (sum): the range (lo, hi); None without device figures."""
    g_b = device_time_ns(base, k, batch, base.context)
    g_0 = device_time_ns(base, k, base.batch, base.context)
    h_b = device_time_ns(base, k, batch, base.context, overlap=False)
    h_0 = device_time_ns(base, k, base.batch, base.context, overlap=False)
    if g_b is None or g_0 is None or h_b is None or h_0 is None:
        return None
    return base.per_token_ns + max(0.0, g_b - g_0), base.per_token_ns + max(0.0, h_b - h_0)


def _batch_model(
    near: Sequence[Measured],
    k: int,
    batch: int,
    table: GemmTable | None,
    table_name: str,
    peaks: Peaks | None,
    notes: list[str],
) -> BatchPrediction | None:
    """Model 1 or 2 (tracekit/analyse/batch_model.py) for `batch` at TP=k from the runs `near`;
    None when only the roofline band applies (a note says why when runs were there for more)."""
    pk = peaks if peaks is not None else datasheet_peaks(near[0].device_name)
    first: dict[int, Measured] = {}  # one run per batch, the first given (as the measured rows keep)
    for x in near:
        first.setdefault(x.batch, x)
    traced = sorted((x for x in first.values() if x.kernels is not None), key=lambda x: x.batch)
    if table is not None and table.tp != k:
        table = None
    if len({x.batch for x in traced}) >= 2:
        base = min(traced, key=lambda x: (abs(x.batch - batch), x.batch))
        assert base.kernels is not None
        return per_kernel(
            [x.kernels for x in traced if x.kernels is not None], base.per_token_ns, base.kernels, batch, pk,
            table, table_name,
        )  # fmt: skip
    if table is not None:
        base = min(near, key=lambda x: (abs(x.batch - batch), x.batch))
        shape = asdict(base.shape)
        prof = base.kernels
        kv_len = prof.kv_len if prof is not None else base.context
        return from_table(
            table, table_name, base.per_token_ns, base.batch, base.path, batch, shape, k, kv_len,
            TORCH_DTYPE.get(base.dtype, base.dtype), pk, prof,
        )  # fmt: skip
    if len({x.batch for x in near}) >= 2:
        msg = (
            f"TP={k} batch {batch}: the runs at batches {sorted({x.batch for x in near})} do not all have a GPU "
            "trace of the reference decoder: the per-kernel batch model needs two; the roofline band instead"
        )
        if msg not in notes:
            notes.append(msg)
    return None


@dataclass
class Advice(Documented):
    """The comparison; `to_json()` per docs/JSON.md#advise."""

    gpus: int
    memory_bytes: float | None
    memory_source: str
    reserve_bytes: float
    weight_dtype: str
    context: int
    runs: list[Measured]
    rows: list[ad.AdviseOption]  # per (batch, option)
    cliff: list[ad.AdviseMemoryCliffItem]  # per option: max concurrent sequences, run dtype vs weight dtype
    recommendations: list[ad.AdviseRecommendation]
    notes: list[str] = field(default_factory=list)
    layers: int | None = None  # the layers the memory is for (`layers`, else the traces')
    layers_traced: int | None = None  # the layers of the traced model (manifest workload.shape)

    def document(self) -> AdviseDoc:
        # gpus, memory_source, weight_dtype, context, layers, layers_traced, recommendations: its own
        return copy_fields(
            AdviseDoc,
            self,
            schema_version=SCHEMA_VERSION,
            kind="tracekit.advise",
            memory_per_gpu_bytes=int(self.memory_bytes) if self.memory_bytes else None,
            reserve_bytes=int(self.reserve_bytes),
            runs=[r.document() for r in self.runs],
            options=self.rows,
            memory_cliff=self.cliff,
            notes=list(self.notes),
        )


def _option_name(k: int, n_inst: int) -> str:
    if k == 1:
        return f"{n_inst} x TP=1 replicas" if n_inst > 1 else "1 x TP=1"
    if n_inst == 1:
        return f"1 x TP={k} (one {k}-way sharded instance)"
    return f"{n_inst} x TP={k}" + (" pairs" if k == 2 else " instances")


def advise(
    tp1: Sequence[Measured],
    tpn: Sequence[Measured],
    *,
    gpus: int | None = None,
    memory_gib: float | None = None,
    reserve_gib: float = 2.0,
    weight_dtype: str | None = None,
    context: int | None = None,
    batches: Sequence[int] = (),
    layers: int | None = None,
    gemm_table: GemmTable | None = None,
    gemm_table_name: str = "--gemm-table",
    peaks: Peaks | None = None,
) -> Advice:
    """Compare the options (module doc). `layers` overrides the model's layer count for the memory
    (weights and KV cache) when the traces were cut to fewer layers than the real model; the
    per-token times stay those measured on the traced layers."""
    runs = [*tp1, *tpn]
    if not tp1:
        raise AdviseError("--tp1: at least one TP=1 run is needed")
    if any(m.tp != 1 for m in tp1):
        bad = next(m for m in tp1 if m.tp != 1)
        raise AdviseError(f"--tp1 {bad.path}: the manifest says tp={bad.tp}")
    shapes = {m.shape for m in runs}
    if len(shapes) > 1:
        raise AdviseError(
            "the runs are of different model shapes: " + "; ".join(f"{m.path}: {m.shape}" for m in runs)
        )
    degrees = sorted({m.tp for m in tpn})
    n = max(degrees) if degrees else 1
    gpus = gpus or n
    notes: list[str] = []
    dtypes = {m.dtype for m in runs}
    run_dtype = runs[0].dtype
    if len(dtypes) > 1:
        notes.append(f"the runs differ in dtype ({', '.join(sorted(dtypes))}); memory uses {run_dtype}")
    wdt = weight_dtype or run_dtype
    if wdt not in WEIGHT_BYTES:
        raise AdviseError(f"--dtype {wdt}: choose one of {', '.join(WEIGHT_BYTES)}")
    act = WEIGHT_BYTES.get(run_dtype, 2.0)
    ctx = context or max(m.context for m in runs)
    if context:
        notes.append(
            f"memory at a context of {ctx} tokens (--context); the per-token times are those measured at "
            f"{sorted({m.context for m in runs})} tokens of context"
        )
    if memory_gib is not None:
        mem: float | None = memory_gib * GIB
        mem_source = "--memory-gib"
    else:
        dev_mem = [m.device_memory_bytes for m in runs if m.device_memory_bytes]
        mem = float(min(dev_mem)) if dev_mem else None
        mem_source = "manifest device" if mem else "unknown (give --memory-gib)"
    reserve = reserve_gib * GIB
    traced_shape = runs[0].shape
    if layers is not None and layers < 1:
        raise AdviseError(f"--layers {layers}: a model has at least one layer")
    shape = traced_shape if layers is None else replace(traced_shape, layers=layers)
    if layers is not None and layers != traced_shape.layers:
        notes.append(
            f"memory for {layers} layers (--layers); the traces have {traced_shape.layers}, and the per-token "
            f"times are those measured on the {traced_shape.layers} traced layers"
        )

    bad_batch = next((b for b in batches if b < 1), None)
    if bad_batch is not None:
        raise AdviseError(f"--batch {bad_batch}: a batch has at least one sequence")
    if gemm_table is not None:
        if gemm_table.tp not in {1, *degrees}:
            raise AdviseError(
                f"{gemm_table_name}: the table is for TP={gemm_table.tp}, no run at that degree"
            )
        check_table(
            gemm_table, gemm_table_name, asdict(traced_shape), gemm_table.tp,
            TORCH_DTYPE.get(run_dtype, run_dtype),
        )  # fmt: skip
    all_degrees = sorted({1, *degrees})
    options = [k for k in all_degrees if gpus % k == 0 and k <= gpus]
    for k in all_degrees:
        if k not in options:
            notes.append(f"TP={k} does not divide {gpus} GPUs: not an option")
    if gpus not in all_degrees:
        notes.append(
            f"TP={gpus} (one {gpus}-way sharded instance) is not measured: give a TP={gpus} run to compare it"
        )

    by_key: dict[tuple[int, int], Measured] = {}
    for m in runs:
        prev = by_key.get((m.tp, m.batch))
        if prev is not None:
            notes.append(f"two runs at TP={m.tp} batch {m.batch}: {prev.path} kept, {m.path} ignored")
            continue
        by_key[(m.tp, m.batch)] = m
    all_batches = sorted({m.batch for m in runs} | set(batches))

    def mem_need(k: int, b: int, wd: str) -> tuple[ad.AdviseMemoryPerGpuBytes, float]:
        """Per GPU, in bytes: the weights, the KV cache and their total; and the total unrounded."""
        w = weight_bytes(shape, k, wd, act)
        kv = b * shape.kv_bytes_per_sequence(k, ctx, act)
        need = ad.AdviseMemoryPerGpuBytes(
            weights=int(round(w)), kv_cache=int(round(kv)), total=int(round(w + kv))
        )
        return need, w + kv

    def fits(total: float) -> bool | None:
        return None if mem is None else total <= mem - reserve

    rows: list[ad.AdviseOption] = []
    for b in all_batches:
        for k in options:
            inst = gpus // k
            hit = by_key.get((k, b))
            status, t, t_hi = "measured", None, None
            model: str | None = "measured"
            detail: ad.AdviseBatchModel | None = None
            if hit is not None:
                t = hit.per_token_ns
            else:
                near = [x for x in runs if x.tp == k]
                if near:
                    pred = _batch_model(near, k, b, gemm_table, gemm_table_name, peaks, notes)
                    if pred is not None:
                        t, status, model = (
                            pred.per_token_ns,
                            f"predicted from batch {pred.base_batch}",
                            pred.model,
                        )
                        detail = pred.document()
                    else:
                        base = min(near, key=lambda x: (abs(x.batch - b), x.batch))
                        band = roofline_band(base, k, b)
                        if band is not None:
                            t, t_hi = band
                            status, model = f"predicted from batch {base.batch}", "roofline band"
                        else:
                            status = "not measured (no device figures to extrapolate)"
                else:
                    status = "not measured"
            if t is None:
                model = None
            need, total = mem_need(k, b, run_dtype)
            need_low, total_low = mem_need(k, b, wdt)
            row = ad.AdviseOption(
                batch=b,
                option=_option_name(k, inst),
                tp=k,
                instances=inst,
                status=status,
                per_token_latency_ns=int(round(t)) if t is not None else None,
                # predicted rows: the same extrapolation with memory and matrix work not overlapping
                per_token_latency_no_overlap_ns=int(round(t_hi)) if t_hi is not None else None,
                # which batch model (docs/METHOD.md section Batch scaling of a decode); the band's range
                model=model if t is not None else None,
                per_token_latency_range_ns=[int(round(t)), int(round(t_hi))]
                if (t is not None and t_hi is not None)
                else None,
                batch_model=detail,
                tokens_per_s=inst * b * 1e9 / t if t else None,
                tokens_per_s_per_instance=b * 1e9 / t if t else None,
                memory_per_gpu_bytes=need,
                fits=fits(total),
            )
            if wdt != run_dtype:
                row.memory_per_gpu_bytes_low_bit = need_low
                row.fits_low_bit = fits(total_low)
            rows.append(row)

    cliff = []
    for k in options:
        per_seq = shape.kv_bytes_per_sequence(k, ctx, act)

        def max_sequences(w: float) -> int | None:
            if mem is None:
                return None
            return max(0, int((mem - reserve - w) // per_seq)) if per_seq > 0 else None  # noqa: B023

        w_run, w_low = weight_bytes(shape, k, run_dtype, act), weight_bytes(shape, k, wdt, act)
        a, bb = max_sequences(w_run), max_sequences(w_low)
        cliff.append(
            ad.AdviseMemoryCliffItem(
                tp=k,
                option=_option_name(k, gpus // k),
                kv_bytes_per_sequence=int(round(per_seq)),
                weights_bytes_run_dtype=int(round(w_run)),
                max_sequences_run_dtype=a,
                weights_bytes_weight_dtype=int(round(w_low)),
                max_sequences_weight_dtype=bb,
                more_sequences=(bb - a) if (a is not None and bb is not None) else None,
            )
        )

    recs = [_recommend(b, [r for r in rows if r.batch == b], gpus, mem) for b in all_batches]
    return Advice(
        gpus, mem, mem_source, reserve, wdt, ctx, runs, rows, cliff, recs, notes,
        layers=shape.layers, layers_traced=traced_shape.layers,
    )  # fmt: skip


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def _latency(row: ad.AdviseOption) -> str:
    """A row's per-token time in words: the band's range when the row has one."""
    rng = given(row.per_token_latency_range_ns)
    if rng:
        return f"{rng[0] / 1e6:.2f}-{rng[1] / 1e6:.2f} ms (roofline band)"
    return f"{(row.per_token_latency_ns or 0) / 1e6:.2f} ms"


def _recommend(
    batch: int, rows: list[ad.AdviseOption], gpus: int, mem: float | None
) -> ad.AdviseRecommendation:
    """A plain sentence for one batch size."""
    sentences = []
    for r in rows:
        if r.fits is False:
            need = r.memory_per_gpu_bytes
            sentences.append(
                f"{r.option} does not fit: each GPU would need {_gib(need.total)} "
                f"(weights {_gib(need.weights)} + KV cache {_gib(need.kv_cache)}) of {_gib(mem or 0)}."
            )
    timed = [(r, r.tokens_per_s) for r in rows if r.tokens_per_s is not None and r.fits is not False]
    if not timed:
        text = f"Batch {batch}: no option both fits and has a per-token time."
        return ad.AdviseRecommendation(
            batch=batch, best_throughput=None, best_latency=None, text=" ".join([text, *sentences])
        )
    best, best_tps = max(timed, key=lambda rt: rt[1])
    fastest, fastest_tps = min(timed, key=lambda rt: rt[0].per_token_latency_ns or 0)
    text = (
        f"Batch {batch} on {gpus} GPU(s): {best.option} gives the most tokens/s "
        f"({best_tps:,.0f} tokens/s, {_latency(best)} per token"
        + ("" if best.status == "measured" else f", {best.status}")
        + ")"
    )
    others = [rt for rt in timed if rt[0] is not best]
    if others:
        runner, runner_tps = max(others, key=lambda rt: rt[1])
        text += f", {best_tps / runner_tps:.2f}x {runner.option}"
    text += "."
    if fastest is not best:
        text += (
            f" For the lowest latency per token take {fastest.option} "
            f"({(fastest.per_token_latency_ns or 0) / 1e6:.2f} ms, {fastest_tps:,.0f} tokens/s)."
        )
    else:
        text += " It also has the lowest latency per token."
    return ad.AdviseRecommendation(
        batch=batch,
        best_throughput=best.option,
        best_latency=fastest.option,
        text=" ".join([text, *sentences]),
    )


def cliff_sentence(adv: Advice) -> list[str]:
    """How the low-bit weights move the memory cliff, one sentence per option."""
    return cliff_sentences(adv.document())


def cliff_sentences(doc: AdviseDoc) -> list[str]:
    """`cliff_sentence` from the JSON document (`Advice.to_json()`, docs/JSON.md#advise)."""
    out = []
    run_dtype = doc.runs[0].dtype if doc.runs else doc.weight_dtype
    for c in doc.memory_cliff:
        a, b = c.max_sequences_run_dtype, c.max_sequences_weight_dtype
        if a is None or b is None:
            out.append(f"{c.option}: memory per GPU unknown (give --memory-gib)")
            continue
        per = c.kv_bytes_per_sequence or 0
        head = (
            f"{c.option}: weights {_gib(c.weights_bytes_run_dtype or 0)} per GPU, KV cache "
            f"{per / 2**20:.1f} MiB per sequence at {doc.context} tokens: up to {a:,} concurrent sequences"
        )
        if doc.weight_dtype != run_dtype:
            head += (
                f"; with {doc.weight_dtype} weights ({_gib(c.weights_bytes_weight_dtype or 0)}) up to {b:,} "
                f"({b - a:+,})"
            )
        out.append(head + ".")
    return out
