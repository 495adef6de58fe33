"""`tracekit rho`: the ratio arithmetic, the datasheet lookup, and the CPU fallback end to end."""

from __future__ import annotations

import json

import pytest

from tracekit.cli.main import main
from tracekit.model.documents.rho import RhoDevice
from tracekit.probe.rho import Rho, anchors_for, datasheet_for
from tracekit.probe.rho_kernels import Measurement


def test_rho_is_matrix_over_fp32_fma_with_datasheet_and_anchor_beside():
    sheet, anchor = datasheet_for("NVIDIA H200"), anchors_for("NVIDIA H200")
    assert sheet["bf16"] == 989.4 and sheet["fp32"] == 66.9 and anchor["fp8"] == 1227.0
    assert datasheet_for("NVIDIA H100 PCIe")["bf16"] == 756.0  # the PCIe part before the SXM one
    assert datasheet_for("Some CPU") == {}
    r = Rho(
        RhoDevice(type="cuda", name="NVIDIA H200", torch="2.13"),
        [
            Measurement(
                "matrix", "bf16", "torch.mm", "8192^3", 1, 768.0, datasheet_tops=989.4, anchor_tops=777.0
            ),
            Measurement("matrix", "int8", "-", "8192^3", 1, None, skipped="RuntimeError: not supported"),
        ],
        [Measurement("vector", "fp32", "kernel", "-", 1, 64.0, datasheet_tops=66.9, anchor_tops=64.0)],
    )
    rows = {x.dtype: x for x in r.rho()}
    assert rows["bf16"].rho == pytest.approx(12.0)
    assert rows["bf16"].datasheet_rho == pytest.approx(989.4 / 66.9)
    assert rows["bf16"].anchor_rho == pytest.approx(777.0 / 64.0)
    assert rows["int8"].rho is None  # a skipped dtype has no rho, and says why
    from tracekit.render.rho import table

    text = table(r.document())
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


def test_int8_operands_are_in_the_layout_cublaslt_wants_and_multiply_right():
    """The int8 product gets A row-major and B column-major (the "TN" layout of cuBLASLt's int8
    tensor-core kernels); a row-major B, the first H200 run's layout (126 TOPS), is named as the
    problem; on the CPU `_int_mm` of either layout equals the int32 product."""
    torch = pytest.importorskip("torch")
    from tracekit.probe.rho_kernels import int8_layout_problem, int8_operands

    gen = torch.Generator().manual_seed(0)
    a, b = int8_operands(32, 48, 64, device="cpu", generator=gen, layout="col")
    assert a.shape == (32, 64) and b.shape == (64, 48)
    assert a.stride() == (64, 1) and b.stride() == (1, 64)  # B's storage is B^T row-major
    assert int8_layout_problem(a, b) is None
    a2, b2 = int8_operands(32, 48, 64, device="cpu", generator=gen, layout="row")
    assert b2.stride() == (48, 1)
    assert "column-major" in (int8_layout_problem(a2, b2) or "")
    assert "m = 16" in (int8_layout_problem(a[:16], b) or "")  # _int_mm wants m > 16
    assert "multiples of 8" in (int8_layout_problem(a[:, :60], b[:60]) or "")
    assert "row-major" in (int8_layout_problem(a.t().contiguous().t(), b) or "")
    for x, y in ((a, b), (a2, b2)):
        if hasattr(torch, "_int_mm"):
            assert torch.equal(torch._int_mm(x, y), x.int() @ y.int())


def test_int8_measurement_runs_the_column_major_product(tmp_path):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "_int_mm"):
        pytest.skip("this torch has no _int_mm")
    from tracekit.probe.rho_kernels import measure_matrix

    col = measure_matrix("int8", 64, device="cpu", iterations=1, repeats=1, warmup=0)
    row = measure_matrix("int8-rowb", 64, device="cpu", iterations=1, repeats=1, warmup=0)
    assert col.skipped is None and col.tops and "B column-major" in col.method
    assert row.skipped is None and "B row-major" in row.method


def test_fma_kernel_unroll_and_the_peak_at_a_clock():
    """The FMA loop is unrolled 32x by default (4x left ~9% of the issue slots to the loop); the peak
    at a clock is SMs x 128 lanes x 2 x clock on Hopper: 132 SMs at the H200's 1980 MHz boost give
    the datasheet's 66.9 TFLOP/s."""
    from tracekit.probe.rho_kernels import FMA_UNROLL, fma_peak_at_clock, fma_source

    assert FMA_UNROLL == 32 and "#pragma unroll 32" in fma_source("fp32")
    assert "#pragma unroll 4\n" in fma_source("fp32", 4) and "fmaf" in fma_source("fp32", 4)
    assert "imad" in fma_source("int32")
    assert fma_peak_at_clock("9.0", 132, 1980.0) == pytest.approx(
        datasheet_for("NVIDIA H200")["fp32"], rel=2e-3
    )
    assert fma_peak_at_clock("9.0", 132, None) is None and fma_peak_at_clock("1.0", 10, 1000.0) is None
    with pytest.raises(ValueError):
        fma_source("fp32", 0)


def test_int8_rowb_is_accepted_and_unroll_checked_by_the_cli():
    assert main(["rho", "--device", "cpu", "--fma-unroll", "0"]) != 0


def test_the_rho_view_gives_the_clock_and_the_share_of_the_fma_peak_at_it():
    """`render.rho.table` of the document: a matrix figure measured with its SM clock under load
    says the clock beside its method and, on the next line, its share of the FMA peak at that
    clock (768 of 800 TFLOP/s: 96.0%); rho is the matrix over the fp32 FMA figure (768 / 64 = 12.0)."""
    from tracekit.render.rho import table

    r = Rho(
        RhoDevice(type="cuda", name="NVIDIA H200", torch="2.13"),
        [
            Measurement(
                "matrix",
                "bf16",
                "torch.mm",
                "8192^3",
                1,
                768.0,
                sm_clock_mhz=1980.0,
                peak_at_clock_tops=800.0,
            )
        ],
        [Measurement("vector", "fp32", "kernel", "-", 1, 64.0)],
        ["a note"],
    )
    lines = table(r.document()).splitlines()
    bf16 = next(i for i, ln in enumerate(lines) if ln.startswith("matrix  bf16"))
    assert "[8192^3, SM clock 1980 MHz under load]" in lines[bf16]
    assert lines[bf16 + 1].strip() == "96.0% of the FMA peak at that clock (800.0)"
    assert next(ln for ln in lines if ln.startswith("bf16 / fp32 FMA")).split()[4] == "12.0"
    assert lines[-1] == "note: a note"
