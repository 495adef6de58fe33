"""A decoder's dimensions (Llama naming), the one definition of them: the capture's reference decoder
(`tracekit.capture.decoder_shape.DecoderShape`, with its RoPE and norm constants) and the advisor's
shape read back from a manifest (`tracekit.analyse.advise_inputs.Shape`, with its weight and memory
counts) both extend it."""

from __future__ import annotations

from dataclasses import dataclass

#: The dimension fields, in order (the manifest's `workload.shape` keys).
DIMENSIONS: tuple[str, ...] = ("hidden", "heads", "kv_heads", "intermediate", "layers", "vocab")


@dataclass(frozen=True)
class DecoderDims:
    """Model dimensions: hidden size, query and KV heads, MLP size, layers, vocabulary."""

    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads
