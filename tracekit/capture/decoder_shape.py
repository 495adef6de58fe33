"""The reference decoder's shapes and choices, without torch (`tracekit.capture.decoder` builds the
model): the presets (`preset`), the tensor-parallel degrees a shape allows (`check_tp`), the
implementations and the A/B's causes (`IMPLS`, `CAUSES`), the KV cache length, and the collectives of
one decode step from the shapes (`collectives`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from tracekit.errors import CaptureError
from tracekit.model.shape import DecoderDims


@dataclass(frozen=True)
class DecoderShape(DecoderDims):
    """Model dimensions (Llama naming: `DecoderDims`) and the reference decoder's constants."""

    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


#: Presets. `tiny` runs in seconds on a CPU; `7b` has the per-layer shape of a 7B-class model
#: (Mistral-7B-like: 32 query heads, 8 KV heads) with a configurable number of layers.
PRESETS: dict[str, DecoderShape] = {
    "tiny": DecoderShape(hidden=256, heads=4, kv_heads=2, intermediate=512, layers=2, vocab=1024),
    "small": DecoderShape(hidden=1024, heads=16, kv_heads=4, intermediate=2816, layers=4, vocab=8192),
    "7b": DecoderShape(hidden=4096, heads=32, kv_heads=8, intermediate=14336, layers=8, vocab=32000),
}


def preset(name: str, layers: int | None = None) -> DecoderShape:
    """The shape of preset `name`, with `layers` overriding its layer count."""
    if name not in PRESETS:
        raise CaptureError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    shape = PRESETS[name]
    if layers is not None:
        if layers < 1:
            raise CaptureError(f"--layers must be at least 1, got {layers}")
        shape = replace(shape, layers=layers)
    return shape


def check_tp(shape: DecoderShape, tp: int) -> None:
    """Refuse a TP degree that does not divide the heads, KV heads, intermediate and vocabulary."""
    for what, n in (
        ("heads", shape.heads),
        ("kv_heads", shape.kv_heads),
        ("intermediate", shape.intermediate),
        ("vocab", shape.vocab),
    ):
        if tp < 1 or n % tp:
            raise CaptureError(f"tensor-parallel degree {tp} does not divide {what}={n}")


#: `TPDecoder(impl=...)`: the decoder implementations, the default first.
IMPLS: tuple[str, ...] = ("fused", "legacy")


#: For the A/B of each cause (`scripts/decoder_ab.py`): `impl="fused-norm"` (or several, "fused-norm-gqa")
#: is the fused decoder with that cause put back as the legacy one has it, on the static decode step:
#: norm (fp32 RMSNorm in five ops and casts), rope (fp32 RoPE on q and k apart, cos/sin selected per
#: layer, K and V written apart), gqa (the cache expanded by repeat_interleave), mask (a boolean mask
#: built per layer).
CAUSES: tuple[str, ...] = ("norm", "rope", "gqa", "mask")


def parse_impl(impl: str) -> tuple[str, frozenset[str]]:
    base, *kept = impl.split("-")
    if base not in IMPLS or (kept and base != "fused") or not set(kept) <= set(CAUSES):
        raise CaptureError(
            f"unknown decoder implementation {impl!r}; choose one of {', '.join(IMPLS)} "
            f"(for the A/B: fused-CAUSE[-CAUSE...], causes {', '.join(CAUSES)})"
        )
    return base, frozenset(kept)


#: The static KV cache length of the fused decoder is rounded up to a multiple of this (positions past
#: the prompt and decode steps are masked): memory-efficient attention wants an aligned mask row and
#: otherwise pads it with extra copies on every call.
CACHE_ALIGN = 16


def cache_length(max_len: int, impl: str) -> int:
    """The KV cache length (positions) a decoder of `max_len` positions allocates: `max_len` for
    `legacy`, rounded up to a multiple of `CACHE_ALIGN` for `fused`. The static decode attends over all
    of it (the manifest's workload.kv_cache_len)."""
    return max_len if parse_impl(impl)[0] == "legacy" else -(-max_len // CACHE_ALIGN) * CACHE_ALIGN


def collectives(shape: DecoderShape, tp: int, batch: int, dtype: str) -> list[dict[str, int | str]]:
    """The collectives of one decode step on each rank, from the decoder's shapes (not a trace):
    `tracekit.analyse.predict.tp_collectives` (torch-free, so the prediction from a shard run computes
    the same list). Per layer the o_proj and down_proj outputs [batch, 1, hidden] all-reduced in place;
    per step the vocabulary-parallel logits [batch, vocab/tp] (float32) all-gathered. Empty at tp=1."""
    # here, not at the top: predict brings the analysis (pandas, the replay); the config stays light
    from tracekit.analyse.predict import PredictError, tp_collectives

    try:
        return tp_collectives(asdict(shape), tp, batch, dtype)
    except PredictError as exc:
        raise CaptureError(str(exc)) from None
