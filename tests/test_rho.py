"""`tracekit rho`: the ratio arithmetic, the datasheet lookup, and the CPU fallback end to end."""

from __future__ import annotations

import json

import pytest

from tracekit.cli.main import main
from tracekit.probe.rho import Measurement, Rho, anchors_for, datasheet_for, format_table


def test_rho_is_matrix_over_fp32_fma_with_datasheet_and_anchor_beside():
    sheet, anchor = datasheet_for("NVIDIA H200"), anchors_for("NVIDIA H200")
    assert sheet["bf16"] == 989.4 and sheet["fp32"] == 66.9 and anchor["fp8"] == 1227.0
    assert datasheet_for("NVIDIA H100 PCIe")["bf16"] == 756.0  # the PCIe part before the SXM one
    assert datasheet_for("Some CPU") == {}
    r = Rho(
        {"type": "cuda", "name": "NVIDIA H200"},
        [
            Measurement(
                "matrix", "bf16", "torch.mm", "8192^3", 1, 768.0, datasheet_tops=989.4, anchor_tops=777.0
            ),
            Measurement("matrix", "int8", "-", "8192^3", 1, None, skipped="RuntimeError: not supported"),
        ],
        [Measurement("vector", "fp32", "kernel", "-", 1, 64.0, datasheet_tops=66.9, anchor_tops=64.0)],
    )
    rows = {x["dtype"]: x for x in r.rho()}
    assert rows["bf16"]["rho"] == pytest.approx(12.0)
    assert rows["bf16"]["datasheet_rho"] == pytest.approx(989.4 / 66.9)
    assert rows["bf16"]["anchor_rho"] == pytest.approx(777.0 / 64.0)
    assert rows["int8"]["rho"] is None  # a skipped dtype has no rho, and says why
    text = format_table(r)
    assert "skipped" in text and "RuntimeError" in text
    doc = r.to_json()
    assert doc["kind"] == "tracekit.rho" and doc["matrix"][1]["skipped"].startswith("RuntimeError")


def test_cpu_fallback_runs_small_and_says_so(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "rho.json"
    assert main(["rho", "--device", "cpu", "--repeats", "2", "--format", "json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"]["type"] == "cpu"
    assert {m["dtype"] for m in doc["matrix"]} >= {"fp32", "bf16"}
    assert {v["dtype"] for v in doc["vector"]} == {"fp32", "int32"}
    assert all(m["tops"] and m["tops"] > 0 for m in doc["matrix"] + doc["vector"])
    assert all(r["rho"] and r["rho"] > 0 for r in doc["rho"])
    assert any("no tensor-core measurement" in n for n in doc["notes"])
    assert main(["rho", "--help"]) == 0
    assert "Examples" in capsys.readouterr().out


def test_bad_dtype_is_a_usage_error():
    assert main(["rho", "--device", "cpu", "--matrix", "bf17"]) != 0
