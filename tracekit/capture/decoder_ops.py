"""The reference decoder's pieces (torch): the collectives it needs (`Comm`; `SHARD_BACKEND` for a shard
run), RMSNorm, rotary embeddings (the fused table and the legacy form), grouped-query attention, one
layer's weights. `tracekit.capture.decoder.TPDecoder` composes them; import only from capture code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tracekit.capture import annotate

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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in one op (`F.rms_norm`, torch >= 2.4; a fused kernel on CUDA), statistics in fp32."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_table(
    head_dim: int, max_len: int, theta: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[max_len, 2, head_dim] in the model dtype: row p holds [cos | cos] and [-sin | sin] at position p,
    so that rotate-half RoPE is x * c + roll(x, head_dim/2) * s (`apply_rope_inplace`)."""
    cos, sin = rope_tables(head_dim, max_len, theta, device)
    return torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), 1).to(dtype).contiguous()


def apply_rope_inplace(x: torch.Tensor, cs: torch.Tensor) -> None:
    """x [B, S, H, D] (a view of the QKV output; query and key heads together), cs [S, 2, D]: rotate-half
    RoPE in place, three ops: roll (= [x2 | x1]), multiply by cos, add roll times the signed sin."""
    rot = x.roll(x.shape[-1] // 2, dims=-1)
    x.mul_(cs[:, None, 0]).addcmul_(rot, cs[:, None, 1])


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
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


def rope_tables(
    head_dim: int, max_len: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    pos = torch.arange(max_len, dtype=torch.float32, device=device)
    freqs = torch.outer(pos, inv)  # [max_len, head_dim/2]
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, S, D]; cos/sin: [S, D/2] (rotate-half form)."""
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2].float(), x[..., d2:].float()
    c, s = cos[None, None], sin[None, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


@dataclass
class Layer:
    """One layer's weights on this rank."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv: torch.Tensor  # [local (q+k+v) rows, hidden]: column-parallel
    o: torch.Tensor  # [hidden, local heads*head_dim]: row-parallel
    gate_up: torch.Tensor  # [2*local intermediate, hidden]: column-parallel
    down: torch.Tensor  # [hidden, local intermediate]: row-parallel
