"""Shortfall attribution on runs built in code with known intervals (METHOD.md 6, 9).

The expected figures are computed by hand in the comments from the intervals below, not from
the code's output.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from tracekit.analyse.shortfall import LEAF_PARTS, reconcile, shortfall
from tracekit.errors import RankError
from tracekit.model.events import Run, make_events

GEMM = "ampere_sgemm_128x64_nn"
COPY = "Memcpy HtoD (Pageable -> Device)"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _events(rows: list[tuple[int, str, str, int, int]]):
    return make_events(
        {
            "rank": [r[0] for r in rows],
            "device": [r[0] if r[1] != "annotation" else -1 for r in rows],
            "stream": [7 if r[1] != "annotation" else 1 for r in rows],
            "kind": [r[1] for r in rows],
            "name": [r[2] for r in rows],
            "start_ns": [r[3] for r in rows],
            "end_ns": [r[4] for r in rows],
        }
    )


def baseline_run(manifest=None) -> Run:
    # 4 steps of 1000 ns: compute 640 [100, 740), memcpy 50 [750, 800), idle 310
    rows = []
    for k in range(4):
        t = k * 10_000
        rows += [
            (0, "annotation", f"decode_step#{k}", t, t + 1000),
            (0, "kernel", GEMM, t + 100, t + 740),
            (0, "memcpy", COPY, t + 750, t + 800),
        ]
    return Run(events=_events(rows), sources={0: "base-rank0"}, manifest=manifest)


#: rank 1's all-reduce start offset per step: rank 0 starts at +360 every step, so its wait is
#: (offset - 360) and its transfer (560 - offset): steps 1..3 -> waits 40, 60, 45; transfers 160, 140, 155
R1_AR_START = [400, 400, 420, 405]


def sharded_run(manifest=None) -> Run:
    rows = []
    for k in range(4):
        t = k * 10_000
        # rank 0 (the slowest: 620 ns window): compute [50, 350) = 300, AR [360, 560), memcpy [570, 595) = 25
        rows += [
            (0, "annotation", f"decode_step#{k}", t, t + 620),
            (0, "kernel", GEMM, t + 50, t + 350),
            (0, "kernel", AR, t + 360, t + 560),
            (0, "memcpy", COPY, t + 570, t + 595),
        ]
        # rank 1: 600 ns window
        o = R1_AR_START[k]
        rows += [
            (1, "annotation", f"decode_step#{k}", t, t + 600),
            (1, "kernel", GEMM, t + 50, t + o - 10),
            (1, "kernel", AR, t + o, t + 560),
            (1, "memcpy", COPY, t + 570, t + 595),
        ]
    return Run(events=_events(rows), sources={0: "tp2-rank0", 1: "tp2-rank1"}, manifest=manifest)


def test_terms_exact_by_hand_and_sum_to_s():
    sf = shortfall(baseline_run(), sharded_run(), skip_first=1)
    # exact per-token leaf terms (f = 1/2), steady steps 1..3:
    #   compute  300 - 640/2 = -20          memory 25 - 50/2 = 0
    #   transfer (160+140+155)/3 = 455/3    wait (40+60+45)/3 = 145/3
    #   idle     rank 0: 620 - 300 - 25 - 200 = 95; 95 - 310/2 = -60;  sync 0
    leaf = sf.uncorrected.leaf_terms
    assert leaf["compute"] == -20 and leaf["memory"] == 0
    assert leaf["transfer"] == Fraction(455, 3) and leaf["wait"] == Fraction(145, 3)
    assert leaf["idle"] == -60 and leaf["sync"] == 0 and leaf["unknown"] == 0
    # S = 620 - 1000/2 = 120, and the exact terms sum to it
    assert sf.uncorrected.shortfall_ns == 120
    assert sum(sf.uncorrected.terms().values()) == 120
    doc = sf.to_json()
    assert doc["kind"] == "tracekit.shortfall" and doc["n_ranks"] == 2
    assert doc["per_token_ns"] == {"baseline": 1000, "sharded": 620, "ideal": 500}
    assert doc["per_token_source"] == "trace"
    assert doc["shortfall_ns"] == 120
    # integers by largest remainder: transfer 151.67 -> 152, wait 48.33 -> 48
    assert doc["terms_ns"] == {"compute": -20, "memory": 0, "transfer": 152, "coordination": 48 - 60}
    assert doc["coordination_ns"] == {"wait": 48, "sync": 0, "idle": -60}
    assert sum(doc["terms_ns"].values()) == doc["shortfall_ns"]
    assert sum(doc["coordination_ns"].values()) == doc["terms_ns"]["coordination"]
    assert doc["shares"]["transfer"] == pytest.approx(152 / 120)
    # the all-reduce on rank 1 always arrives last
    assert {s["rank"]: s["last_count"] for s in doc["stragglers"]} == {0: 0, 1: 4}
    assert doc["collectives"]["instances"] == 4 and doc["collectives"]["per_token"] == 1.0
    assert doc["dilation"]["baseline"] is None and doc["dilation"]["inflated"] is None
    assert doc["verdict"].startswith("Transfer holds this run back")
    # spread over steps: wait per step is 40, 60, 45 -> median term 45
    assert doc["spread_ns"]["wait"]["median"] == 45


def _manifest(tp: int, unprof: list[int], prof: list[int]) -> dict:
    return {
        "workload": {"tp": tp, "step_pattern": "decode_step"},
        "unprofiled": {"per_token_ns": {str(r): unprof for r in range(tp)}},
        "profiled": {"per_token_ns": {str(r): prof for r in range(tp)}},
    }


def test_correction_to_unprofiled_takes_excess_from_idle_first():
    # sharded unprofiled: 600 per token (traced 620): on a GPU timeline the 20 ns excess comes out
    # of idle (95 -> 75). The baseline's unprofiled time equals its traced time (nothing to do).
    base = baseline_run(_manifest(1, [1000] * 4, [1000] * 4))
    shard = sharded_run(_manifest(2, [700, 600, 600, 600], [700, 620, 620, 620]))
    sf = shortfall(base, shard, skip_first=1)
    doc = sf.to_json()
    assert doc["per_token_source"] == "unprofiled"
    assert doc["per_token_ns"] == {"baseline": 1000, "sharded": 600, "ideal": 500}
    assert doc["shortfall_ns"] == 100
    leaf = sf.corrected.leaf_terms
    assert leaf["idle"] == 75 - 155 and leaf["compute"] == -20 and leaf["transfer"] == Fraction(455, 3)
    assert sum(sf.corrected.terms().values()) == 100
    assert sum(doc["terms_ns"].values()) == 100
    # the uncorrected block keeps the trace-only figures
    assert doc["uncorrected"]["shortfall_ns"] == 120 and doc["uncorrected"]["coordination_ns"]["idle"] == -60
    assert doc["dilation"]["sharded"] == pytest.approx(620 / 600)
    assert doc["dilation"]["baseline"] == pytest.approx(1.0)
    assert doc["dilation"]["inflated"] is False
    assert "idle" in doc["dilation"]["reconciliation"]


def test_reconcile_rules_by_hand():
    parts = {p: Fraction(0) for p in LEAF_PARTS}
    parts.update(
        compute=Fraction(500), transfer=Fraction(100), wait=Fraction(50), sync=Fraction(30), idle=Fraction(20)
    )
    # GPU: excess 60 = idle 20 + sync 30 + 10 of wait
    out, why = reconcile(parts, Fraction(640), "gpu")
    assert (out["idle"], out["sync"], out["wait"], out["compute"], out["transfer"]) == (0, 0, 40, 500, 100)
    assert "idle then sync then wait" in why
    # GPU: excess 200 > idle+sync+wait (100): those emptied, then 100 more in proportion of 600 -> x 5/6
    out, _ = reconcile(parts, Fraction(500), "gpu")
    assert (
        out["compute"] == Fraction(500 * 5, 6)
        and out["transfer"] == Fraction(100 * 5, 6)
        and out["idle"] == 0
    )
    assert sum(out.values()) == 500
    # host timeline: all but transfer scaled by one factor: (700 - 100) / (600) ... target 400 -> (400-100)/600
    out, why = reconcile(parts, Fraction(400), "host")
    assert out["transfer"] == 100 and out["compute"] == Fraction(500 * 300, 600) and out["idle"] == 10
    assert sum(out.values()) == 400 and "transfer" in why
    # traced shorter than unprofiled: everything scaled up in proportion
    out, _ = reconcile(parts, Fraction(1400), "gpu")
    assert out["compute"] == 1000 and out["idle"] == 40


def test_missing_rank_file_named():
    shard = sharded_run(_manifest(4, [600] * 4, [620] * 4))
    with pytest.raises(RankError, match=r"tp=4 .*rank\(s\) 2, 3"):
        shortfall(baseline_run(), shard)


def test_tp1_baseline_without_collectives_and_transfer_term_from_sharded_only():
    sf = shortfall(baseline_run(), sharded_run())
    assert sf.baseline.collectives.n_instances == 0
    assert sf.baseline.per_token["transfer"] == 0 and sf.baseline.per_token["wait"] == 0


def test_h200_diagnosis_names_the_host_bound_baseline() -> None:
    """On the committed H200 runs the TP=1 GPU is busy a small share of each token; the diagnosis says
    so with the share computed from the baseline's own breakdown and unprofiled per-token times."""
    import json
    import re
    from pathlib import Path

    from tracekit.analyse.breakdown import breakdown
    from tracekit.analyse.shortfall import shortfall
    from tracekit.read import read_run

    root = Path(__file__).resolve().parents[1] / "traces"
    base, sharded = read_run([root / "h200-tp1"]), read_run([root / "h200-tp2"])
    text = shortfall(base, sharded).diagnosis()
    m = re.search(r"busy only (\d+)% of a token", text)
    assert m, text
    # independent figure: GPU compute+memory per steady step (trace) over the unprofiled mean token
    bd = breakdown(base, skip_first=1).to_json()
    busy_ns = [s["parts_ns"]["compute"] + s["parts_ns"]["memory"] for s in bd["steps"]]
    manifest = json.loads((root / "h200-tp1" / "manifest.json").read_text())
    unprof = manifest["unprofiled"]["per_token_ns"]["0"][1:]
    share = (sum(busy_ns) / len(busy_ns)) / (sum(unprof) / len(unprof))
    assert abs(int(m.group(1)) - round(share * 100)) <= 2
    assert share < 0.5 and "host" in text


def test_swapped_baseline_and_sharded_is_refused_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from tracekit.cli.main import main

    root = Path(__file__).resolve().parents[1] / "traces"
    rc = main(["shortfall", "--baseline", str(root / "cpu-tp2"), "--sharded", str(root / "cpu-tp1")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error:") and "swapped" in err and err.count("\n") == 1
