"""The reference decoder: KV-cache decode equals full recomputation, shapes, rank 0's shard (TP=2
equals TP=1: tests/test_decoder_impl.py::test_tp2_fused_equals_legacy_and_tp1, for both implementations)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tracekit.capture.decoder import PRESETS, Comm, TPDecoder, check_tp, make_prompt, preset  # noqa: E402
from tracekit.errors import CaptureError  # noqa: E402


def test_presets() -> None:
    s = preset("7b", layers=3)
    assert (s.hidden, s.heads, s.kv_heads, s.intermediate, s.vocab, s.layers) == (
        4096,
        32,
        8,
        14336,
        32000,
        3,
    )
    assert PRESETS["7b"].layers == 8 and s.head_dim == 128
    with pytest.raises(CaptureError, match="unknown preset"):
        preset("13b")


def test_tp_must_divide_the_shape() -> None:
    check_tp(PRESETS["tiny"], 2)
    with pytest.raises(CaptureError, match="kv_heads=2"):
        check_tp(PRESETS["tiny"], 4)
    with pytest.raises(CaptureError, match="does not divide"):
        check_tp(PRESETS["7b"], 3)


def test_cached_decode_equals_full_recomputation() -> None:
    """Each greedy token from the KV-cache loop is the argmax of a fresh, cache-free forward of the
    whole sequence so far: checks cache writes, rotary positions and the causal mask together."""
    m = TPDecoder(PRESETS["tiny"], Comm(), seed=3, max_len=64)
    prompt = make_prompt(1024, 2, 5, 3)
    tokens, times = m.generate(prompt, 6)
    assert tokens.shape == (2, 6) and len(times) == 6
    seq = prompt
    with torch.inference_mode():
        for i in range(6):
            m._reset_cache(2)
            logits = m.forward(seq, 0)  # prefill of everything: no cached state
            nxt = logits.argmax(-1)
            assert torch.equal(nxt, tokens[:, i]), f"token {i}"
            seq = torch.cat((seq, nxt[:, None]), 1)


def test_same_seed_same_tokens_other_seed_differs() -> None:
    p = make_prompt(1024, 1, 8, 0)
    a = TPDecoder(PRESETS["tiny"], Comm(), seed=0).generate(p, 8)[0]
    b = TPDecoder(PRESETS["tiny"], Comm(), seed=0).generate(p, 8)[0]
    c = TPDecoder(PRESETS["tiny"], Comm(), seed=1).generate(p, 8)[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_shard_of_holds_rank_0s_weights_and_runs_without_peers() -> None:
    """`capture --shard-of N`: rank 0's shard of TP=N in one process. Its weights are exactly those a real
    TP=N rank 0 holds (the process group is only touched by collectives, which the shard skips), and a
    decode runs with no process group at all."""
    from tracekit.capture.decoder_ops import SHARD_BACKEND

    shard = TPDecoder(PRESETS["tiny"], Comm(2, 0, SHARD_BACKEND), seed=5, max_len=32)
    real = TPDecoder(PRESETS["tiny"], Comm(2, 0, "gloo"), seed=5, max_len=32)
    full = TPDecoder(PRESETS["tiny"], Comm(), seed=5, max_len=32)
    for a, b, f in zip(shard.layers, real.layers, full.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
            # half of the work: column-parallel rows / row-parallel columns of the full weight
            assert getattr(a, name).numel() * 2 == getattr(f, name).numel(), name
    assert not torch.distributed.is_initialized()
    tokens, times = shard.generate(make_prompt(PRESETS["tiny"].vocab, 1, 4, 0), 3)
    assert tokens.shape == (1, 3) and len(times) == 3
    assert int(tokens.max()) < PRESETS["tiny"].vocab  # the gather kept the full vocabulary's width
