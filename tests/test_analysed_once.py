"""One analysed run per run (issue 18): a report of a TP pair classifies each run once, partitions
its step windows once and builds each rank's layer unions once, where breakdown and shortfall used
to do it twice each (and the critical path a third time for the layer unions).

Counted by wrapping the functions that do the work (every tracekit module's binding of them), on
the committed CPU pair; and the shared analysis changes no figure: the report's breakdown and
shortfall equal those of separate, unshared runs."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tracekit as tk
import tracekit.analyse.timeline.partition as partition_mod
import tracekit.analyse.timeline.steps as steps_mod
import tracekit.classify as classify_mod
from tracekit.cli.main import main

TRACES = Path(__file__).resolve().parents[1] / "traces"
TP1, TP2 = str(TRACES / "cpu-tp1"), str(TRACES / "cpu-tp2")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[int, ...]]]:
    """Per counted function, the ranks of each call's events (so the two runs are told apart)."""
    seen: dict[str, list[tuple[int, ...]]] = {
        "classify": [],
        "partition_steps": [],
        "layer_unions": [],
        "find_steps": [],
    }

    def wrap(name: str, orig: Callable[..., Any], ranks_of: Callable[..., tuple[int, ...]]) -> None:
        def counted(*args: Any, **kwargs: Any) -> Any:
            seen[name].append(ranks_of(*args))
            return orig(*args, **kwargs)

        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("tracekit"):
                for attr, value in list(vars(mod).items()):
                    if value is orig:
                        monkeypatch.setattr(mod, attr, counted)

    def ranks(ev: Any, *_: Any) -> tuple[int, ...]:
        return tuple(sorted(int(r) for r in ev["rank"].unique())) if "rank" in ev.columns else ()

    wrap("classify", classify_mod.classify, ranks)
    wrap("partition_steps", partition_mod.partition_steps, lambda ev, st, *a: tuple(sorted(set(st["rank"]))))
    wrap("layer_unions", partition_mod.layer_unions, lambda ev: ())
    wrap("find_steps", steps_mod.find_steps_detailed, ranks)
    return seen


def test_a_report_of_a_tp_pair_classifies_and_partitions_each_run_once(tmp_path: Path, calls):
    out = tmp_path / "r.json"
    assert main(["report", TP2, "--baseline", TP1, "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["attribution"] is not None and [r["role"] for r in doc["runs"]] == ["baseline", "sharded"]
    # once per run: the TP=1 run (rank 0) and the TP=2 run (ranks 0, 1); it was twice each before
    assert sorted(calls["classify"]) == [(0,), (0, 1)]
    # breakdown (auto rule) and shortfall (the manifest's decode_step) find the same windows: one
    # partition per rank (the plans' per-rank stages share the rank's AnalysedRun)
    assert sorted(calls["partition_steps"]) == [(0,), (0,), (1,)]
    # one layer-union build per rank (1 + 2), shared by the partition and the critical path
    assert len(calls["layer_unions"]) == 3


def test_the_api_and_whatif_share_one_analysis_per_run(tmp_path: Path, calls):
    base, run = tk.load(TP1), tk.load(TP2)
    bd = run.breakdown()
    sf = tk.shortfall(base, run)
    cols = ["rank", "step", "start_ns", "end_ns"]
    assert (run.steps().table[cols].to_numpy() == bd.steps[cols].to_numpy()).all()  # the same windows
    assert sorted(calls["classify"]) == [(0,), (0, 1)]
    assert sorted(calls["partition_steps"]) == [(0,), (0,), (1,)]  # once per rank
    assert sf.to_json()["shortfall_ns"] > 0
    for v in calls.values():
        v.clear()
    out = tmp_path / "w.json"
    assert main(["whatif", "--baseline", TP1, "--sharded", TP2, "--knob", "transfer=0",
                 "--format", "json", "--out", str(out)]) == 0  # fmt: skip
    assert sorted(calls["classify"]) == [(0,), (0, 1)]
    assert sorted(calls["partition_steps"]) == [(0,), (0,), (1,)]
    # the replay takes the windows attribute_run found (it searched the steps again before); the
    # attribution plan finds them per rank (rank_step_summary, rank_step_windows), not by a search
    # of the whole run
    assert calls["find_steps"] == []


def test_sharing_changes_no_figure():
    """The report's analyses equal breakdown and shortfall of separately read, unshared runs."""
    from tracekit.analyse.attribution.pair import shortfall
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.model.documents import Breakdown, Shortfall
    from tracekit.read import read_run
    from tracekit.report.build import analyse_dirs, analysed_document

    shared = analyse_dirs(TP2, TP1)
    alone = {
        "breakdown": analysed_document(breakdown(read_run([Path(TP2)])), Breakdown),
        "baseline_breakdown": analysed_document(breakdown(read_run([Path(TP1)])), Breakdown),
        "shortfall": analysed_document(shortfall(read_run([Path(TP1)]), read_run([Path(TP2)])), Shortfall),
    }
    assert shared.breakdown == alone["breakdown"]
    assert shared.baseline_breakdown == alone["baseline_breakdown"]
    assert shared.shortfall == alone["shortfall"]


def test_a_partition_handed_out_is_a_copy(tmp_path: Path):
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.read import read_run

    ar = AnalysedRun.of(read_run([Path(TP2)]))
    found = ar.steps()
    first = ar.partition(found.steps)
    first["compute_ns"] = -1  # a caller scribbling on its table
    again = ar.partition(ar.steps().steps)
    assert (again["compute_ns"] >= 0).all()
    assert (again[[f"{p}_ns" for p in partition_mod.PARTS]].sum(axis=1) == again["window_ns"]).all()
