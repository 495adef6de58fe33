"""Clocks aligned by policy and steps joined by their collectives (issue 23 items 3, 4, 9, 10;
docs/METHOD.md section Clocks and step matching), on the committed traces mutated as the
failures happen in the field:

- one rank's clock moved by +-5 ms (every timestamp of that rank): no figure of the shortfall
  (terms, per-rank parts, critical path, verdict, diagnosis) or of `diff` against the original
  moves by more than 1 us, whatever the manifest says about hosts; the offset moves by the shift;
- rank 1's step numbers off by one, or rank 1's profiler missing the first step (windows numbered
  by order): the figures of the original run;
- a run whose ranks cannot be put on one clock (no collectives; host ops only) is refused in one
  line;
- a run whose ranks never wait: the diagnosis says nothing about waiting;
- a diff whose change sits in the critical path's offset names the offset, not a component.

Real data only; the traces are committed, so a missing one is a failure, not a skip.
"""

from __future__ import annotations

import dataclasses
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from committed_pairs import committed_analysed, committed_parts, committed_run, committed_shortfall

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.pair import shortfall_of_pair
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.compare.diff import diff_sides
from tracekit.analyse.compare.result import Diff
from tracekit.analyse.compare.sides import Side, rank_side_tables, side_of, side_windows
from tracekit.analyse.timeline.align import renumber_steps, step_tokens
from tracekit.errors import MatchError
from tracekit.model.documents import to_builtins
from tracekit.model.events import Run

TRACES = Path(__file__).resolve().parents[1] / "traces"
PAIRS = {"h200-tp2": "h200-tp1", "cpu-tp2": "cpu-tp1"}
STEP = "decode_step#"
#: the tolerance of the issue: no figure moves by more than 1 us
TOL_NS = 1_000


def _run(name: str) -> Run:
    """The committed run, read once per process (tests/committed_pairs.py; a missing one fails)."""
    return committed_run(name)


def _analysed(name: str) -> AnalysedRun:
    """The committed run classified once (`AnalysedRun`): its attribution and its diff side read it."""
    return committed_analysed(name)


def _parts(name: str) -> RunParts:
    """The committed run attributed once per process (the pairs of other files read the same)."""
    return committed_parts(name, "baseline" if name.endswith("tp1") else "sharded")


@cache
def _doc(name: str) -> dict[str, Any]:
    """The original pair's shortfall document: the process's one shortfall of it, made from the one
    attribution of each run (`_parts`; tests/committed_pairs.py)."""
    return committed_shortfall(PAIRS[name], name).to_json()


def _side(ar: AnalysedRun, parts: RunParts, label: str) -> Side:
    """The diff's side of an attributed run: what `diff` makes of it (`attribute_side` is
    `attribute_run` and these tables), from the attribution the test already has."""
    return side_of(parts, label, label, *rank_side_tables(ar.events, side_windows(parts)))


def _diff(before: tuple[AnalysedRun, RunParts], after: tuple[AnalysedRun, RunParts]) -> Diff:
    """`diff(before, after)` from the two runs' attributions (`diff` = `attribute_side` of each +
    `diff_sides`; each run is attributed once per test, not again inside the diff)."""
    return diff_sides(_side(*before, "before"), _side(*after, "after"))


def _original(name: str) -> tuple[AnalysedRun, RunParts]:
    return _analysed(name), _parts(name)


@cache
def _mutated(name: str, mutation: str, *args: int) -> tuple[AnalysedRun, RunParts]:
    """The committed run `name` mutated (`shifted` / `steps_off_by_one`, with `args`), classified and
    attributed once: its shortfall test and its diff test read the same attribution."""
    run = {"shifted": shifted, "steps_off_by_one": steps_off_by_one}[mutation](_run(name), *args)
    ar = AnalysedRun.of(run)
    return ar, attribute_run(ar, label="sharded")


def _shortfall_doc(base: str, sharded: RunParts) -> dict[str, Any]:
    return shortfall_of_pair(_parts(base), sharded, []).to_json()


def _with_events(run: Run, ev: pd.DataFrame) -> Run:
    return dataclasses.replace(run, events=ev.reset_index(drop=True))


def shifted(run: Run, rank: int, dt: int) -> Run:
    """Every timestamp of `rank` moved by `dt` ns (its clock set `dt` ahead)."""
    ev = run.events.copy()
    m = (ev["rank"] == rank).to_numpy()
    for c in ("start_ns", "end_ns"):
        ev.loc[m, c] = ev.loc[m, c].to_numpy(np.int64) + dt
    return _with_events(run, ev)


def _renamed(run: Run, rank: int, rename: Any) -> Run:
    ev = run.events.copy()
    names = ev["name"].astype(str).to_numpy(object)
    m = (ev["rank"] == rank).to_numpy() & np.array([n.startswith(STEP) for n in names])
    names[m] = [rename(n) for n in names[m]]
    ev["name"] = pd.Categorical(names)
    return _with_events(run, ev)


def steps_off_by_one(run: Run, rank: int) -> Run:
    """`rank`'s step annotations numbered one higher (decode_step#N -> decode_step#N+1)."""
    return _renamed(run, rank, lambda n: f"{STEP}{int(n[len(STEP) :]) + 1}")


def first_step_missing(run: Run, rank: int) -> Run:
    """`rank`'s profiler missed the first step annotation, and its step names carry no numbers:
    windows are numbered by their order on each rank, so `rank`'s are one behind."""
    ev = run.events
    names = ev["name"].astype(str)
    ann = (ev["rank"] == rank).to_numpy() & names.str.startswith(STEP).to_numpy()
    on = ev[ann].sort_values("start_ns")
    drop = on[on["name"].astype(str) == on["name"].astype(str).iloc[0]].index
    out = _with_events(run, ev.drop(index=drop))
    return _renamed(out, rank, lambda n: STEP.rstrip("#"))


def _figures(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Every number and sentence of a JSON document, by path."""
    out: dict[str, Any] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(_figures(v, f"{prefix}.{k}"))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.update(_figures(v, f"{prefix}[{i}]"))
    elif isinstance(doc, (int, float, str)) and not isinstance(doc, bool):
        out[prefix] = doc
    return out


FIGURES = ("terms_ns", "coordination_ns", "per_token_ns", "per_rank", "critical_path", "verdict", "diagnosis")


def _moved(
    a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...] = FIGURES
) -> list[tuple[str, Any, Any]]:
    fa, fb = _figures({k: a[k] for k in keys}), _figures({k: b[k] for k in keys})
    out = []
    for k in sorted(set(fa) | set(fb)):
        x, y = fa.get(k), fb.get(k)
        if isinstance(x, str) or isinstance(y, str) or x is None or y is None:
            if x != y:
                out.append((k, x, y))
        elif abs(x - y) > TOL_NS:
            out.append((k, x, y))
    return out


def _assert_no_change(d: Any) -> None:
    """A diff of a run against itself (mutated): nothing moved on the path or in the parts."""
    doc = d.to_json()
    flat = _figures({"pc": doc["critical_path"]["change"], "parts": d.integers().leaf})
    big = {k: v for k, v in flat.items() if isinstance(v, (int, float)) and abs(v) > TOL_NS}
    assert not big, big
    assert abs(d.integers().change) <= TOL_NS


# ------------------------------------------------------------------------------------------
# clocks


#: each pair with rank 1's clock 5 ms ahead (its diff test reads the same attribution); the GPU pair
#: with rank 0's moved instead (the offset moves by minus the shift), the gloo pair with rank 1's
#: 5 ms behind (a negative shift)
CLOCK_MOVES = [
    ("h200-tp2", 1, 5_000_000),
    ("h200-tp2", 0, 5_000_000),
    ("cpu-tp2", 1, 5_000_000),
    ("cpu-tp2", 1, -5_000_000),
]


@pytest.mark.parametrize(("name", "rank", "dt"), CLOCK_MOVES)
def test_moving_one_rank_clock_moves_no_figure(name: str, rank: int, dt: int) -> None:
    run = _run(name)
    ref = _doc(name)
    doc = _shortfall_doc(PAIRS[name], _mutated(name, "shifted", rank, dt)[1])
    assert _moved(ref, doc) == []
    # the skew is measured and removed, whatever the manifest says about the host
    assert run.manifest and run.manifest.host and run.manifest.host.hostname
    clk, clk0 = doc["clock"], ref["clock"]
    assert clk["estimated"] and clk["aligned"] and clk["offsets_applied"]
    # rank 1's offset against rank 0 moves by the shift (rank 0 moved: by minus it), exactly
    want = clk0["offsets_ns"]["1"] + (dt if rank == 1 else -dt)
    assert clk["offsets_ns"] == {"0": 0, "1": want}
    assert clk["residual_ns"] == clk0["residual_ns"]
    # the unaligned clocks would have put every collective over the threshold (the gloo
    # threshold, 10 ms, is over the 5 ms shift: there the raw check says nothing)
    if clk["check"]["level"] == "gpu_kernel":
        assert clk["raw_instances_over"] == clk["check"]["instances"] > 0
    assert clk["check"]["instances_over"] == clk0["check"]["instances_over"]
    note = next(n for n in doc["data_quality"]["notes"] if "rank clocks aligned" in n)
    assert f"rank 1: {want:+d} ns" in note and "residual median" in note


@pytest.mark.parametrize("name", list(PAIRS))
def test_diff_against_the_same_run_with_one_clock_moved_is_empty(name: str) -> None:
    _assert_no_change(_diff(_original(name), _mutated(name, "shifted", 1, 5_000_000)))


def _strip(run: Run, keep: Any) -> Run:
    return _with_events(run, run.events[keep(run.events)])


def test_runs_whose_clocks_cannot_be_aligned_are_refused_in_one_line() -> None:
    run = _run("h200-tp2")
    name = run.events["name"].astype(str)
    nccl = name.str.contains("nccl", case=False).to_numpy() & (run.events["device"] >= 0).to_numpy()
    host_coll = name.str.contains(r"^(?:c10d::|record_param_comms$|nccl:)").to_numpy()
    # host ops only: they return once the work is enqueued, their ends do not agree
    with pytest.raises(MatchError) as host_only:
        attribute_run(_strip(run, lambda ev: ~nccl), label="sharded")
    msg = str(host_only.value)
    assert "\n" not in msg and msg.startswith("sharded: the clocks of ranks 0, 1 cannot be aligned")
    assert "host ops" in msg and "refused" in msg
    # no collective at all
    with pytest.raises(MatchError, match=r"no collectives matched across ranks.*refused") as none:
        attribute_run(_strip(run, lambda ev: ~(nccl | host_coll)), label="sharded")
    assert "\n" not in str(none.value)
    # one rank alone is not cross-rank: attributed
    one = _strip(run, lambda ev: (ev["rank"] == 0).to_numpy() & ~(nccl | host_coll))
    one = dataclasses.replace(
        one, sources={0: run.sources[0]}, rank_info={0: run.rank_info[0]}, manifest=None
    )
    assert attribute_run(one).collectives.clock.refusal is None


# ------------------------------------------------------------------------------------------
# steps


@pytest.mark.parametrize("name", list(PAIRS))
def test_steps_off_by_one_give_the_figures_of_the_original(name: str) -> None:
    off = _mutated(name, "steps_off_by_one", 1)
    doc = _shortfall_doc(PAIRS[name], off[1])
    assert _moved(_doc(name), doc) == []
    assert doc["critical_path"]["offset_ns"] == _doc(name)["critical_path"]["offset_ns"] >= 0
    assert doc["data_quality"]["counts"]["steps_renumbered_by_collectives"] == len(_parts(name).steps) // 2
    _assert_no_change(_diff(_original(name), off))


def test_a_step_the_profiler_missed_on_one_rank_leaves_the_others_joined() -> None:
    """Rank 1 lacks its first window; step names without numbers number windows by order, so
    joined by number every one of rank 1's windows meets rank 0's next one."""
    name = "h200-tp2"
    mutated = first_step_missing(_run(name), 1)
    parts = attribute_run(mutated, label="sharded")
    # premise: numbered by order, rank 1's windows are one behind rank 0's
    win = parts.steps
    assert win["name"].astype(str).str.fullmatch(r"decode_step(#\d+)?").all()
    assert (win["rank"] == 1).sum() == (win["rank"] == 0).sum() - 1
    doc = shortfall_of_pair(_parts(PAIRS[name]), parts, []).to_json()
    assert _moved(_doc(name), doc) == []
    assert parts.data_quality.counts["steps_unmatched_across_ranks"] == 1


def test_step_tokens_map_each_rank_to_the_reference_numbers() -> None:
    """The public mapping: rank 1's window holding the k-th matched collective takes the number of
    rank 0's window holding it."""
    from tracekit.analyse.collectives.matching import match_collectives

    ar = _mutated("h200-tp2", "steps_off_by_one", 1)[0]
    run = ar.run
    windows = ar.steps("decode_step").steps
    coll = match_collectives(ar.events, ranks=run.ranks, rank_info=run.rank_info, manifest=run.manifest)
    tok = step_tokens(windows, coll.per_rank)
    assert tok.method == "collective sequence" and tok.reference == 0
    t = tok.table
    r0, r1 = t[t["rank"] == 0], t[t["rank"] == 1]
    assert (r0["token"] == r0["step"]).all()
    assert (r1["token"] == r1["step"] - 1).all()
    # the anchors: the same instance opens the same token on both ranks
    a = r0.set_index("token")["anchor"]
    assert (r1.set_index("token")["anchor"] == a.reindex(r1["token"]).to_numpy()).all()
    assert (renumber_steps(windows, tok).groupby("step")["rank"].nunique() == 2).all()


# ------------------------------------------------------------------------------------------
# the diagnosis asserts only what was measured


def rank0_twice(run: Run) -> Run:
    """A TP=2 run whose rank 1 is rank 0's trace: every collective starts on both ranks at once,
    so no rank ever waits."""
    ev0 = run.events[run.events["rank"] == 0]
    ev1 = ev0.copy()
    ev1["rank"] = np.int32(1)
    info = {0: run.rank_info[0], 1: {**run.rank_info[0], "rank": 1}}
    return dataclasses.replace(run, events=pd.concat([ev0, ev1], ignore_index=True), rank_info=info)


def test_a_run_whose_ranks_never_wait_is_not_said_to_wait() -> None:
    """Eager TP=2 against a CUDA-graph TP=1 baseline (its GPU busy most of a token): the largest
    term is coordination, and all of it is idle, none wait. (traces/cpu-tp2 so built still 'waits'
    0.11 ms per token: the c10d enqueue ops around the gloo ranges count as wait in the exposed
    split; the H200 runs' kernels do not.)"""
    base, sharded = "h200x2-tp1-b1-graphs", "h200x2-tp2-b1"
    doc = shortfall_of_pair(
        _parts(base), attribute_run(rank0_twice(_run(sharded)), label="sharded"), []
    ).to_json()
    # premise: measured, not assumed
    terms = doc["terms_ns"]
    assert max(terms, key=lambda k: terms[k]) == "coordination", terms
    assert all(r["coordination_ns"]["wait"] == 0 for r in doc["per_rank"])
    assert doc["coordination_ns"]["wait"] == 0 < doc["coordination_ns"]["idle"]
    text = doc["diagnosis"]
    assert not re.search(r"\bwait", text, re.IGNORECASE), text
    # the clause it does state rests on its figure: the idle it names is printed
    assert f"{doc['coordination_ns']['idle'] / 1e6:.2f} ms per token" in text, text


# ------------------------------------------------------------------------------------------
# diff: the path offset is part of the path


def windows_opened_early(run: Run, parts: RunParts, dt: int) -> tuple[Run, int]:
    """Per step whose longest window is not the rank the critical path ends on, that window's
    step annotation opened `dt` ns earlier (inside the gap before it): the step time grows by `dt`,
    the path not at all. Returns the run and the number of steps changed."""
    segs = parts.critical.segments
    ends_on = segs.groupby("step").tail(1).set_index("step")["rank"]
    st = parts.steps
    longest = st.sort_values(["step", "window_ns", "rank"], ascending=[True, False, True]).drop_duplicates(
        "step"
    )
    ev = run.events.copy()
    names = ev["name"].astype(str)
    n = 0
    for row in longest.itertuples(index=False):
        if int(row.step) not in ends_on.index or int(ends_on.loc[int(row.step)]) == int(row.rank):
            continue
        hit = (
            (ev["rank"] == row.rank).to_numpy()
            & (names == f"{STEP}{row.step}").to_numpy()
            & (ev["start_ns"] == row.start_ns).to_numpy()
        )
        assert hit.sum() == 1
        before = st[(st["rank"] == row.rank) & (st["end_ns"] <= row.start_ns)]["end_ns"]
        assert before.empty or int(row.start_ns) - int(before.max()) > dt, (
            "the gap before the window is too short"
        )
        ev.loc[hit, "start_ns"] = int(row.start_ns) - dt
        n += 1
    return dataclasses.replace(_with_events(run, ev), manifest=None), n


def test_a_change_in_the_path_offset_is_named_as_such() -> None:
    name = "h200-tp2"
    run = dataclasses.replace(_run(name), manifest=None)  # traced per-token times: no reconciliation
    ar = AnalysedRun.of(run)
    parts = attribute_run(ar)
    dt = 80_000
    after, n = windows_opened_early(run, parts, dt)
    ar_after = AnalysedRun.of(after)
    d = _diff((ar, parts), (ar_after, attribute_run(ar_after)))
    pc = to_builtins(d.path_change().change)
    steady = len(parts.steady)
    assert n >= steady // 4, n  # premise: a good share of the steps moved
    # premise, measured: the path did not move, its offset did, by the step time's change
    # (integers by largest remainder: a component may read +-1 ns)
    assert all(abs(v) <= 1 for v in pc["by_component_ns"].values()), pc
    assert abs(pc["offset_ns"] - d.integers().change) <= 1 and pc["offset_ns"] > 0
    cause = to_builtins(d.cause())
    assert cause["component"] == "offset" and cause["rank"] is None
    assert cause["component_change_ns"] == pc["offset_ns"] == cause["offset_change_ns"]
    assert "path offset" in d.cause_sentence() and "compute" not in d.cause_sentence()


def test_whatif_of_steps_off_by_one_is_the_whatif_of_the_original() -> None:
    """The replay finds its windows again from the events: it joins them as the attribution did
    (before, rank 1's step k met token k's end: transfer=0 read 0.70 ms for a 2.45 ms replay)."""
    from tracekit.analyse.whatif.knobs import parse_knob
    from tracekit.analyse.whatif.pair import whatif

    base, base_parts = _original("cpu-tp1")
    docs = []
    for ar, parts in (_original("cpu-tp2"), _mutated("cpu-tp2", "steps_off_by_one", 1)):
        w = whatif(base_parts, base, parts, ar, [parse_knob("transfer=0")])
        docs.append(w.to_json())
    for key in ("predicted_ns", "shapley_ns"):
        assert docs[1][key] == docs[0][key]


def test_step_tokens_by_construction_chain_groups_and_fill_windows_without_collectives() -> None:
    """Four steps on three ranks: ranks 0 and 1 share instances 0-3 (one per step), ranks 1 and 2
    share 10-13 (another group, rank 0 not in it); rank 1 numbers its steps from 5, rank 2 from 0
    with an extra first window and no collective in step 2 (so does every rank). Tokens are rank
    0's numbers: rank 2 reaches them through rank 1; its window without a collective takes the
    token between its neighbours'."""
    wins, rows = [], []
    for k in range(4):
        t = 1_000 * k
        wins += [(0, k + 1, t, t + 900), (1, k + 5, t + 7, t + 907), (2, k + 1, t + 3, t + 903)]
        if k != 2:
            rows += [(0, k, t + 100), (1, k, t + 110), (1, 10 + k, t + 500), (2, 10 + k, t + 505)]
    wins.append((2, 0, -1_000, -100))  # a window before the first on rank 2 only
    windows = pd.DataFrame(wins, columns=["rank", "step", "start_ns", "end_ns"])
    per_rank = pd.DataFrame(rows, columns=["rank", "instance", "raw_start_ns"])
    tok = step_tokens(windows, per_rank)
    got = {(r, s): t for (r, s), t in tok.mapping().items()}
    for k in range(4):
        assert got[(0, k + 1)] == k + 1
        assert got[(1, k + 5)] == k + 1
        assert got[(2, k + 1)] == k + 1  # step 3 (k = 2) by the distance rule
    assert got[(2, 0)] > 4  # its own token: not on every rank
    assert tok.renumbered == {1: 4, 2: 0} and tok.unmatched == {1: 0, 2: 1}
