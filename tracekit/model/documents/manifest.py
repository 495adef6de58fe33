"""The `Manifest` document: manifest.json, written by tracekit capture beside the rank traces (docs/JSON.md#manifest)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class ManifestError(Doc, kw_only=True):
    rank: int | None
    message: str
    how: str | UnsetType = UNSET


class ManifestHost(Doc, kw_only=True):
    hostname: str
    cpu: str
    cpu_count: int
    platform: str


class ManifestDevice(Doc, kw_only=True):
    index: int
    name: str
    memory_bytes: int
    capability: str
    multiprocessors: int


class ManifestNvmlLink(Doc, kw_only=True):
    gpu_a: int | UnsetType = UNSET
    gpu_b: int | UnsetType = UNSET
    p2p_nvlink: str | UnsetType = UNSET
    p2p_read: str | UnsetType = UNSET
    gpu: int | UnsetType = UNSET
    nvlink_active_links: int | UnsetType = UNSET


class ManifestTopology(Doc, kw_only=True):
    nvidia_smi_topo: str | None
    nvml_links: list[ManifestNvmlLink] | None


class ManifestShape(Doc, kw_only=True):
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int
    vocab: int
    rope_theta: float
    norm_eps: float


class ManifestCollective(Doc, kw_only=True):
    op: str
    name: str
    in_bytes: int
    out_bytes: int
    dtype: str
    per_token: int
    group_size: int


class ManifestInjectDelay(Doc, kw_only=True):
    rank: int
    ms: float


class ManifestNsys(Doc, kw_only=True):
    unprofiled: str
    traced: str
    unprofiled_rank_pids: dict[str, int]
    tokens_match: bool


class ManifestWorkload(Doc, kw_only=True):
    preset: str
    tp: int
    tokens: int
    prompt: int
    batch: int
    backend: str
    device: str
    dtype: str
    seed: int
    layers: int
    shape: ManifestShape
    warmup_tokens: int
    profiler_warmup_steps: int
    untimed_tail_steps: int
    collectives: list[ManifestCollective]
    inject_delay: ManifestInjectDelay | None
    inject_sync: bool
    cuda_graphs: bool | UnsetType = UNSET
    compile: bool | UnsetType = UNSET
    mode: str
    step_pattern: str
    cpu_threads_per_rank: int | None
    rounds: int | UnsetType = UNSET
    pass_order: str | UnsetType = UNSET
    profiler_env: dict[str, str] | UnsetType = UNSET
    nsys: ManifestNsys | UnsetType = UNSET


class ManifestUnprofiled(Doc, kw_only=True):
    per_token_ns: dict[str, list[int]]
    rounds: list[dict[str, list[int]]] | UnsetType = UNSET


class ManifestProfiled(Doc, kw_only=True):
    per_token_ns: dict[str, list[int]]
    rounds: list[dict[str, list[int]]] | UnsetType = UNSET
    traced_round: int | UnsetType = UNSET


class ManifestFilesValue(Doc, kw_only=True):
    rank: int | None
    sha256: str
    bytes: int
    gzip_of: str | UnsetType = UNSET
    uncompressed_sha256: str | UnsetType = UNSET
    uncompressed_bytes: int | UnsetType = UNSET


class Manifest(Doc, kw_only=True):
    schema_version: str
    kind: str
    complete: bool
    errors: list[ManifestError]
    created: str
    versions: dict[str, str | None]
    host: ManifestHost
    devices: list[ManifestDevice]
    topology: ManifestTopology
    nccl_env: dict[str, str]
    workload: ManifestWorkload
    unprofiled: ManifestUnprofiled
    profiled: ManifestProfiled
    dilation: float
    dilation_interval: list[float] | UnsetType = UNSET
    tokens_generated: list[list[int]]
    nvtx: str
    inject_sync_count: dict[str, int]
    rank_pids: dict[str, int]
    files: dict[str, ManifestFilesValue]
    command: str
    notes: list[str] | UnsetType = UNSET
