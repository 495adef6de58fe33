"""The attribution plan's step rule and windows in one rank stage (issue 27: one barrier fewer).

Each rank's rule task also finds its windows under its own rule (`choose_step_rule` on that rank
alone); the client keeps them for the ranks whose own rule is the run's, and only the others run
the windows stage, under the run's rule. The windows must be those of the two stages in turn (the
run's rule from every rank's summary, then every rank's windows under it), on a real run where
every rank has the run's markers (traces/h200-tp2: no windows task on Dask) and on the same run
with rank 1's `decode_step` annotations taken out and no manifest (auto's rule: rank 1's own is
then `profiler_step`, the run's still `decode_step`: rank 1 alone runs the windows stage, and finds none under the run's rule).
"""

from __future__ import annotations

import gzip
import json
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tracekit.analyse.attribution.plan import attribution_plan
from tracekit.analyse.attribution.run import attribute_setup
from tracekit.analyse.plans import Plan, run_in_process, split_ranks
from tracekit.analyse.timeline.rules import choose_step_rule, rank_step_summary
from tracekit.analyse.timeline.steps import assemble_steps
from tracekit.analyse.timeline.windows import rank_step_windows
from tracekit.read import read_run

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "traces" / "h200-tp2"


def _without_decode_steps(out: Path) -> Path:
    """traces/h200-tp2's two rank files in `out`, rank 1's `decode_step` annotations taken out
    (host and device side); no manifest (it pins the files' digests)."""
    for src in sorted(RUN.glob("rank-*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(src.read_bytes()))
        if src.name.startswith("rank-1."):
            n = len(doc["traceEvents"])
            doc["traceEvents"] = [
                e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("decode_step")
            ]
            assert len(doc["traceEvents"]) < n
        (out / src.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def _to_windows() -> Plan:
    """The attribution plan up to its windows' combine; its result the plan's state."""
    plan = attribution_plan(label="run")
    assert [s.name for s in plan.stages[:2]] == ["rule", "windows"]
    return Plan("attribution", plan.start, plan.stages[:2], lambda st, _arg: st)


def _two_stages(run: Any) -> tuple[Any, pd.DataFrame, dict[int, Any]]:
    """The run's rule from every rank's summary, then every rank's windows under it: (the rule,
    the assembled steps, each rank's own rule)."""
    pattern, _dq = attribute_setup(run, "run", None)  # the manifest's step pattern, if any
    ranks = split_ranks(run)
    summaries = {r: rank_step_summary(inp.events, pattern) for r, inp in ranks.items()}
    choice = choose_step_rule([summaries[r] for r in sorted(ranks)], pattern)
    found = assemble_steps(choice, [rank_step_windows(ranks[r].events, choice) for r in sorted(ranks)])
    return choice, found.steps, {r: choose_step_rule([s], pattern) for r, s in summaries.items()}


@pytest.fixture(scope="module")
def edited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _without_decode_steps(tmp_path_factory.mktemp("rule"))


@pytest.mark.parametrize("which", ["as captured", "rank 1 without decode_step"])
def test_the_fused_rule_stage_gives_the_two_stages_windows(which: str, edited: Path) -> None:
    path = RUN if which == "as captured" else edited
    run = read_run([path], cache=False)
    choice, steps, own = _two_stages(run)
    assert choice.pattern == "decode_step"  # the manifest's pattern; without it (edited) auto's rule
    if which == "as captured":
        assert set(own.values()) == {choice}
        assert sorted(steps["rank"].unique().tolist()) == [0, 1]
    else:  # rank 1's own rule differs: its windows are found again, under the run's rule
        assert own[0] == choice and own[1].rule == "profiler_step"
        assert steps["rank"].unique().tolist() == [0]  # none on rank 1 under decode_step
    st = run_in_process(_to_windows(), run)
    assert st.choice == choice
    pd.testing.assert_frame_equal(st.found.steps, steps)


@pytest.mark.skipif(find_spec("distributed") is None, reason="Dask (the dask extra) is not installed")
@pytest.mark.parametrize("which", ["as captured", "rank 1 without decode_step"])
def test_on_dask_only_a_rank_whose_own_rule_differs_runs_the_windows_stage(
    which: str, edited: Path, dask: Any
) -> None:
    from tracekit.engine.dask_engine import DaskExecutor
    from tracekit.engine.executor import Job

    path = RUN if which == "as captured" else edited
    (res,), _ = DaskExecutor(dask).run([Job((path,), (_to_windows(),), cache=False)])
    _choice, steps, _own = _two_stages(read_run([path], cache=False))
    pd.testing.assert_frame_equal(res.results[0].found.steps, steps)
    rule = [t for t in res.tasks if t.stage == "attribution.rule"]
    windows = [t.ranks for t in res.tasks if t.stage == "attribution.windows"]
    assert sorted(r for t in rule for r in t.ranks) == [0, 1]
    assert windows == ([] if which == "as captured" else [[1]])


@pytest.mark.parametrize("sizes", [[1, 16], [16, 1], [2, 8, 1], [4, 4]])
def test_the_largest_runs_graph_worker_takes_no_other_runs_reduce(sizes: list[int]) -> None:
    """The Reduces' placement on Dask (`_Run.pair_workers`): the run of most ranks (the first of
    them) has its graph's Reduce (then its correction, on that graph) and its path's on two
    workers; no smaller run's graph or path Reduce goes to that graph's worker, on any cluster of
    two workers or more; its tasks alone have the higher priority."""
    from tracekit.engine import Engine
    from tracekit.engine.dask_engine import _Run

    for n in range(1, 10):
        r = _Run(None, Engine(kind="dask"), [None] * len(sizes), [])  # type: ignore[list-item]
        r.workers, r.sizes = [f"w{i}" for i in range(n)], sizes
        big = sizes.index(max(sizes))
        graph, path = r.pair_workers(big)
        assert {graph, path} <= set(range(n))
        assert (graph != path) == (n > 1)
        others = [w for j in range(len(sizes)) if j != big for w in r.pair_workers(j)]
        if n > 1:
            assert graph not in others, (n, sizes)
        assert [r.priority(j) for j in range(len(sizes))] == [int(j == big) for j in range(len(sizes))]


@pytest.mark.skipif(find_spec("distributed") is None, reason="Dask (the dask extra) is not installed")
def test_on_four_workers_a_one_rank_baseline_waits_for_the_sharded_runs_rank_stages(
    synthetic_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-rank baseline against the synthetic many-rank run on four workers: every stage of
    the baseline's plan waits (`_Runner.hold`) until the sharded run's rank stages are over, and
    the shortfall is still the local engine's JSON."""
    from distributed import LocalCluster
    from engine_refs import local_shortfall, text

    from tracekit.engine import Engine, shortfall_paths
    from tracekit.engine.dask_engine import _Runner

    held: list[tuple[int, str, bool, str]] = []  # (job, stage, held, the sharded run's stage)
    hold = _Runner.hold

    def spy(self: Any, st: Any) -> bool:
        got = hold(self, st)
        sharded = next(rn for rn in self.run.runners if rn.j == 1)
        if self.j == 0:
            held.append((self.j, st.name, got, sharded.plan.stages[min(sharded.stage, 9)].name))
        return got

    monkeypatch.setattr(_Runner, "hold", spy)
    base = ROOT / "traces" / "h200-tp1-graphs-fused"
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0", silence_logs=40
    ) as c:
        doc = shortfall_paths(base, synthetic_run, Engine(kind="dask", scheduler=c.scheduler_address))
    assert text(doc.to_json()) == local_shortfall(base, synthetic_run)
    # the baseline's first stage held while the sharded run had rank stages ahead, then run
    first = [h for h in held if h[1] == "rule"]
    assert first[0][2] and first[-1][2] is False
    # no stage of the baseline's submitted while the sharded run was at its first rank stages
    early = {"rule", "windows", "match", "attribute"}
    assert all(h[2] for h in held if h[3] in early)


@pytest.mark.parametrize(
    ("files", "homed"),
    [([1, 16], {0}), ([16, 1], {1}), ([4, 4], set()), ([2, 8, 1], {0, 2}), ([5, 16], set())],
)
def test_a_small_runs_files_are_read_on_the_last_worker_never_the_graph_worker(
    files: list[int], homed: set[int]
) -> None:
    """`small_run_homes`: a run of at most a quarter of the largest run's files (a one-GPU
    baseline) is read on the last worker on clusters of three workers or more, which is never the
    largest run's graph worker (`_Run.pair_workers`): its rank stages there would wait behind the
    largest run's serial graph and correction Reduces. A run of more than a quarter (5 of 16) and
    every run on one or two workers is left to the scheduler."""
    from tracekit.engine import Engine
    from tracekit.engine.dask_engine import _Run, small_run_homes

    for n in range(1, 10):
        workers = [f"w{i}" for i in range(n)]
        homes = small_run_homes(files, workers)
        assert set(homes) == (homed if n >= 3 else set()), (n, files)
        r = _Run(None, Engine(kind="dask"), [None] * len(files), [])  # type: ignore[list-item]
        r.workers, r.sizes = workers, files
        graph, _path = r.pair_workers(files.index(max(files)))
        assert all(w == workers[-1] != workers[graph] for w in homes.values())


@pytest.mark.skipif(find_spec("distributed") is None, reason="Dask (the dask extra) is not installed")
def test_on_four_workers_the_baselines_rank_stages_run_off_the_sharded_runs_graph_worker(
    synthetic_run: Path,
) -> None:
    """The real placement on a four-worker cluster: every rank-stage task of a one-rank baseline
    ran on the last worker (where its file was read), none on the worker of the sharded run's
    graph Reduce (the 8-worker stream of 2026-12-03 had the baseline's chain wait there for the
    sharded run's graph and correction); both results are the local engine's."""
    from distributed import LocalCluster

    from tracekit.engine import Engine
    from tracekit.engine.dask_engine import DaskExecutor
    from tracekit.engine.executor import Job, LocalExecutor

    base = ROOT / "traces" / "h200-tp1-graphs-fused"
    jobs = [
        Job((base,), (attribution_plan(label="baseline"),)),
        Job((synthetic_run,), (attribution_plan(label="sharded"),)),
    ]
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0", silence_logs=40
    ) as c:
        got, _ = DaskExecutor(Engine(kind="dask", scheduler=c.scheduler_address)).run(jobs)
        last = sorted(c.scheduler.workers)[-1]
    ref, _ = LocalExecutor().run(jobs)
    graph = {t.worker for t in got[1].tasks if t.stage == "graph"}
    ranks = [t for t in got[0].tasks if t.stage.startswith("attribution.")]
    assert ranks and {t.worker for t in ranks} == {last}
    assert len(graph) == 1 and last not in graph
    # the sharded run's assembly (`plans.Later`) ran on the client while its Reduces ran
    assert 0 < got[1].client_beside_s < got[1].client_s
    for g, r in zip(got, ref, strict=True):
        pd.testing.assert_frame_equal(g.results[0].steps, r.results[0].steps)
        assert g.results[0].per_token == r.results[0].per_token
        assert g.results[0].path_token == r.results[0].path_token
