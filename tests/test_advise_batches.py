"""benchmarks/advise_batches.py: several batch sizes in one process with alternating rounds, one run
folder per batch that `tracekit advise` reads, and the check of advise fitted on one batch only."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tracekit.cli.main import main as tk_main

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("advise_batches", ROOT / "benchmarks" / "advise_batches.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_batches_alternate_in_one_process_and_the_check_never_sees_the_predicted_batch(tmp_path, capsys):
    pytest.importorskip("torch")
    ab = _script()
    out = tmp_path / "ab"
    args = ["--device", "cpu", "--preset", "tiny", "--batches", "1,2", "--tokens", "2", "--rounds", "3"]
    assert ab.main([*args, "-o", str(out)]) == 0
    m1 = json.loads((out / "b1" / "manifest.json").read_text())
    m2 = json.loads((out / "b2" / "manifest.json").read_text())
    assert m1["workload"]["batch"] == 1 and m2["workload"]["batch"] == 2
    # the rounds alternate, the order rotated each round: no batch always runs first
    assert m1["workload"]["batch_rounds_order"] == "1 2 2 1 1 2"
    for m in (m1, m2):
        rounds = m["unprofiled"]["rounds"]
        assert len(rounds) == 3 and all(len(r["0"]) == 2 and min(r["0"]) > 0 for r in rounds)
        assert m["files"] == {} and "no trace" in m["notes"][0]
        assert m1["workload"]["shape"] == m["workload"]["shape"]
    # the tokens of batch 1 are the first sequence's at batch 2 (same weights, same prompt seed)
    assert m2["tokens_generated"][0] == m1["tokens_generated"][0]
    # tracekit advise reads the folder
    assert (
        tk_main(["advise", "--tp1", str(out / "b1"), "--format", "json", "-o", str(tmp_path / "a.json")]) == 0
    )
    # the check, with the device named as an H200 (CPU runs have no device figures to extrapolate)
    for b in (1, 2):
        p = out / f"b{b}" / "manifest.json"
        m = json.loads(p.read_text())
        m["devices"] = [{"name": "NVIDIA H200", "memory_bytes": 150 * 2**30}]
        p.write_text(json.dumps(m))
    doc = ab.check(out, 1, tmp_path / "check.json")
    (row,) = doc["rows"]
    fit_ns = doc["fitted_on"]["per_token_ns"]
    assert row["batch"] == 2 and row["status"] == "predicted from batch 1"
    # the prediction is the fit's time plus the roofline's added device work: never below the fit,
    # and independent of batch 2's measured time (change it: the prediction stays)
    assert row["predicted_per_token_ns"] >= fit_ns
    assert row["ratio"] == pytest.approx(row["predicted_per_token_ns"] / row["measured_per_token_ns"])
    m = json.loads((out / "b2" / "manifest.json").read_text())
    m["unprofiled"]["rounds"] = [{"0": [x * 10 for x in r["0"]]} for r in m["unprofiled"]["rounds"]]
    (out / "b2" / "manifest.json").write_text(json.dumps(m))
    again = ab.check(out, 1, None)["rows"][0]
    assert again["predicted_per_token_ns"] == row["predicted_per_token_ns"]
    assert again["measured_per_token_ns"] == pytest.approx(10 * row["measured_per_token_ns"], rel=1e-6)
    assert json.loads((tmp_path / "check.json").read_text())["fitted_on"]["batch"] == 1

    # the GEMM sweep on this CPU (a real measurement of its matmuls, the tiny preset's shapes), and the
    # check given batch 1 and the table: batch 2 = batch 1's time + the table's change of every GEMM
    # of the step from M = 1 to 2 + attention's roofline change (the H200 datasheet the manifests
    # now name); the non-matrix kernels held
    table_path = tmp_path / "gemm-table.json"
    sweep = [
        "gemmsweep",
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--m-max",
        "2",
        "--reps",
        "4",
        "--repeats",
        "3",
    ]
    assert ab.main([*sweep, "-o", str(table_path)]) == 0
    table = json.loads(table_path.read_text())
    assert table["kind"] == "tracekit.gemm-table" and {r["m"] for r in table["rows"]} == {1, 2}
    t = {(r["role"], r["m"]): r["time_ns"] for r in table["rows"]}
    # tiny: hidden 256, 4 heads of 64, 2 KV heads, intermediate 512, vocab 1024, 2 layers
    assert t.keys() >= {("qkv", 1), ("gate_up", 2)} and len(table["rows"]) == 10
    assert {(r["role"], r["k"], r["n"]) for r in table["rows"]} == {
        ("qkv", 256, 512), ("o", 256, 256), ("gate_up", 256, 1024), ("down", 512, 256), ("lm_head", 256, 1024)
    }  # fmt: skip
    gemm = (
        sum(2 * (t[(r, 2)] - t[(r, 1)]) for r in ("qkv", "o", "gate_up", "down"))
        + t[("lm_head", 2)]
        - t[("lm_head", 1)]
    )
    # attention per layer and sequence: K and V of 2 KV heads x 18 positions (prompt 16 + 2 tokens, no
    # trace: the context) x 64 x 4 bytes + q and out of 4 heads x 64 x 4 bytes = 20,480 B, 2 layers
    attn = 2 * 20_480 / 4800  # ns at the H200 datasheet's 4.8 TB/s
    doc = ab.check(out, 1, None, gemm_table=table_path)
    (row,) = doc["per_kernel"]["rows"]
    assert row["model"] == "gemm-table" and row["batch"] == 2
    assert row["predicted_per_token_ns"] == pytest.approx(fit_ns + gemm + attn, abs=1.5)
    assert row["measured_per_token_ns"] == again["measured_per_token_ns"]
