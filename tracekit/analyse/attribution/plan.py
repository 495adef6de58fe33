"""The attribution of one run as a plan (`attribution_plan`), and that plan run in this process
(`attribute_run`; docs/METHOD.md section Shortfall attribution).

The plan's per-rank stages and combines are the pieces of `run.py` (`attribute_setup`,
`attribute_rank`, `join_steps`, `assemble_attribution`, `finish_attribution`) in the order every
engine runs them (`tracekit.engine`: in this process, in a local pool, or on Dask with each rank's
stages where its events are); its profiler-correction stages are `correction_stages.py`.
`plan_of(options, label)` is the one place an `AttributionOptions` becomes the plan's keywords."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.correction import identify_finish, identify_spread
from tracekit.analyse.attribution.correction_stages import (
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
from tracekit.analyse.attribution.document import read_ahead
from tracekit.analyse.attribution.options import DEFAULT_OPTIONS, AttributionOptions
from tracekit.analyse.attribution.run import (
    RunParts,
    assemble_attribution,
    attribute_rank,
    attribute_setup,
    finish_attribution,
    join_steps,
)
from tracekit.analyse.collectives.matching import match_collectives
from tracekit.analyse.collectives.select import select_collective_events
from tracekit.analyse.compute.kernel_scaling import compact_kernels, gather_kernels
from tracekit.analyse.dilation import DEFAULT_THRESHOLD
from tracekit.analyse.path.critical_path import path_timeline
from tracekit.analyse.plans import Fan, Later, PerRank, Plan, RankInput, RankStage, Reduce, run_in_process
from tracekit.analyse.timeline.rules import choose_step_rule, rank_step_summary
from tracekit.analyse.timeline.steps import assemble_steps
from tracekit.analyse.timeline.windows import rank_step_windows
from tracekit.errors import StepError
from tracekit.model.events import DataQuality, Run, empty_events

__all__ = ["attribute_run", "attribution_plan", "plan_of"]


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
    return rank_step_windows(inp.events, choice)


def _att_rank(inp: RankInput, arg: tuple[pd.DataFrame, pd.DataFrame, int]) -> Any:
    """Per rank: `run.attribute_rank`; its graph piece is kept for the path's Reduce."""
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
    """`attribute_run` as a plan: per rank the step rule and collective rows, the
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
    if correct is not None and correct not in CORRECT_TARGETS:
        raise ValueError(f"correct: {correct!r} is not one of {CORRECT_TARGETS}")
    threshold = DEFAULT_THRESHOLD if dilation_threshold is None else dilation_threshold

    def start(meta: Run) -> tuple[_Attribution, Any]:
        st = _Attribution(meta, label, skip_first, threshold, allow_partial)
        st.pattern, st.dq = attribute_setup(meta, label, step_pattern)
        return st, st.pattern

    def after_rule(st: _Attribution, got: dict[int, Any]) -> Any:
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


def plan_of(
    options: AttributionOptions, label: str, *, correct: str | None = None, keep_graph: bool = True
) -> Plan:
    """`attribution_plan` of a run labelled `label` attributed with `options` (`correct`,
    `keep_graph`: what the caller needs of the result, not an option of the attribution)."""
    # the fields are attribution_plan's keywords, by name
    return attribution_plan(label=label, correct=correct, keep_graph=keep_graph, **asdict(options))


def attribute_run(
    run: Run | AnalysedRun, options: AttributionOptions = DEFAULT_OPTIONS, *, label: str = "run"
) -> RunParts:
    """Per-step leaf parts of one run attributed with `options` (`tracekit.analyse.attribution`'s
    module doc): `attribution_plan` (`plan_of(options, label)`) run in this process, the plan every
    engine runs (`tracekit.engine`: locally, or on Dask with each rank's stages where its events
    are).

    The pieces: `attribute_setup` (run metadata) -> per rank the step rule and its collective rows
    -> the step windows -> the matched collectives -> `attribute_rank` per rank (partition, host
    layers, exposed split, ranks without kernels, graph piece) -> `assemble_attribution` (step
    time, per-rank parts, their mean) -> the critical path -> `finish_attribution` (path check,
    dilation)."""
    ar = AnalysedRun.of(run)  # classified once; its partitions and layer unions shared (analysed.py)
    parts: RunParts = run_in_process(plan_of(options, label), ar)
    return parts
