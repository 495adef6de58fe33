"""The profiler correction through the replay (issue 23 item 7; docs/METHOD.md section Noise and the
profiler correction): wait, sync and idle read from the dependency graph re-timed without the
profiler's per-call cost, held to the ground-truth simulator's own figures."""

from __future__ import annotations

import json
import statistics
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.groundtruth.cases import CASES
from tests.groundtruth.harness import tolerance
from tests.groundtruth.kineto import write_run
from tests.groundtruth.sim import RunSpec
from tests.groundtruth.truth import case_truth
from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.correction import correct_run
from tracekit.analyse.attribution.correction_replay import graph_parts
from tracekit.analyse.attribution.pair import shortfall_from_parts
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.run import RunParts
from tracekit.model.parts import LEAF_PARTS
from tracekit.read import read_run


def _calibrate(spec: RunSpec, folder: Path) -> None:
    """The manifest's `profiler_calibration` as `capture` writes it (per kind the median over
    ranks, each rank's own in `per_rank_ns`), with the simulator's true cost per runtime call."""
    man = json.loads((folder / "manifest.json").read_text())
    per = {str(r): {"runtime": int(x.profiler_cost)} for r, x in enumerate(spec.ranks)}
    man["profiler_calibration"] = {
        "per_call_ns": {"runtime": int(statistics.median(v["runtime"] for v in per.values()))},
        "method": "test: the simulator's cost per call",
        "calls": 1,
        "per_rank_ns": per,
    }
    (folder / "manifest.json").write_text(json.dumps(man))


def _runs(name: str, root: Path, calibrated: bool) -> tuple[RunParts, RunParts]:
    case = CASES[name]
    assert case.sharded is not None
    out = []
    for label, spec in (("baseline", case.baseline), ("sharded", case.sharded)):
        d = root / label
        write_run(spec, d)
        if calibrated:
            _calibrate(spec, d)
        out.append(attribute_run(AnalysedRun.of(read_run([str(d)], cache=False)), label=label))
    return out[0], out[1]


def _off(sf: dict[str, Any], truth: dict[str, Any]) -> list[str]:
    bad = []
    for pr in sf["per_rank"]:
        r = int(pr["rank"])
        for k in ("wait", "sync", "idle"):
            got, want = pr["coordination_ns"][k], float(truth["terms_rank"][r][k])
            if abs(got - want) > tolerance(want):
                bad.append(f"rank {r} {k}: {got} vs {want:.0f}")
    for k in ("wait", "sync", "idle"):
        got, want = sf["coordination_ns"][k], float(truth["terms"][k])
        if abs(got - want) > tolerance(want):
            bad.append(f"{k}: {got} vs {want:.0f}")
    return bad


def _path_off(sf: dict[str, Any], truth: dict[str, Any]) -> list[str]:
    bad = []
    for r, want_r in truth["path"].items():
        row = sf["critical_path"]["by_rank"].get(str(r), {})
        for k in ("host", "compute", "memory", "transfer", "sync"):
            got, want = row.get(f"{k}_ns", 0), float(want_r[k])
            if abs(got - want) > tolerance(want):
                bad.append(f"path rank {r} {k}: {got} vs {want:.0f}")
    return bad


def test_the_profiler_making_another_rank_last_gives_its_wait_back(tmp_path: Path) -> None:
    """Issue 23 item 7: rank 1 arrives last without the profiler (20 us sleeps), rank 0's 12 us per
    call makes rank 0 last in the trace. With each rank's measured cost removed call by call in the
    replay, every rank's wait, sync and idle and the critical path are the unprofiled run's (rank 0
    waits 182.5 us per token, rank 1 none; the path runs through rank 1's host); the proportional
    rule on the same runs cannot give them back."""
    truth = case_truth("profiler_changes_last_rank")
    base, shard = _runs("profiler_changes_last_rank", tmp_path, calibrated=True)
    sf = shortfall_from_parts(base, shard).to_json()
    assert _off(sf, truth) == []
    # the path walked on the corrected timeline: rank 1's host (its sleeps), not rank 0's profiler cost
    assert _path_off(sf, truth) == []
    corr = sf["dilation"]["correction"]
    assert corr["sharded"]["method"] == "replay"
    assert corr["sharded"]["cost_source"] == "manifest calibration"
    # each rank's measured cost identifies the split: no ranges, and the verdict names the path's rank
    assert "identified" not in corr["sharded"] and "ranges" not in corr["sharded"]
    assert "rank 1's host time" in sf["verdict"]
    assert any("removed call by call in the replay" in n for n in sf["data_quality"]["notes"])
    # the figures still sum exactly
    assert sum(sf["terms_ns"].values()) == sf["shortfall_ns"]
    for pr in sf["per_rank"]:
        assert sum(pr["terms_ns"].values()) == sf["shortfall_ns"]
    # the same runs without their graph: the proportional rule, which swaps wait and idle
    base.graph = shard.graph = None
    base.__dict__.pop("_corrections", None)
    shard.__dict__.pop("_corrections", None)
    prop = shortfall_from_parts(base, shard).to_json()
    assert prop["dilation"]["correction"]["sharded"]["method"] == "proportional"
    assert any(b.startswith("rank 0 wait") for b in _off(prop, truth))
    assert any(b.startswith("path rank 1 host") for b in _path_off(prop, truth))
    assert sum(prop["terms_ns"].values()) == prop["shortfall_ns"]


@pytest.mark.parametrize("name", ["gpu_bound_tp2", "sync_per_layer", "nccl_stream_event_waits"])
def test_the_graph_reads_each_window_as_the_partition_does(name: str, tmp_path: Path) -> None:
    """At the measured times, the graph's reading of every (rank, step) window (`graph_parts`) is the
    partition's own (`rank_steps`), so the correction moves a part only by what the corrected
    timeline changes."""
    case = CASES[name]
    assert case.sharded is not None
    write_run(case.sharded, tmp_path)
    parts = attribute_run(AnalysedRun.of(read_run([str(tmp_path)], cache=False)))
    g = parts.graph
    assert g is not None
    got = graph_parts(g, g.t)
    pos = {s: i for i, s in enumerate(g.steps)}
    for row in parts.rank_steps.itertuples():
        i, k = g.ranks.index(int(row.rank)), pos[int(row.step)]
        for p in LEAF_PARTS:
            assert int(got[p][i, k]) == int(getattr(row, f"{p}_ns")), (row.rank, row.step, p)


def test_a_correction_of_nothing_changes_nothing(tmp_path: Path) -> None:
    """A run corrected to its own traced per-token time with a calibration of 0 per call keeps every
    rank's traced parts and critical path exactly."""
    case = CASES["host_sleep_rank1"]
    assert case.sharded is not None
    write_run(case.sharded, tmp_path)
    parts = attribute_run(AnalysedRun.of(read_run([str(tmp_path)], cache=False)))
    parts.profiler_calibration = {"per_call_ns": {"runtime": 0}, "method": "test", "calls": 1}
    c = correct_run(parts, Fraction(parts.per_token["window"]))
    assert c.method == "replay"
    for r, p in parts.per_rank.items():
        assert {k: c.per_rank[r][k] for k in LEAF_PARTS} == {k: p[k] for k in LEAF_PARTS}
    assert c.path["by_rank"] == parts.path_token["by_rank"]
    assert c.rows is not None
    assert np.array_equal(c.rows.sum(axis=-1), np.broadcast_to(c.rows.sum(axis=-1)[:, :1], c.rows.shape[:2]))


def test_a_path_top_that_tops_every_split_of_the_cost_is_named_else_not() -> None:
    """`prose.robust_path_top` reads `_identify`'s ranges: rank 1's host time of 40-44 ms stays above
    every other component's largest value (rank 0's host at most 3 ms) in every split of an
    unidentified profiler cost, so the path's cause is named; when rank 0's host can reach 41 ms in
    some split, the top is not robust and nothing is named (the h200-tp2-straggler report and the
    ground-truth case profiler_changes_last_rank are the two sides on real and simulated runs)."""
    from tracekit.analyse.prose import robust_path_top

    ranges = {
        "wait": {"0": [38_000_000, 44_000_000], "1": [0, 10], "mean": [19_000_000, 22_000_000]},
        "path_host": {"0": [1_000_000, 3_000_000], "1": [40_000_000, 44_000_000]},
        "path_compute": {"0": [100_000, 100_000], "1": [90_000, 95_000]},
    }
    assert robust_path_top(ranges) == ("1", "host", 40_000_000, 44_000_000)
    ranges["path_host"]["0"] = [1_000_000, 41_000_000]
    assert robust_path_top(ranges) is None
    assert robust_path_top(None) is None
