"""The ground-truth simulator suite (issue 23): simulated TP ranks written as faithful Kineto traces
and manifests (`tests/groundtruth/`), analysed by tracekit as the CLI does, every figure compared
with the truth the simulator computed itself within max(1 us, 1%).

Comparisons the current tracekit gets wrong are the defects of issue 23 being fixed on other
branches: they are marked xfail(strict=True) with the item, so a fix turns them into failures and
the mark must be removed then. Everything else must pass unmarked."""

from __future__ import annotations

import pytest

from tests.groundtruth.cases import CASES
from tests.groundtruth.harness import figures, tolerance
from tests.groundtruth.truth import no_wait

# why the current tracekit fails a comparison (README.md there). profiler_changes_last_rank has no
# profiler calibration, so which rank paid the profiler's cost is not identified from its one
# per-token time: tracekit says so (dilation.correction.sharded: identified false, with ranges) and
# the harness holds wait, idle and the path to the stated ranges and the verdict to naming no rank
# on the path (`harness._not_identified`); what is left:
SYNC_RANGE = (
    "issue 23 items 6/7, not identified without a calibration: the stated range of rank 0's sync term "
    "(read at 9 points of each rank's cost interval) misses the truth's 3.5 us per token: its corrected "
    "sync part dips to the true 5.0 us only at the exact cost (12 us per call) and reads 7.0-7.25 us on "
    "either side"
)
WHATIF_NOT_IDENTIFIED = (
    "issue 23 items 6/7, not identified without a calibration: the what-if predictions under a "
    "solved cost for every rank still give one value (the replay does not state the range the "
    "correction's allocations allow)"
)

#: (case, comparison group) -> why the current tracekit fails it
XFAIL: dict[tuple[str, str], str] = {
    ("profiler_changes_last_rank", "terms_per_rank"): SYNC_RANGE,
    ("profiler_changes_last_rank", "whatif transfer=0"): WHATIF_NOT_IDENTIFIED,
    ("profiler_changes_last_rank", "whatif launch=0"): WHATIF_NOT_IDENTIFIED,
    ("profiler_changes_last_rank", "whatif straggler=off"): WHATIF_NOT_IDENTIFIED,
    ("profiler_changes_last_rank", "shapley"): WHATIF_NOT_IDENTIFIED,
}

GROUPS = (
    "per_token",
    "terms",
    "terms_per_rank",
    "path offset",
    "path device",
    "path host",
    "replay",
    "whatif transfer=0",
    "whatif launch=0",
    "whatif sync=0",
    "whatif straggler=off",
    "whatif compute=/N",
    "whatif all",
    "shapley",
    "clock",
    "steps",
    "diff",
    "verdict",
    "diagnosis",
    "whatif",
)


def _params() -> list[object]:
    out: list[object] = []
    for name, case in CASES.items():
        groups = ["whatif", "replay"] if case.sharded is None else [g for g in GROUPS if g != "whatif"]
        if case.after is None:
            groups = [g for g in groups if g != "diff"]
        if not no_wait(name):
            groups = [g for g in groups if g != "diagnosis"]
        for g in groups:
            marks = []
            if (name, g) in XFAIL:
                marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[(name, g)]))
            out.append(pytest.param(name, g, id=f"{name}-{g}", marks=marks))
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("groundtruth"))


@pytest.mark.parametrize(("case", "group"), _params())
def test_figure_matches_truth(case: str, group: str, root: str) -> None:
    rows = figures(case, root)[group]
    assert rows, f"{case}: no figures in group {group}"
    bad = [
        f"{label}: tracekit {float(got):.0f} ns, truth {float(want):.0f} ns"
        for label, got, want in rows
        if abs(float(got) - float(want)) > tolerance(float(want), label)
    ]
    assert not bad, f"{case} ({CASES[case].about}):\n  " + "\n  ".join(bad)
