"""What an executor is given and gives back: a `Job` (one run's paths and the plans to run on
it), per job a `JobResult` (the run's metadata, each plan's result, what the tasks did:
`TaskRecord`), and the `Check` run on the runs' metadata before any plan (`executor.execute`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracekit.analyse.plans import Plan
from tracekit.model.events import Run

__all__ = ["Check", "Job", "JobResult", "TaskRecord"]


@dataclass(frozen=True)
class Job:
    """One run to analyse: its paths (files and/or folders), read settings and plans."""

    paths: tuple[str | os.PathLike[str], ...]
    plans: tuple[Plan, ...]
    rank: int | None = None  # read a single trace file as this rank
    cache: bool = True


@dataclass
class TaskRecord:
    """What one task did (for the tests and the benchmark)."""

    stage: str  # "read" or "<plan>.<stage>"
    file: str
    ranks: list[int]
    seconds: float
    peak_rss_bytes: int = 0
    worker: str = ""  # on Dask, the address of the worker that ran a rank stage or a Reduce


@dataclass
class JobResult:
    meta: Run  # the run's metadata (events empty on Dask)
    results: list[Any]  # per plan, in order
    tasks: list[TaskRecord] = field(default_factory=list)
    client_s: float = 0.0  # the client's own work: metadata, starts, combines, finishes
    client_beside_s: float = 0.0  # of it, done while the workers ran tasks (Dask: `plans.Later`)
    n_events: int = 0
    files: int = 0


Check = Callable[[list[Run]], Any]
