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
    kernel_change,
    kernel_profile,
    line_at,
    load_gemm_table,
    per_kernel,
    table_step_ns,
)
from tracekit.analyse.compute.roofline import Peaks, load_peaks
from tracekit.cli.main import main
from tracekit.read import load_manifest, read_run

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

    u = dilation_of(load_manifest(folder / "manifest.json")).unprofiled
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
        from tracekit.read import load_manifest

        return measured_from(load_manifest(folder / "manifest.json"), str(folder))

    b1, b16 = run(ADV / "h200-graphs-b1"), run(ADV / "h200-graphs-b16")
    both = {b1.path, b16.path}
    assert needs_kernels([b1, b16], [64], table=False) == both  # two batch sizes: per-kernel
    assert needs_kernels([b1, b16], [16], table=False) == set()  # nothing to predict
    assert needs_kernels([b1], [64], table=False) == set()  # one run: the band, no trace needed
    assert needs_kernels([b1], [64], table=True) == {b1.path}  # one run + the table: its floors


# ------------------------------------------------------------------------------------------
# the GEMM table measured on the H200 (GPU stage gemmsweep, reports/advise/gemmsweep/)

SWEEP = ADV / "gemmsweep"
PEAK_FILES = ["--copy", str(ROOT / "reports/h200/copy.json"), "--rho", str(ROOT / "reports/rho/h200.json")]


def _rows(table: Path) -> dict[tuple[str, int], int]:
    return {(r["role"], r["m"]): r["time_ns"] for r in json.loads(table.read_text())["rows"]}


def test_h200_table_on_the_batch_1_trace_by_hand(tmp_path: Path) -> None:
    """Batch 1's graph capture + the H200 GEMM table predict 16 and 64 (the issue's must-show): each
    kind's added time checked against arithmetic on the table's rows and the KV cache's bytes, and
    the totals against the one-process means advise never saw (within the issue's 15%)."""
    out = tmp_path / "a.json"
    table = SWEEP / "gemm-table-h200.json"
    args = ["advise", "--tp1", str(SWEEP / "graphs-b1"), "--gemm-table", str(table), *PEAK_FILES]
    assert main([*args, "--batch", "16", "--batch", "64", "--format", "json", "-o", str(out)]) == 0
    rows = {r["batch"]: r for r in json.loads(out.read_text())["options"] if r["tp"] == 1}
    t = _rows(table)
    # one GEMM by hand: qkv (4096 x 6144) at M = 64 and 1 are table rows, 16,360 and 16,245 ns: each of
    # the 8 layers' qkv adds 115 ns; the step's GEMMs add the same per role, the LM head once
    assert (t["qkv", 64], t["qkv", 1]) == (16360, 16245)
    gemm = (
        8 * sum(t[r, 64] - t[r, 1] for r in ("qkv", "o", "gate_up", "down"))
        + t["lm_head", 64]
        - t["lm_head", 1]
    )
    assert gemm == 8 * (115 - 1235 + 94 + 4377) + 1933  # 28,741 ns: down (31,951 -> 36,328) the most
    # attention by its roofline: per layer and sequence, K and V of 8 KV heads x 128 x 64 cached
    # positions in bf16 (262,144 bytes) + q and its output, 32 heads x 128 (16,384), at the best local
    # copy rate of reports/h200/copy.json; 63 more sequences x 8 layers
    copy = json.loads((ROOT / "reports/h200/copy.json").read_text())
    bw = max(r["rw_gbps"] for r in copy if r["kind"] == "local")
    attn = 63 * 8 * (2 * 8 * 128 * 64 * 2 + 2 * 32 * 128 * 2) / bw
    base = _mean_ns(SWEEP / "graphs-b1")
    parts = {p["kind"]: p for p in rows[64]["batch_model"]["by_kind"]}
    assert parts["gemm"]["added_ns"] == pytest.approx(gemm, abs=1)  # no GEMM at its roofline here
    assert parts["attention"]["added_ns"] == pytest.approx(attn, abs=1)
    assert parts["other"]["added_ns"] == 0 and "held at batch 1" in parts["other"]["source"]
    assert rows[64]["per_token_latency_ns"] == pytest.approx(base + gemm + attn, abs=3)
    for b in (16, 64):
        measured = _mean_ns(SWEEP / "batches" / f"b{b}")
        assert abs(rows[b]["per_token_latency_ns"] / measured - 1) <= 0.15, b


def test_table_step_by_hand_and_against_a_shard_capture() -> None:
    doc = json.loads((SWEEP / "gemm-table-h200.json").read_text())
    t1, shape = load_gemm_table(doc, "t"), doc["shape"]
    r = _rows(SWEEP / "gemm-table-h200.json")
    # batch 1: 8 x (qkv 16,245 + o 13,228 + gate_up 61,425 + down 31,951) + the LM head's 63,712
    assert table_step_ns(t1, shape, 1, 1) == 8 * (16245 + 13228 + 61425 + 31951) + 63712 == 1_046_504
    assert table_step_ns(t1, shape, 1, 48) == pytest.approx(  # between the rows at 32 and 64
        8 * sum((r[k, 32] + r[k, 64]) / 2 for k in ("qkv", "o", "gate_up", "down"))
        + (r["lm_head", 32] + r["lm_head", 64]) / 2
    )
    # one rank's shard of TP=4: the table of that shard against the committed shard capture's GEMMs
    # (another session's process): a micro-benchmark of the same products, within 10%
    t4 = load_gemm_table(json.loads((SWEEP / "gemm-table-h200-tp4.json").read_text()), "t4")
    shard = kernel_profile(read_run([ROOT / "traces/h200-shard4-graphs-fused"]), "shard4")
    traced = sum(x for (role, _), x in zip(shard.roles, shard.times_ns, strict=True) if role != "attention")
    assert shard.tp == 4 and abs(table_step_ns(t4, shard.shape, 4, 1) / traced - 1) <= 0.10
    with pytest.raises(BatchModelError, match="another model shape or TP degree"):
        table_step_ns(t4, shard.shape, 2, 1)


def test_the_non_matrix_kernels_change_between_batch_1_and_16_not_16_and_64() -> None:
    """The traces name the change: at batch 1 the SwiGLU's silu and multiply are vectorised kernels,
    at 16 and 64 the strided halves run ATen's non-vectorised elementwise kernel and a copy is
    added (reports/advise/README.md): the line through 1 and 16 is flagged, 16 -> 64 is not."""
    b1, b16, b64 = (
        kernel_profile(read_run([d]), str(d))
        for d in (SWEEP / "graphs-b1", SWEEP / "graphs-b16", ADV / "h200-graphs-b64")
    )
    assert any("vectorized_elementwise_kernel" in n and "silu" in n for n in b1.other_names)
    assert not any("vectorized_elementwise_kernel" in n and "silu" in n for n in b16.other_names)
    assert b16.other_names == b64.other_names and len(b1.other_names) < len(b16.other_names)
    said = kernel_change([b1, b16], 64)
    assert said is not None and "between batch 1 and 16" in said
    assert kernel_change([b1, b16, b64], 128) is None  # 128 is read off the 16 -> 64 segment
    assert kernel_change([b16, b64], 8) is None
    pred = per_kernel([b1, b16], 1.5e6, b16, 64, Peaks())
    other = next(p for p in pred.parts if p.kind == "other")
    assert "change of kernels" in other.source


def test_three_traced_batches_predict_the_held_out_128_and_256(tmp_path: Path) -> None:
    """The per-kernel model, unchanged since the b1 + b16 -> b64 check, given traced runs at 1, 16
    (this stage) and 64 (an earlier session, the same decoder and torch): batch 128 and 256 were
    never given to it nor used to design it; within the issue's 15% of the one-process means."""
    out = tmp_path / "a.json"
    runs = [SWEEP / "graphs-b1", SWEEP / "graphs-b16", ADV / "h200-graphs-b64"]
    args = ["advise", *(w for d in runs for w in ("--tp1", str(d))), *PEAK_FILES]
    assert main([*args, "--batch", "128", "--batch", "256", "--format", "json", "-o", str(out)]) == 0
    rows = {r["batch"]: r for r in json.loads(out.read_text())["options"] if r["tp"] == 1}
    for b in (128, 256):
        assert rows[b]["model"] == "per-kernel" and rows[b]["status"] == "predicted from batch 64"
        measured = _mean_ns(SWEEP / "batches" / f"b{b}")
        assert abs(rows[b]["per_token_latency_ns"] / measured - 1) <= 0.15, b
        other = next(p for p in rows[b]["batch_model"]["by_kind"] if p["kind"] == "other")
        assert "change of kernels" not in other["source"]  # read off 16 -> 64: the same kernels


def test_what_the_table_only_model_misses_at_256_is_attention_and_the_non_matrix_kernels() -> None:
    """reports/advise/README.md: batch 1 + the table misses batch 256 by ~30%; the traced batch-256
    capture (stage batchtraces) says where: the GEMMs are predicted within 10%, while attention
    (rounds of work tiles) and the non-matrix kernels (held at batch 1's) come out at less than half
    of their measured time."""
    table = load_gemm_table(json.loads((SWEEP / "gemm-table-h200.json").read_text()), "t")
    b1 = kernel_profile(read_run([SWEEP / "graphs-b1"]), "b1")
    b256 = kernel_profile(read_run([ADV / "batchtraces" / "graphs-b256"]), "b256")
    peaks = load_peaks(ROOT / "reports/h200/copy.json", ROOT / "reports/rho/h200.json", "bfloat16")
    pred = from_table(table, "t", 1.4e6, 1, "b1", 256, b1.shape, 1, b1.kv_len, b1.dtype, peaks, b1)
    got = {p.kind: float(p.predicted_ns or 0.0) for p in pred.parts}
    assert all(p.predicted_ns for p in pred.parts)  # the base run has a trace: every kind has a time

    def measured(kind: str) -> float:
        if kind == "other":
            return b256.other_ns
        pick = (lambda r: r == "attention") if kind == "attention" else (lambda r: r != "attention")
        return sum(t for (r, _), t in zip(b256.roles, b256.times_ns, strict=True) if pick(r))

    assert abs(got["gemm"] / measured("gemm") - 1) <= 0.10
    assert got["attention"] < measured("attention") / 2 and got["other"] < measured("other") / 2
    # the non-matrix kernels at 256 are the same kernels as at 16 and 64: a growth, not a change
    b16 = kernel_profile(read_run([SWEEP / "graphs-b16"]), "b16")
    assert b256.other_names == b16.other_names
