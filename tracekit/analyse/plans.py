"""Analyses as plans: per-rank stages and run-level combines, run by any executor (issue 27).

A `Plan` is what one analysis of one run needs, said once:

- `start(meta)`: on the client, from the run's metadata (a `Run` whose events may be empty):
  the plan's client-side state and the first stage's argument;
- `stages`: in order, each either
  - a `RankStage`: `rank(RankInput, arg)` per rank where the rank's events are (the heavy work:
    steps, partitions, per-rank graph pieces), returning something small, then
    `combine(state, {rank: result})` on the client (cheap), returning the next stage's argument:
    one value for every rank, or a `PerRank` mapping (a rank not in it is skipped);
  - a `Reduce`: `fn([kept value of every rank, in rank order], arg)` in one task (on a worker,
    next to the ranks' values, not on the client), then `then(state, result)`; a Reduce may keep
    a value where it ran (`keeps`: the run's dependency graph) for a later Reduce of the plan
    (`on_kept`: the profiler correction on that graph), so it never reaches the client;
  - a `Fan`: `fn(value a Reduce kept, a)` for each `a` of its argument (a list), one task each
    (on Dask spread over the workers, the kept value copied to them), then
    `then(state, [results, in order])`: independent work on one run-level value (the profiler
    correction's identifiability check, one task per rank);
- `finish(state, arg)`: on the client, the analysis result.

A rank stage may keep values for later stages in `RankInput.keep` (its dependency-graph piece,
for the critical path's `Reduce`): they stay where the rank's events are.

`run_in_process(plan, run)` runs a plan in this process on a `Run` in memory (what
`tracekit.analyse.attribution.plan.attribute_run` does); `tracekit.engine` runs the same plans locally
(`read_run` and this) or on Dask (`tracekit.engine.dask_engine`: one task per rank file and stage,
the rank's events held in the worker's memory from the read on).

This module is the machinery only: it imports no analysis. The attribution's plan is
`tracekit.analyse.attribution.plan.attribution_plan` (`attribute_run`: one run's per-step parts
and critical path, and with `correct` its profiler correction); `tracekit.analyse.command_plans`
has the breakdown's (`breakdown_plan`, with the report's top kernels), diff's, decompose's and the
what-if's (a plan followed by a rank stage: `command_plans.followed_by`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.timeline.partition import rank_selectors
from tracekit.model.events import Run

__all__ = [
    "Fan",
    "Later",
    "PerRank",
    "Plan",
    "RankInput",
    "RankStage",
    "Reduce",
    "arg_for",
    "kept",
    "now",
    "run_in_process",
    "run_reduce",
    "run_rank_stage",
    "split_ranks",
]


@dataclass
class RankInput:
    """One rank's share of a plan's run: its classified events (their index: the row labels of
    the run's table), their `AnalysedRun` (its partitions and layer unions kept for every plan of
    the call) and what earlier stages kept for it."""

    rank: int
    analysed: AnalysedRun
    keep: dict[str, Any] = field(default_factory=dict)

    @property
    def events(self) -> pd.DataFrame:
        return self.analysed.events

    def layer_unions(self) -> Any:
        return self.analysed.layer_unions([self.rank])[self.rank]


class PerRank(dict[int, Any]):
    """A stage argument that differs per rank (a rank not in it is skipped by that stage)."""


@dataclass(frozen=True)
class Later:
    """What a combine (or a Reduce's `then`) may return instead of the next stage's argument:
    `arg` that argument, `fn()` client work of the plan's state that the next stages' tasks do
    not need. An executor submits those tasks first and runs `fn` while they run, before the
    plan's next combine that has tasks' results to take (in one process: at once)."""

    arg: Any
    fn: Callable[[], None]


def now(got: Any) -> Any:
    """A combine's result in one process: the argument, with a `Later`'s work done first."""
    if isinstance(got, Later):
        got.fn()
        return got.arg
    return got


@dataclass(frozen=True)
class RankStage:
    name: str
    rank: Callable[[RankInput, Any], Any]
    combine: Callable[[Any, dict[int, Any]], Any]
    #: run again (on the combine's new argument) while `again(state)`: rounds of an exchange
    again: Callable[[Any], bool] | None = None
    #: not run in one process (`run_in_process`): the next stage's argument is `skip(state)`
    skip: Callable[[Any], Any] | None = None
    #: the keys of `RankInput.keep` this stage sets for a later Reduce: on Dask taken out of each
    #: file's state as its task ends (unless a later rank stage with tasks comes first)
    keeps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reduce:
    """`fn(values, arg)` in one task: `values` the list of what every rank kept under `key` (rank
    order; ranks without it are left out) or, with `on_kept`, the value an earlier Reduce of the
    plan kept under `key`. With `keeps`, `fn` returns (result, value) and the value stays where
    the task ran (a worker's memory, on Dask), for a later Reduce: only the result reaches `then`."""

    name: str
    key: str
    fn: Callable[[Any, Any], Any]
    then: Callable[[Any, Any], Any]
    keeps: str | None = None
    on_kept: bool = False
    #: False: a Reduce beside the next one, which it does not hold up: submitted with it over the
    #: same kept values (on Dask on another worker), its result not gathered (`then` is not
    #: called; the next stage takes this one's argument), only what it keeps used, by a later
    #: `on_kept` Reduce (the run's graph prepared for the correction while the path is walked)
    wait: bool = True
    #: in one process (`run_in_process`): `fn` takes the value an earlier Reduce kept under this
    #: key instead of the ranks' values (the run's graph, assembled once there; on Dask each
    #: Reduce assembles its own from the pieces, on its own worker)
    in_process: str | None = None


@dataclass(frozen=True)
class Fan:
    """`fn(value, a)` for each `a` of the stage's argument (a list; empty: no task), `value` what
    an earlier Reduce of the plan kept under `key`; each call independent of the others (its own
    task on Dask, on any worker: `fn` must not change `value`); `then(state, [results in the
    argument's order])`."""

    name: str
    key: str
    fn: Callable[[Any, Any], Any]
    then: Callable[[Any, list[Any]], Any]


@dataclass(frozen=True)
class Plan:
    name: str
    start: Callable[[Run], tuple[Any, Any]]
    stages: tuple[RankStage | Reduce | Fan, ...]
    finish: Callable[[Any, Any], Any]
    only_rank: int | None = None  # the plan reads only this rank's events


def split_ranks(run: Run | AnalysedRun, only: int | None = None) -> dict[int, RankInput]:
    """The run's classified table as per-rank inputs (rank order; the row labels kept), each on
    an `AnalysedRun` sharing the run's kept partitions and layer unions."""
    ar = AnalysedRun.of(run)
    events = ar.events
    out = {}
    for r, sel in sorted(rank_selectors(events["rank"].to_numpy(np.int64)).items()):
        if only is None or r == only:
            out[int(r)] = RankInput(int(r), ar.of_rank(int(r), events.iloc[sel]))
    return out


def arg_for(arg: Any, rank: int) -> tuple[bool, Any]:
    """(whether `rank` runs the stage, its argument)."""
    if isinstance(arg, PerRank):
        return (rank in arg), arg.get(rank)
    return True, arg


def run_rank_stage(stage: RankStage, ranks: Mapping[int, RankInput], arg: Any) -> dict[int, Any]:
    """A rank stage over some ranks (one rank file's, or the run's)."""
    out = {}
    for r, inp in ranks.items():
        go, a = arg_for(arg, r)
        if go:
            out[r] = stage.rank(inp, a)
    return out


def kept(ranks: Mapping[int, RankInput], key: str) -> dict[int, Any]:
    return {r: inp.keep[key] for r, inp in ranks.items() if key in inp.keep}


def run_in_process(plan: Plan, run: Run | AnalysedRun, ranks: Mapping[int, RankInput] | None = None) -> Any:
    """The plan on `run` in this process (its per-rank stages on `split_ranks(run)`)."""
    if ranks is None:
        ranks = split_ranks(run, plan.only_rank)
    state, arg = plan.start(run.run if isinstance(run, AnalysedRun) else run)
    reduced: dict[str, Any] = {}  # what the plan's Reduces kept
    for stage in plan.stages:
        if isinstance(stage, RankStage) and stage.skip is not None:
            arg = stage.skip(state)
        elif isinstance(stage, RankStage):
            arg = now(stage.combine(state, run_rank_stage(stage, ranks, arg)))
            while stage.again is not None and stage.again(state):
                arg = now(stage.combine(state, run_rank_stage(stage, ranks, arg)))
        elif isinstance(stage, Fan):
            arg = now(stage.then(state, [stage.fn(reduced[stage.key], a) for a in arg]))
        elif not stage.wait:  # beside the next Reduce: only what it keeps matters
            run_reduce(stage, reduced, kept(ranks, stage.key), arg)
        elif stage.in_process is not None:
            arg = now(stage.then(state, stage.fn(reduced[stage.in_process], arg)))
        else:
            values = None if stage.on_kept else kept(ranks, stage.key)
            arg = now(stage.then(state, run_reduce(stage, reduced, values, arg)))
    return plan.finish(state, arg)


def run_reduce(stage: Reduce, reduced: dict[str, Any], values: Mapping[int, Any] | None, arg: Any) -> Any:
    """A Reduce here: on `reduced[stage.key]` (`on_kept`, what an earlier Reduce kept) or on
    `values` (rank -> what the rank kept under `stage.key`); what it keeps goes into `reduced`;
    returns what `then` takes."""
    if stage.on_kept:
        got = stage.fn(reduced[stage.key], arg)
    else:
        assert values is not None
        got = stage.fn([values[r] for r in sorted(values)], arg)
    if stage.keeps is not None:
        got, reduced[stage.keeps] = got
    return got
