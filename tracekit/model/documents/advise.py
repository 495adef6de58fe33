"""The `Advise` document: tracekit advise --format json (docs/JSON.md#advise)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class AdviseRun(Doc, kw_only=True):
    path: str
    tp: int
    batch: int
    per_token_ns: int
    per_token_source: str
    dtype: str
    context: int
    device: str


class AdviseMemoryPerGpuBytes(Doc, kw_only=True):
    weights: int
    kv_cache: int
    total: int


class AdviseOption(Doc, kw_only=True):
    batch: int
    option: str
    tp: int
    instances: int
    status: str
    per_token_latency_ns: int
    tokens_per_s: float
    tokens_per_s_per_instance: float
    memory_per_gpu_bytes: AdviseMemoryPerGpuBytes
    fits: bool


class AdviseMemoryCliffItem(Doc, kw_only=True):
    tp: int
    option: str
    kv_bytes_per_sequence: int
    weights_bytes_run_dtype: int
    max_sequences_run_dtype: int
    weights_bytes_weight_dtype: int
    max_sequences_weight_dtype: int
    more_sequences: int


class AdviseRecommendation(Doc, kw_only=True):
    batch: int
    best_throughput: str
    best_latency: str
    text: str


class Advise(Doc, kw_only=True):
    schema_version: str
    kind: str
    gpus: int
    memory_per_gpu_bytes: int
    memory_source: str
    reserve_bytes: int
    weight_dtype: str
    context: int
    layers: int | UnsetType = UNSET
    layers_traced: int | UnsetType = UNSET
    runs: list[AdviseRun]
    options: list[AdviseOption]
    memory_cliff: list[AdviseMemoryCliffItem]
    recommendations: list[AdviseRecommendation]
    notes: list[str]
