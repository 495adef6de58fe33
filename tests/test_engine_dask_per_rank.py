"""Stage 2 of a breakdown on the Dask engine holds one rank's events per task (issue 19).

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


@pytest.mark.parametrize("kw", [{}, {"skip_first": 1}, {"step_pattern": "whole"}, {"rank": 5}])
def test_a_breakdown_task_holds_one_rank_files_rows(
    dask: Engine, synthetic16: Path, monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]
) -> None:
    local = _text(breakdown_paths(synthetic16, **kw).to_json())
    reads: list[tuple[str, int, int]] = []  # (file, rows, ranks) of every Parquet read
    real = pd.read_parquet

    def counting(path: Any, *a: Any, **k: Any) -> pd.DataFrame:
        df = real(path, *a, **k)
        reads.append((str(path), len(df), df["rank"].nunique() if "rank" in df.columns else 0))
        return df

    def no_run(*a: Any, **k: Any) -> Any:
        raise AssertionError("a breakdown task loaded the whole run")

    monkeypatch.setattr(pd, "read_parquet", counting)
    monkeypatch.setattr(dask_engine, "load_run", no_run)
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
