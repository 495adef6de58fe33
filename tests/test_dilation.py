"""Profiler dilation (docs/METHOD.md section Dilation, issue 9): the figure, the threshold, and the correction.

The correction test builds a GPU-timeline run twice in code: the "unprofiled" world, where the
host leaves a gap of H_TRUE ns before each kernel launch, and the "profiled" world, where the
profiler's host work widens every gap to H_PROF (device work unchanged). Rank 1 has an injected
host delay D before its all-reduce. The truth is the attribution of the unprofiled world, computed
by hand below; the attribution of the profiled trace must come closer to it with the correction
(T from the unprofiled pass, the excess out of each rank's wait + sync + idle in proportion) than
without; a second test slows one rank's host only, so the profiler's time lands in the other
rank's wait.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tracekit.analyse.attribution.pair import shortfall
from tracekit.analyse.dilation import dilation_of, token_times
from tracekit.cli.dilation import command as dilation_command
from tracekit.model.documents import Manifest
from tracekit.model.events import Run, make_events
from tracekit.read.manifests import manifest_from_json

GEMM = "ampere_sgemm_128x64_nn"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"

C = 1_000  # each GEMM
X = 300  # all-reduce transfer (from the last arrival to the end)
D = 2_000  # injected host delay on rank 1 before its all-reduce
H_TRUE = 50  # host gap before each launch, unprofiled
H_PROF = 400  # the same gap under the profiler
STEPS = 5


def _typed(doc: dict | None) -> Manifest | None:
    """A manifest's JSON object as the reader reads manifest.json (None stays None)."""
    return None if doc is None else manifest_from_json(doc).manifest


def test_token_times_slowest_rank_and_warmup():
    tt = token_times({"per_token_ns": {"0": [9, 10, 30, 10], "1": [8, 12, 10, 20]}}, skip_first=1)
    assert tt is not None and tt.per_token_ns == (12, 30, 20) and tt.skipped == 1
    assert tt.median_ns == 20 and tt.mean_ns == Fraction(62, 3)


def test_dilation_and_threshold():
    m = {
        "unprofiled": {"per_token_ns": {"0": [1, 100, 100, 100]}},
        "profiled": {"per_token_ns": {"0": [1, 100, 105, 110]}},
    }
    # means over the steady tokens (the first is warm-up): 105 / 100
    d = dilation_of(_typed(m))
    assert d.dilation == pytest.approx(1.05) and d.inflated is False
    m["profiled"] = {"per_token_ns": {"0": [1, 190, 200, 210]}}
    d = dilation_of(_typed(m), threshold=0.10)
    assert d.dilation == pytest.approx(2.0) and d.inflated is True
    assert "inflated" in d.sentence()
    none = dilation_of(None)
    assert none.dilation is None and none.inflated is None and none.to_json()["dilation"] is None


def test_dilation_cli(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(
        json.dumps(
            {
                "workload": {"mode": "cpu"},
                "unprofiled": {"per_token_ns": {"0": [5_000_000, 1_000_000, 1_000_000, 1_000_000]}},
                "profiled": {"per_token_ns": {"0": [5_000_000, 1_500_000, 1_500_000, 1_500_000]}},
            }
        )
    )
    res = CliRunner().invoke(dilation_command, [str(run)])
    assert res.exit_code == 0, res.output
    assert "1.50x" in res.output and "INFLATED" in res.output
    res = CliRunner().invoke(dilation_command, [str(run), "--format", "json"])
    assert json.loads(res.output)[0]["dilation"] == pytest.approx(1.5)


def _rows(rank: int, t0: int, h: int, delay: int, ar_start_other: int | None) -> tuple[list[tuple], int]:
    """One step on one rank of the TP=2 run; returns rows and the all-reduce start."""
    k1 = t0 + h
    k2 = k1 + C + h
    ar = k2 + C + h + delay
    return [(rank, "kernel", GEMM, k1, k1 + C), (rank, "kernel", GEMM, k2, k2 + C)], ar


def sharded(h: int, manifest=None, h1: int | None = None) -> Run:
    """Rank 0 leaves host gaps of h, rank 1 of h1 (default h) and sleeps D before its all-reduce."""
    h1 = h if h1 is None else h1
    rows = []
    for k in range(STEPS):
        t0 = k * 100_000
        r0, a0 = _rows(0, t0, h, 0, None)
        r1, a1 = _rows(1, t0, h1, D, None)
        end = max(a0, a1) + X
        for r, ar in ((0, a0), (1, a1)):
            rows.append((r, "kernel", AR, ar, end))
            rows.append((r, "annotation", f"decode_step#{k}", t0, end + h))
        rows += r0 + r1
    return Run(events=_ev(rows), sources={0: "r0", 1: "r1"}, manifest=_typed(manifest))


def baseline(h: int, manifest=None) -> Run:
    rows = []
    for k in range(STEPS):
        t0 = k * 100_000
        t = t0
        for _ in range(4):  # the whole model: 4 GEMMs
            t += h
            rows.append((0, "kernel", GEMM, t, t + C))
            t += C
        rows.append((0, "annotation", f"decode_step#{k}", t0, t + h))
    return Run(events=_ev(rows), sources={0: "r0"}, manifest=_typed(manifest))


def _ev(rows):
    return make_events(
        {
            "rank": [r[0] for r in rows],
            "device": [r[0] if r[1] == "kernel" else -1 for r in rows],
            "stream": [7 if r[1] == "kernel" else 1 for r in rows],
            "kind": [r[1] for r in rows],
            "name": [r[2] for r in rows],
            "start_ns": [r[3] for r in rows],
            "end_ns": [r[4] for r in rows],
        }
    )


def _manifest(tp: int, unprof: int, prof: int) -> dict:
    return {
        "workload": {"tp": tp},
        "unprofiled": {"per_token_ns": {str(r): [unprof] * STEPS for r in range(tp)}},
        "profiled": {"per_token_ns": {str(r): [prof] * STEPS for r in range(tp)}},
    }


def test_corrected_attribution_of_an_injected_delay_is_closer_to_the_truth():
    # by hand: sharded window = 3h + 2C + D + X + h (rank 0 waits D; windows equal -> rank 0)
    #          baseline window = 4C + 5h
    def tn(h: int) -> int:
        return 4 * h + 2 * C + D + X

    def t1(h: int) -> int:
        return 4 * C + 5 * h

    # truth (unprofiled world): coordination = WN + IN - I1/2 = D + 4h - 5h/2
    truth_coord = Fraction(D) + 4 * H_TRUE - Fraction(5 * H_TRUE, 2)
    truth_s = tn(H_TRUE) - Fraction(t1(H_TRUE), 2)
    # the truth really is what the attribution of the unprofiled world gives (same code, no profiler)
    sf_truth = shortfall(baseline(H_TRUE), sharded(H_TRUE))
    assert sf_truth.corrected.terms()["coordination"] == truth_coord

    # the profiled traces, with the unprofiled per-token times in their manifests
    b = baseline(H_PROF, _manifest(1, t1(H_TRUE), t1(H_PROF)))
    s = sharded(H_PROF, _manifest(2, tn(H_TRUE), tn(H_PROF)))
    sf = shortfall(b, s)
    doc = sf.to_json()
    assert doc["per_token_source"] == "unprofiled"
    assert doc["dilation"]["sharded"] == pytest.approx(tn(H_PROF) / tn(H_TRUE))
    assert doc["dilation"]["inflated"] is True
    corrected = sf.corrected.terms()["coordination"]
    uncorrected = sf.uncorrected.terms()["coordination"]
    # the uncorrected attribution books the profiler's host time as coordination
    assert uncorrected == Fraction(D) + 4 * H_PROF - Fraction(5 * H_PROF, 2)
    assert abs(corrected - truth_coord) < abs(uncorrected - truth_coord)
    assert corrected == truth_coord  # here the excess is all idle, so the correction is exact
    assert sf.corrected.shortfall_ns == truth_s
    # shares: the truth's coordination share vs the two attributions'
    share_truth = float(truth_coord / truth_s)
    share_c = float(corrected / sf.corrected.shortfall_ns)
    share_u = float(uncorrected / sf.uncorrected.shortfall_ns)
    assert abs(share_c - share_truth) < abs(share_u - share_truth)
    assert "Profiler dilation" in doc["verdict"]


def test_profiler_slowing_one_host_lands_in_the_other_ranks_wait_and_is_corrected_there():
    """The profiler slows rank 1's host only (gaps H_PROF, rank 0 keeps H_TRUE): rank 0's wait
    grows by 3 (H_PROF - H_TRUE) per token while its own gaps do not. A correction taken out of
    idle alone leaves that in the wait; spread over wait + sync + idle per rank, the corrected wait
    and idle terms are each closer to the unprofiled world's than the traced ones."""

    def tn(h0: int, h1: int) -> int:  # the step: rank 1's three gaps, 2 GEMMs, D, X, rank 0's tail gap
        return 3 * h1 + 2 * C + D + X + h0

    def t1(h: int) -> int:
        return 4 * C + 5 * h

    truth = shortfall(baseline(H_TRUE), sharded(H_TRUE)).corrected.leaf_terms
    b = baseline(H_TRUE, _manifest(1, t1(H_TRUE), t1(H_TRUE)))
    s = sharded(H_TRUE, _manifest(2, tn(H_TRUE, H_TRUE), tn(H_TRUE, H_PROF)), h1=H_PROF)
    sf = shortfall(b, s)
    assert sf.per_token_source == "unprofiled"
    corr, unc = sf.corrected.leaf_terms, sf.uncorrected.leaf_terms
    # premise: the traced wait carries the profiler's host time of the other rank
    assert unc["wait"] - truth["wait"] == Fraction(3 * (H_PROF - H_TRUE), 2)
    for part in ("wait", "idle"):
        assert abs(corr[part] - truth[part]) < abs(unc[part] - truth[part]), part
    # idle-first would have left the wait exactly as traced
    assert corr["wait"] < unc["wait"]
    assert sum(corr[p] for p in corr) == sf.corrected.shortfall_ns


# ------------------------------------------------------------------------------------------
# malformed manifest fields (review finding 2): treated as missing, with a note naming the field

GOOD = {"per_token_ns": {"0": [5, 100, 100, 100], "1": [5, 90, 90, 90]}}


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ([1, 2], "'unprofiled' is a JSON array, not an object"),
        ({"per_token_ns": [1, 2]}, "per_token_ns is a JSON array"),
        ({"per_token_ns": {"0": "abc", "1": [1, 2, 3]}}, "per_token_ns['0'] is a JSON string"),
        ({"per_token_ns": {"0": [None, None, None], "1": [1, 2, 3]}}, "3 value(s) that are not"),
        ({"per_token_ns": {"0": [1, "a", 3]}}, "first: 'a'"),
        ({"per_token_ns": {"0": [1, True, 3]}}, "first: True"),
        ({"per_token_ns": {"0": [1, -4, 3]}}, "first: -4"),
    ],
)
def test_malformed_times_are_missing_with_a_note(block, says):
    from tracekit.analyse.dilation import MalformedTimes

    with pytest.raises(MalformedTimes, match=re.escape(says.split(" is a JSON")[-1])):
        token_times(block)  # the block as JSON: the dilation's own check says what is wrong
    # read as manifest.json is: a block not of its JSON type the reader leaves out (noted there);
    # one of the right type but no times (a negative ns) the dilation leaves out (noted there)
    read = manifest_from_json({"unprofiled": block, "profiled": GOOD, "dilation": 1.25})
    d = dilation_of(read.manifest)
    assert d.unprofiled is None and d.profiled is not None
    # the capture's own figure is kept when the times cannot be used
    assert d.dilation == 1.25 and d.source == "manifest"
    (note,) = [n for _, n in read.notes] + list(d.notes)
    assert note.startswith("manifest.json field 'unprofiled") and "treated as missing" in note
    if d.notes:
        assert says in note and d.to_json()["notes"] == [note]
    else:
        assert read.notes == [("manifest_field_malformed", note)] and "does not fit" in note


def test_well_formed_times_have_no_notes_and_empty_blocks_are_just_missing():
    d = dilation_of(_typed({"unprofiled": GOOD, "profiled": GOOD}))
    assert d.dilation == pytest.approx(1.0) and d.notes == ()
    assert token_times({"per_token_ns": {}}) is None and token_times({"per_token_ns": {"0": []}}) is None
    assert token_times(None) is None and token_times({}) is None


def test_manifest_dilation_not_a_number_is_ignored_with_a_note():
    read = manifest_from_json({"dilation": "fast"})  # not a number: the reader leaves it out
    d = dilation_of(read.manifest)
    assert d.dilation is None and d.manifest_dilation is None and d.notes == ()
    assert read.notes == [
        (
            "manifest_field_malformed",
            "manifest.json field 'dilation' does not fit (Expected `float | null`, got `str`); treated as missing",
        )
    ]
    d = dilation_of(_typed({"dilation": 5000.0}))  # a number, not a dilation: the dilation says so
    assert d.dilation is None and d.manifest_dilation is None
    assert d.notes == ("manifest.json field 'dilation' is 5000.0, not a number from 0.001 to 1000; ignored",)


@pytest.mark.parametrize(
    "unprofiled",
    [[1, 2], {"per_token_ns": {"0": "abc"}}, {"per_token_ns": {"0": [None] * 4}}],
)
def test_dilation_cli_on_malformed_times_runs_clean_with_a_note(tmp_path, unprofiled):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(
        json.dumps(
            {"workload": "x", "unprofiled": unprofiled, "profiled": {"per_token_ns": {"0": [1, 2, 3]}}}
        )
    )
    res = CliRunner().invoke(dilation_command, [str(run)])
    assert res.exit_code == 0 and res.exception is None, res.output
    assert "manifest.json field 'unprofiled" in " ".join(res.output.split())
    res = CliRunner().invoke(dilation_command, [str(run), "--format", "json"])
    doc = json.loads(res.output)[0]
    assert doc["dilation"] is None and doc["unprofiled"] is None and len(doc["notes"]) == 1


def test_dilation_cli_manifest_not_an_object_is_one_error(tmp_path):
    from tracekit.errors import TraceFormatError

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("[1, 2]")
    res = CliRunner().invoke(dilation_command, [str(run)])
    assert isinstance(res.exception, TraceFormatError) and "manifest.json" in str(res.exception)


def test_the_dilation_view_flags_each_run_by_its_figure_and_the_threshold() -> None:
    """`render.dilation.table` on a committed run's manifest: its row holds the dilation and its
    interval as the analysis gives them; the flag is INFLATED for an inflated dilation, NOISY for
    one under 1 / (1 + threshold) (the profiled pass faster), blank between; each note follows the
    table under the run's name."""
    import dataclasses

    from tracekit.analyse.dilation import dilation_of
    from tracekit.read.manifests import read_manifest
    from tracekit.render.dilation import table

    run = "traces/h200-tp2"
    m = read_manifest(Path(__file__).resolve().parents[1] / run / "manifest.json").manifest
    dil = dilation_of(m, skip_first=1, threshold=0.10)
    assert dil.dilation is not None and dil.interval is not None

    def row(d: Any, threshold: float = 0.10) -> str:
        return next(
            ln for ln in table([(run, m, d)], threshold).splitlines() if ln.lstrip("│ ").startswith(run)
        )

    first = row(dil)
    assert f"{dil.dilation:.2f}x" in first and f"{dil.interval[0]:.2f}-{dil.interval[1]:.2f}" in first
    assert ("INFLATED" in first) == bool(dil.inflated)
    assert "INFLATED" in row(dataclasses.replace(dil, dilation=1.5))  # over 1 + 10%
    within = row(dataclasses.replace(dil, dilation=1.05))
    assert "INFLATED" not in within and "NOISY" not in within
    assert "NOISY" in row(dataclasses.replace(dil, dilation=0.85))  # under 1 / 1.1
    assert "NOISY" not in row(dataclasses.replace(dil, dilation=0.85, threshold=0.2), 0.2)  # over 1 / 1.2
    noted = table([(run, m, dataclasses.replace(dil, notes=("a note",)))], 0.10)
    assert f"{run}: a note" in noted
