"""`tracekit advise` on the committed traces, every figure recomputed here from the manifests.

Per-token time: per token the slowest rank's unprofiled time, the first token of each round left
out, the mean (the shortfall's T1 / TN). Memory: the reference decoder's weights by hand (q, k, v,
o, gate, up, down per layer, the LM head, all split k ways; the embedding and 2 L + 1 norms on
every rank) plus the KV cache (2 x layers x KV heads / k x head dim x context x bytes per
sequence).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.cli.main import main
from tracekit.model.units import GIB

TRACES = Path(__file__).resolve().parents[1] / "traces"


def _manifest(name: str) -> dict:
    return json.loads((TRACES / name / "manifest.json").read_text())


def _per_token_ns(m: dict) -> float:
    u = m["unprofiled"]
    rounds = u.get("rounds") or [u["per_token_ns"]]
    tokens = []
    for r in rounds:
        lists = list(r.values())
        n = min(len(x) for x in lists)
        tokens += [max(x[i] for x in lists) for i in range(1, n)]
    return sum(tokens) / len(tokens)


def _memory(m: dict, k: int, batch: int, bytes_per: float) -> float:
    s = m["workload"]["shape"]
    h, heads, kvh, inter, layers, vocab = (
        s[x] for x in ("hidden", "heads", "kv_heads", "intermediate", "layers", "vocab")
    )
    hd = h // heads
    linear = layers * (h * h + 2 * h * kvh * hd + h * h + 3 * h * inter) + vocab * h
    replicated = vocab * h + (2 * layers + 1) * h
    context = m["workload"]["prompt"] + m["workload"]["tokens"]
    kv = 2 * layers * (kvh // k) * hd * context * bytes_per
    return linear / k * bytes_per + replicated * bytes_per + batch * kv


def _advise(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "a.json"
    assert main(["advise", *args, "--format", "json", "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    ("tp1", "tpn", "bytes_per"), [("h200-tp1", "h200-tp2", 2), ("cpu-tp1", "cpu-tp2", 4)]
)
def test_replicas_and_sharded_figures_match_the_manifests(tmp_path, tp1, tpn, bytes_per):
    m1, m2 = _manifest(tp1), _manifest(tpn)
    doc = _advise(tmp_path, "--tp1", str(TRACES / tp1), "--tpn", str(TRACES / tpn), "--memory-gib", "80")
    rows = {r["tp"]: r for r in doc["options"]}
    t1, t2 = _per_token_ns(m1), _per_token_ns(m2)
    assert rows[1]["instances"] == 2 and rows[2]["instances"] == 1
    assert rows[1]["per_token_latency_ns"] == pytest.approx(t1, abs=1)
    assert rows[2]["per_token_latency_ns"] == pytest.approx(t2, abs=1)
    assert rows[1]["tokens_per_s"] == pytest.approx(2 * 1e9 / t1, rel=1e-9)
    assert rows[2]["tokens_per_s"] == pytest.approx(1e9 / t2, rel=1e-9)
    for k in (1, 2):
        assert rows[k]["memory_per_gpu_bytes"]["total"] == pytest.approx(_memory(m1, k, 1, bytes_per), abs=1)
        assert rows[k]["fits"] is True
    # TP=1 replicas win both ways on these runs (TP=2 is slower per token than TP=1)
    rec = doc["recommendations"][0]
    assert rec["best_throughput"] == rows[1]["option"] == rec["best_latency"]
    assert "replicas" in rec["text"]


def test_pairs_with_four_gpus_and_a_plain_statement_when_an_option_does_not_fit(tmp_path):
    m1 = _manifest("h200-tp1")
    need1 = _memory(m1, 1, 1, 2)
    need2 = _memory(m1, 2, 1, 2)
    assert need2 < need1
    mem_gib = (need2 + need1) / 2 / GIB + 0.5  # the pair fits (0.5 GiB kept back), a replica does not
    doc = _advise(
        tmp_path,
        "--tp1",
        str(TRACES / "h200-tp1"),
        "--tpn",
        str(TRACES / "h200-tp2"),
        "--gpus",
        "4",
        "--memory-gib",
        f"{mem_gib}",
        "--reserve-gib",
        "0.5",
    )
    rows = {r["tp"]: r for r in doc["options"]}
    assert rows[1]["option"] == "4 x TP=1 replicas" and rows[2]["option"] == "2 x TP=2 pairs"
    assert rows[1]["fits"] is False and rows[2]["fits"] is True
    text = doc["recommendations"][0]["text"]
    assert "4 x TP=1 replicas does not fit" in text
    assert doc["recommendations"][0]["best_throughput"] == "2 x TP=2 pairs"
    assert any("TP=4" in n for n in doc["notes"])


def test_low_bit_weights_move_the_memory_cliff(tmp_path):
    m1 = _manifest("h200-tp1")
    doc = _advise(
        tmp_path,
        "--tp1",
        str(TRACES / "h200-tp1"),
        "--tpn",
        str(TRACES / "h200-tp2"),
        "--memory-gib",
        "40",
        "--dtype",
        "int4",
        "--context",
        "8192",
    )
    cliff = {c["tp"]: c for c in doc["memory_cliff"]}
    s = m1["workload"]["shape"]
    hd = s["hidden"] // s["heads"]
    per_seq = 2 * s["layers"] * s["kv_heads"] * hd * 8192 * 2
    assert cliff[1]["kv_bytes_per_sequence"] == per_seq
    w_bf16 = _memory(m1, 1, 0, 2)  # batch 0: weights only
    h, layers, vocab = s["hidden"], s["layers"], s["vocab"]
    linear = layers * (2 * h * h + 2 * h * s["kv_heads"] * hd + 3 * h * s["intermediate"]) + vocab * h
    w_int4 = linear * (0.5 + 2 / 128) + (vocab * h + (2 * layers + 1) * h) * 2  # group-128 fp16 scales
    assert cliff[1]["weights_bytes_run_dtype"] == pytest.approx(w_bf16, abs=1)
    assert cliff[1]["weights_bytes_weight_dtype"] == pytest.approx(w_int4, abs=1)
    free = 40 * GIB - 2 * GIB
    assert cliff[1]["max_sequences_run_dtype"] == int((free - w_bf16) // per_seq)
    assert cliff[1]["max_sequences_weight_dtype"] == int((free - w_int4) // per_seq)
    assert abs(cliff[1]["more_sequences"] - (w_bf16 - w_int4) / per_seq) <= 1
    assert cliff[1]["more_sequences"] > 0


def test_batch_not_measured_is_marked_predicted_and_help_has_examples(tmp_path, capsys):
    doc = _advise(
        tmp_path, "--tp1", str(TRACES / "h200-tp1"), "--tpn", str(TRACES / "h200-tp2"), "--batch", "16"
    )
    b16 = [r for r in doc["options"] if r["batch"] == 16]
    assert b16 and all(r["status"].startswith("predicted from batch 1") for r in b16)
    b1 = {r["tp"]: r for r in doc["options"] if r["batch"] == 1}
    for r in b16:  # more device work per token, never less
        assert r["per_token_latency_ns"] >= b1[r["tp"]]["per_token_latency_ns"]
    assert main(["advise", "--help"]) == 0
    assert "Examples" in capsys.readouterr().out


def test_tp1_run_must_be_tp1(tmp_path, capsys):
    rc = main(["advise", "--tp1", str(TRACES / "cpu-tp2"), "--tpn", str(TRACES / "cpu-tp2")])
    assert rc == 2
    assert "tp=2" in capsys.readouterr().err


def test_extrapolated_batch_has_the_no_overlap_bound_by_hand(tmp_path):
    """The prediction from batch 1 adds the roofline's extra device time, max(bytes / bw, flops /
    peak) at B minus at 1; the no-overlap bound adds (bytes / bw + flops / peak) at B minus at 1,
    i.e. the extra bytes' time plus the extra matrix work's time: here by hand from the shape."""
    doc = _advise(tmp_path, "--tp1", str(TRACES / "h200-tp1"), "--batch", "64")
    m = json.loads((TRACES / "h200-tp1" / "manifest.json").read_text())
    s, wl = m["workload"]["shape"], m["workload"]
    h, hd, kv = s["hidden"], s["hidden"] // s["heads"], s["kv_heads"]
    linear = s["layers"] * (2 * h * h + 2 * h * kv * hd + 3 * h * s["intermediate"]) + s["vocab"] * h
    ctx = wl["prompt"] + wl["tokens"]
    kv_seq = 2 * s["layers"] * kv * hd * ctx * 2  # bf16 K and V of one sequence
    bw, peak = 4.8e12, 989.4e12  # H200 datasheet figures (advise.DEVICE_FIGURES)
    extra_bytes_ns = 63 * kv_seq / bw * 1e9
    extra_flops_ns = 2 * linear * 63 / peak * 1e9
    b1 = next(r for r in doc["options"] if r["batch"] == 1)
    b64 = next(r for r in doc["options"] if r["batch"] == 64)
    assert b1["per_token_latency_no_overlap_ns"] is None  # measured: no bound
    hi = b64["per_token_latency_no_overlap_ns"] - b1["per_token_latency_ns"]
    assert hi == pytest.approx(extra_bytes_ns + extra_flops_ns, abs=2)
    weights = linear * 2 + (s["vocab"] * h + (2 * s["layers"] + 1) * h) * 2
    lo = b64["per_token_latency_ns"] - b1["per_token_latency_ns"]
    g1 = max((weights + kv_seq) / bw, 2 * linear / peak)
    g64 = max((weights + 64 * kv_seq) / bw, 2 * linear * 64 / peak)
    assert lo == pytest.approx((g64 - g1) * 1e9, abs=2)
    assert lo < hi


def test_the_advise_view_shows_every_option_of_the_json_with_its_figures(tmp_path):
    """`render.advise.text` of the JSON document `advise --format json` writes (h200-tp1 + tp2,
    batch 16 predicted): the recommendations first, then one row per option of the document with
    its latency (ms), tokens/s, GiB per GPU, fit and status; the runs read; every note."""
    import msgspec

    from tracekit.model.documents.advise import Advise
    from tracekit.render.advise import text

    js = _advise(
        tmp_path, "--tp1", str(TRACES / "h200-tp1"), "--tpn", str(TRACES / "h200-tp2"), "--batch", "16"
    )
    doc = msgspec.convert(js, Advise)
    lines = text(doc).splitlines()
    assert lines[: len(js["recommendations"])] == [r["text"] for r in js["recommendations"]]
    rows = [ln for ln in lines if ln[:5].strip().isdigit()]
    assert len(rows) == len(js["options"])
    for ln, o in zip(rows, js["options"], strict=True):
        assert ln.split()[0] == str(o["batch"]) and o["option"] in ln and o["status"] in ln
        lat = o["per_token_latency_ns"]
        assert ("-" if lat is None else f"{lat / 1e6:.3f}") in ln
        assert f"{o['memory_per_gpu_bytes']['total'] / GIB:.2f}" in ln
        assert {True: " yes ", False: " NO ", None: " ? "}[o["fits"]] in ln
    assert sum(ln.startswith("  TP=") for ln in lines) == len(js["runs"])
    assert [ln[len("note: ") :] for ln in lines if ln.startswith("note: ")] == js["notes"]
