"""Where the analysis runs: in this process (`local`, the default) or on a Dask cluster (`dask`).

Every analysis is a plan (`tracekit.analyse.plans`: per-rank stages and run-level combines) and
one executor interface runs any plan (`tracekit.engine.executor.execute`); the engine decides only
where the work is done and what travels:

- `local` (`executor.LocalExecutor`): `tracekit.read.read_run` (a process pool reads the rank
  files) and the plans in this process.
- `dask` (`dask_engine.DaskExecutor`): per rank file one task reads and classifies it and keeps
  its events in that worker's memory; each rank stage of each plan is one task per rank file
  there; only the stages' small results come to the client, which runs the combines
  (docs/SCALE.md). The JSON is the same, to the byte, as the local engine's
  (tests/test_engine_dask.py).

`Engine` is the configuration (frozen); `Engine.parse(kind, scheduler, workers)` is what the CLI's
`--engine / --scheduler / --workers` build. Dask is imported only when the dask engine runs
(`pip install 'tracekit[dask]'`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from tracekit.analyse.attribution.options import DEFAULT_OPTIONS, AttributionOptions
from tracekit.analyse.attribution.pair import check_pair, shortfall_of_pair
from tracekit.analyse.attribution.result import Shortfall
from tracekit.analyse.attribution.run import check_ranks
from tracekit.analyse.command_plans import (
    ReplayInput,
    breakdown_plan,
    figures_plan,
    replay_plan,
    shortfall_plan,
    side_plan,
)
from tracekit.analyse.compare.decompose import RUNS, Decomposition, decomposition_of
from tracekit.analyse.compare.diff import diff_sides
from tracekit.analyse.compare.result import TOP, Diff
from tracekit.analyse.timeline.breakdown import Breakdown
from tracekit.engine.config import ENGINES, Engine, EngineError
from tracekit.engine.executor import execute
from tracekit.engine.jobs import Job, JobResult
from tracekit.model import documents
from tracekit.report import build
from tracekit.report.build import AnalysedRuns

__all__ = [
    "ENGINES",
    "Engine",
    "EngineError",
    "analyse_dirs",
    "breakdown_paths",
    "decompose_paths",
    "diff_paths",
    "pair_check",
    "run_plans",
    "shortfall_paths",
    "shortfall_plan",
    "whatif_runs",
]

Paths = Sequence[str | os.PathLike[str]] | str | os.PathLike[str]


def _as_list(paths: Paths) -> tuple[str | os.PathLike[str], ...]:
    return (paths,) if isinstance(paths, (str, os.PathLike)) else tuple(paths)


def run_plans(engine: Engine | None, jobs: Sequence[Job], check: Any = None) -> tuple[list[JobResult], Any]:
    """`jobs` (`jobs.Job`: a run's paths and the plans to run on it) on the engine: each
    run read once, `check(metas)` before any plan (`executor.execute`)."""
    return execute(engine or Engine(), jobs, check)


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
    engine (`command_plans.breakdown_plan`). `rank`: with one trace file, read it as that rank; with
    several, show only that rank (as the `breakdown` command does)."""
    from pathlib import Path

    plist = _as_list(paths)
    single_file = len(plist) == 1 and Path(plist[0]).is_file()
    read_rank = rank if single_file else None
    show_rank = None if single_file else rank
    plan = breakdown_plan(step_pattern=step_pattern, skip_first=skip_first, rank=show_rank)
    (res,), _ = run_plans(engine, [Job(plist, (plan,), rank=read_rank, cache=cache)])
    return res.results[0].breakdown  # type: ignore[no-any-return]


def pair_check(metas: list[Any]) -> list[tuple[str, str]]:
    """The shortfall's checks on the two runs' metadata (baseline first), before any analysis."""
    check_ranks(metas[0], "baseline")  # a rank file missing first, as `shortfall` says it
    check_ranks(metas[1], "sharded")
    return check_pair(metas[0], metas[1])


def shortfall_paths(
    baseline: Paths,
    sharded: Paths,
    engine: Engine | None = None,
    *,
    options: AttributionOptions | None = None,
    cache: bool = True,
) -> Shortfall:
    """`tracekit.analyse.attribution.pair.shortfall` of `sharded` against `baseline` (both attributed
    with `options`), on the engine (`shortfall_plan` on each run, `shortfall_of_pair` on the
    client)."""
    (base, shard), notes = run_plans(
        engine,
        [
            Job(_as_list(baseline), (shortfall_plan(options, "baseline"),), cache=cache),
            Job(_as_list(sharded), (shortfall_plan(options, "sharded"),), cache=cache),
        ],
        pair_check,
    )
    return shortfall_of_pair(base.results[0], shard.results[0], notes)


def diff_paths(
    before: Paths,
    after: Paths,
    engine: Engine | None = None,
    *,
    before_path: str = "before",
    after_path: str = "after",
    top: int | None = None,
    options: AttributionOptions | None = None,
    cache: bool = True,
) -> tuple[Diff, Any, Any]:
    """`tracekit.analyse.diff.diff` of the two runs (both attributed with `options`, default
    `AttributionOptions()`) on the engine (`command_plans.side_plan` on each, `diff.diff_sides` on
    the client). Returns the diff and the two runs' metadata (before, after: manifest, ranks)."""
    opts = options or DEFAULT_OPTIONS
    pb = side_plan(label=f"before ({before_path})", path=before_path, options=opts)
    pa = side_plan(label=f"after ({after_path})", path=after_path, options=opts)
    (rb, ra), _ = run_plans(
        engine, [Job(_as_list(before), (pb,), cache=cache), Job(_as_list(after), (pa,), cache=cache)]
    )
    b, a = rb.results[0], ra.results[0]
    b.label, a.label = "before", "after"
    result = diff_sides(b, a, top=TOP if top is None else top, dilation_threshold=opts.dilation_threshold)
    return result, rb.meta, ra.meta


def decompose_paths(
    paths: dict[str, str],
    engine: Engine | None = None,
    *,
    options: AttributionOptions | None = None,
    cache: bool = True,
) -> Decomposition:
    """`tracekit.analyse.decompose.decompose_runs` of the three runs (`decompose.RUNS` keys; each
    attributed with `options`) on the engine (`command_plans.figures_plan` on each,
    `decompose.decomposition_of`)."""
    jobs = [Job((paths[k],), (figures_plan(k, path=paths[k], options=options),), cache=cache) for k in RUNS]
    results, _ = run_plans(engine, jobs)
    return decomposition_of({k: res.results[0] for k, res in zip(RUNS, results, strict=True)})


def whatif_runs(
    paths: dict[str, str],
    engine: Engine | None = None,
    *,
    options: AttributionOptions | None = None,
    cache: bool = True,
) -> dict[str, ReplayInput]:
    """What `tracekit.analyse.whatif.pair.whatif` takes of each run (label -> path: baseline, and
    sharded and check when given; each attributed with `options`), on the engine
    (`command_plans.replay_plan`): per label a `ReplayInput` (the RunParts with its dependency
    graph, the replay's device events)."""
    jobs = [Job((p,), (replay_plan(label=k, options=options),), cache=cache) for k, p in paths.items()]
    results, _ = run_plans(engine, jobs)
    out = {}
    for k, res in zip(paths, results, strict=True):
        got: ReplayInput = res.results[0]
        g, parts = got.parts.graph, got.parts
        timeline = parts.timeline if parts.timeline in ("gpu", "host") else "gpu"
        # `whatif.build.build_model` builds the graph again from every event otherwise: not at hand here
        if g is None or g.timeline != timeline or len(g.ranks) != len(parts.ranks):
            raise EngineError(
                f"{paths[k]}: the replay needs the run's dependency graph, which its attribution did not "
                f"build ({parts.timeline} timeline); run the what-if with --engine local"
            )
        out[k] = got
    return out


def analyse_dirs(
    run_dir: str | os.PathLike[str],
    baseline_dir: str | os.PathLike[str] | None = None,
    engine: Engine | None = None,
    *,
    step_pattern: str | None = None,
) -> AnalysedRuns:
    """The report's analyses on the engine: the breakdown (with its top kernels) of the run and
    the baseline, the shortfall between them; each run read once for all of them; only their
    JSON is kept (`tracekit.report.build.AnalysedRuns`)."""
    bd = breakdown_plan(step_pattern=step_pattern)
    if baseline_dir is None:
        (res,), _ = run_plans(engine, [Job((run_dir,), (bd,))])
        out = build.AnalysedRuns(
            breakdown=build.analysed_document(res.results[0].breakdown, documents.Breakdown),
            manifest=res.meta.manifest,
        )
        out.top_kernels = build.analysed_document(res.results[0].top_kernels, documents.TopKernels)
        return out
    # the shortfall with the default options, as `report.build.analyse_dirs` makes it
    (base, run), notes = run_plans(
        engine,
        [
            Job((baseline_dir,), (bd, shortfall_plan(None, "baseline"))),
            Job((run_dir,), (bd, shortfall_plan(None, "sharded"))),
        ],
        pair_check,
    )
    out = build.AnalysedRuns(
        breakdown=build.analysed_document(run.results[0].breakdown, documents.Breakdown),
        manifest=run.meta.manifest,
    )
    out.top_kernels = build.analysed_document(run.results[0].top_kernels, documents.TopKernels)
    out.baseline_breakdown = build.analysed_document(base.results[0].breakdown, documents.Breakdown)
    out.baseline_manifest = base.meta.manifest
    out.baseline_top_kernels = build.analysed_document(base.results[0].top_kernels, documents.TopKernels)
    out.shortfall = build.analysed_document(
        shortfall_of_pair(base.results[1], run.results[1], notes), documents.Shortfall
    )
    return out
