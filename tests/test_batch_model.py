"""The batch model of `tracekit advise --batch` (tracekit/analyse/batch_model.py, docs/METHOD.md section
Batch scaling of a decode): its arithmetic by hand on small synthetic kernel tables, the committed
H200 check (given batch 1 and 16 traces, batch 64 predicted), and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.analyse.batch_model import (
    BatchModelError,
    KernelProfile,
    check_table,
    from_table,
    line_at,
    load_gemm_table,
    per_kernel,
)
from tracekit.analyse.compute.roofline import Peaks
from tracekit.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
ADV = ROOT / "reports" / "advise"
# a small decoder: hidden 256, 4 heads of 64, 2 KV heads, intermediate 512, one layer, vocab 1024
SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512, "layers": 1, "vocab": 1024}
ROLES = (("qkv", 0), ("attention", 0), ("o", 0), ("gate_up", 0), ("down", 0), ("lm_head", None))
# 1000 GB/s: a floor of B bytes is B / 1000 us = B ns / 1000 ... i.e. bytes / 1000 ns; no matrix rate
PEAKS = Peaks(bw_gbps=1000.0, bw_source="test", matrix_tflops=None, matrix_source="test")


def _profile(batch: int, times: tuple[float, ...], other: float, **kw: object) -> KernelProfile:
    return KernelProfile(
        f"run-b{batch}", 1, batch, kw.get("roles", ROLES), times, other, SHAPE, 8, "float32",  # type: ignore[arg-type]
    )  # fmt: skip


def test_line_at_by_hand() -> None:
    pts = [(1.0, 10.0), (16.0, 40.0)]
    assert line_at(pts, 64) == pytest.approx(10 + 30 * 63 / 15)  # 136: the line beyond the last point
    assert line_at(pts, 8) == pytest.approx(10 + 30 * 7 / 15)  # 24: between them
    three = [(16.0, 40.0), (1.0, 10.0), (64.0, 100.0)]  # any order
    assert line_at(three, 32) == pytest.approx(40 + 60 * 16 / 48)  # 60: the segment 16..64
    assert line_at(three, 128) == pytest.approx(100 + 60 * 64 / 48)  # 180: the last segment extended
    assert line_at(three, 1) == 10.0 and line_at([(4.0, 7.0)], 9) == 7.0


def test_per_kernel_by_hand_with_a_floor_that_binds() -> None:
    # times per step (ns) at batch 1 and 3, units in the decoder's order
    b1 = _profile(1, (2000, 100, 300, 3000, 2000, 1500), 5000)
    b3 = _profile(3, (2400, 160, 250, 3600, 2200, 1500), 6000)
    pred = per_kernel([b1, b3], 20_000, b3, 5, PEAKS)
    # the lines at 5: qkv 2800, attention 220, o 200, gate_up 4200, down 2400, lm_head 1500, other 7000.
    # o's line falls below its roofline at batch 5: weight 256 x 256 fp32 + 5 x (256 + 256) activations
    # = 4 x (65536 + 2560) = 272,384 bytes at 1000 GB/s = 272.384 ns > 200 ns: held at the floor.
    o_floor = 4 * (256 * 256 + 5 * (256 + 256)) / 1000
    assert o_floor == pytest.approx(272.384)
    # the others stay above theirs (gate_up: 4 x (256 x 1024 + 5 x 1280) / 1000 = 1074 ns < 4200)
    expected = 20_000 + (2800 - 2400) + (220 - 160) + (o_floor - 250) + (4200 - 3600) + (2400 - 2200) + 0
    expected += 7000 - 6000
    assert pred.per_token_ns == pytest.approx(expected)  # 22,282.384
    kinds = {p.kind: p for p in pred.parts}
    assert kinds["gemm"].base_ns == 2400 + 250 + 3600 + 2200 + 1500
    assert kinds["gemm"].predicted_ns == pytest.approx(2800 + o_floor + 4200 + 2400 + 1500)
    assert "1 unit(s) at their roofline" in kinds["gemm"].source
    assert (kinds["attention"].base_ns, kinds["attention"].predicted_ns) == (160, pytest.approx(220))
    assert (kinds["other"].base_ns, kinds["other"].predicted_ns) == (6000, pytest.approx(7000))
    assert pred.model == "per-kernel" and pred.base_batch == 3
    # the parts' added times are the whole change of the per-token time
    assert sum(p.added_ns for p in pred.parts) == pytest.approx(pred.per_token_ns - 20_000)


def test_per_kernel_refuses_runs_that_do_not_match() -> None:
    b1 = _profile(1, (2000, 100, 300, 3000, 2000, 1500), 5000)
    short = _profile(3, (2400, 160, 250, 3600, 2200), 6000, roles=ROLES[:5])
    with pytest.raises(BatchModelError, match="do not match batch 1's 6"):
        per_kernel([b1, short], 20_000, short, 5, PEAKS)
    eager = KernelProfile("e", 1, 3, ROLES, (1.0,) * 6, 1.0, SHAPE, 8, "float32", False)
    graphs = KernelProfile("g", 1, 1, ROLES, (1.0,) * 6, 1.0, SHAPE, 8, "float32", True)
    with pytest.raises(BatchModelError, match="an eager decode .* serving-style"):
        per_kernel([graphs, eager], 1.0, eager, 5, PEAKS)


def _table(rows: list[tuple[str, int, int]], shape: dict = SHAPE, dtype: str = "float32") -> dict:
    """rows: (role, m, time_ns), K x N of each role at TP=1 for `shape`."""
    kn = {
        "qkv": (256, 512),
        "o": (256, 256),
        "gate_up": (256, 1024),
        "down": (512, 256),
        "lm_head": (256, 1024),
    }
    return {
        "schema_version": "1.0",
        "kind": "tracekit.gemm-table",
        "device": "cpu",
        "dtype": dtype,
        "tp": 1,
        "shape": shape,
        "timing": "test",
        "rows": [{"role": r, "k": kn[r][0], "n": kn[r][1], "m": m, "time_ns": t} for r, m, t in rows],
    }


TABLE = _table(
    [
        *(("qkv", m, t) for m, t in ((1, 100), (2, 110), (4, 150))),
        *(("o", m, t) for m, t in ((1, 50), (2, 52), (4, 60))),
        *(("gate_up", m, t) for m, t in ((1, 200), (2, 230), (4, 330))),
        *(("down", m, t) for m, t in ((1, 120), (2, 125), (4, 145))),
        *(("lm_head", m, t) for m, t in ((1, 180), (2, 190), (4, 250))),
    ]
)


def test_gemm_table_by_hand() -> None:
    table = load_gemm_table(TABLE, "t.json")
    check_table(table, "t.json", SHAPE, 1, "float32")
    base = _profile(1, (2000, 100, 300, 3000, 2000, 1500), 5000)
    pred = from_table(table, "t.json", 10_000, 1, "run-b1", 3, SHAPE, 1, 8, "float32", PEAKS, base)
    # the table at M = 3 (between 2 and 4): qkv 130, o 56, gate_up 280, down 135, lm_head 220; minus M = 1
    gemm = (130 - 100) + (56 - 50) + (280 - 200) + (135 - 120) + (220 - 180)  # 171 ns
    # attention: its roofline's change from 1 to 3 sequences: keys + values of 2 KV heads x 8 positions
    # x 64 x 4 bytes per sequence (8192) + q and out of 4 heads x 64 x 4 bytes (2048), at 1000 GB/s
    attn = 2 * (8192 + 2048) / 1000
    assert pred.per_token_ns == pytest.approx(10_000 + gemm + attn)
    kinds = {p.kind: p for p in pred.parts}
    assert kinds["gemm"].added_ns == pytest.approx(gemm) and kinds["other"].added_ns == 0
    assert "held at batch 1" in kinds["other"].source and pred.model == "gemm-table"
    # without the base run's trace: the same change, no base times
    bare = from_table(table, "t.json", 10_000, 1, "run-b1", 3, SHAPE, 1, 8, "float32", PEAKS, None)
    assert bare.per_token_ns == pytest.approx(pred.per_token_ns)
    assert all(p.base_ns is None and p.predicted_ns is None for p in bare.parts)


def test_gemm_table_refusals() -> None:
    other = dict(SHAPE, hidden=512)
    with pytest.raises(BatchModelError, match=r"t.json at \$.rows\[0\]: qkv is 256 x 512, .* 512 x 1024"):
        check_table(load_gemm_table(TABLE, "t.json"), "t.json", other, 1, "float32")
    with pytest.raises(BatchModelError, match=r"at \$.dtype: the table timed float32, the run is bfloat16"):
        check_table(load_gemm_table(TABLE, "t.json"), "t.json", SHAPE, 1, "bfloat16")
    one_m = _table([(r, 1, 10) for r in ("qkv", "o", "gate_up", "down", "lm_head")])
    with pytest.raises(BatchModelError, match="qkv is timed at 1 batch size"):
        check_table(load_gemm_table(one_m, "t.json"), "t.json", SHAPE, 1, "float32")
    bad = dict(TABLE, rows=[{"role": "qkv", "k": "x"}])
    with pytest.raises(BatchModelError, match=r"t.json at \$.rows\[0\]"):
        load_gemm_table(bad, "t.json")


# ------------------------------------------------------------------------------------------
# the committed H200 runs (one H200, CUDA graphs, 7b shape, 8 layers)


def _mean_ns(folder: Path) -> float:
    from tracekit.analyse.dilation import dilation_of

    u = dilation_of(json.loads((folder / "manifest.json").read_text())).unprofiled
    assert u is not None
    return float(u.mean_ns)


def test_b1_and_b16_traces_predict_b64_within_the_band_the_readme_states(tmp_path: Path) -> None:
    """Given only the batch-1 and batch-16 graph captures (with traces), advise predicts batch 64;
    set against the one-process batch-64 mean (never given to it), within the issue's 15%
    (reports/advise/README.md: the model was designed after the batch-64 miss was seen, so this is
    the band the claim is held to, not a fitted one)."""
    out = tmp_path / "a.json"
    args = ["advise", "--tp1", str(ADV / "h200-graphs-b1"), "--tp1", str(ADV / "h200-graphs-b16")]
    peaks = ["--copy", str(ROOT / "reports/h200/copy.json"), "--rho", str(ROOT / "reports/rho/h200.json")]
    assert main([*args, *peaks, "--batch", "64", "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = [r for r in doc["options"] if r["batch"] == 64]
    assert row["model"] == "per-kernel" and row["status"] == "predicted from batch 16"
    measured = _mean_ns(ADV / "h200-graphs-batches" / "b64")
    assert abs(row["per_token_latency_ns"] / measured - 1) <= 0.15
    # the parts add up to the prediction: batch 16's measured time plus what each kind adds
    parts = row["batch_model"]["by_kind"]
    base = _mean_ns(ADV / "h200-graphs-b16")
    assert row["per_token_latency_ns"] == pytest.approx(base + sum(p["added_ns"] for p in parts), abs=3)
    # the GEMMs at batch 64 are the linear reading of 1 -> 16 (they are below their line, not at the
    # roofline: the weights' read alone, ~1.0 ms at the copy rate, says no growth at all)
    gemm = next(p for p in parts if p["kind"] == "gemm")
    assert gemm["predicted_ns"] > gemm["base_ns"] and "at their roofline" not in gemm["source"]


def test_one_run_gives_the_band_and_the_h200_runs_lie_above_it(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    fit = ADV / "h200-graphs-batches" / "b1"
    assert (
        main(
            [
                "advise",
                "--tp1",
                str(fit),
                "--batch",
                "16",
                "--batch",
                "64",
                "--format",
                "json",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    rows = {r["batch"]: r for r in json.loads(out.read_text())["options"]}
    for b in (16, 64):
        lo, hi = rows[b]["per_token_latency_range_ns"]
        assert rows[b]["model"] == "roofline band" and lo < hi
        assert rows[b]["per_token_latency_ns"] == lo and rows[b]["per_token_latency_no_overlap_ns"] == hi
        # the measured one-process means lie above even the no-overlap end: the band has no term for
        # the attention and non-matrix kernels' growth (reports/advise/README.md)
        assert _mean_ns(ADV / "h200-graphs-batches" / f"b{b}") > hi


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b16 = str(ADV / "h200-graphs-b16")
    cases = [
        # a compiled decode whose GEMM / attention units are not the reference decoder's order
        (
            ["--tp1", str(ROOT / "traces" / "h200-tp1-graphs-compile"), "--tp1", b16],
            "not the reference decoder's",
        ),
        # an eager batch-1 run beside a CUDA-graph batch-16 one
        (["--tp1", str(ROOT / "traces" / "h200-tp1"), "--tp1", b16], "the same decode at each batch"),
        # a table of another model shape (the CPU table times the tiny preset)
        (["--tp1", b16, "--gemm-table", str(ADV / "cpu-gemm-table.json")], "another model shape"),
    ]
    cases.append((["--tp1", b16, "--batch", "0"], "a batch has at least one sequence"))
    for args, msg in cases:
        assert main(["advise", *args, "--batch", "64"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tracekit: error: ") and msg in err[0], err


def test_which_runs_the_batch_model_reads_the_traces_of() -> None:
    from tracekit.analyse.advise_inputs import measured_from, needs_kernels

    def run(folder: Path):
        return measured_from(json.loads((folder / "manifest.json").read_text()), str(folder))

    b1, b16 = run(ADV / "h200-graphs-b1"), run(ADV / "h200-graphs-b16")
    both = {b1.path, b16.path}
    assert needs_kernels([b1, b16], [64], table=False) == both  # two batch sizes: per-kernel
    assert needs_kernels([b1, b16], [16], table=False) == set()  # nothing to predict
    assert needs_kernels([b1], [64], table=False) == set()  # one run: the band, no trace needed
    assert needs_kernels([b1], [64], table=True) == {b1.path}  # one run + the table: its floors
