"""The `Roofline` document: tracekit roofline --format json (docs/JSON.md#roofline)."""

from __future__ import annotations

from tracekit.model.documents.base import Doc, Header


class RooflineWorkload(Doc, kw_only=True):
    tp: int
    shard_of: int | None
    batch: int
    dtype: str
    layers: int
    kv_len: int
    kv_len_source: str
    cuda_graphs: bool


class RooflineShapes(Doc, kw_only=True):
    source: str
    matched: bool


class RooflinePeaks(Doc, kw_only=True):
    memory_gbps: float | None  # null: no copy probe and no known device peak
    memory_source: str
    matrix_tflops: float | None
    matrix_source: str


class RooflinePerToken(Doc, kw_only=True):
    bytes: int
    flops: int
    floor_ns: int | None  # null: no peaks (neither --copy nor --rho nor a known device)
    achieved_ns: int
    achieved_source: str
    kernel_ns: int
    matrix_kernel_ns: int
    efficiency: float | None  # null: no floor (peaks unknown)
    kernels_per_token: int


class RooflineByRoleItem(Doc, kw_only=True):
    role: str
    units_per_token: int
    time_ns: int
    bytes: int | None
    flops: int | None
    achieved_gbps: float | None
    achieved_tflops: float | None
    floor_ns: int | None
    lost_ns: int | None
    efficiency: float | None


class RooflineTopLostItem(Doc, kw_only=True):
    name: str
    role: str
    per_token: int
    time_ns: int
    floor_ns: int | None
    lost_ns: int | None
    achieved_gbps: float | None


class RooflineSteps(Doc, kw_only=True):
    used: int
    following_sequence: int
    of: int


class Roofline(Header, kw_only=True):
    """`tracekit roofline --format json` (`tracekit.analyse.compute.roofline`; docs/METHOD.md section Roofline
    of a decode): per token of a decode step, the floor its matrix work (weights and KV cache, from
    the manifest's `workload.shape`) has at the measured memory bandwidth (`tracekit probe --op
    copy`, its `rw_gbps`) and matrix rate (`tracekit rho`), against the measured time; `by_role`
    per decoder role (QKV, attention, output, gate/up, down, LM head), `shapes.source` saying
    whether the roles could be assigned, `peaks` the two rates with the files they came from."""

    definition: str
    workload: RooflineWorkload
    shapes: RooflineShapes
    peaks: RooflinePeaks
    per_token: RooflinePerToken
    by_role: list[RooflineByRoleItem]
    verdict: str
    top_lost: list[RooflineTopLostItem]
    steps: RooflineSteps
