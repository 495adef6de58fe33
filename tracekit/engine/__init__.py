"""Where the analysis runs: in this process (`local`, the default) or on a Dask cluster (`dask`).

The analyses (`breakdown`, `shortfall`, the report's `analyse_dirs`) are the same code either way;
the engine decides only where the work is done and what travels:

- `local`: `tracekit.read.read_run` (a process pool reads the rank files) and the analysis in this
  process, as always.
- `dask` (`tracekit.engine.dask_engine`): per rank file, one task reads, classifies and writes the
  classified events as Parquet into a shared folder (memory: one rank file); the analyses run as
  per-rank tasks (each one rank file's Parquet), per-bucket collective matching and per-step-range
  critical-path tasks, and only summaries (per-step partition rows, per-collective rows, the walk's
  per-step records) come back to the client, which assembles them with the local engine's pieces
  (docs/SCALE.md). The JSON is the same, to the byte, as the local engine's (tests/test_engine_dask.py).

`Engine` is the configuration (frozen); `Engine.parse(kind, scheduler, workers)` is what the CLI's
`--engine / --scheduler / --workers` build. Dask is imported only when the dask engine runs
(`pip install 'tracekit[dask]'`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tracekit.errors import TracekitError

if TYPE_CHECKING:
    from tracekit.analyse.breakdown import Breakdown
    from tracekit.analyse.shortfall import Shortfall
    from tracekit.report.build import AnalysedRuns

__all__ = ["ENGINES", "Engine", "EngineError", "breakdown_paths", "shortfall_paths", "analyse_dirs"]

ENGINES: tuple[str, ...] = ("local", "dask")

Paths = Sequence[str | os.PathLike[str]] | str | os.PathLike[str]


class EngineError(TracekitError):
    """The engine cannot run (Dask not installed, scheduler unreachable, a bad setting)."""


@dataclass(frozen=True)
class Engine:
    """Where the analysis runs."""

    kind: str = "local"  # "local" (this process + the reader's process pool) or "dask"
    scheduler: str | None = (
        None  # address of a running Dask scheduler (tcp://host:8786); None: a LocalCluster
    )
    workers: int | None = None  # LocalCluster workers (default: the CPU count); ignored with `scheduler`
    work_dir: str | None = None  # folder for the per-rank Parquet files, visible to every worker (default: a
    # temporary folder on the client, removed afterwards: right for a LocalCluster, not for remote workers)
    processes: bool = True  # LocalCluster workers as processes; False: threads of this process (tests)
    threads_per_worker: int = 1  # LocalCluster threads per worker
    retries: int = 2  # times a task is retried when it fails or its worker is lost
    progress: bool = False  # a rich progress bar on stderr over the rank files done on all workers
    buckets: int = 16  # hash partitions of the process groups for cross-rank collective matching

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise EngineError(f"unknown engine {self.kind!r} (choose from {', '.join(ENGINES)})")
        if self.workers is not None and self.workers < 1:
            raise EngineError(f"--workers must be at least 1, not {self.workers}")

    @classmethod
    def parse(
        cls,
        kind: str | None = None,
        scheduler: str | None = None,
        workers: int | None = None,
        *,
        work_dir: str | None = None,
        progress: bool = False,
    ) -> Engine:
        """The engine the CLI options ask for: `--scheduler` or `--workers` without `--engine`
        mean dask; `--engine local` with either is refused (EngineError)."""
        if kind is None:
            kind = "dask" if (scheduler or workers is not None) else "local"
        if kind == "local" and (scheduler or workers is not None):
            raise EngineError("--scheduler and --workers apply to --engine dask, not --engine local")
        return cls(kind=kind, scheduler=scheduler, workers=workers, work_dir=work_dir, progress=progress)


def _as_list(paths: Paths) -> list[str | os.PathLike[str]]:
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)


def breakdown_paths(
    paths: Paths,
    engine: Engine | None = None,
    *,
    step_pattern: str | None = None,
    skip_first: int = 0,
    rank: int | None = None,
    cache: bool = True,
) -> Breakdown:
    """`tracekit.analyse.breakdown.breakdown` of the run in `paths` (files and/or folders), on the
    engine. `rank`: with one trace file, read it as that rank; with several, show only that rank
    (as the `breakdown` command does)."""
    from pathlib import Path

    engine = engine or Engine()
    plist = _as_list(paths)
    single_file = len(plist) == 1 and Path(plist[0]).is_file()
    read_rank = rank if single_file else None
    show_rank = None if single_file else rank
    if engine.kind == "local":
        from tracekit.analyse.breakdown import breakdown
        from tracekit.read import read_run

        run = read_run(plist, rank=read_rank, cache=cache, progress=engine.progress)
        return breakdown(run, step_pattern=step_pattern, skip_first=skip_first, rank=show_rank)
    from tracekit.engine import dask_engine

    (result,) = dask_engine.analyse(
        engine,
        [
            dask_engine.RunJob(
                paths=plist,
                rank=read_rank,
                cache=cache,
                breakdown={"step_pattern": step_pattern, "skip_first": skip_first, "rank": show_rank},
            )
        ],
    )
    return result.breakdown  # type: ignore[return-value]


def shortfall_paths(
    baseline: Paths,
    sharded: Paths,
    engine: Engine | None = None,
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float | None = None,
    allow_partial: bool = False,
    cache: bool = True,
) -> Shortfall:
    """`tracekit.analyse.shortfall.shortfall` of `sharded` against `baseline`, on the engine."""
    from tracekit.analyse.dilation import DEFAULT_THRESHOLD

    engine = engine or Engine()
    kw: dict[str, Any] = {
        "step_pattern": step_pattern,
        "skip_first": skip_first,
        "dilation_threshold": DEFAULT_THRESHOLD if dilation_threshold is None else dilation_threshold,
        "allow_partial": allow_partial,
    }
    if engine.kind == "local":
        from tracekit.analyse.shortfall import shortfall
        from tracekit.read import read_run

        run_b = read_run(_as_list(baseline), cache=cache, progress=engine.progress)
        run_s = read_run(_as_list(sharded), cache=cache, progress=engine.progress)
        return shortfall(run_b, run_s, **kw)
    from tracekit.engine import dask_engine

    base, shard = dask_engine.analyse(
        engine,
        [
            dask_engine.RunJob(paths=_as_list(baseline), cache=cache, attribute={**kw, "label": "baseline"}),
            dask_engine.RunJob(paths=_as_list(sharded), cache=cache, attribute={**kw, "label": "sharded"}),
        ],
        pair=(0, 1),
    )
    return _shortfall_of(base, shard)


def _shortfall_of(base: Any, shard: Any) -> Shortfall:
    """`tracekit.analyse.shortfall.shortfall`'s tail (`shortfall_of_pair`) on the two runs'
    parts, with `check_pair`'s notes (the engine ran it between its stages, before the analyses)."""
    from tracekit.analyse.shortfall import shortfall_of_pair

    return shortfall_of_pair(base.parts, shard.parts, base.pair_notes)


def analyse_dirs(
    run_dir: str | os.PathLike[str],
    baseline_dir: str | os.PathLike[str] | None = None,
    engine: Engine | None = None,
    *,
    step_pattern: str | None = None,
) -> AnalysedRuns:
    """The report's analyses (`tracekit.report.build.analyse_dirs`: breakdown of the run and the
    baseline, the shortfall between them), on the engine; only their JSON is kept."""
    from pathlib import Path

    from tracekit.report import build

    engine = engine or Engine()
    if engine.kind == "local":
        return build.analyse_dirs(
            Path(run_dir), None if baseline_dir is None else Path(baseline_dir), step_pattern=step_pattern
        )
    from tracekit.engine import dask_engine

    jobs = [
        dask_engine.RunJob(
            paths=[run_dir],
            breakdown={"step_pattern": step_pattern},
            attribute={"label": "sharded"} if baseline_dir is not None else None,
        )
    ]
    if baseline_dir is not None:
        jobs.append(
            dask_engine.RunJob(
                paths=[baseline_dir],
                breakdown={"step_pattern": step_pattern},
                attribute={"label": "baseline"},
            )
        )
    results = dask_engine.analyse(engine, jobs, pair=(1, 0) if baseline_dir is not None else None)
    out = build.AnalysedRuns(breakdown=build._to_json(results[0].breakdown), manifest=results[0].manifest)
    out.top_kernels = build._to_json(results[0].top_kernels) if results[0].top_kernels else None
    if baseline_dir is not None:
        base = results[1]
        out.baseline_breakdown = build._to_json(base.breakdown)
        out.baseline_manifest = base.manifest
        out.baseline_top_kernels = build._to_json(base.top_kernels) if base.top_kernels else None
        out.shortfall = build._to_json(_shortfall_of(base, results[0]))
    return out
