"""TP=N predicted from one rank's shard plus the link's collectives (tracekit/analyse/predict.py):
the sum checked on a simulated shard run and probe whose truth is known by construction; the
collective list against the one the real decoder recorded at TP=2; the committed H200 shard of TP=2
against the real two-H200 TP=2 CUDA-graph run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.analyse.predict import PredictError, predict, tp_collectives
from tracekit.cli.main import main
from tracekit.model.documents import given

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden": 4096, "heads": 32, "kv_heads": 8, "intermediate": 14336, "layers": 8, "vocab": 32000}


def _shard(tmp: Path, name: str, n: int, rounds: list[list[int]], *, shard: bool = True) -> Path:
    d = tmp / name
    d.mkdir()
    wl = {
        "tp": 1 if shard else n,
        "shard_of": n if shard else None,
        "shape": SHAPE,
        "batch": 1,
        "dtype": "bfloat16",
    }
    m = {
        "workload": wl,
        "unprofiled": {"rounds": [{"0": r} for r in rounds], "per_token_ns": {"0": rounds[-1]}},
    }
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def _probe(tmp: Path, ranks: int = 2) -> Path:
    # all-reduce 8192 B (bf16 hidden) 10 us, all-gather (32000 x 4 B in total) 20 us; other sizes far off
    rows = [
        {"op": "all_reduce", "bytes": 8, "time_us": 5.0, "in_place": True, "ranks": ranks, "mode": "nvlink"},
        {
            "op": "all_reduce",
            "bytes": 8192,
            "time_us": 10.0,
            "in_place": True,
            "ranks": ranks,
            "mode": "nvlink",
        },
        {
            "op": "all_reduce",
            "bytes": 8192,
            "time_us": 99.0,
            "in_place": False,
            "ranks": ranks,
            "mode": "nvlink",
        },
        {
            "op": "all_gather",
            "bytes": 128000,
            "time_us": 20.0,
            "in_place": True,
            "ranks": ranks,
            "mode": "nvlink",
        },
        {
            "op": "all_gather",
            "bytes": 1 << 20,
            "time_us": 80.0,
            "in_place": True,
            "ranks": ranks,
            "mode": "nvlink",
        },
        {
            "op": "all_reduce",
            "bytes": 8192,
            "time_us": 500.0,
            "in_place": True,
            "ranks": ranks,
            "mode": "pcie",
        },
    ]
    p = tmp / "probe.json"
    p.write_text(json.dumps({"rows": rows}))
    return p


def test_the_prediction_is_the_shard_plus_each_skipped_collective(tmp_path: Path) -> None:
    rounds = [[1_000_000, 1_000_100, 999_900], [1_010_000, 990_000, 1_000_000]]
    s4 = _shard(tmp_path, "s4", 4, rounds)
    doc = predict([str(s4)], f"{_probe(tmp_path)}@nvlink")
    (row,) = doc.predictions
    assert row.tp == 4 and row.shard.per_token_ns == 1_000_000
    # 16 all-reduces (2 per layer) at the in-place row's 10 us, one all-gather of 32000 float32 at 20 us;
    # the pcie row and the out-of-place row are not used
    assert row.transfer_ns.flat == 16 * 10_000 + 20_000
    assert row.predicted_ns.flat == 1_000_000 + 180_000
    # the probe ran at 2 ranks: ring scales by (4 - 1) / (2 - 1)
    assert row.ring_factor == 3.0 and row.transfer_ns.ring == 3 * 180_000
    lo, hi = row.shard.interval_ns
    assert lo < 1_000_000 < hi and row.predicted_ns.flat_interval == [lo + 180_000, hi + 180_000]
    assert "prediction" in doc.caveat


def test_a_probe_at_the_runs_rank_count_is_used_as_it_is(tmp_path: Path) -> None:
    doc = predict([str(_shard(tmp_path, "s4", 4, [[1_000_000]]))], str(_probe(tmp_path, ranks=4)))
    row = doc.predictions[0]
    assert row.ring_factor == 1.0 and row.predicted_ns.ring == row.predicted_ns.flat


def test_check_against_a_real_run(tmp_path: Path) -> None:
    s2 = _shard(tmp_path, "s2", 2, [[1_000_000, 1_000_000]])
    real = _shard(tmp_path, "real", 2, [[1_300_000, 1_300_000]], shard=False)
    row = predict([str(s2)], str(_probe(tmp_path)), checks=[str(real)]).predictions[0]
    check = given(row.check)
    assert check is not None and check.measured_ns == 1_300_000
    assert check.residual_ns == 1_300_000 - 1_180_000
    assert check.error == pytest.approx(1_180_000 / 1_300_000 - 1)
    with pytest.raises(PredictError, match="--check wants a real TP=N run"):
        predict([str(s2)], str(_probe(tmp_path)), checks=[str(s2)])


def test_the_collectives_are_those_the_real_decoder_recorded() -> None:
    """The torch-free list equals the one the capture wrote into the real two-H200 TP=2 run's manifest
    (counted there against its traced NCCL kernels: tests/test_capture.py)."""
    m = json.loads((ROOT / "traces" / "h200x2-tp2-b1-graphs" / "manifest.json").read_text())
    wl = m["workload"]
    assert tp_collectives(wl["shape"], 2, wl["batch"], wl["dtype"]) == wl["collectives"]


def test_the_h200_shard_of_tp2_predicts_the_real_tp2_run() -> None:
    """rank 0's shard of TP=2 on one H200 (traces/h200-shard2-graphs) plus the graph-timed NVLink probe
    of the two-H200 machine, against the real TP=2 CUDA-graph run on two H200s: the collectives add
    (the error is a few percent, not the 11% the 17 collectives are of the step), and the prediction
    is the low side (coordination is left out)."""
    doc = predict(
        [str(ROOT / "traces" / "h200-shard2-graphs")],
        str(ROOT / "reports" / "h200" / "links-graph.json") + "@nvlink",
        checks=[str(ROOT / "traces" / "h200x2-tp2-b1-graphs")],
    )
    row = doc.predictions[0]
    check = given(row.check)
    assert doc.probe.graph_timed is True and doc.probe.ranks == 2 and check is not None
    share = row.transfer_ns.flat / check.measured_ns
    assert share > 0.08  # the collectives matter at this size
    assert -0.08 < check.error < 0.0, check


def test_cli_refuses_a_run_that_is_not_a_shard(capsys: pytest.CaptureFixture[str]) -> None:
    probe = str(ROOT / "reports" / "h200" / "links-graph.json")
    assert main(["predict", "--shard", str(ROOT / "traces" / "h200x2-tp2-b1-graphs"), "--link", probe]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a shard run" in err[0]


def test_cli_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s8 = _shard(tmp_path, "s8", 8, [[900_000, 910_000]])
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "predict",
                "--shard",
                str(s8),
                "--link",
                str(_probe(tmp_path)),
                "--format",
                "json",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["kind"] == "tracekit.predict" and doc["predictions"][0]["ring_factor"] == 7.0
    assert main(["predict", "--shard", str(s8), "--link", str(_probe(tmp_path))]) == 0
    text = capsys.readouterr().out
    assert "A prediction, not a measurement" in text and "1.085" in text  # 0.905 + 0.180


def test_the_bare_row_list_of_tracekit_probe_is_read(tmp_path: Path) -> None:
    """`tracekit probe --format json` writes a list of rows, `compare-links` an object with rows[]:
    the link model reads both (replay.load_probe refused the probe's own output before)."""
    from tracekit.analyse.whatif.knobs import load_probe

    obj = _probe(tmp_path)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(json.loads(obj.read_text())["rows"]))
    assert load_probe(f"{bare}@nvlink").rows == load_probe(f"{obj}@nvlink").rows
    s4 = str(_shard(tmp_path, "s4", 4, [[1_000_000]]))
    a, b = predict([s4], f"{bare}@nvlink"), predict([s4], f"{obj}@nvlink")
    assert a.predictions == b.predictions and a.probe.ranks == 2
