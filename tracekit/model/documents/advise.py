"""The `Advise` document: tracekit advise --format json (docs/JSON.md#advise)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, Header
from tracekit.model.documents.roofline import RooflinePeaks
from tracekit.model.shape import DecoderDims


class AdviseRun(Doc, kw_only=True):
    path: str | None
    tp: int | None
    batch: int | None
    per_token_ns: int | None
    per_token_source: str | None
    dtype: str | None
    context: int | None
    device: str | None


class AdviseMemoryPerGpuBytes(Doc, kw_only=True):
    weights: int
    kv_cache: int
    total: int


class AdviseKindPart(Doc, kw_only=True):
    kind: str  # gemm | attention | other (all non-matrix kernels)
    base_ns: int | None  # the kind's time per step at the base batch (null: the base run has no trace)
    predicted_ns: int | None  # at the predicted batch
    added_ns: int
    source: str  # where the prediction of this kind came from


class AdviseBatchModel(Doc, kw_only=True):
    model: str  # per-kernel | gemm-table
    detail: str
    base_batch: int
    base_run: str
    by_kind: list[AdviseKindPart]
    floors: RooflinePeaks  # the peaks each unit's roofline floor was taken at


class AdviseOption(Doc, kw_only=True):
    batch: int
    option: str
    tp: int
    instances: int
    status: str
    per_token_latency_ns: int | None
    #: predicted rows: the no-overlap bound (bytes / bandwidth + flops / matrix peak, summed), beside
    #: the max-of-the-two prediction; null on measured rows (absent in older documents)
    per_token_latency_no_overlap_ns: int | None | UnsetType = UNSET
    #: measured | per-kernel | gemm-table | roofline band | null (no time); schema 1.1
    model: str | None | UnsetType = UNSET
    #: roofline band rows: [overlap, no overlap] (the range; one run gives no better); else null
    per_token_latency_range_ns: list[int] | None | UnsetType = UNSET
    #: per-kernel / gemm-table rows: the model's parts (docs/METHOD.md section Batch scaling of a decode)
    batch_model: AdviseBatchModel | None | UnsetType = UNSET
    tokens_per_s: float | None
    tokens_per_s_per_instance: float | None
    memory_per_gpu_bytes: AdviseMemoryPerGpuBytes
    fits: bool | None
    #: only with --dtype other than the runs': the same with the low-bit weights
    memory_per_gpu_bytes_low_bit: AdviseMemoryPerGpuBytes | UnsetType = UNSET
    fits_low_bit: bool | None | UnsetType = UNSET


class AdviseMemoryCliffItem(Doc, kw_only=True):
    tp: int
    option: str
    kv_bytes_per_sequence: int
    weights_bytes_run_dtype: int | None
    max_sequences_run_dtype: int | None
    weights_bytes_weight_dtype: int | None
    max_sequences_weight_dtype: int | None
    more_sequences: int | None


class AdviseRecommendation(Doc, kw_only=True):
    batch: int
    best_throughput: str | None
    best_latency: str | None
    text: str


class Advise(Header, kw_only=True):
    r"""`tracekit advise --format json` (`tracekit.analyse.advise.Advice.to_json`). Bytes are bytes (GiB in
    the text only); per-token figures are ns.
    ```
    { "schema_version": "1.1", "kind": "tracekit.advise",
      "gpus": 2, "memory_per_gpu_bytes": 150109880320 | null,   # --memory-gib, else the manifest's device
      "memory_source": "--memory-gib" | "manifest device" | "unknown (give --memory-gib)",
      "reserve_bytes": 2147483648,                 # --reserve-gib: kept back per GPU (context, workspace)
      "weight_dtype": "bf16" | "fp16" | "fp32" | "fp8" | "int4",   # --dtype (default: the runs')
      "context": 48,                               # tokens of KV cache: prompt + tokens, or --context
      "layers": 32,                                # layers the memory is for: --layers, else the traces'
      "layers_traced": 8,                          # layers of the traced model (manifest workload.shape.layers)
      "runs": [{"path": "...", "tp": 1, "batch": 1, "per_token_ns": 7565524,
                "per_token_source": "unprofiled" | "trace", "dtype": "bf16", "context": 48, "device": "NVIDIA H200"}],
      "options": [{"batch": 1, "option": "2 x TP=1 replicas", "tp": 1, "instances": 2,
                   "status": "measured" | "predicted from batch 1" | "not measured" | "...",
                   "per_token_latency_ns": 7565524 | null,
                   "tokens_per_s": 264.4 | null,          # instances x batch x 1e9 / per_token_latency_ns
                   "tokens_per_s_per_instance": 132.2 | null,
                   "memory_per_gpu_bytes": {"weights": ..., "kv_cache": ..., "total": ...},
                   "fits": true | false | null,           # total <= memory - reserve; null: memory unknown
                   "memory_per_gpu_bytes_low_bit": {...}, "fits_low_bit": ...}],   # only with --dtype != run's
                                                   # one row per (batch, TP degree k dividing gpus): gpus/k instances
      "memory_cliff": [{"tp": 1, "option": "...", "kv_bytes_per_sequence": ...,
                        "weights_bytes_run_dtype": ..., "weights_bytes_weight_dtype": ...,
                        "max_sequences_run_dtype": 91519, "max_sequences_weight_dtype": ...,
                        "more_sequences": ...}],   # concurrent sequences whose KV cache fits beside the weights
      "recommendations": [{"batch": 1, "best_throughput": "2 x TP=1 replicas", "best_latency": "...",
                           "text": "Batch 1 on 2 GPU(s): ... does not fit: each GPU would need ..."}],
      "notes": [...] }
    ```
    Memory model: the reference decoder's layout (q, k, v, o, gate, up, down and the LM head split k
    ways; embedding and norms on every rank; KV cache 2 x layers x ceil(kv_heads / k) x head_dim x
    context x bytes per sequence). Low-bit weights: fp8 1 byte, int4 0.5 byte + an fp16 scale per 128
    weights, for the linear layers only. `--layers N` sizes weights and KV cache for an N-layer model
    (the 7b-shaped traces run 8 of 32 layers); the per-token times and the batch extrapolation stay
    those of the traced layers, and a note says so. `predicted` rows (schema 1.1: `model` says which,
    docs/METHOD.md section Batch scaling of a decode): `per-kernel` from two or more traced runs at other
    batches (each GEMM / attention unit's time piecewise linear in the batch, bounded below by its
    roofline), `gemm-table` with `--gemm-table`, else `roofline band` from one run: T(B) = T(b0) +
    max(0, g(B) - g(b0)), g the per-rank roofline of weights + KV reads and 2 flops per weight per
    sequence (datasheet bandwidth and bf16 rate of the manifest's device), with memory and matrix work
    overlapping (`per_token_latency_ns`) and not (`per_token_latency_no_overlap_ns`): the range.
    """

    gpus: int | None
    memory_per_gpu_bytes: int | None
    memory_source: str | None
    reserve_bytes: int | None
    weight_dtype: str | None
    context: int | None
    layers: int | None | UnsetType = UNSET
    layers_traced: int | None | UnsetType = UNSET
    runs: list[AdviseRun]
    options: list[AdviseOption]
    memory_cliff: list[AdviseMemoryCliffItem]
    recommendations: list[AdviseRecommendation]
    notes: list[str]


class GemmTableRow(Doc, kw_only=True):
    role: str
    k: int
    n: int
    m: int
    time_ns: int


class GemmTable(Header, kw_only=True):
    r"""`benchmarks/advise_batches.py gemmsweep -o FILE`: the decoder's GEMMs timed alone at each batch
    size M, what `tracekit advise --gemm-table FILE` reads
    (docs/METHOD.md section Batch scaling of a decode).
    ```
    { "schema_version": "1.0", "kind": "tracekit.gemm-table",
      "device": "NVIDIA H200" | "cpu", "dtype": "bfloat16", "tp": 1,
      "shape": {"hidden": 4096, "heads": 32, "kv_heads": 8, "intermediate": 14336, "layers": 8, "vocab": 32000},
      "timing": "cuda-graph replay of ... matmuls over distinct weights ..." | "host clock ...",
      "rows": [{"role": "qkv" | "o" | "gate_up" | "down" | "lm_head",
                "k": 4096, "n": 6144,        # the weight (K x N) on one of tp ranks
                "m": 1,                      # the batch: an M x K x N product
                "time_ns": 12345}] }         # one product's time
    ```
    """

    device: str | None
    dtype: str
    tp: int
    shape: DecoderDims  # the model's dimensions (`tracekit.model.shape`, the one definition)
    timing: str
    rows: list[GemmTableRow]
