"""`tracekit advise --layers N`: the memory of the real model when the traces run fewer layers.

The 7b-shaped H200 traces run 8 of the model's 32 layers. With --layers 32 the weights must be
those of the full model: its shape (hidden 4096, 32 heads, 8 KV heads, MLP 14336, vocab 32000,
32 layers, untied LM head) has 7,241,732,096 parameters (Mistral-7B's published count), 2 bytes
each in bf16; the KV cache 2 x layers x KV heads x head dim x context x batch x bytes."""

from __future__ import annotations

import json
from pathlib import Path

from tracekit.cli.main import main

TRACES = Path(__file__).resolve().parents[1] / "traces"
PARAMS_7B = 7_241_732_096  # 32 x (4 attention + 3 MLP matrices + 2 norms) + embedding + LM head + norm
EMBED_AND_NORMS = 32000 * 4096 + (2 * 32 + 1) * 4096  # on every rank under TP


def _advise(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "a.json"
    args = ["advise", "--tp1", str(TRACES / "h200-tp1"), "--tpn", str(TRACES / "h200-tp2")]
    assert main([*args, *extra, "--format", "json", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_layers_32_gives_the_full_7b_memory(tmp_path: Path):
    m = json.loads((TRACES / "h200-tp1" / "manifest.json").read_text())["workload"]
    assert m["shape"]["layers"] == 8 and m["dtype"] == "bfloat16"
    context = m["prompt"] + m["tokens"]
    doc = _advise(tmp_path, "--layers", "32")
    assert (doc["layers"], doc["layers_traced"]) == (32, 8)
    rows = {r["tp"]: r for r in doc["options"]}
    # TP=1: the whole model on one GPU
    assert rows[1]["memory_per_gpu_bytes"]["weights"] == PARAMS_7B * 2
    kv_tp1 = 2 * 32 * 8 * 128 * context * 1 * 2  # K and V, layers, KV heads, head dim, context, batch 1, bf16
    assert rows[1]["memory_per_gpu_bytes"]["kv_cache"] == kv_tp1
    # TP=2: the linear layers and the LM head split in two, embedding and norms on both; 4 KV heads each
    assert (
        rows[2]["memory_per_gpu_bytes"]["weights"]
        == ((PARAMS_7B - EMBED_AND_NORMS) // 2 + EMBED_AND_NORMS) * 2
    )
    assert rows[2]["memory_per_gpu_bytes"]["kv_cache"] == kv_tp1 // 2
    assert 13.48 < rows[1]["memory_per_gpu_bytes"]["total"] / 2**30 < 13.50  # 14.48 GB
    # the per-token times stay those measured on the 8 traced layers
    plain = _advise(tmp_path)
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # q, o, k, v, gate, up, down
    for a, b in zip(plain["options"], doc["options"], strict=True):
        assert a["per_token_latency_ns"] == b["per_token_latency_ns"]
        added = 24 * (per_layer // b["tp"] + 2 * 4096) * 2  # 24 more layers, split k ways, 2 norms each
        assert b["memory_per_gpu_bytes"]["weights"] - a["memory_per_gpu_bytes"]["weights"] == added
    assert any("memory for 32 layers (--layers); the traces have 8" in n for n in doc["notes"])
    assert (plain["layers"], plain["layers_traced"]) == (8, 8) and not plain["notes"]


def test_layers_moves_the_memory_cliff_and_fits(tmp_path: Path):
    # 16 GiB, 1 GiB kept back: the 8-layer model fits on one GPU, the 32-layer one (14.48 GB of weights
    # + KV) only just; at 14 GiB it no longer fits as a replica but does as a TP=2 pair
    doc = _advise(tmp_path, "--layers", "32", "--memory-gib", "14", "--reserve-gib", "1")
    rows = {r["tp"]: r for r in doc["options"]}
    assert rows[1]["fits"] is False and rows[2]["fits"] is True
    assert "2 x TP=1 replicas does not fit" in doc["recommendations"][0]["text"]
    cliff = {c["tp"]: c for c in doc["memory_cliff"]}
    per_seq = 2 * 32 * 4 * 128 * doc["context"] * 2
    assert cliff[2]["kv_bytes_per_sequence"] == per_seq
    free = 13 * 2**30 - cliff[2]["weights_bytes_run_dtype"]
    assert cliff[2]["max_sequences_run_dtype"] == free // per_seq


def test_layers_must_be_positive(tmp_path: Path, capsys):
    args = ["advise", "--tp1", str(TRACES / "h200-tp1"), "--layers", "0"]
    assert main(args) == 2
    assert "--layers" in capsys.readouterr().err


def test_help_shows_the_layers_example(capsys):
    assert main(["advise", "--help"]) == 0
    assert "--layers 32" in capsys.readouterr().out
