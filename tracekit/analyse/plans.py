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
`tracekit.analyse.attribution.run.attribute_run` does); `tracekit.engine` runs the same plans locally
(`read_run` and this) or on Dask (`tracekit.engine.dask_engine`: one task per rank file and stage,
the rank's events held in the worker's memory from the read on).

The plan here is `attribution_plan` (`shortfall.attribute_run`: one run's per-step parts and
critical path, and with `correct` its profiler correction); `tracekit.analyse.command_plans` has
the breakdown's (`breakdown_plan`, with the report's top kernels), diff's, decompose's and the
what-if's (a plan followed by a rank stage: `command_plans.followed_by`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.compute.kernel_scaling import compact_kernels, gather_kernels
from tracekit.analyse.correction_stages import (
    CORRECT_TARGETS,
    CorrectionInput,
    RetimeRounds,
    att_correct,
    att_graph,
    att_identify_between,
    att_identify_ends,
    att_path,
    att_retime,
    correction_target,
    retime_after,
    retime_again,
    retime_skip,
)
from tracekit.errors import StepError
from tracekit.model.events import DataQuality, Run

__all__ = [
    "Later",
    "PerRank",
    "Plan",
    "RankInput",
    "RankStage",
    "Reduce",
    "CorrectionInput",
    "Fan",
    "attribution_plan",
    "correction_target",
    "run_in_process",
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
    from tracekit.analyse.timeline.partition import rank_selectors

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


# ------------------------------------------------------------------------------------------
# the attribution of one run (tracekit.analyse.attribution.run.attribute_run)


#: collective levels, best first (`select_collective_events` takes the first the run has)
_LEVELS = ("gpu_kernel", "gloo", "host_op", "none")


@dataclass
class _Attribution:
    meta: Run
    label: str
    skip_first: int
    threshold: float
    allow_partial: bool
    pattern: str | None = None
    dq: DataQuality = field(default_factory=DataQuality)
    level: str = "none"  # the run's collective level (the ranks' best)
    choice: Any = None
    windows: dict[int, Any] = field(default_factory=dict)  # per rank, found in the rule stage
    found: Any = None
    coll: Any = None
    att: Any = None
    path: Any = None
    parts: Any = None  # the RunParts (`finish_attribution`)
    target: Any = None  # the profiler correction's target, its Correction, its IdentifyJob
    corr: Any = None
    job: Any = None
    reduce_arg: Any = None  # the path's and the graph's Reduces' argument
    retime: Any = None  # the per-rank re-timing's rounds (`RetimeRounds`) while they run
    figures: list[Any] = field(default_factory=list)  # the identifiability check's first round
    intervals: list[Any] = field(default_factory=list)  # its ranks' cost intervals


def _att_rule(inp: RankInput, pattern: str | None) -> tuple[Any, str, Any, Any]:
    """Per rank: which step rules it matches, its collective rows at its best level
    (`select_collective_events` on the rank: at the run's level a rank has rows only if that is
    its own best level), and, speculatively, its windows under its own rule (the rule
    `choose_step_rule` gives on this rank alone; None where either raises, so an error is raised
    only where the two stages raise it, by the windows stage): where the run's
    rule is the rank's own (every rank of a run with one kind of step marker) the windows stage
    does not run for it (`after_rule`), one barrier fewer."""
    from tracekit.analyse.collectives.select import select_collective_events
    from tracekit.analyse.timeline.rules import choose_step_rule, rank_step_summary

    sel, level = select_collective_events(inp.events)
    rows = inp.events.loc[sel["event_index"].to_numpy()] if len(sel) else inp.events.iloc[0:0]
    inp.keep["coll_rows"] = (level, rows)  # for the matching's Reduce, where the rank is
    summary = rank_step_summary(inp.events, pattern)
    own: Any
    try:
        own = choose_step_rule([summary], pattern)
        windows = _att_windows(inp, own)
    except Exception:  # noqa: BLE001 - speculative: the windows stage raises it again if the run's rule is this one
        own = windows = None
    return summary, level, own, windows


def _att_match(values: list[tuple[str, pd.DataFrame]], arg: tuple[Any, ...]) -> Any:
    """`match_collectives` of the run on its ranks' collective rows at the run's level (the ranks'
    best), in one task on a worker: the rows never reach the client."""
    from tracekit.analyse.collectives.matching import match_collectives
    from tracekit.model.events import empty_events

    level, ranks, rank_info, manifest, allow_partial, steps = arg
    frames = [rows for lv, rows in values if lv == level and len(rows)]
    coll_events = pd.concat(frames).sort_index(kind="stable") if frames else empty_events().iloc[0:0]
    return match_collectives(
        coll_events,
        ranks=ranks,
        rank_info=rank_info,
        manifest=manifest,
        allow_partial=allow_partial,
        steps=steps,
    )


def _att_windows(inp: RankInput, choice: Any) -> Any:
    from tracekit.analyse.timeline.windows import rank_step_windows

    return rank_step_windows(inp.events, choice)


def _att_rank(inp: RankInput, arg: tuple[pd.DataFrame, pd.DataFrame, int]) -> Any:
    """Per rank: `shortfall.attribute_rank`; its graph piece is kept for the path's Reduce."""
    from tracekit.analyse.attribution.run import attribute_rank

    windows, matched, offset = arg
    piece = attribute_rank(
        inp.events,
        inp.rank,
        windows,
        matched,
        table=inp.analysed.partition(windows),
        unions=inp.layer_unions(),
        graph_windows=windows,
        offset=offset,
    )
    if piece.graph is not None:
        inp.keep["graph"] = piece.graph
    piece.graph = None
    if piece.kernels is not None:
        piece.kernels = compact_kernels(piece.kernels)
    return piece


def _unused(_state: Any, _got: Any) -> None:
    """The `then` of a Reduce that is not waited for (never called)."""
    raise AssertionError("a Reduce with wait=False has no combine")


def attribution_plan(
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float | None = None,
    label: str = "run",
    allow_partial: bool = False,
    correct: str | None = None,
    keep_graph: bool = True,
) -> Plan:
    """`shortfall.attribute_run` as a plan: per rank the step rule and collective rows, the
    windows, `attribute_rank`; on the client `attribute_setup`, `choose_step_rule`,
    `assemble_steps`, `match_collectives` (on the collective rows only), `join_steps`,
    `assemble_attribution`; the run's graph in one Reduce (kept there, and with `correct` its
    forward pass built) beside the critical path's Reduce (its own copy of the graph, walked; with
    `correct` the graph's reading of each window at the measured times for the correction);
    `finish_attribution`; then a Reduce on the kept graph: with `correct` (CORRECT_TARGETS) the
    profiler correction to that target (`correction.correct_run`, cached on the RunParts: a later
    `correct_run` to the same target finds it), and the graph itself for the RunParts when
    `keep_graph` (the what-if replays it; the shortfall, diff and decompose need only the
    correction, so on Dask the graph need not reach the client)."""
    from tracekit.analyse.dilation import DEFAULT_THRESHOLD

    if correct is not None and correct not in CORRECT_TARGETS:
        raise ValueError(f"correct: {correct!r} is not one of {CORRECT_TARGETS}")
    threshold = DEFAULT_THRESHOLD if dilation_threshold is None else dilation_threshold

    def start(meta: Run) -> tuple[_Attribution, Any]:
        from tracekit.analyse.attribution.run import attribute_setup

        st = _Attribution(meta, label, skip_first, threshold, allow_partial)
        st.pattern, st.dq = attribute_setup(meta, label, step_pattern)
        return st, st.pattern

    def after_rule(st: _Attribution, got: dict[int, Any]) -> Any:
        from tracekit.analyse.timeline.rules import choose_step_rule

        try:
            st.choice = choose_step_rule([got[r][0] for r in sorted(got)], st.pattern)
        except StepError as exc:
            raise StepError(f"{st.label}: {exc}") from None
        st.level = min((got[r][1] for r in got), key=_LEVELS.index, default="none")
        # the ranks whose own rule is the run's keep the windows the rule stage found; the others
        # find theirs under the run's rule in the windows stage (the same function on the same
        # events: the same windows as in two stages)
        st.windows = {r: g[3] for r, g in got.items() if g[2] == st.choice}
        return PerRank({r: st.choice for r in sorted(got) if r not in st.windows})

    def after_windows(st: _Attribution, got: dict[int, Any]) -> tuple[Any, ...]:
        from tracekit.analyse.timeline.steps import assemble_steps

        got = {**st.windows, **got}
        st.windows = {}
        try:
            st.found = assemble_steps(st.choice, [got[r] for r in sorted(got)])
        except StepError as exc:
            raise StepError(f"{st.label}: {exc}") from None
        st.dq.merge(st.found.data_quality)
        m = st.meta
        return st.level, m.ranks, m.rank_info, m.manifest, st.allow_partial, st.found.steps

    def after_match(st: _Attribution, coll: Any) -> PerRank:
        from tracekit.analyse.attribution.run import join_steps

        st.coll = coll
        st.dq.merge(st.coll.data_quality)
        windows = join_steps(st.found.steps, st.coll, st.label, st.dq)
        offsets = st.coll.clock.offsets_ns
        w_rank = windows["rank"].to_numpy(np.int64)
        m_rank = st.coll.per_rank["rank"].to_numpy(np.int64)
        return PerRank(
            {
                int(r): (windows[w_rank == r], st.coll.per_rank[m_rank == r], int(offsets.get(r, 0)))
                for r in sorted(set(w_rank.tolist()))
            }
        )

    def after_ranks(st: _Attribution, got: dict[int, Any]) -> Later:
        from tracekit.analyse.attribution.run import assemble_attribution
        from tracekit.analyse.path.critical_path import path_timeline

        pieces = [got[r] for r in sorted(got)]
        offsets = {int(k): int(v) for k, v in st.coll.clock.offsets_ns.items()}
        st.reduce_arg = offsets, path_timeline(p.timeline for p in pieces), correct is not None, None
        # the correction re-timed per rank (its latencies known now; docs/SCALE.md section Left)
        st.retime = RetimeRounds.of(
            st.meta.manifest, st.reduce_arg[1], len(st.meta.ranks), correct is not None
        )

        def assemble() -> None:  # while the graph's and the path's Reduces run (`after_path` reads it)
            for p, k in zip(pieces, gather_kernels([p.kernels for p in pieces]), strict=True):
                p.kernels = k
            st.att = assemble_attribution(pieces, label=st.label, skip_first=st.skip_first, dq=st.dq)

        return Later(PerRank() if st.retime is None else st.retime.first(), assemble)

    def after_path(st: _Attribution, got: tuple[Any, Any]) -> Later:
        from tracekit.analyse.attribution.document import read_ahead
        from tracekit.analyse.attribution.run import finish_attribution

        st.path, measured = got
        parts = st.parts = finish_attribution(
            st.meta,
            st.att,
            st.path,
            st.coll,
            step_pattern=st.found.pattern,
            label=st.label,
            skip_first=st.skip_first,
            dilation_threshold=st.threshold,
            dq=st.dq,
        )
        target = correction_target(parts, correct)
        # the document's readings of this run that need no correction: while the correction runs
        ahead = functools.partial(read_ahead, parts)
        if target is None:
            return Later((None, None, keep_graph), ahead)
        inp = CorrectionInput(
            steady_steps=parts.steady_steps,
            timeline=parts.timeline,
            ranks=list(parts.ranks),
            profiler_calibration=parts.profiler_calibration,
            rank_steps=parts.rank_steps,
            critical=parts.critical,
            per_rank=parts.per_rank,
            path_token=parts.path_token,
            measured=measured,
        )
        return Later((inp, target, keep_graph), ahead)

    def after_correct(st: _Attribution, got: tuple[Any, Any, Any, Any]) -> list[Any]:
        target, corr, graph, job = got
        st.target, st.corr, st.job = target, corr, job
        if graph is not None:
            st.parts.graph = graph
        # the identifiability check of a solved cost, one task per rank
        return [] if job is None else [(job, r) for r in job.ranks]

    def after_ends(st: _Attribution, got: list[Any]) -> list[Any]:
        from tracekit.analyse.attribution.correction import identify_spread

        if st.job is None:
            return []
        st.figures = [st.corr, *(f for _iv, fs, _kn in got for f in fs)]
        st.intervals = [iv for iv, _fs, _kn in got if iv is not None]
        if not identify_spread(st.job, st.figures):
            return []
        # the points between the ends: one task over every interval (one budget of midpoints)
        known = {p: v for _iv, _fs, kn in got for p, v in kn.items()}
        return [(st.job, st.intervals, known)]

    def after_between(st: _Attribution, got: list[Any]) -> None:
        from tracekit.analyse.attribution.correction import identify_finish

        if st.job is not None:
            identify_finish(st.job, st.corr, [*st.figures, *(f for fs in got for f in fs)], st.intervals)
        if st.corr is not None:  # where `correction.correct_run` looks first
            st.parts.__dict__.setdefault("_corrections", {})[st.target] = st.corr

    def finish(st: _Attribution, _arg: Any) -> Any:
        return st.parts

    return Plan(
        "attribution",
        start,
        (
            RankStage("rule", _att_rule, after_rule, keeps=("coll_rows",)),
            RankStage("windows", _att_windows, after_windows),
            Reduce("match", "coll_rows", _att_match, after_match),
            RankStage("attribute", _att_rank, after_ranks, keeps=("graph",)),
            RankStage("retime", att_retime, retime_after, again=retime_again, skip=retime_skip),
            # the graph assembled (and prepared) on one worker, the path walked on another's copy
            Reduce("graph", "graph", att_graph, _unused, keeps="run_graph", wait=False),
            Reduce("path", "graph", att_path, after_path, in_process="run_graph"),
            Reduce("correction", "run_graph", att_correct, after_correct, keeps="corr_run", on_kept=True),
            Fan("identify", "corr_run", att_identify_ends, after_ends),
            Fan("identify_between", "corr_run", att_identify_between, after_between),
        ),
        finish,
    )
