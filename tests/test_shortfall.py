"""Shortfall attribution on runs built in code with known intervals (METHOD.md 6, 9).

The expected figures are computed by hand in the comments from the intervals below, not from
the code's output.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

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


# ------------------------------------------------------------------------------------------
# the collectives table: the wait of the rank that waited (review finding 1)

#: rank 1's all-reduce start per step; rank 0 starts at +360 and both end at +800, so rank 0 waits
#: (start - 360) = 2, 300, 300, 300 and rank 1 (the last arriver) waits 0 in every instance
R1_LATE_START = [362, 660, 660, 660]


def _late_rank_run() -> Run:
    rows = []
    for k, o in enumerate(R1_LATE_START):
        t = k * 10_000
        rows += [
            (0, "annotation", f"decode_step#{k}", t, t + 1000),
            (0, "kernel", GEMM, t + 50, t + 350),
            (0, "kernel", AR, t + 360, t + 800),
            (1, "annotation", f"decode_step#{k}", t, t + 1000),
            (1, "kernel", GEMM, t + 50, t + o - 10),
            (1, "kernel", AR, t + o, t + 800),
        ]
    return Run(events=_events(rows), sources={0: "r0", 1: "r1"})


def test_collective_wait_median_is_the_median_of_per_instance_max_wait():
    doc = shortfall(baseline_run(), _late_rank_run(), skip_first=1).to_json()
    assert doc["schema_version"] == "1.4"
    (op,) = doc["collectives"]["by_op"]
    assert op["op"] == "all_reduce" and op["count"] == 4
    # by hand: per instance the largest wait is rank 0's: 2, 300, 300, 300 -> median 300. The old
    # figure, the median over the 8 (instance, rank) rows [0, 0, 0, 0, 2, 300, 300, 300], was 1.
    assert op["wait_ns_median"] == 300
    # the skew (last start - first start) is the same 2, 300, 300, 300: rank 0 waits the whole skew
    assert op["skew_ns_median"] == 300
    # transfer per row: 800 - last start = 438, 140, 140, 140 on both ranks -> median 140
    assert op["transfer_ns_median"] == 140


def test_cli_table_header_says_what_the_wait_column_is():
    from tracekit.cli.shortfall import render_table

    text = render_table(shortfall(baseline_run(), _late_rank_run()), width=200, color=False)
    assert "wait ms (median of per-collective max)" in text


H200 = Path(__file__).resolve().parents[1] / "traces"


def test_h200_tp2_all_reduce_wait_tracks_the_skew() -> None:
    """At TP=2 the early rank waits from its start to the late rank's start, i.e. the whole skew,
    as long as every rank's kernel ends after the last arrival (checked here on the trace first).
    The reported wait median then equals the skew median; the old per-row median was ~0."""
    import numpy as np

    from tracekit.analyse.shortfall import attribute_run
    from tracekit.read import read_run

    if not (H200 / "h200-tp2").is_dir():
        pytest.skip("traces/h200-tp2 not in this checkout")
    base, sharded = read_run([H200 / "h200-tp1"]), read_run([H200 / "h200-tp2"])
    parts = attribute_run(sharded, label="sharded")
    pr = parts.collectives.per_rank
    ar = pr[pr["op"] == "all_reduce"]
    last = ar.groupby("instance")["start_ns"].transform("max")
    assert (ar["end_ns"] >= last).all(), "premise: every all_reduce ends after its last arrival"
    # independent: per instance, the first rank's start to the last rank's start
    first = ar.groupby("instance")["start_ns"].min()
    skew_median = float(np.median((ar.groupby("instance")["start_ns"].max() - first).to_numpy()))
    doc = shortfall(base, sharded).to_json()
    op = next(o for o in doc["collectives"]["by_op"] if o["op"] == "all_reduce")
    assert skew_median > 100_000  # ~0.7 ms on this capture
    assert abs(op["wait_ns_median"] - skew_median) <= 0.2 * skew_median
    assert abs(op["skew_ns_median"] - skew_median) <= 1
    # the old figure (median over every (instance, rank) row) is far below: the last arriver waits 0
    assert float(ar["wait_ns"].median()) < 0.1 * skew_median


# ------------------------------------------------------------------------------------------
# malformed manifests and kernel-less traces (review findings 2, 3)


def test_workload_not_an_object_is_a_note_not_a_crash():
    m = _manifest(2, [600] * 4, [620] * 4)
    m["workload"] = "x"
    sf = shortfall(baseline_run(), sharded_run(m))
    dq = sf.to_json()["data_quality"]
    assert dq["counts"]["manifest_field_malformed"] == 1
    assert any("'workload' is not an object" in n for n in dq["notes"])
    # the pattern falls back to the default (decode_step) and the figures are those without a manifest
    assert sf.uncorrected.shortfall_ns == 120


def test_malformed_unprofiled_block_is_treated_as_missing():
    m = _manifest(2, [600] * 4, [620] * 4)
    m["unprofiled"] = {"per_token_ns": {"0": "abc", "1": [600] * 4}}
    doc = shortfall(baseline_run(_manifest(1, [1000] * 4, [1000] * 4)), sharded_run(m)).to_json()
    assert doc["per_token_source"] == "trace" and doc["shortfall_ns"] == 120
    assert doc["data_quality"]["counts"]["manifest_field_malformed"] == 1
    assert any("'unprofiled'" in n and "treated as missing" in n for n in doc["data_quality"]["notes"])


def _host_run(n_ranks: int, op_ns: int) -> Run:
    """CPU-only steps: one host op per step and rank, no GPU events, no collectives."""
    rows = []
    for k in range(4):
        t = k * 10_000
        for r in range(n_ranks):
            rows += [
                (r, "annotation", f"decode_step#{k}", t, t + 1000),
                (r, "cpu_op", "aten::mm", t + 100, t + 100 + op_ns),
            ]
    ev = _events(rows)
    return Run(events=ev, sources={r: f"cpu-r{r}" for r in range(n_ranks)})


def test_host_timeline_run_without_collectives_is_not_refused():
    sf = shortfall(_host_run(1, 600), _host_run(2, 300))
    assert sf.sharded.timeline == "host" and sf.sharded.collectives.n_instances == 0
    assert "ranks_without_kernels" not in sf.data_quality.counts


def _nsys_without_kernels(tmp_path: Path) -> Path:
    import gzip
    import shutil
    import sqlite3

    src = H200 / "h200-tp2-nsys" / "nsys.sqlite.gz"
    if not src.is_file():
        pytest.skip("traces/h200-tp2-nsys not in this checkout")
    d = tmp_path / "nokern"
    d.mkdir()
    with gzip.open(src) as f, open(d / "nsys.sqlite", "wb") as o:
        shutil.copyfileobj(f, o)
    shutil.copy(H200 / "h200-tp2-nsys" / "manifest.json", d / "manifest.json")
    con = sqlite3.connect(d / "nsys.sqlite")
    n = con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL").rowcount
    con.commit()
    con.close()
    assert n > 0
    return d


def test_nsys_run_without_kernels_is_refused_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tracekit.analyse.shortfall import attribute_run
    from tracekit.cli.main import main
    from tracekit.errors import MatchError
    from tracekit.read import read_run

    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    nokern = _nsys_without_kernels(tmp_path)
    run = read_run([nokern])
    assert run.ranks == [0, 1]
    parts = attribute_run(run, label="sharded")
    # both ranks keep their copies and sets (a GPU timeline) but lost every kernel
    assert parts.timeline == "gpu" and parts.collectives.n_instances == 0
    assert parts.data_quality.counts["ranks_without_kernels"] == 2
    base = read_run([H200 / "h200-tp1-nsys"])
    with pytest.raises(MatchError, match=r"no collectives \(kernels missing from the trace\?\)"):
        shortfall(base, run)
    rc = main(["shortfall", "--baseline", str(H200 / "h200-tp1-nsys"), "--sharded", str(nokern)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("tracekit: error:") and err.count("\n") == 1
    # a TP=1 baseline has no collectives by nature and is still attributed
    assert shortfall(base, read_run([H200 / "h200-tp2-nsys"])).baseline.collectives.n_instances == 0


def test_cpu_transfer_diagnosis_names_gloo_not_a_gpu_link() -> None:
    """On a CPU (gloo) run whose largest term is transfer, the advice is about gloo's exchange, not NVLink."""
    from pathlib import Path

    from tracekit.analyse.shortfall import shortfall
    from tracekit.read import read_run

    root = Path(__file__).resolve().parents[1] / "traces"
    sf = shortfall(read_run([root / "cpu-tp1"]), read_run([root / "cpu-tp2"]))
    terms = sf.to_json()["terms_ns"]
    if max(terms, key=lambda k: terms[k]) != "transfer":
        pytest.skip("the committed CPU run is not transfer-dominated")
    assert sf.sharded.timeline == "host" and "gloo" in sf.diagnosis()
