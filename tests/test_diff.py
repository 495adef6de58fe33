"""`tracekit diff` (issue 20): two runs of the same workload side by side, and a CI gate.

Real pairs only:
- the committed H200 captures `h200-tp2` and `h200-tp2-straggler` (rank 1 sleeps 2 ms on the host
  before each of its 16 all-reduces per token: 32 ms per token inserted): the change must be named
  as host time on rank 1 (critical path) within 15% of 32 ms, in coordination, not compute;
- a run diffed with itself: no change, exit 0 under `--fail-if-slower 1`;
- fresh CPU captures (tiny preset, gloo, TP=2, 8 tokens): two repeats (no significant change) and
  one with `inject_delay=(1, 20 ms)` (20 ms x 4 all-reduces = 80 ms per token inserted on rank 1).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from committed_pairs import committed_analysed, committed_parts
from gloo_truth import DELAY_MS

from tracekit.analyse.attribution.reconcile import AppliedDilation
from tracekit.analyse.compare.diff import diff, diff_sides
from tracekit.analyse.compare.result import Diff
from tracekit.analyse.compare.sides import DIFF_PARTS, Side, rank_side_tables, side_of, side_windows
from tracekit.cli.main import main
from tracekit.read import read_run

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
INSERTED_H200_NS = 2e6 * 16  # 2 ms before each of 16 all-reduces per token


def _diff(before: Path, after: Path) -> Diff:
    return diff(read_run([before]), read_run([after]), before_path=str(before), after_path=str(after))


def _committed_side(name: str, label: str) -> Side:
    """The diff's side of a committed run from the process's one attribution of it
    (tests/committed_pairs.py: `attribute_side` is `attribute_run` and these tables; the parts'
    label, the run's role in the shortfall pairs of other files, only names it in notes)."""
    parts = committed_parts(name, "sharded")
    tables = rank_side_tables(committed_analysed(name).events, side_windows(parts))
    return side_of(parts, label, str(TRACES / name), *tables)


@pytest.fixture(scope="module")
def straggler() -> Diff:
    """`diff` of h200-tp2 and h200-tp2-straggler (each run attributed once per process)."""
    return diff_sides(_committed_side("h200-tp2", "before"), _committed_side("h200-tp2-straggler", "after"))


def _check_exact(d: Diff) -> None:
    """Every figure sums: the exact parts, the ints by part, per rank and on the critical path."""
    exact = sum((d.after.leaf[p] - d.before.leaf[p] for p in DIFF_PARTS), Fraction(0))
    assert exact == d.change_ns
    doc = d.to_json()
    change = doc["change_ns"]
    assert change == doc["per_token_ns"]["after"] - doc["per_token_ns"]["before"]
    assert sum(t["change_ns"] for t in doc["by_part"]["terms"].values()) == change
    for r in doc["per_rank"]:
        assert sum(r["change_ns"].values()) == change
        assert sum(r["coordination_ns"].values()) == r["change_ns"]["coordination"]
    cp = doc["critical_path"]
    for k in ("before", "after"):
        total = sum(v for d_r in cp[k]["by_rank"].values() for v in d_r.values()) + cp[k]["offset_ns"]
        assert total == cp[k]["step_ns"] == doc["per_token_ns"][k]
    assert sum(cp["change"]["by_component_ns"].values()) + cp["change"]["offset_ns"] == change


def test_straggler_pair_names_the_inserted_host_time_on_rank_1(straggler: Diff):
    d = straggler
    doc = d.to_json()
    _check_exact(d)
    assert doc["kind"] == "tracekit.diff" and doc["per_token_source"] == "unprofiled"
    assert doc["verdict"] == "slower" and doc["interval"]["relative"][0] > 0
    # the per-token change and the coordination term: the inserted 32 ms, within 15%
    assert doc["change_ns"] == pytest.approx(INSERTED_H200_NS, rel=0.15)
    terms = doc["by_part"]["terms"]
    assert terms["coordination"]["change_ns"] == pytest.approx(INSERTED_H200_NS, rel=0.15)
    assert abs(terms["compute"]["change_ns"]) < 0.01 * INSERTED_H200_NS
    assert abs(terms["transfer"]["change_ns"]) < 0.01 * INSERTED_H200_NS
    # the cause: host time on the critical path, on rank 1
    cause = doc["cause"]
    assert cause["component"] == "host" and cause["rank"] == 1
    assert cause["component_change_ns"] == pytest.approx(INSERTED_H200_NS, rel=0.15)
    assert "rank 1" in cause["sentence"] and "host time" in cause["sentence"]
    # the consequence: rank 0 waits; on rank 1 the GPU idles while its host sleeps
    ranks = {r["rank"]: r for r in doc["per_rank"]}
    assert ranks[0]["coordination_ns"]["wait"] > 0.9 * INSERTED_H200_NS
    assert ranks[1]["coordination_ns"]["idle"] > 0.9 * INSERTED_H200_NS
    assert ranks[1]["coordination_ns"]["wait"] < 0
    # matrix / vector on the GPU timeline, neither moved
    assert doc["matrix_vector"] is True
    leaves = doc["by_part"]["leaves"]
    assert leaves["matrix"]["before_ns"] > 0 and leaves["vector"]["before_ns"] > 0
    assert abs(leaves["matrix"]["change_ns"]) < 10_000
    # the collectives: same counts, the all-reduce's wait moved
    coll = {(c["op"], c["bytes"]): c for c in doc["collectives"]}
    ar = coll[("all_reduce", 8192)]
    assert ar["status"] == "both" and ar["count_before"] == ar["count_after"] == 16
    assert ar["wait_ns_change"] > 0.4 * INSERTED_H200_NS
    assert abs(ar["transfer_ns_change"]) < 10_000
    # the dilation differs (1.46x vs 1.09x) but explains a fraction of the change: no warning
    dil = doc["dilation"]
    assert dil["before"]["factor"] == pytest.approx(1.46, abs=0.01)
    assert dil["after"]["factor"] == pytest.approx(1.09, abs=0.01)
    assert dil["warning"] is None
    assert doc["summary"].startswith("Slower:") and "rank 1" in doc["summary"]


def test_a_run_against_itself_has_no_change_and_passes_the_gate(
    straggler: Diff, capsys: pytest.CaptureFixture[str]
):
    # h200-tp2 against itself (its attribution reused from the pair's), then the CLI on cpu-tp2
    side = straggler.before
    d = diff_sides(dataclasses.replace(side, label="before"), dataclasses.replace(side, label="after"))
    _check_exact(d)
    doc = d.to_json()
    assert doc["change_ns"] == 0 and doc["verdict"] == "no significant change"
    lo, hi = doc["interval"]["relative"]
    assert lo < 0 < hi
    assert all(t["change_ns"] == 0 for t in doc["by_part"]["terms"].values())
    assert all(k["time_ns_change"] == 0 and k["status"] == "both" for k in doc["kernels"])
    assert doc["dilation"]["warning"] is None
    small = str(TRACES / "cpu-tp2")
    assert main(["diff", small, small, "--fail-if-slower", "1"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("No significant change") and out.err == ""


def test_gate_exits_1_with_one_line_naming_what_moved(straggler: Diff, capsys: pytest.CaptureFixture[str]):
    # the CLI's gate on the committed gloo pair of the same kind (rank 1 sleeps before each
    # all-reduce: 8 -> 87 ms per token), whose two attributions cost a fraction of the H200 pair's
    a, b = str(TRACES / "cpu-tp2"), str(TRACES / "cpu-tp2-straggler")
    assert main(["diff", a, b, "--fail-if-slower", "5", "--format", "json"]) == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["verdict"] == "slower"
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tracekit: slower by +") and "coordination" in lines[0]
    assert "host time on rank 1" in lines[0]
    # a gate above the slowdown's lower bound passes
    assert not straggler.fails(1000.0) and straggler.fails(200.0)
    # the reverse direction is faster, never a failure
    reverse = diff_sides(
        dataclasses.replace(straggler.after, label="before"),
        dataclasses.replace(straggler.before, label="after"),
    )
    _check_exact(reverse)
    assert reverse.verdict_word() == "faster" and not reverse.fails(0.0)
    assert reverse.change_ns == -straggler.change_ns


def test_table_and_markdown(straggler: Diff):
    from tracekit.model import documents
    from tracekit.render.diff import markdown as render_markdown
    from tracekit.render.diff import table as render_table

    doc = documents.convert(straggler.to_json(), documents.Diff)
    text = render_table(doc, color=False)
    assert text.startswith("Slower:")
    for title in (
        "The change by part",
        "Per rank",
        "Critical path",
        "Kernels that moved most",
        "Collectives",
    ):
        assert title in text, title
    assert "compute: matrix" in text and "coordination: wait" in text
    md = render_markdown(doc)
    assert md.startswith("# tracekit diff:") and "| part | before | after | change | 95% interval |" in md
    assert "**Slower:" in md


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    run = str(TRACES / "cpu-tp2")
    not_a_trace = tmp_path / "notes.txt"
    not_a_trace.write_text("hello")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "rank-0.pt.trace.json").write_text('{"traceEvents": [')
    cases = [
        ["diff", str(tmp_path / "nope"), run],
        ["diff", run, str(not_a_trace)],
        ["diff", run, str(broken), "--no-cache"],
        ["diff", run, run, "--fail-if-slower", "abc"],
        ["diff", run, run, "--fail-if-slower", "nan"],
        ["diff", run, run, "--top", "-1"],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tracekit: error: "), (argv, err)


def test_different_tp_and_traced_times_without_manifests(tmp_path: Path):
    # any TP: TP=1 against TP=2; the collectives are new in the TP=2 run
    d = _diff(TRACES / "cpu-tp1", TRACES / "cpu-tp2")
    _check_exact(d)
    doc = d.to_json()
    assert doc["runs"]["before"]["n_ranks"] == 1 and doc["runs"]["after"]["n_ranks"] == 2
    assert [r["rank"] for r in doc["per_rank"]] == [0]
    assert "rank_counts_differ" in doc["data_quality"]["counts"]
    assert doc["collectives"] and all(c["status"] == "new" for c in doc["collectives"])
    assert doc["matrix_vector"] is False and "matrix" not in doc["by_part"]["leaves"]
    # a run without its manifest: both sides fall back to the traced step times (like with like)
    bare = tmp_path / "cpu-tp2-bare"
    bare.mkdir()
    for f in (TRACES / "cpu-tp2").glob("rank-*"):
        shutil.copy(f, bare / f.name)
    d = diff(read_run([bare], cache=False), read_run([TRACES / "cpu-tp2"]))
    _check_exact(d)
    doc = d.to_json()
    assert doc["per_token_source"] == "trace"
    assert doc["change_ns"] == 0 and doc["verdict"] == "no significant change"
    assert "dilation unknown for the before run" in doc["dilation"]["warning"]


def test_dilation_that_explains_the_change_is_warned(straggler: Diff):
    # the same pair in traced times, with the after run's profiler made 3x as costly as the
    # before run's: the profiler alone would change the traced time by +200%, against +195%
    d = straggler
    b, a = d.before, d.after
    saved = b.applied, a.applied
    try:
        b.applied = AppliedDilation(
            1.0, (0.98, 1.02), saved[0].traced_mean_ns, saved[0].unprofiled_mean_ns, 1
        )
        a.applied = AppliedDilation(3.0, (2.9, 3.1), saved[1].traced_mean_ns, saved[1].unprofiled_mean_ns, 1)
        warning = d.dilation().warning
        assert warning and warning.startswith("profiler dilation differs: before 1.00x, after 3.00x"), warning
        assert "+200.0%" in warning and "split by part" in warning
    finally:
        b.applied, a.applied = saved


# ------------------------------------------------------------------------------------------
# fresh CPU captures


@pytest.fixture(scope="module")
def captures(gloo_truth: Any) -> Any:
    """The committed CPU ground-truth captures (tests/gloo_truth.py): a, b (repeats), inj; `speed`
    holds the host-speed probe taken with each."""
    return gloo_truth


def _skip_unless_same_host_speed(captures: dict[str, Any], names: tuple[str, ...]) -> None:
    """The pair compares the workload only if the host ran at one speed throughout: on a shared
    machine whose load changed between the captures (others' jobs starting), the tool rightly
    reports the host's slowdown as a change; that is not what these tests are about."""
    # per capture the mean of its two probes (one probe alone catches a quiet or a busy instant)
    speed = {n: float(np.mean(captures.speed[n])) for n in names}
    ratio = max(speed.values()) / min(speed.values())
    if ratio > 1.5:
        pytest.skip(
            f"host speed moved {ratio:.2f}x between the captures (a loaded machine: probe "
            + ", ".join(f"{n} {t * 1e3:.0f} ms" for n, t in speed.items())
            + "): not a comparison under one condition"
        )


@pytest.mark.slow
def test_cpu_injected_delay_is_found_as_coordination_on_rank_1(captures: dict[str, Any]):
    _skip_unless_same_host_speed(captures, ("a", "inj"))
    d = diff(read_run([captures["a"]]), read_run([captures["inj"]]))
    _check_exact(d)
    doc = d.to_json()
    per_token = sum(
        c["count_after"] for c in doc["collectives"] if c["op"] == "all_reduce"
    )  # all-reduces per token per rank
    assert per_token == 4  # 2 per layer, 2 layers (tiny)
    truth = DELAY_MS * 1e6 * per_token
    assert doc["verdict"] == "slower"
    assert doc["change_ns"] == pytest.approx(truth, rel=0.15)
    terms = doc["by_part"]["terms"]
    assert terms["coordination"]["change_ns"] == pytest.approx(truth, rel=0.15)
    assert abs(terms["compute"]["change_ns"]) < 0.05 * truth
    cause = doc["cause"]
    assert cause["component"] == "host" and cause["rank"] == 1
    assert cause["rank_change_ns"] == pytest.approx(truth, rel=0.15)
    ranks = {r["rank"]: r for r in doc["per_rank"]}
    assert ranks[0]["coordination_ns"]["wait"] == pytest.approx(truth, rel=0.15)


@pytest.mark.slow
def test_cpu_repeats_have_no_significant_change(captures: dict[str, Any], capsys: pytest.CaptureFixture[str]):
    _skip_unless_same_host_speed(captures, ("a", "b"))
    # On a quiet host the repeats show no significant change. On this shared 2-core VM two captures
    # a minute apart have differed by up to -24% (interval -38% to -6%), and +40% with a linter
    # running beside the suite, while others' jobs came and went: the rounds of one capture do not
    # see that between-capture drift (docs/METHOD-NOTES.md). The committed pair was taken back to
    # back at one host speed (scripts/capture_cpu_test_traces.py); still: no change, or a change
    # within the host's noise, never one the size of the injected delay.
    x, y = str(captures["a"]), str(captures["b"])
    d = diff(read_run([x]), read_run([y]))
    _check_exact(d)
    doc = d.to_json()
    lo, hi = doc["interval"]["relative"]
    if doc["verdict"] == "no significant change":
        assert lo < 0 < hi
    else:
        assert abs(doc["relative_change"]) < 0.35, doc["summary"]
    # a gate set above the host's noise passes both ways (the reverse from the same attributions:
    # the CLI's passing gate is test_a_run_against_itself_has_no_change_and_passes_the_gate's);
    # the injected delay fails a tight gate, through the CLI
    reverse = diff_sides(
        dataclasses.replace(d.after, label="before"), dataclasses.replace(d.before, label="after")
    )
    _check_exact(reverse)
    assert reverse.change_ns == -d.change_ns
    assert not d.fails(50.0) and not reverse.fails(50.0)
    a = x
    capsys.readouterr()
    inj = str(captures["inj"])
    assert main(["diff", a, inj, "--fail-if-slower", "10", "--no-cache", "--format", "json"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rank 1" in err[0], err


def test_nsys_against_kineto_capture_of_one_workload_warns_on_the_dilation(straggler: Diff):
    # any input: the Nsight Systems capture (SQLite) of h200-tp2's workload against the Kineto one.
    # Their dilations differ (nsys 1.32x, Kineto `cuda` mode 1.47x): the profiler alone would move the
    # traced time by +11%, more than the traced change (+7%): warned, with the unprofiled cross-check
    nsys = _committed_side("h200-tp2-nsys", "before")
    d = diff_sides(nsys, dataclasses.replace(straggler.before, label="after"))
    _check_exact(d)
    doc = d.to_json()
    assert doc["per_token_source"] == "unprofiled"
    dil = doc["dilation"]
    assert dil["before"]["factor"] == pytest.approx(1.32, abs=0.01)
    assert dil["after"]["factor"] == pytest.approx(1.47, abs=0.01)
    warning = dil["warning"]
    assert warning and warning.startswith("profiler dilation differs: before 1.32x, after 1.47x"), warning
    assert "cross-check: the unprofiled passes' own means change by" in warning
    # the corrected change and the unprofiled passes' own change agree in sign and size
    assert dil["unprofiled_change"] == pytest.approx(doc["relative_change"], abs=0.02)


def test_cli_refuses_a_tp_change_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """`tracekit diff` of a TP=1 and a TP=2 run is one error line naming both degrees and the
    command that analyses sharding; --allow-tp-change runs it (the library's diff() always does)."""
    argv = ["diff", str(TRACES / "cpu-tp1"), str(TRACES / "cpu-tp2"), "--no-cache", "--format", "json"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TP=2 against" in err[0] and "TP=1" in err[0], err
    assert "tracekit shortfall" in err[0] and "--allow-tp-change" in err[0]
    assert main([*argv, "--allow-tp-change"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"]["before"]["n_ranks"] == 1 and doc["runs"]["after"]["n_ranks"] == 2
