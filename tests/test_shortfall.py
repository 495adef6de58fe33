"""Shortfall attribution on runs built in code with known intervals (docs/METHOD.md sections "Shortfall attribution" and "Dilation").

The expected figures are computed by hand in the comments from the intervals below, not from
the code's output.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from tracekit.analyse.attribution.options import AttributionOptions
from tracekit.analyse.attribution.pair import shortfall
from tracekit.analyse.attribution.reconcile import reconcile
from tracekit.errors import MatchError, RankError
from tracekit.model.events import Run, make_events
from tracekit.model.parts import LEAF_PARTS
from tracekit.read.manifests import attach_manifest

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
    return attach_manifest(Run(events=_events(rows), sources={0: "base-rank0"}), manifest)


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
    return attach_manifest(Run(events=_events(rows), sources={0: "tp2-rank0", 1: "tp2-rank1"}), manifest)


def test_terms_exact_by_hand_and_sum_to_s():
    sf = shortfall(baseline_run(), sharded_run(), AttributionOptions(skip_first=1))
    # steady steps 1..3, step time 620 (rank 0's window); rank 1's 600 ns window is padded with
    # 20 ns of idle. Rank 1's all-reduce starts at o = 400, 420, 405.
    #   rank 0: compute 300, wait o-360 (40, 60, 45), transfer 560-o (160, 140, 155), memory 25,
    #           idle 620-300-200-25 = 95
    #   rank 1: compute o-60 (340, 360, 345), wait 0, transfer 560-o, memory 25,
    #           idle 600-(o-60)-(560-o)-25 = 75, + pad 20 = 95
    # per token, mean over ranks: compute (300 + 1045/3)/2 = 1945/6, wait 145/6, transfer 455/3,
    # memory 25, idle 95. Terms (f = 1/2): compute 1945/6 - 320 = 25/6, memory 0,
    # transfer 455/3, wait 145/6, idle 95 - 155 = -60; they sum to S = 620 - 500 = 120.
    leaf = sf.uncorrected.leaf_terms
    assert leaf["compute"] == Fraction(25, 6) and leaf["memory"] == 0
    assert leaf["transfer"] == Fraction(455, 3) and leaf["wait"] == Fraction(145, 6)
    assert leaf["idle"] == -60 and leaf["sync"] == 0 and leaf["unknown"] == 0
    assert sf.uncorrected.shortfall_ns == 120
    assert sum(sf.uncorrected.terms().values()) == 120
    doc = sf.to_json()
    assert doc["kind"] == "tracekit.shortfall" and doc["n_ranks"] == 2
    assert doc["per_token_ns"] == {"baseline": 1000, "sharded": 620, "ideal": 500}
    assert doc["per_token_source"] == "trace"
    assert doc["shortfall_ns"] == 120
    # integers by largest remainder: compute 4.17 -> 4, transfer 151.67 -> 152, wait 24.17 -> 24
    assert doc["terms_ns"] == {"compute": 4, "memory": 0, "transfer": 152, "coordination": 24 - 60}
    assert doc["coordination_ns"] == {"wait": 24, "sync": 0, "idle": -60}
    assert sum(doc["terms_ns"].values()) == doc["shortfall_ns"]
    # per rank, each against the baseline: rank 0 compute -20, wait 48.33 -> 48; rank 1 compute
    # 85/3 = 28.33 -> 28, wait 0; both transfer 152, idle -60; each sums to S
    pr = {d["rank"]: d for d in doc["per_rank"]}
    assert pr[0]["terms_ns"]["compute"] == -20 and pr[0]["coordination_ns"]["wait"] == 48
    assert pr[1]["terms_ns"]["compute"] == 28 and pr[1]["coordination_ns"]["wait"] == 0
    assert pr[1]["pad_ns"] == 20 and pr[0]["pad_ns"] == 0
    for d in pr.values():
        assert sum(d["terms_ns"].values()) == 120
        assert d["coordination_ns"]["idle"] == -60
    # the critical path (docs/METHOD.md section "The dependency graph"): the step ends at rank 0's
    # window end (620, the later of the two: rank 1's ends at 600), which is its annotation's end
    # marker (the memcpy ends at 595, before it). A host marker is reached only by the host's
    # program order unless a synchronising call or a full launch queue ties it to the device; this
    # kernels-only trace records no runtime call at all, so nothing from the device reaches it.
    # Its one in-edge is the gap from the window start marker at t: host 620 on rank 0 and the walk
    # is done (exactly one step time); rank 1 is not on the path, offset 0.
    cp = doc["critical_path"]
    assert cp["step_ns"] == 620 and cp["offset_ns"] == 0
    assert cp["by_rank"]["0"] == {
        "compute_ns": 0,
        "memory_ns": 0,
        "transfer_ns": 0,
        "host_ns": 620,
        "sync_ns": 0,
        "unknown_ns": 0,
        "total_ns": 620,
    }
    assert cp["by_rank"]["1"]["total_ns"] == 0
    assert doc["shares"]["transfer"] == pytest.approx(152 / 120)
    # the all-reduce on rank 1 always arrives last
    assert {s["rank"]: s["last_count"] for s in doc["stragglers"]} == {0: 0, 1: 4}
    assert doc["collectives"]["instances"] == 4 and doc["collectives"]["per_token"] == 1.0
    assert doc["dilation"]["baseline"] is None and doc["dilation"]["inflated"] is None
    assert doc["verdict"].startswith("Transfer holds this run back")
    # spread over steps: the wait per step (mean over ranks) is 20, 30, 22.5 -> median 22.5
    assert 22 <= doc["spread_ns"]["wait"]["median"] <= 23


def _manifest(tp: int, unprof: list[int], prof: list[int]) -> dict:
    return {
        "workload": {"tp": tp, "step_pattern": "decode_step"},
        "unprofiled": {"per_token_ns": {str(r): unprof for r in range(tp)}},
        "profiled": {"per_token_ns": {str(r): prof for r in range(tp)}},
    }


def test_correction_takes_the_excess_from_every_ranks_coordination_in_proportion():
    # sharded unprofiled: 600 per token (traced 620): the 20 ns excess is host time, taken out of
    # each rank's wait + sync + idle in proportion. Rank 0: wait 145/3 + idle 95 = 430/3, kept at
    # 1 - 20 / (430/3) = 37/43; rank 1: idle 95 -> 75. The baseline is already at its unprofiled time.
    base = baseline_run(_manifest(1, [1000] * 4, [1000] * 4))
    shard = sharded_run(_manifest(2, [700, 600, 600, 600], [700, 620, 620, 620]))
    sf = shortfall(base, shard, AttributionOptions(skip_first=1))
    doc = sf.to_json()
    assert doc["per_token_source"] == "unprofiled"
    assert doc["per_token_ns"] == {"baseline": 1000, "sharded": 600, "ideal": 500}
    assert doc["shortfall_ns"] == 100
    keep = Fraction(37, 43)
    wait = (Fraction(145, 3) * keep + 0) / 2
    idle = (95 * keep + 75) / 2
    leaf = sf.corrected.leaf_terms
    assert leaf["wait"] == wait and leaf["idle"] == idle - 155
    assert leaf["compute"] == Fraction(25, 6) and leaf["transfer"] == Fraction(455, 3)
    assert sum(sf.corrected.terms().values()) == 100
    assert sum(doc["terms_ns"].values()) == 100
    for d in doc["per_rank"]:
        assert sum(d["terms_ns"].values()) == 100
    # the uncorrected block keeps the trace-only figures
    assert doc["uncorrected"]["shortfall_ns"] == 120 and doc["uncorrected"]["coordination_ns"]["idle"] == -60
    # the dilation stated is the one applied: traced mean step time / unprofiled mean token time
    assert doc["dilation"]["sharded"] == pytest.approx(620 / 600)
    assert doc["dilation"]["baseline"] == pytest.approx(1.0)
    assert doc["dilation"]["inflated"] is False
    assert "wait, sync and idle" in doc["dilation"]["reconciliation"]
    # the critical path is reconciled too: the 20 ns come out of its host (and sync) time. The
    # traced path is rank 0's host 620 alone (test_terms_exact_by_hand_and_sum_to_s: no runtime
    # call ties its window end to the device), so host keeps 1 - 20/620: 600 on rank 0, 0 on rank 1
    cp = doc["critical_path"]
    assert cp["step_ns"] == 600
    assert cp["by_rank"]["0"]["host_ns"] == 600 and cp["by_rank"]["1"]["host_ns"] == 0
    assert sum(d["total_ns"] for d in cp["by_rank"].values()) + cp["offset_ns"] == 600


def test_reconcile_rules_by_hand():
    parts = {p: Fraction(0) for p in LEAF_PARTS}
    parts.update(
        compute=Fraction(500), transfer=Fraction(100), wait=Fraction(50), sync=Fraction(30), idle=Fraction(20)
    )
    # GPU: excess 60 of wait + sync + idle = 100: each kept at 40%
    out, why = reconcile(parts, Fraction(640), "gpu")
    assert (out["idle"], out["sync"], out["wait"], out["compute"], out["transfer"]) == (8, 12, 20, 500, 100)
    assert "in proportion" in why
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

    from committed_pairs import committed_run, committed_shortfall

    from tracekit.analyse.timeline.breakdown import breakdown

    root = Path(__file__).resolve().parents[1] / "traces"
    base = committed_run("h200-tp1")
    text = committed_shortfall("h200-tp1", "h200-tp2").diagnosis()
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
    doc = shortfall(baseline_run(), _late_rank_run(), AttributionOptions(skip_first=1)).to_json()
    assert doc["schema_version"] == "1.5"
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
    from tracekit.model import documents
    from tracekit.render.shortfall import table as render_table

    doc = documents.convert(shortfall(baseline_run(), _late_rank_run()).to_json(), documents.Shortfall)
    text = render_table(doc, width=200, color=False)
    assert "wait ms (median of per-collective max)" in text


H200 = Path(__file__).resolve().parents[1] / "traces"


# ------------------------------------------------------------------------------------------
# malformed manifests and kernel-less traces (review findings 2, 3)


def test_workload_not_an_object_is_a_note_not_a_crash():
    m = _manifest(2, [600] * 4, [620] * 4)
    m["workload"] = "x"
    sf = shortfall(baseline_run(), sharded_run(m))
    dq = sf.to_json()["data_quality"]
    assert dq["counts"]["manifest_field_malformed"] == 1
    assert any("field 'workload' does not fit (Expected `object`, got `str`)" in n for n in dq["notes"])
    # the pattern falls back to the default (decode_step) and the figures are those without a manifest
    assert sf.uncorrected.shortfall_ns == 120


def test_malformed_unprofiled_block_is_treated_as_missing():
    m = _manifest(2, [600] * 4, [620] * 4)
    m["unprofiled"] = {"per_token_ns": {"0": "abc", "1": [600] * 4}}
    doc = shortfall(baseline_run(_manifest(1, [1000] * 4, [1000] * 4)), sharded_run(m)).to_json()
    assert doc["per_token_source"] == "trace" and doc["shortfall_ns"] == 120
    assert doc["data_quality"]["counts"]["manifest_field_malformed"] == 1
    assert any(
        "'unprofiled.per_token_ns'" in n and "treated as missing" in n for n in doc["data_quality"]["notes"]
    )


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


def test_host_timeline_run_without_collectives_is_refused_in_one_line_not_as_kernels_lost():
    """Two ranks with no collective: nothing puts their clocks or their steps on one line, so the
    cross-rank figures are refused (docs/METHOD.md section Clocks and step matching), for what it
    is, not as a trace that lost its kernels; one rank alone is attributed."""
    with pytest.raises(MatchError) as exc:
        shortfall(_host_run(1, 600), _host_run(2, 300))
    msg = str(exc.value)
    assert "\n" not in msg and "no collectives matched across ranks" in msg and "kernels missing" not in msg
    from tracekit.analyse.attribution.plan import attribute_run

    one = attribute_run(_host_run(1, 600))
    assert one.timeline == "host" and one.collectives.n_instances == 0
    assert "ranks_without_kernels" not in one.data_quality.counts


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
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.cli.main import main
    from tracekit.errors import MatchError
    from tracekit.read import read_run

    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    nokern = _nsys_without_kernels(tmp_path)
    run = read_run([nokern])
    assert run.ranks == [0, 1]
    # two ranks without a collective: their clocks and steps cannot be joined, refused in one line
    # (docs/METHOD.md section Clocks and step matching) before the attribution
    with pytest.raises(MatchError, match=r"no collectives matched across ranks.*capture the GPU kernels"):
        attribute_run(run, label="sharded")
    # one rank of it alone: it keeps its copies and sets (a GPU timeline) but lost every kernel
    import dataclasses

    one = dataclasses.replace(
        run,
        events=run.events[run.events["rank"] == 0],
        sources={0: run.sources[0]},
        rank_info={},
        manifest=None,
    )
    parts = attribute_run(one, label="sharded")
    assert parts.timeline == "gpu" and parts.collectives.n_instances == 0
    assert parts.data_quality.counts["ranks_without_kernels"] == 1
    base = read_run([H200 / "h200-tp1-nsys"])
    with pytest.raises(MatchError, match=r"cannot be aligned: there are no collectives"):
        shortfall(base, run)
    rc = main(["shortfall", "--baseline", str(H200 / "h200-tp1-nsys"), "--sharded", str(nokern)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("tracekit: error:") and err.count("\n") == 1
    # a TP=1 baseline has no collectives by nature and is still attributed (as the shortfall
    # attributes it: `attribute_run`, label baseline; the refusal above is the sharded run's):
    # the process's one attribution of it (tests/committed_pairs.py)
    from committed_pairs import committed_parts

    assert committed_parts("h200-tp1-nsys", "baseline").collectives.n_instances == 0


def test_cpu_transfer_diagnosis_names_gloo_not_a_gpu_link() -> None:
    """On a CPU (gloo) run whose largest term is transfer, the advice is about gloo's exchange, not NVLink."""
    from committed_pairs import committed_shortfall

    sf = committed_shortfall("cpu-tp1", "cpu-tp2")  # the process's one (tests/committed_pairs.py)
    doc = sf.to_json()
    terms = doc["terms_ns"]
    # premise checked, not skipped: the committed CPU run is transfer-dominated (gloo's exchange
    # over loopback dwarfs a 0.27 ms ideal token)
    assert max(terms, key=lambda k: terms[k]) == "transfer", terms
    assert sf.sharded.timeline == "host" and "gloo" in sf.diagnosis()
    # the verdict and the JSON call it gloo's exchange, never "bytes on the link"
    assert "bytes on the link" not in doc["verdict"] and "gloo" in doc["verdict"]
    assert "gloo" in doc["term_words"]["transfer"] and "scheduler" in doc["term_words"]["transfer"]
