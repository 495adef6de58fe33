"""One executor interface for every analysis plan (`tracekit.analyse.plans`), two implementations.

A `Job` is one run (its paths) and the plans to run on it; `execute(engine, jobs, check=...)`
reads every job's run once and runs its plans on it, returning per job a `JobResult` (the run's
metadata, each plan's result in order, what the tasks did). `check(metas)` runs on the run
metadata after every read and before any plan (the shortfall's pair checks), and returns what
`execute` hands back as `checked`.

- `LocalExecutor`: `tracekit.read.read_run` (its process pool reads the rank files), the run
  classified once, then each plan in this process (`plans.run_in_process`).
- `tracekit.engine.dask_engine.DaskExecutor`: one task per rank file reads and classifies it
  and holds its ranks' events in that worker's memory; every rank stage of every plan is one
  task per rank file on that state; only the stages' small results reach the client, which runs
  the combines; a plan's `Reduce` runs in one task on a worker.

Plans run in job order, and an error is raised as the local engine would raise it: the first
failing plan in that order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.plans import run_in_process, split_ranks
from tracekit.engine.config import Engine
from tracekit.engine.dask_engine import DaskExecutor
from tracekit.engine.jobs import Check, Job, JobResult, TaskRecord
from tracekit.read import read_run

__all__ = ["Check", "Job", "JobResult", "LocalExecutor", "TaskRecord", "execute"]


class LocalExecutor:
    """Plans in this process on runs read by `read_run` (its process pool)."""

    def __init__(self, progress: bool = False) -> None:
        self.progress = progress

    def run(self, jobs: Sequence[Job], check: Check | None = None) -> tuple[list[JobResult], Any]:
        runs = []
        for job in jobs:
            read = read_run(list(job.paths), rank=job.rank, cache=job.cache, progress=self.progress)
            runs.append(AnalysedRun.of(read))  # classified once for every plan
        checked = check([ar.run for ar in runs]) if check is not None else None
        out = []
        for job, ar in zip(jobs, runs, strict=True):
            t0 = time.perf_counter()
            ranks = split_ranks(ar)  # each rank's AnalysedRun, its partitions shared by the plans
            results = []
            for plan in job.plans:
                only = plan.only_rank
                mine = ranks if only is None else {r: v for r, v in ranks.items() if r == only}
                results.append(run_in_process(plan, ar, mine))
            run = ar.run
            out.append(
                JobResult(
                    meta=run,
                    results=results,
                    client_s=time.perf_counter() - t0,
                    n_events=len(run.events),
                    files=len(run.sources),
                )
            )
        return out, checked


def execute(engine: Engine, jobs: Sequence[Job], check: Check | None = None) -> tuple[list[JobResult], Any]:
    """Run `jobs` on `engine` (`tracekit.engine.Engine`): locally or on Dask."""
    if engine.kind == "local":
        return LocalExecutor(engine.progress).run(jobs, check)
    return DaskExecutor(engine).run(jobs, check)
