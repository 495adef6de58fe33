"""What `tracekit.analyse.advise` is computed from: the model's shape and its bytes per GPU under
Megatron TP (`Shape`, `weight_bytes`, `WEIGHT_BYTES` per weight dtype), and each measured run of the
workload (`Measured`, `measured_from`: per-token time, batch, shape and device from the run and its
manifest; `needs_kernels`). docs/METHOD.md section Batch scaling of a decode."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tracekit.analyse.batch_model import (
    KernelProfile,
)
from tracekit.analyse.dilation import dilation_of
from tracekit.errors import TracekitError
from tracekit.model.documents.advise import AdviseRun
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import Manifest, ManifestWorkload
from tracekit.model.dtypes import SHORT_NAME
from tracekit.model.shape import DIMENSIONS, DecoderDims

#: Bytes per weight of the linear layers in each weight dtype (int4: 0.5 + an fp16 scale per 128).
WEIGHT_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5 + 2.0 / 128}


_RUN_DTYPE = SHORT_NAME  # the manifest's dtype -> the weight dtype it is (`model.dtypes`)


TORCH_DTYPE = {v: k for k, v in _RUN_DTYPE.items()}


class AdviseError(TracekitError):
    """The runs cannot be compared (different shapes, no TP=1 run, ...)."""


@dataclass(frozen=True)
class Shape(DecoderDims):
    """A run's decoder dimensions (its manifest's `workload.shape`), with the weights and memory
    they imply."""

    @classmethod
    def from_workload(cls, wl: ManifestWorkload, where: str) -> Shape:
        sh = given(wl.shape)
        if sh is None:
            raise AdviseError(f"{where}: manifest workload has no 'shape' (captured by an older tracekit?)")
        values = {k: given(getattr(sh, k)) for k in DIMENSIONS}
        lacking = [k for k, v in values.items() if v is None]
        if lacking:
            raise AdviseError(f"{where}: manifest workload.shape is incomplete (no {', '.join(lacking)})")
        return cls(**{k: int(v) for k, v in values.items() if v is not None})

    def linear_params(self, k: int) -> float:
        """Weights of the linear layers on one of k ranks (attention, MLP, LM head)."""
        hd = self.head_dim
        per_layer = (
            self.hidden * self.heads * hd  # q
            + 2 * self.hidden * self.kv_heads * hd  # k, v
            + self.heads * hd * self.hidden  # o
            + 3 * self.hidden * self.intermediate  # gate, up, down
        )
        return (self.layers * per_layer + self.vocab * self.hidden) / k

    def replicated_params(self) -> int:
        """Embedding and norms: every rank holds them."""
        return self.vocab * self.hidden + (2 * self.layers + 1) * self.hidden

    def kv_bytes_per_sequence(self, k: int, context: int, act_bytes: float) -> float:
        kv_heads = math.ceil(self.kv_heads / k)  # a KV head is replicated when k exceeds them
        return 2 * self.layers * kv_heads * self.head_dim * context * act_bytes


def weight_bytes(shape: Shape, k: int, weight_dtype: str, act_bytes: float) -> float:
    return shape.linear_params(k) * WEIGHT_BYTES[weight_dtype] + shape.replicated_params() * act_bytes


@dataclass
class Measured:
    """One run: its TP degree, batch and per-token time."""

    path: str
    tp: int
    batch: int
    per_token_ns: float
    source: str  # "unprofiled" | "trace"
    shape: Shape
    dtype: str  # bf16 | fp32 | ...
    context: int
    device_name: str | None
    device_memory_bytes: int | None
    #: the traced step's kernels (`batch_model.kernel_profile`), when the batch model needs them
    kernels: KernelProfile | None = None

    def document(self) -> AdviseRun:
        return AdviseRun(
            path=self.path,
            tp=self.tp,
            batch=self.batch,
            per_token_ns=int(round(self.per_token_ns)),
            per_token_source=self.source,
            dtype=self.dtype,
            context=self.context,
            device=self.device_name,
        )


def measured_from(manifest: Manifest | None, path: str, traced_ns: float | None = None) -> Measured:
    """A run's figures from its manifest; `traced_ns` (the trace's steady mean) when the manifest has
    no unprofiled times (the CLI reads the trace only then)."""
    if manifest is None:
        raise AdviseError(f"{path}: no manifest.json (the workload's shape, batch and context are needed)")
    wl = given(manifest.workload)
    if wl is None:
        raise AdviseError(f"{path}: manifest.json has no workload")
    shape = Shape.from_workload(wl, path)
    tp, batch, prompt, tokens = given(wl.tp), given(wl.batch), given(wl.prompt), given(wl.tokens)
    if tp is None or batch is None or prompt is None or tokens is None:
        lacking = [
            k for k, v in (("tp", tp), ("batch", batch), ("prompt", prompt), ("tokens", tokens)) if v is None
        ]
        raise AdviseError(
            f"{path}: manifest workload lacks tp / batch / prompt / tokens (no {', '.join(lacking)})"
        )
    context = prompt + tokens
    dil = dilation_of(manifest)
    u = dil.unprofiled
    if u is not None and u.n:
        per_token, source = float(u.mean_ns), "unprofiled"
    elif traced_ns is not None:
        per_token, source = float(traced_ns), "trace"
    else:
        raise AdviseError(f"{path}: no unprofiled per-token times in the manifest and no trace time given")
    devices = given(manifest.devices) or []
    name = given(devices[0].name) if devices else None
    mem = given(devices[0].memory_bytes) if devices else None
    return Measured(
        path=path,
        tp=tp,
        batch=batch,
        per_token_ns=per_token,
        source=source,
        shape=shape,
        dtype=_RUN_DTYPE.get(str(given(wl.dtype)), str(given(wl.dtype))),
        context=context,
        device_name=name or None,
        device_memory_bytes=mem if mem is not None and mem > 0 else None,
    )


def needs_kernels(runs: Sequence[Measured], batches: Sequence[int], table: bool) -> set[str]:
    """The runs whose traced kernels the batch model uses: at each TP degree with a `batches` size
    not measured, all its runs when there are two or more batch sizes or a GEMM table."""
    out: set[str] = set()
    for k in {m.tp for m in runs}:
        at = [m for m in runs if m.tp == k]
        measured = {m.batch for m in at}
        if any(b not in measured for b in batches) and (len(measured) >= 2 or table):
            out |= {m.path for m in at}
    return out
