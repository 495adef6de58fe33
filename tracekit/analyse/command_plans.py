"""The plans of breakdown, diff, decompose and the what-if (issue 27). `breakdown_plan`
(`timeline.breakdown.breakdown` with the report's top kernels): per rank the step rule's summary,
then its windows, partition and kernel sums; the others: the attribution plan
(`attribution.plan.attribution_plan`) followed by one rank stage that reads what else the command needs of
each rank's events, where they are (`followed_by`); every engine runs them
(`tracekit.engine.diff_paths`, `decompose_paths`, `whatif_paths`), so the commands take
`--engine` and give the same JSON on each.

- `side_plan` (diff, one side): the attribution corrected to the applied dilation
  (`correct="applied"`, what `diff` settles to), then per rank its matrix time per steady step
  and its kernel sums (`diff.rank_side_tables`); on the client `diff.side_of`.
- `figures_plan` (decompose, one run): the attribution corrected to the unprofiled mean
  (`correct="unprofiled"`), then per rank `compute_split` of its rank steps; on the client
  `decompose.figures_of`.
- `replay_plan` (whatif, one run): the attribution with its dependency graph kept (the what-if
  replays it on the client), then per rank the device events `retime.norm.norm_after_all_reduce`
  reads (the `allreduce_norm` knob); on the client an AnalysedRun of those rows and the run's
  manifest for `whatif.build.build_model`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.options import DEFAULT_OPTIONS, AttributionOptions
from tracekit.analyse.attribution.plan import plan_of
from tracekit.analyse.compare.decompose import figures_of, split_windows
from tracekit.analyse.compare.sides import rank_side_tables, side_of, side_windows
from tracekit.analyse.compute.kernels import assemble_top_kernels, rank_kernel_sums
from tracekit.analyse.plans import Fan, PerRank, Plan, RankInput, RankStage, Reduce
from tracekit.analyse.timeline.breakdown import assemble_breakdown, rank_breakdown_table, rank_events
from tracekit.analyse.timeline.compute_split import compute_split
from tracekit.analyse.timeline.partition import cat_mask
from tracekit.analyse.timeline.rules import choose_step_rule, rank_step_summary
from tracekit.analyse.timeline.steps import assemble_steps
from tracekit.analyse.timeline.windows import rank_step_windows
from tracekit.classify.rules import GPU_KINDS
from tracekit.errors import StepError
from tracekit.model.events import Run

__all__ = [
    "BreakdownResult",
    "ReplayInput",
    "breakdown_plan",
    "figures_plan",
    "followed_by",
    "replay_plan",
    "shortfall_plan",
    "side_plan",
]


@dataclass
class _Then:
    meta: Run  # the run's metadata
    inner: Any  # the first plan's state
    result: Any = None  # its result


def followed_by(
    plan: Plan,
    name: str,
    arg_of: Callable[[Any], Any],
    rank: Callable[[RankInput, Any], Any],
    finish: Callable[[Run, Any, dict[int, Any]], Any],
) -> Plan:
    """`plan`, then one more rank stage on its result (on the same ranks' events, where they are):
    `arg_of(result)` its argument (a `PerRank` for per-rank windows), `rank(inp, arg)` per rank,
    `finish(meta, result, {rank: value})` on the client the analysis result (`meta`: the run's
    metadata; what diff, decompose and the what-if add to the attribution)."""
    last = len(plan.stages) - 1

    def done(st: _Then, arg: Any) -> Any:
        st.result = plan.finish(st.inner, arg)
        return arg_of(st.result)

    def wrap(i: int, stage: RankStage | Reduce | Fan) -> RankStage | Reduce | Fan:
        if isinstance(stage, RankStage):
            combine = stage.combine

            def comb(st: _Then, got: dict[int, Any]) -> Any:
                arg = combine(st.inner, got)
                return done(st, arg) if i == last else arg

            again, skip = stage.again, stage.skip  # on the inner plan's state too
            return dataclasses.replace(
                stage,
                combine=comb,
                again=None if again is None else (lambda st: again(st.inner)),
                skip=None if skip is None else (lambda st: skip(st.inner)),
            )
        then = stage.then

        def then_(st: _Then, got: Any) -> Any:
            arg = then(st.inner, got)
            return done(st, arg) if i == last else arg

        return dataclasses.replace(stage, then=then_)

    def start(meta: Run) -> tuple[_Then, Any]:
        st, arg = plan.start(meta)
        return _Then(meta, st), arg

    stages = tuple(wrap(i, s) for i, s in enumerate(plan.stages))
    extra = RankStage(name, rank, lambda st, got: finish(st.meta, st.result, got))
    return Plan(
        f"{plan.name}+{name}", start, (*stages, extra), lambda _st, res: res, only_rank=plan.only_rank
    )


def _per_rank(frame: pd.DataFrame) -> PerRank:
    """A table of (rank, ...) rows as each rank's own rows (rank order)."""
    rk = frame["rank"].to_numpy(np.int64)
    return PerRank({int(r): frame[rk == r] for r in sorted(set(rk.tolist()))})


def _in_rank_order(got: dict[int, pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [got[r] for r in sorted(got) if len(got[r])]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


# ------------------------------------------------------------------------------------------
# diff


def _side_rank(inp: RankInput, windows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    return rank_side_tables(inp.events, windows)


def shortfall_plan(options: AttributionOptions | None, label: str) -> Plan:
    """The attribution the shortfall needs of one run (`options`, default `AttributionOptions()`):
    corrected to the applied dilation, without its graph (the correction, not the graph); a diff
    side's first plan too."""
    return plan_of(options or DEFAULT_OPTIONS, label, correct="applied", keep_graph=False)


def side_plan(*, label: str, path: str, options: AttributionOptions | None = None) -> Plan:
    """One side of `diff.diff` (`diff.attribute_side`) as a plan: returns its `diff.Side`."""
    base = shortfall_plan(options, label)

    def finish(_meta: Any, parts: Any, got: dict[int, Any]) -> Any:
        sm = _in_rank_order({r: v[0] for r, v in got.items()}, ["rank", "step", "matrix_ns"])
        return side_of(parts, label, path, sm, [got[r][1] for r in sorted(got)])

    return followed_by(base, "tables", lambda parts: _per_rank(side_windows(parts)), _side_rank, finish)


# ------------------------------------------------------------------------------------------
# decompose


def _split_rank(inp: RankInput, steps: pd.DataFrame) -> pd.DataFrame:
    return compute_split(inp.events, steps)


def figures_plan(label: str, *, path: str = "", options: AttributionOptions | None = None) -> Plan:
    """`decompose.run_figures` as a plan: returns the run's `decompose.RunFigures`."""
    base = plan_of(options or DEFAULT_OPTIONS, label, correct="unprofiled", keep_graph=False)

    def finish(_meta: Any, parts: Any, got: dict[int, pd.DataFrame]) -> Any:
        split = _in_rank_order(got, ["rank", "step", "matrix_ns", "vector_ns"])
        return figures_of(parts, split, label, path=path)

    return followed_by(base, "split", lambda parts: _per_rank(split_windows(parts)), _split_rank, finish)


# ------------------------------------------------------------------------------------------
# whatif


#: the event columns `retime.norm.norm_after_all_reduce` reads
_NORM_COLUMNS = ["kind", "cls", "subclass", "coll_op", "name", "rank", "start_ns", "end_ns"]


@dataclasses.dataclass
class ReplayInput:
    """What the what-if needs of one run: its RunParts (with the graph) and, as an AnalysedRun,
    its device events (the columns the replay's masks read) and its manifest."""

    parts: Any
    classified: AnalysedRun


def _device_rows(inp: RankInput, _arg: Any) -> pd.DataFrame:
    ev = inp.events
    return ev.loc[cat_mask(ev["kind"], GPU_KINDS), _NORM_COLUMNS]


def replay_plan(*, label: str, options: AttributionOptions | None = None) -> Plan:
    """`attribution.plan.attribute_run` with the graph kept, and the device events the what-if's
    masks read: returns a `ReplayInput`."""
    base = plan_of(options or DEFAULT_OPTIONS, label, keep_graph=True)

    def finish(meta: Any, parts: Any, got: dict[int, pd.DataFrame]) -> ReplayInput:
        frames = [got[r] for r in sorted(got)]
        rows = pd.concat(frames) if frames else pd.DataFrame(columns=_NORM_COLUMNS)
        return ReplayInput(parts, AnalysedRun(run=dataclasses.replace(meta, events=rows)))

    return followed_by(base, "device", lambda _parts: None, _device_rows, finish)


# ------------------------------------------------------------------------------------------
# the breakdown of one run (tracekit.analyse.breakdown.breakdown) and its top kernels


@dataclass
class BreakdownResult:
    breakdown: Any
    top_kernels: Any = None


@dataclass
class _Breakdown:
    meta: Run
    pattern: str | None
    skip_first: int
    rank: int | None
    choice: Any = None


def _bd_rule(inp: RankInput, pattern: str | None) -> Any:
    return rank_step_summary(inp.events, pattern)


def _bd_rank(inp: RankInput, arg: tuple[Any, int]) -> Any:
    """Per rank: its windows under the run's rule, its partition after the warm-up with the
    compute split, its event figures and its kernel sums."""
    choice, skip_first = arg
    win = rank_step_windows(inp.events, choice)
    table, dropped = rank_breakdown_table(inp.analysed, win.rows, skip_first)
    return (
        win,
        table,
        dropped,
        rank_events(inp.events, inp.rank),
        rank_kernel_sums(inp.events, win.rows, inp.rank),
    )


def breakdown_plan(*, step_pattern: str | None = None, skip_first: int = 0, rank: int | None = None) -> Plan:
    """`breakdown.breakdown` as a plan (with `kernels.assemble_top_kernels`): per rank the step
    rule's summary, then windows, partition, compute split and event figures; on the client
    `choose_step_rule`, `assemble_steps`, `assemble_breakdown`. Returns a `BreakdownResult`."""
    if skip_first < 0:
        raise StepError(f"skip_first must be >= 0, not {skip_first}")

    def start(meta: Run) -> tuple[_Breakdown, Any]:
        if rank is not None and rank not in meta.sources:
            have = ", ".join(str(r) for r in meta.ranks) or "none"
            raise StepError(f"rank {rank} is not in this run (ranks: {have})")
        return _Breakdown(meta, step_pattern, skip_first, rank), step_pattern

    def after_rule(st: _Breakdown, got: dict[int, Any]) -> Any:
        st.choice = choose_step_rule([got[r] for r in sorted(got)], st.pattern)
        return st.choice, st.skip_first

    def after_ranks(st: _Breakdown, got: dict[int, Any]) -> BreakdownResult:
        pieces = [got[r] for r in sorted(got)]
        found = assemble_steps(st.choice, [p[0] for p in pieces])
        tables = []
        for _win, table, _d, ev, _k in pieces:  # the run's step numbers on each rank's kept windows
            final = found.steps.loc[found.steps["rank"] == ev.rank, "step"].to_numpy(np.int64)
            tables.append(table.assign(step=final[len(final) - len(table) :]))
        if any(len(t) for t in tables):
            table = pd.concat(tables, ignore_index=True)
        elif pieces:
            table = pieces[0][1]
        else:
            raise StepError("the trace holds no timed events: there is no window to break down")
        bd = assemble_breakdown(
            st.meta,
            found,
            table,
            [p[3] for p in pieces],
            skip_first=st.skip_first,
            dropped=sum(p[2] for p in pieces),
            rank=st.rank,
        )
        top = assemble_top_kernels([p[4] for p in pieces if p[4] is not None], found.steps)
        return BreakdownResult(bd, top)

    return Plan(
        "breakdown",
        start,
        (RankStage("rule", _bd_rule, after_rule), RankStage("ranks", _bd_rank, after_ranks)),
        lambda _st, res: res,
        only_rank=rank,
    )
