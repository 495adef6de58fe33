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
