"""The reference decoder: a Llama-style stack with Megatron-style tensor parallelism.

RMSNorm, rotary embeddings, grouped-query attention with a KV cache, SwiGLU MLP; random weights
from a seed (no downloads). Over N ranks: QKV and gate/up are column-parallel (each rank holds
heads/N query heads, kv_heads/N KV heads, intermediate/N MLP columns), o_proj and down are
row-parallel with one all-reduce each, and the LM head is vocabulary-parallel (vocab/N rows per
rank) followed by an all-gather of the logits. The embedding is replicated.

Every rank generates the *full* weights of each layer from the seed (same generator, same order)
and keeps its slice, so TP=N computes the same function as TP=1 up to the order of the
floating-point sums in the all-reduce: greedy tokens agree (tests/test_decoder.py).

Each decode step runs inside `annotate.step(i)`, with regions "attention", "mlp", "all_reduce"
(TP > 1 only) and "lm_head".

As serving engines run it (`cuda_graphs=True`, `compile=True`; `tracekit capture --cuda-graphs /
--compile`): the prefill is eager, every decode step runs `_decode_static` on static shapes (the
KV cache at its full length, attention masked to the positions so far, the position a device
tensor), either as one CUDA-graph replay per token (captured on the first step, NCCL collectives
inside the graph) or through `torch.compile` (both: the compiled step captured in a graph). The
per-step regions are not opened there (a graph replays no host code).

Two implementations of the same function (`impl`, `tracekit capture --decoder-impl`, recorded in the
manifest's workload as `decoder_impl`): `fused` (the default) runs RMSNorm as one
`F.rms_norm`, RoPE from one precomputed [cos | signed sin] table in three in-place ops on the query
and key heads together, writes K and V into one cache tensor per layer with one copy, attends
grouped-query heads without expanding the cache (at decode the query heads of one KV head are packed
as that head's query rows; at prefill `enable_gqa`), and builds the decode mask once per step, in the
model dtype; `legacy` is the decoder as first written (fp32 RMSNorm and RoPE in several ops each,
`repeat_interleave` of the whole KV cache for GQA, a boolean mask per layer), kept for the A/B
(docs/METHOD.md section Roofline of a decode). Both use the same weights and compute the same function:
in float32 the same seed gives the same tokens; in bfloat16 the roundings differ and a greedy choice can
flip where the top two logits nearly tie (tests/test_decoder_impl.py, scripts/decoder_check.py).

This module imports torch; import it only from capture code.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from tracekit.capture import annotate
from tracekit.errors import CaptureError


@dataclass(frozen=True)
class DecoderShape:
    """Model dimensions (Llama naming)."""

    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int
    vocab: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


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


#: `Comm.backend` of a shard run (`tracekit capture --shard-of N`): rank 0's shard of a TP=N decoder in
#: one process, every collective a no-op (all-reduce returns its input; the all-gather repeats this
#: rank's logits N times, so the shapes and the concatenation stay and the tokens are not the model's).
SHARD_BACKEND = "shard"


@dataclass
class Comm:
    """The collectives the decoder needs. World size 1: no communication at all; the backend
    `SHARD_BACKEND`: no communication either, with the weights split as at `world_size` ranks."""

    world_size: int = 1
    rank: int = 0
    backend: str = "none"
    #: Called on the host right before each all-reduce (the straggler knob: a sleep).
    before_all_reduce: Callable[[], None] | None = None

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1 or self.backend == SHARD_BACKEND:
            return t
        import torch.distributed as dist

        if self.before_all_reduce is not None:
            self.before_all_reduce()
        with annotate.region("all_reduce"):
            dist.all_reduce(t)
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `t` along the last dimension (rank order)."""
        if self.world_size == 1:
            return t
        if self.backend == SHARD_BACKEND:
            return torch.cat([t] * self.world_size, dim=-1)
        import torch.distributed as dist

        t = t.contiguous()
        if self.backend == "nccl":
            out = torch.empty((self.world_size, *t.shape), dtype=t.dtype, device=t.device)
            dist.all_gather_into_tensor(out, t)
            parts = list(out.unbind(0))
        else:  # gloo: the list form works on every version
            parts = [torch.empty_like(t) for _ in range(self.world_size)]
            dist.all_gather(parts, t)
        return torch.cat(parts, dim=-1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


#: `TPDecoder(impl=...)`: the decoder implementations, the default first.
IMPLS: tuple[str, ...] = ("fused", "legacy")
#: For the A/B of each cause (`scripts/decoder_ab.py`): `impl="fused-norm"` (or several, "fused-norm-gqa")
#: is the fused decoder with that cause put back as the legacy one has it, on the static decode step:
#: norm (fp32 RMSNorm in five ops and casts), rope (fp32 RoPE on q and k apart, cos/sin selected per
#: layer, K and V written apart), gqa (the cache expanded by repeat_interleave), mask (a boolean mask
#: built per layer).
CAUSES: tuple[str, ...] = ("norm", "rope", "gqa", "mask")


def _parse_impl(impl: str) -> tuple[str, frozenset[str]]:
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
    return max_len if _parse_impl(impl)[0] == "legacy" else -(-max_len // CACHE_ALIGN) * CACHE_ALIGN


def _rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in one op (`F.rms_norm`, torch >= 2.4; a fused kernel on CUDA), statistics in fp32."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rope_table(
    head_dim: int, max_len: int, theta: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[max_len, 2, head_dim] in the model dtype: row p holds [cos | cos] and [-sin | sin] at position p,
    so that rotate-half RoPE is x * c + roll(x, head_dim/2) * s (`_apply_rope_inplace`)."""
    cos, sin = _rope_tables(head_dim, max_len, theta, device)
    return torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), 1).to(dtype).contiguous()


def _apply_rope_inplace(x: torch.Tensor, cs: torch.Tensor) -> None:
    """x [B, S, H, D] (a view of the QKV output; query and key heads together), cs [S, 2, D]: rotate-half
    RoPE in place, three ops: roll (= [x2 | x1]), multiply by cos, add roll times the signed sin."""
    rot = x.roll(x.shape[-1] // 2, dims=-1)
    x.mul_(cs[:, None, 0]).addcmul_(rot, cs[:, None, 1])


def _sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
    """Causal attention of q [B, H, S, D] over k, v [B, H/group, S', D] (the last S positions of S' are
    q's): `enable_gqa` where torch has it (>= 2.5), else the KV heads repeated."""
    causal = q.shape[2] > 1
    if group == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # torch < 2.5
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=causal
        )


def _rope_tables(
    head_dim: int, max_len: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    pos = torch.arange(max_len, dtype=torch.float32, device=device)
    freqs = torch.outer(pos, inv)  # [max_len, head_dim/2]
    return freqs.cos(), freqs.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, S, D]; cos/sin: [S, D/2] (rotate-half form)."""
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2].float(), x[..., d2:].float()
    c, s = cos[None, None], sin[None, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


@dataclass
class _Layer:
    """One layer's weights on this rank."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv: torch.Tensor  # [local (q+k+v) rows, hidden]: column-parallel
    o: torch.Tensor  # [hidden, local heads*head_dim]: row-parallel
    gate_up: torch.Tensor  # [2*local intermediate, hidden]: column-parallel
    down: torch.Tensor  # [hidden, local intermediate]: row-parallel


class TPDecoder:
    """One rank's shard of the decoder. `generate()` runs prefill + greedy decode."""

    def __init__(
        self,
        shape: DecoderShape,
        comm: Comm,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_len: int = 512,
        sync_per_layer: bool = False,
        cuda_graphs: bool = False,
        compile: bool = False,
        impl: str = IMPLS[0],
    ):
        check_tp(shape, comm.world_size)
        base, self._kept = _parse_impl(impl)
        self.impl = base
        self.shape, self.comm = shape, comm
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.max_len = max_len
        self.sync_per_layer = sync_per_layer
        self.sync_count = 0
        n, r = comm.world_size, comm.rank
        s = shape
        self.local_heads, self.local_kv = s.heads // n, s.kv_heads // n
        self.local_inter, self.local_vocab = s.intermediate // n, s.vocab // n
        hd = s.head_dim

        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)

        def full(rows: int, cols: int) -> torch.Tensor:
            # identical on every rank: same generator state, same order of draws
            w = torch.randn(rows, cols, generator=gen, device=self.device, dtype=torch.float32)
            return w.mul_(1.0 / math.sqrt(cols))

        def rows_of(w: torch.Tensor, per: int, k: int = 1) -> torch.Tensor:
            # rank r's rows of `w`, seen as k stacked blocks (q|k|v or gate|up) each split n ways
            blocks = w.chunk(k, dim=0)
            return torch.cat([b[r * per : (r + 1) * per] for b in blocks], 0)

        def cast(w: torch.Tensor) -> torch.Tensor:
            return w.to(self.dtype).contiguous()

        self.embed = cast(torch.randn(s.vocab, s.hidden, generator=gen, device=self.device))
        self.layers: list[_Layer] = []
        for _ in range(s.layers):
            wq, wk, wv = (
                full(s.heads * hd, s.hidden),
                full(s.kv_heads * hd, s.hidden),
                full(s.kv_heads * hd, s.hidden),
            )
            wo = full(s.hidden, s.heads * hd)
            wg, wu = full(s.intermediate, s.hidden), full(s.intermediate, s.hidden)
            wd = full(s.hidden, s.intermediate)
            qkv = torch.cat(
                (
                    wq[r * self.local_heads * hd : (r + 1) * self.local_heads * hd],
                    wk[r * self.local_kv * hd : (r + 1) * self.local_kv * hd],
                    wv[r * self.local_kv * hd : (r + 1) * self.local_kv * hd],
                ),
                0,
            )
            gate_up = rows_of(torch.cat((wg, wu), 0), self.local_inter, k=2)
            self.layers.append(
                _Layer(
                    attn_norm=torch.ones(s.hidden, device=self.device, dtype=self.dtype),
                    mlp_norm=torch.ones(s.hidden, device=self.device, dtype=self.dtype),
                    qkv=cast(qkv),  # [local (q+k+v) rows, hidden]: column-parallel
                    o=cast(
                        wo[:, r * self.local_heads * hd : (r + 1) * self.local_heads * hd]
                    ),  # row-parallel
                    gate_up=cast(gate_up),  # column-parallel
                    down=cast(wd[:, r * self.local_inter : (r + 1) * self.local_inter]),  # row-parallel
                )
            )
            del wq, wk, wv, wo, wg, wu, wd
        self.final_norm = torch.ones(s.hidden, device=self.device, dtype=self.dtype)
        head = full(s.vocab, s.hidden)
        self.lm_head = cast(head[r * self.local_vocab : (r + 1) * self.local_vocab])  # vocab-parallel
        del head
        self.cos, self.sin = _rope_tables(hd, max_len, s.rope_theta, self.device)
        # fused: the KV cache length (static decode attends over all of it, masked), the RoPE table
        self.cache_len = cache_length(max_len, impl)
        self.rope_cs = _rope_table(hd, self.cache_len, s.rope_theta, self.dtype, self.device)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        #: fused: per layer one [2, B, local KV heads, cache_len, head_dim] tensor (K, V); k_cache and
        #: v_cache are its two halves
        self.kv_cache: list[torch.Tensor] = []
        # serving-engine decode (--cuda-graphs, --compile): static shapes, see `_decode_static`
        if cuda_graphs and self.device.type != "cuda":
            raise CaptureError("--cuda-graphs needs CUDA (--device cuda); on a CPU use --compile")
        if cuda_graphs and sync_per_layer:
            raise CaptureError(
                "--cuda-graphs cannot replay --inject-sync (no synchronisation inside a graph)"
            )
        if cuda_graphs and comm.before_all_reduce is not None:
            raise CaptureError(
                "--cuda-graphs cannot replay --inject-delay (a host sleep is not in the graph)"
            )
        self.cuda_graphs, self.compiled = cuda_graphs, compile
        self._positions = torch.arange(self.cache_len, device=self.device)
        self._mask_open = torch.zeros(self.cache_len, device=self.device, dtype=self.dtype)
        self._mask_shut = torch.full((self.cache_len,), float("-inf"), device=self.device, dtype=self.dtype)
        self._step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._decode_static
        if compile:
            self._step_fn = torch.compile(self._decode_static, dynamic=False)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._tok: torch.Tensor | None = None  # static input: [B, 1] token ids
        self._pos = torch.zeros(1, dtype=torch.long, device=self.device)  # static input: position
        self._next: torch.Tensor | None = None  # static output: [B] next ids

    # -- forward ---------------------------------------------------------------------------------
    def _reset_cache(self, batch: int) -> None:
        shape = (batch, self.local_kv, self.cache_len, self.shape.head_dim)
        if self.k_cache and tuple(self.k_cache[0].shape) == shape and self.serving:
            for c in (*self.k_cache, *self.v_cache):  # in place: a captured graph holds these tensors
                c.zero_()
            return
        if self.impl == "legacy":
            self.k_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
            self.v_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
            return
        self.kv_cache = [torch.zeros((2, *shape), device=self.device, dtype=self.dtype) for _ in self.layers]
        self.k_cache = [kv[0] for kv in self.kv_cache]
        self.v_cache = [kv[1] for kv in self.kv_cache]

    def release(self) -> None:
        """Drop the captured CUDA graph and wait for the device. NCCL keeps a communicator alive
        while a graph that captured its collectives exists, so `destroy_process_group()` with the
        graph still held never returns (pytorch/pytorch#115388, seen here at TP=2 on two H200s)."""
        if self._graph is None:
            return
        self._graph.reset()
        self._graph = None
        torch.cuda.synchronize(self.device)

    @property
    def serving(self) -> bool:
        """Decode steps run the static-shape step (`--cuda-graphs` and/or `--compile`)."""
        return self.cuda_graphs or self.compiled

    def _device_sync(self) -> None:
        self.sync_count += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _attention(self, i: int, layer: _Layer, h: torch.Tensor, pos: int) -> torch.Tensor:
        b, seq, _ = h.shape
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        qkv = h @ layer.qkv.t()
        q, k, v = qkv.split((nh * hd, nkv * hd, nkv * hd), dim=-1)
        q = q.view(b, seq, nh, hd).transpose(1, 2)
        k = k.view(b, seq, nkv, hd).transpose(1, 2)
        v = v.view(b, seq, nkv, hd).transpose(1, 2)
        cos, sin = self.cos[pos : pos + seq], self.sin[pos : pos + seq]
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        self.k_cache[i][:, :, pos : pos + seq] = k
        self.v_cache[i][:, :, pos : pos + seq] = v
        keys = self.k_cache[i][:, :, : pos + seq]
        values = self.v_cache[i][:, :, : pos + seq]
        if nh != nkv:
            keys = keys.repeat_interleave(nh // nkv, dim=1)
            values = values.repeat_interleave(nh // nkv, dim=1)
        att = F.scaled_dot_product_attention(q, keys, values, is_causal=seq > 1)
        att = att.transpose(1, 2).reshape(b, seq, nh * hd)
        return att @ layer.o.t()  # partial sum over this rank's heads

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.impl == "legacy" or "norm" in self._kept:
            return _rms_norm(x, weight, self.shape.norm_eps)
        return _rms_norm_fused(x, weight, self.shape.norm_eps)

    def _attention_fused(
        self,
        i: int,
        layer: _Layer,
        h: torch.Tensor,
        pos: int | torch.Tensor,
        cs: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """`impl="fused"`: h [B, S, hidden] at positions pos.. (an int: eager, the cache sliced to the
        positions so far; a [1] device tensor: static decode, S = 1, the whole cache under `mask`).
        `cs` is the RoPE table's rows of these positions [S, 2, D]. RoPE is applied in place on the
        QKV output (query and key heads together), K and V go into the cache in one copy, and the
        grouped-query heads attend without expanding the cache."""
        b, seq, _ = h.shape
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        qkv = h @ layer.qkv.t()  # [B, S, (nh + 2 nkv) hd]
        if self._kept and not isinstance(pos, int):
            return self._attention_kept(i, layer, qkv, pos, mask)
        _apply_rope_inplace(qkv[..., : (nh + nkv) * hd].view(b, seq, nh + nkv, hd), cs)
        kv_new = qkv[..., nh * hd :].view(b, seq, 2, nkv, hd).permute(2, 0, 3, 1, 4)  # [2, B, nkv, S, hd]
        cache = self.kv_cache[i]
        if isinstance(pos, int):
            cache[:, :, :, pos : pos + seq] = kv_new
            keys, values = cache[0, :, :, : pos + seq], cache[1, :, :, : pos + seq]
        else:
            cache.index_copy_(3, pos, kv_new)
            keys, values = cache[0], cache[1]
        q = qkv[..., : nh * hd]
        if seq == 1:
            # one position: the nh/nkv query heads of each KV head are that head's query rows (the
            # head order repeat_interleave gives), so the cache is read once per KV head
            att = F.scaled_dot_product_attention(q.view(b, nkv, nh // nkv, hd), keys, values, attn_mask=mask)
        else:
            q = q.view(b, seq, nh, hd).transpose(1, 2)
            att = _sdpa_gqa(q, keys, values, nh // nkv).transpose(1, 2)
        return att.reshape(b, seq, nh * hd) @ layer.o.t()  # partial sum over this rank's heads

    def _attention_kept(
        self, i: int, layer: _Layer, qkv: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The static step's attention of `impl="fused-CAUSE..."`: the fused one with the kept causes
        as the legacy decoder has them (`CAUSES`)."""
        b = qkv.shape[0]
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        cache = self.kv_cache[i]
        if "rope" in self._kept:
            q, k, v = qkv.split((nh * hd, nkv * hd, nkv * hd), dim=-1)
            q = q.view(b, 1, nh, hd).transpose(1, 2)
            k = k.view(b, 1, nkv, hd).transpose(1, 2)
            v = v.view(b, 1, nkv, hd).transpose(1, 2)
            cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
            cache[0].index_copy_(2, pos, k)
            cache[1].index_copy_(2, pos, v)
            q = q.reshape(b, nh * hd)
        else:
            cs = self.rope_cs.index_select(0, pos)
            _apply_rope_inplace(qkv[..., : (nh + nkv) * hd].view(b, 1, nh + nkv, hd), cs)
            cache.index_copy_(3, pos, qkv[..., nh * hd :].view(b, 1, 2, nkv, hd).permute(2, 0, 3, 1, 4))
            q = qkv[..., : nh * hd]
        if "mask" in self._kept:
            mask = (self._positions <= pos)[None, None, None, :]
        keys, values = cache[0], cache[1]
        if "gqa" in self._kept:
            keys = keys.repeat_interleave(nh // nkv, dim=1)
            values = values.repeat_interleave(nh // nkv, dim=1)
            att = F.scaled_dot_product_attention(
                q.view(b, 1, nh, hd).transpose(1, 2), keys, values, attn_mask=mask
            )
        else:
            att = F.scaled_dot_product_attention(q.view(b, nkv, nh // nkv, hd), keys, values, attn_mask=mask)
        return att.reshape(b, 1, nh * hd) @ layer.o.t()

    def _mlp(self, layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        gate, up = (h @ layer.gate_up.t()).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ layer.down.t()  # partial sum over this rank's columns

    def forward(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """tokens [B, S] at positions pos..pos+S-1 -> full-vocabulary logits of the last position [B, V]."""
        x = self.embed[tokens]
        fused = self.impl != "legacy"
        cs = self.rope_cs[pos : pos + tokens.shape[1]] if fused else None
        for i, layer in enumerate(self.layers):
            with annotate.region("attention"):
                h = self._norm(x, layer.attn_norm)
                a = (
                    self._attention_fused(i, layer, h, pos, cs, None)
                    if cs is not None
                    else self._attention(i, layer, h, pos)
                )
            x = x + self.comm.all_reduce(a)
            with annotate.region("mlp"):
                m = self._mlp(layer, self._norm(x, layer.mlp_norm))
            x = x + self.comm.all_reduce(m)
            if self.sync_per_layer:
                self._device_sync()
        with annotate.region("lm_head"):
            h = self._norm(x[:, -1], self.final_norm)
            local = (h @ self.lm_head.t()).float()  # [B, V/N]
            return self.comm.all_gather_last(local)

    # -- serving-engine decode: static KV cache and shapes, masked attention ---------------------
    def _attention_static(self, i: int, layer: _Layer, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One token's attention against the whole static cache, later positions masked out: the
        shapes do not depend on the position, so one graph (or one compiled kernel set) serves
        every token. `pos` is a [1] long tensor on the device."""
        b = h.shape[0]
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        qkv = h @ layer.qkv.t()
        q, k, v = qkv.split((nh * hd, nkv * hd, nkv * hd), dim=-1)
        q = q.view(b, 1, nh, hd).transpose(1, 2)
        k = k.view(b, 1, nkv, hd).transpose(1, 2)
        v = v.view(b, 1, nkv, hd).transpose(1, 2)
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        self.k_cache[i].index_copy_(2, pos, k)
        self.v_cache[i].index_copy_(2, pos, v)
        keys, values = self.k_cache[i], self.v_cache[i]
        if nh != nkv:
            keys = keys.repeat_interleave(nh // nkv, dim=1)
            values = values.repeat_interleave(nh // nkv, dim=1)
        mask = (self._positions <= pos)[None, None, None, :]
        att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return att.transpose(1, 2).reshape(b, 1, nh * hd) @ layer.o.t()

    def _decode_static(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One decode step on static shapes: tokens [B, 1] at position `pos` ([1] tensor) -> next ids [B].
        The same function as `forward` + argmax for one token (tests/test_whatif.py checks the tokens)."""
        x = self.embed[tokens]
        if self.impl == "legacy":
            eps = self.shape.norm_eps
            for i, layer in enumerate(self.layers):
                x = x + self.comm.all_reduce(
                    self._attention_static(i, layer, _rms_norm(x, layer.attn_norm, eps), pos)
                )
                x = x + self.comm.all_reduce(self._mlp(layer, _rms_norm(x, layer.mlp_norm, eps)))
            h = _rms_norm(x[:, -1], self.final_norm, eps)
        else:  # once per step, not per layer: the RoPE rows and the additive mask
            cs = self.rope_cs.index_select(0, pos)
            mask = torch.where(self._positions <= pos, self._mask_open, self._mask_shut)[None, None, None]
            for i, layer in enumerate(self.layers):
                a = self._attention_fused(i, layer, self._norm(x, layer.attn_norm), pos, cs, mask)
                x = x + self.comm.all_reduce(a)
                x = x + self.comm.all_reduce(self._mlp(layer, self._norm(x, layer.mlp_norm)))
            h = self._norm(x[:, -1], self.final_norm)
        logits = self.comm.all_gather_last((h @ self.lm_head.t()).float())
        return logits.argmax(-1)

    def _serve_step(self, nxt: torch.Tensor, pos: int) -> torch.Tensor:
        """A decode step as serving engines run it: copy the inputs into static buffers, then one
        graph replay (`--cuda-graphs`; captured on the first call, NCCL inside) or one call of the
        compiled step (`--compile`). Returns the next ids (a copy: the static output is reused)."""
        if self._tok is None or self._tok.shape[0] != nxt.shape[0]:
            self._tok = torch.zeros((nxt.shape[0], 1), dtype=torch.long, device=self.device)
            self._graph = None
        self._tok.copy_(nxt[:, None])
        self._pos.fill_(pos)
        if not self.cuda_graphs:
            return self._step_fn(self._tok, self._pos)
        if self._graph is None:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up off the capture (allocations, kernel choice)
                for _ in range(2):
                    self._next = self._step_fn(self._tok, self._pos)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._next = self._step_fn(self._tok, self._pos)
            self._graph = graph
        self._graph.replay()
        assert self._next is not None
        return self._next.clone()

    @torch.inference_mode()
    def generate(
        self,
        prompt: torch.Tensor,
        tokens: int,
        *,
        on_token: Callable[[int, int], None] | None = None,
        before_step: Callable[[int], None] | None = None,
        annotate_step: Callable[[int], bool] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """Prefill `prompt` [B, P], then greedy-decode `tokens` tokens.

        Returns (generated ids [B, tokens], host wall ns per decode step). Each step's time runs
        from before its range opens to after its token exists (a device sync on CUDA).
        `before_step(i)` runs before step i is timed (the profiler's schedule step goes there);
        `on_token(i, ns)` after it (progress). `annotate_step(i)` says whether step i runs inside
        `annotate.step(i)` (default: every step); the others run without a step range.
        """
        b, p = prompt.shape
        if p + tokens > self.max_len:
            raise CaptureError(f"prompt {p} + tokens {tokens} exceeds the KV cache length {self.max_len}")
        self._reset_cache(b)
        prompt = prompt.to(self.device)
        logits = self.forward(prompt, 0)
        nxt = logits.argmax(-1)
        out: list[torch.Tensor] = []
        times_ns: list[int] = []
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        for i in range(tokens):
            if before_step is not None:
                before_step(i)
            t0 = time.perf_counter_ns()
            with annotate.step(i) if annotate_step is None or annotate_step(i) else _NO_RANGE:
                out.append(nxt)
                if self.serving:
                    nxt = self._serve_step(nxt, p + i)
                else:
                    logits = self.forward(nxt[:, None], p + i)
                    nxt = logits.argmax(-1)
            if cuda:
                torch.cuda.synchronize(self.device)
            dt = time.perf_counter_ns() - t0
            times_ns.append(dt)
            if on_token is not None:
                on_token(i, dt)
        return torch.stack(out, 1).cpu(), times_ns


_NO_RANGE = contextlib.nullcontext()


def collectives(shape: DecoderShape, tp: int, batch: int, dtype: str) -> list[dict[str, int | str]]:
    """The collectives of one decode step on each rank, from the decoder's shapes (not a trace):
    `tracekit.analyse.predict.tp_collectives` (torch-free, so the prediction from a shard run computes
    the same list). Per layer the o_proj and down_proj outputs [batch, 1, hidden] all-reduced in place;
    per step the vocabulary-parallel logits [batch, vocab/tp] (float32) all-gathered. Empty at tp=1."""
    from tracekit.analyse.predict import PredictError, tp_collectives

    try:
        return tp_collectives(asdict(shape), tp, batch, dtype)
    except PredictError as exc:
        raise CaptureError(str(exc)) from None


def make_prompt(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    """A deterministic random prompt [batch, length] (the same on every rank)."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (batch, length), generator=g)


__all__ = [
    "CAUSES",
    "IMPLS",
    "PRESETS",
    "Comm",
    "DecoderShape",
    "TPDecoder",
    "cache_length",
    "check_tp",
    "collectives",
    "make_prompt",
    "preset",
]
