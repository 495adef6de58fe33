"""Stage 2 of a breakdown, a shortfall and a report on the Dask engine holds one rank file's
events per task (issue 19); the shortfall's critical path walks in step-bucket tasks, each given
every rank's layer unions clipped to its own steps only.

On a LocalCluster of threads (`processes=False`, so the tasks run in this process), every Parquet
read is counted: a per-rank task receives one rank file's Parquet path and loads that file's rows
only, and no task loads the run's table (`load_run` is never called). The JSON is the local
engine's, to the byte, on the synthetic 64-rank run and on an Nsight pair (ranks renumbered and
clocks shifted per file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

import pandas as pd  # noqa: E402

from tracekit.engine import Engine, breakdown_paths, dask_engine  # noqa: E402
from tracekit.engine.synthetic import make_synthetic_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


@pytest.fixture(scope="module")
def dask() -> Any:
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0", silence_logs=40
    ) as c:
        yield Engine(kind="dask", scheduler=c.scheduler_address)


@pytest.fixture(scope="module")
def synthetic16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_run(TRACES / "cpu-tp2", tmp_path_factory.mktemp("syn") / "tp16", 16, max_steps=3)


def _text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every Parquet read as (file, rows, ranks); `load_run` fails (no task may load the run)."""
    reads: list[tuple[str, int, int]] = []
    real = pd.read_parquet

    def counting(path: Any, *a: Any, **k: Any) -> pd.DataFrame:
        df = real(path, *a, **k)
        reads.append((str(path), len(df), df["rank"].nunique() if "rank" in df.columns else 0))
        return df

    def no_run(*a: Any, **k: Any) -> Any:
        raise AssertionError("a task loaded the whole run")

    monkeypatch.setattr(pd, "read_parquet", counting)
    monkeypatch.setattr(dask_engine, "load_run", no_run)
    return reads


@pytest.mark.parametrize("kw", [{}, {"skip_first": 1}, {"step_pattern": "whole"}, {"rank": 5}])
def test_a_breakdown_task_holds_one_rank_files_rows(
    dask: Engine, synthetic16: Path, monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]
) -> None:
    local = _text(breakdown_paths(synthetic16, **kw).to_json())
    reads = _counting_reads(monkeypatch)
    (res,) = dask_engine.analyse(
        dask,
        [
            dask_engine.RunJob(
                paths=[synthetic16], breakdown={"step_pattern": None, "skip_first": 0, "rank": None, **kw}
            )
        ],
    )
    assert _text(res.breakdown.to_json()) == local  # type: ignore[union-attr]
    event_reads = [r for r in reads if ".coll-b" not in r[0]]
    assert event_reads and all(ranks <= 1 for _p, _rows, ranks in event_reads)
    # each task got one rank file's Parquet path, read that file alone and held at most one rank
    n_files = 1 if "rank" in kw else 16
    assert len(res.rank_tasks) == 2 * n_files  # the step-rule summary, then the breakdown pieces
    assert len({t.parquet for t in res.rank_tasks}) == n_files
    assert {p for p, _rows, _r in event_reads} == {t.parquet for t in res.rank_tasks}
    assert all(len(t.ranks) <= 1 for t in res.rank_tasks)
    largest = max(p.n_events for p in res.files)
    assert max(t.rows for t in res.rank_tasks) <= largest < sum(p.n_events for p in res.files)


@pytest.mark.parametrize("run", ["h200-tp2-nsys", "h200-tp2"])
def test_per_rank_breakdown_on_committed_runs(dask: Engine, run: str) -> None:
    for kw in ({}, {"skip_first": 2}, {"step_pattern": "whole"}):
        local = _text(breakdown_paths(TRACES / run, **kw).to_json())
        assert _text(breakdown_paths(TRACES / run, dask, **kw).to_json()) == local


@pytest.mark.parametrize(("base", "sharded"), [("cpu-tp1", None), ("h200-tp1", "h200-tp2-nsys")])
def test_a_shortfall_task_holds_one_rank_files_rows(
    dask: Engine, synthetic16: Path, monkeypatch: pytest.MonkeyPatch, base: str, sharded: str | None
) -> None:
    from tracekit.analyse.shortfall import shortfall_from_parts
    from tracekit.engine import shortfall_paths

    shard = synthetic16 if sharded is None else TRACES / sharded
    local = _text(shortfall_paths(TRACES / base, shard).to_json())
    reads = _counting_reads(monkeypatch)
    b_res, s_res = dask_engine.analyse(
        dask,
        [
            dask_engine.RunJob(paths=[TRACES / base], attribute={"label": "baseline"}),
            dask_engine.RunJob(paths=[shard], attribute={"label": "sharded"}),
        ],
        pair=(0, 1),
    )
    for key, note in b_res.pair_notes:
        b_res.parts.data_quality.add(key, 1, note)  # type: ignore[union-attr]
    assert _text(shortfall_from_parts(b_res.parts, s_res.parts).to_json()) == local  # type: ignore[arg-type]
    event_reads = [r for r in reads if ".coll-b" not in r[0]]
    # every read is one rank file's Parquet (one rank each, but the Nsight file holds two ranks)
    files = {p.parquet: p for res in (b_res, s_res) for p in res.files}
    assert event_reads and all(
        path in files and ranks <= len(files[path].sources) and rows == files[path].n_events
        for path, rows, ranks in event_reads
    )
    if sharded is None:
        assert all(ranks <= 1 for _p, _rows, ranks in event_reads)
    for res in (b_res, s_res):
        # per rank file: the step-rule summary, the windows, the attribution; each one file's rows
        n_files = len(res.files)
        assert len(res.attribute_tasks) == 3 * n_files
        assert all(len(t.ranks) <= max(len(p.sources) for p in res.files) for t in res.attribute_tasks)
        largest = max(p.n_events for p in res.files)
        assert max(t.rows for t in res.attribute_tasks) <= largest
        # the critical path: one task, given every rank's share of the dependency graph (the
        # graph chains the steps: time between steps is host work on it), every step once
        steps = res.parts.steps  # type: ignore[union-attr]
        got = sorted(k for w in res.path_tasks for k in w.received)
        assert got == sorted((int(r), int(s)) for r, s in steps[["rank", "step"]].itertuples(index=False))
        for w in res.path_tasks:
            assert {s for _r, s in w.received} == set(w.steps)
        assert sorted(s for w in res.path_tasks for s in w.steps) == sorted(set(steps["step"].tolist()))
        assert len(res.path_tasks) == 1


def test_report_on_dask_loads_no_run(dask: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.engine import analyse_dirs

    local = analyse_dirs(TRACES / "h200-tp2", TRACES / "h200-tp1")
    reads = _counting_reads(monkeypatch)
    got = analyse_dirs(TRACES / "h200-tp2", TRACES / "h200-tp1", dask)
    assert reads and all(ranks <= 1 for p, _rows, ranks in reads if ".coll-b" not in p)
    for name in ("breakdown", "baseline_breakdown", "shortfall"):
        assert json.dumps(getattr(got, name), indent=1) == json.dumps(getattr(local, name), indent=1)


def test_clipped_unions_measure_what_the_whole_ones_do() -> None:
    from tracekit.analyse.steps import rank_layer_unions
    from tracekit.read import read_run

    run = read_run([TRACES / "cpu-tp2"])
    from tracekit.classify import classify

    ev = classify(run.events)
    lay = rank_layer_unions(ev, [0])[0]
    lo0, hi0 = int(ev["start_ns"].min()), int(ev["end_ns"].max())
    rng = __import__("random").Random(0)
    for _ in range(200):
        lo, hi = sorted(rng.randint(lo0 - 10, hi0 + 10) for _ in range(2))
        cut = lay.clipped(lo, hi)
        a, b = sorted(rng.randint(lo, hi) for _ in range(2))
        assert cut.measure(a, b) == lay.measure(a, b)
        assert cut.measure(b, a) == lay.measure(b, a)  # empty: zeros anywhere
        if lo > lo0:
            with pytest.raises(AssertionError, match="outside the clipped"):
                cut.measure(lo - 1, hi)


def test_per_rank_and_path_tasks_that_fail_once_are_retried(
    dask: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracekit.engine import shortfall_paths

    local = _text(shortfall_paths(TRACES / "h200-tp1", TRACES / "h200-tp2").to_json())
    for name in ("rank_attributions", "walk_bucket"):
        marker = tmp_path / f"failed-{name}"
        real = getattr(dask_engine, name)

        def flaky(*a: Any, _real: Any = real, _marker: Path = marker, **k: Any) -> Any:
            if not _marker.exists():
                _marker.write_text("x")
                raise OSError("worker lost its disk for a moment")
            return _real(*a, **k)

        monkeypatch.setattr(dask_engine, name, flaky)
    assert _text(shortfall_paths(TRACES / "h200-tp1", TRACES / "h200-tp2", dask).to_json()) == local
    assert (tmp_path / "failed-rank_attributions").exists() and (tmp_path / "failed-walk_bucket").exists()
