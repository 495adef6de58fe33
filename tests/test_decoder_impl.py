"""The reference decoder's two implementations (`--decoder-impl fused|legacy`): the same function from
the same weights, at TP=1 and TP=2 (gloo), eager and on static shapes; the fused one launches fewer ops
(counted in a CPU profiler trace of one decode step).

Tolerances: fp32 logits agree to 1e-4 absolute (the two differ only in the order of a few roundings: RMSNorm
by `F.rms_norm`, RoPE as x*c + roll(x)*s); bf16 logits (|logits| ~4) to 0.1: the fused RoPE table and its
products are bf16 where the legacy one computes in fp32 and rounds once. Greedy tokens are equal in both."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")

from tests.spawn_ranks import spawn_ranks  # noqa: E402
from tracekit.capture.decoder import (  # noqa: E402
    IMPLS,
    PRESETS,
    Comm,
    TPDecoder,
    cache_length,
    make_prompt,
)
from tracekit.errors import CaptureError  # noqa: E402

TINY = PRESETS["tiny"]  # 4 query heads over 2 KV heads: grouped-query attention


def _static(m: TPDecoder) -> TPDecoder:
    """Decode steps through `_decode_static` (the function --cuda-graphs captures) without a graph or
    a compiler: what a CPU can run of the serving-style path."""
    m.compiled = True
    m._step_fn = m._decode_static
    return m


@pytest.mark.parametrize(
    ("shape", "dtype", "atol"),
    [
        (TINY, torch.float32, 1e-4),
        (TINY, torch.bfloat16, 0.1),
    ],
    ids=["tiny-fp32", "tiny-bf16"],
)
def test_fused_and_legacy_give_the_same_logits_and_tokens(
    shape: object, dtype: torch.dtype, atol: float
) -> None:
    prompt = make_prompt(shape.vocab, 2, 6, 0)  # type: ignore[attr-defined]
    got = {}
    for impl in IMPLS:
        eager = TPDecoder(shape, Comm(), seed=0, max_len=16, impl=impl, dtype=dtype)  # type: ignore[arg-type]
        tokens, _ = eager.generate(prompt, 6)
        with torch.inference_mode():
            eager._reset_cache(2)
            logits = eager.forward(prompt, 0)
            step = eager.forward(tokens[:, :1], prompt.shape[1])  # one cached decode step
        static = _static(TPDecoder(shape, Comm(), seed=0, max_len=16, impl=impl, dtype=dtype))  # type: ignore[arg-type]
        got[impl] = (tokens, logits, step, static.generate(prompt, 6)[0])
    (lt, ll, ls, lst), (ft, fl, fs, fst) = got["legacy"], got["fused"]
    assert torch.equal(lt, ft) and torch.equal(lst, fst)
    assert torch.equal(ft, fst)  # the fused static step is the fused eager decode
    assert ll.abs().max() > 1.0  # logits of a real scale, so the tolerance means something
    assert (ll - fl).abs().max().item() <= atol
    assert (ls - fs).abs().max().item() <= atol


def test_fused_cache_is_aligned_and_the_mask_hides_its_padding() -> None:
    """The fused static cache is rounded up to a multiple of 16 positions; the positions past the
    tokens so far hold garbage here on purpose, and the tokens do not change."""
    assert (
        cache_length(51, "fused") == 64
        and cache_length(51, "legacy") == 51
        and cache_length(64, "fused") == 64
    )
    prompt = make_prompt(TINY.vocab, 1, 5, 2)
    ref = _static(TPDecoder(TINY, Comm(), seed=2, max_len=21, impl="legacy")).generate(prompt, 8)[0]
    m = _static(TPDecoder(TINY, Comm(), seed=2, max_len=21, impl="fused"))
    assert m.cache_len == 32
    m._reset_cache(1)
    m._reset_cache = lambda b: None  # type: ignore[method-assign]
    for kv in m.kv_cache:
        kv.normal_(0.0, 50.0)  # what the mask must hide, and what the prefill and steps overwrite
    assert torch.equal(m.generate(prompt, 8)[0], ref)


def test_unknown_impl_is_refused() -> None:
    with pytest.raises(CaptureError, match="unknown decoder implementation"):
        TPDecoder(TINY, Comm(), impl="fast")


#: Ops that launch no kernel (views, metadata, allocation) are not counted.
_NO_KERNEL = {
    "aten::as_strided", "aten::view", "aten::_unsafe_view", "aten::resolve_conj", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::result_type", "aten::to", "aten::lift_fresh",
    "aten::detach", "aten::alias", "aten::expand", "aten::t", "aten::transpose", "aten::slice",
    "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::reshape", "aten::split",
    "aten::chunk", "aten::split_with_sizes", "aten::narrow", "aten::_reshape_alias", "aten::unbind",
    "aten::scalar_tensor",
}  # fmt: skip


def _step_ops(impl: str, static: bool) -> collections.Counter[str]:
    """The kernel-launching ATen ops of one decode step in a CPU profiler trace: leaf ops (no counted
    op inside them), views and allocations left out."""
    from torch.profiler import ProfilerActivity, profile

    m = TPDecoder(TINY, Comm(), seed=0, max_len=16, impl=impl, dtype=torch.bfloat16)  # as on the GPU
    m.generate(make_prompt(TINY.vocab, 1, 6, 0), 2)
    tok = torch.tensor([[3]])
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        if static:
            m._decode_static(tok, torch.tensor([7]))
        else:
            m.forward(tok, 7)
    counted = collections.Counter[str]()
    for e in prof.events():
        if not e.name.startswith("aten::") or e.name in _NO_KERNEL:
            continue
        if any(c.name.startswith("aten::") and c.name not in _NO_KERNEL for c in e.cpu_children):
            continue
        counted[e.name] += 1
    return counted


@pytest.mark.parametrize("static", [True, False], ids=["static", "eager"])
def test_fused_launches_fewer_ops(static: bool) -> None:
    legacy, fused = _step_ops("legacy", static), _step_ops("fused", static)
    layers = TINY.layers
    # the same GEMMs (4 per layer + LM head): the work is the same, only its glue differs
    assert legacy["aten::mm"] == fused["aten::mm"] == 4 * layers + 1
    # the legacy step casts to fp32 and back around every norm and RoPE and expands the KV cache per
    # layer (copies); the fused one has no cast and one cache write per layer
    assert fused["aten::copy_"] < legacy["aten::copy_"] - 2 * layers
    if static:
        assert fused["aten::index_select"] == 1 and legacy["aten::index_select"] == 2 * layers
        assert fused["aten::index_copy_"] == layers and legacy["aten::index_copy_"] == 2 * layers
        assert fused["aten::where"] == 1 and legacy["aten::where"] == layers  # the mask: once per step
    total_l, total_f = sum(legacy.values()), sum(fused.values())
    assert total_f < 0.8 * total_l, (total_f, total_l)


def _tp_rank(rank: int, world: int, port: int, q: object) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {}
    prompt = make_prompt(TINY.vocab, 2, 8, 0)
    for impl in IMPLS:
        m = TPDecoder(TINY, Comm(world, rank, "gloo"), seed=0, impl=impl, max_len=32)
        tokens, _ = m.generate(prompt, 8)
        s = _static(TPDecoder(TINY, Comm(world, rank, "gloo"), seed=0, impl=impl, max_len=32))
        with torch.inference_mode():
            m._reset_cache(2)
            logits = m.forward(prompt, 0)
        out[impl] = (
            tokens.tolist(),
            s.generate(prompt, 8)[0].tolist(),
            logits.tolist(),
            (m.local_heads, m.local_vocab),
        )  # no tensor: a queue shares its memory
    q.put((rank, out))  # type: ignore[attr-defined]
    dist.destroy_process_group()


@pytest.mark.slow
def test_tp2_fused_equals_legacy_and_tp1() -> None:
    """At TP=2 (gloo) each rank holds its slice of the fused QKV and gate/up weights (half the
    heads and of the vocabulary); both implementations give TP=1's greedy tokens, eager and static,
    and the same logits (fp32, 1e-4). (tests/test_decoder.py's TP=2 check, the same tokens as TP=1,
    is this one: one pair of ranks for both files.)"""
    prompt = make_prompt(TINY.vocab, 2, 8, 0)
    ref = TPDecoder(TINY, Comm(), seed=0, impl="legacy", max_len=32).generate(prompt, 8)[0].tolist()
    got = dict(spawn_ranks(_tp_rank, 2, timeout_s=180))
    for rank in (0, 1):
        for impl in IMPLS:
            eager, static, _, (heads, vocab) = got[rank][impl]
            assert eager == ref and static == ref, (rank, impl)
            assert (heads, vocab) == (TINY.heads // 2, TINY.vocab // 2) == (2, 512)
        diff = torch.tensor(got[rank]["legacy"][2]) - torch.tensor(got[rank]["fused"][2])
        assert diff.abs().max().item() <= 1e-4


@pytest.mark.parametrize("impl", IMPLS)
def test_the_manifest_records_the_impl_and_the_cache_the_decoder_allocates(impl: str) -> None:
    """workload.decoder_impl and workload.kv_cache_len (what the roofline reads as the static KV length)
    are those of the decoder the runner builds."""
    from tracekit.capture.config import decoder_max_len, workload
    from tracekit.capture.runner import CaptureConfig, resolve

    config = CaptureConfig(tp=1, preset="tiny", tokens=5, device="cpu", decoder_impl=impl)
    wl = workload(config, resolve(config), 1)
    m = TPDecoder(TINY, Comm(), max_len=decoder_max_len(config), impl=impl)
    m._reset_cache(1)
    assert wl.decoder_impl == impl
    assert wl.kv_cache_len == m.k_cache[0].shape[2] == m.cache_len
    assert m.cache_len >= config.prompt + 5 + 2  # every position a decode reaches


def test_capture_refuses_an_unknown_impl() -> None:
    from tracekit.capture.runner import CaptureConfig, resolve

    with pytest.raises(CaptureError, match="--decoder-impl"):
        resolve(CaptureConfig(tp=1, preset="tiny", device="cpu", decoder_impl="fast"))


def _script(name: str) -> object:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_ab_and_check_scripts_of_the_gpu_stages_run_on_a_cpu(tmp_path: object) -> None:
    """scripts/decoder_ab.py and scripts/decoder_check.py (GPU stages ab and check) on the CPU: alternating
    rounds of both arms, and the teacher-forced same-function check in float32."""
    import json
    from pathlib import Path

    out = Path(str(tmp_path))
    ab = _script("decoder_ab")
    assert (
        ab.main(
            [
                "--device",
                "cpu",
                "--preset",
                "tiny",
                "--tokens",
                "4",
                "--rounds",
                "2",
                "--prompt",
                "4",
                "-o",
                str(out / "ab.json"),
            ]
        )
        == 0
    )  # type: ignore[attr-defined]
    doc = json.loads((out / "ab.json").read_text())
    assert doc["same_tokens"] is True and doc["rounds"] == 2
    assert all(len(r) == 3 for r in doc["per_token_ns"]["fused"])  # 4 tokens, the first of each round dropped
    assert "ratio_interval" in doc["arms"]["fused"] and "ratio_interval" not in doc["arms"]["legacy"]
    check = _script("decoder_check")
    assert (
        check.main(
            [
                "--device",
                "cpu",
                "--preset",
                "tiny",
                "--tokens",
                "5",
                "--prompt",
                "4",
                "--dtypes",
                "float32",
                "-o",
                str(out / "c.json"),
            ]
        )
        == 0
    )  # type: ignore[attr-defined]
    row = json.loads((out / "c.json").read_text())["dtypes"]["float32"]
    assert row["eager_same_choice"] == row["steps"] == 5 and row["static_same_choice"] == 4
    assert row["max_abs_logit_diff"] < 1e-4


def test_each_cause_put_back_is_still_the_same_function() -> None:
    """`impl="fused-CAUSE"` (the A/B of each cause, scripts/decoder_ab.py): the fused static step with one
    legacy cause put back (and all of them) gives the legacy tokens; unknown ones are refused."""
    from tracekit.capture.decoder import CAUSES

    prompt = make_prompt(TINY.vocab, 2, 6, 1)
    ref = _static(TPDecoder(TINY, Comm(), seed=1, max_len=16, impl="legacy")).generate(prompt, 6)[0]
    for cause in (*CAUSES, "-".join(CAUSES)):
        m = _static(TPDecoder(TINY, Comm(), seed=1, max_len=16, impl=f"fused-{cause}"))
        assert torch.equal(m.generate(prompt, 6)[0], ref), cause
    with pytest.raises(CaptureError, match="fused-CAUSE"):
        TPDecoder(TINY, Comm(), impl="legacy-norm")
    with pytest.raises(CaptureError, match="causes norm"):
        TPDecoder(TINY, Comm(), impl="fused-cast")
