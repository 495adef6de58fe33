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

The shapes and choices are in `decoder_shape.py` (torch-free: the capture's config reads them), the
pieces (Comm, RMSNorm, RoPE, attention, a layer's weights) in `decoder_ops.py`; `__all__` here is the
decoder's API (examples/my_decode.py imports it from here).

This module imports torch; import it only from capture code.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tracekit.capture import annotate
from tracekit.capture.decoder_ops import (
    Comm,
    Layer,
    apply_rope,
    apply_rope_inplace,
    rms_norm,
    rms_norm_fused,
    rope_table,
    rope_tables,
    sdpa_gqa,
)
from tracekit.capture.decoder_shape import (
    CAUSES,
    IMPLS,
    PRESETS,
    DecoderShape,
    cache_length,
    check_tp,
    collectives,
    parse_impl,
    preset,
)
from tracekit.errors import CaptureError


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
        base, self._kept = parse_impl(impl)
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
        self.layers: list[Layer] = []
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
                Layer(
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
        self.cos, self.sin = rope_tables(hd, max_len, s.rope_theta, self.device)
        # fused: the KV cache length (static decode attends over all of it, masked), the RoPE table
        self.cache_len = cache_length(max_len, impl)
        self.rope_cs = rope_table(hd, self.cache_len, s.rope_theta, self.dtype, self.device)
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

    def _heads(
        self, qkv: torch.Tensor, seq: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of this rank's projection `qkv` as [batch, heads, seq, head_dim], q and k
        rotated by RoPE at the positions whose `cos` and `sin` are given."""
        b = qkv.shape[0]
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        q, k, v = qkv.split((nh * hd, nkv * hd, nkv * hd), dim=-1)
        q = q.view(b, seq, nh, hd).transpose(1, 2)
        k = k.view(b, seq, nkv, hd).transpose(1, 2)
        v = v.view(b, seq, nkv, hd).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _attention(self, i: int, layer: Layer, h: torch.Tensor, pos: int) -> torch.Tensor:
        b, seq, _ = h.shape
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        q, k, v = self._heads(h @ layer.qkv.t(), seq, self.cos[pos : pos + seq], self.sin[pos : pos + seq])
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
            return rms_norm(x, weight, self.shape.norm_eps)
        return rms_norm_fused(x, weight, self.shape.norm_eps)

    def _attention_fused(
        self,
        i: int,
        layer: Layer,
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
        apply_rope_inplace(qkv[..., : (nh + nkv) * hd].view(b, seq, nh + nkv, hd), cs)
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
            att = sdpa_gqa(q, keys, values, nh // nkv).transpose(1, 2)
        return att.reshape(b, seq, nh * hd) @ layer.o.t()  # partial sum over this rank's heads

    def _attention_kept(
        self, i: int, layer: Layer, qkv: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The static step's attention of `impl="fused-CAUSE..."`: the fused one with the kept causes
        as the legacy decoder has them (`CAUSES`)."""
        b = qkv.shape[0]
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        cache = self.kv_cache[i]
        if "rope" in self._kept:
            q, k, v = self._heads(qkv, 1, self.cos.index_select(0, pos), self.sin.index_select(0, pos))
            cache[0].index_copy_(2, pos, k)
            cache[1].index_copy_(2, pos, v)
            q = q.reshape(b, nh * hd)
        else:
            cs = self.rope_cs.index_select(0, pos)
            apply_rope_inplace(qkv[..., : (nh + nkv) * hd].view(b, 1, nh + nkv, hd), cs)
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

    def _mlp(self, layer: Layer, h: torch.Tensor) -> torch.Tensor:
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
    def _attention_static(self, i: int, layer: Layer, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One token's attention against the whole static cache, later positions masked out: the
        shapes do not depend on the position, so one graph (or one compiled kernel set) serves
        every token. `pos` is a [1] long tensor on the device."""
        b = h.shape[0]
        hd, nh, nkv = self.shape.head_dim, self.local_heads, self.local_kv
        q, k, v = self._heads(
            h @ layer.qkv.t(), 1, self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        )
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
                    self._attention_static(i, layer, rms_norm(x, layer.attn_norm, eps), pos)
                )
                x = x + self.comm.all_reduce(self._mlp(layer, rms_norm(x, layer.mlp_norm, eps)))
            h = rms_norm(x[:, -1], self.final_norm, eps)
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
