"""The profiler correction's stages of the attribution plan (`plan.attribution_plan`): the run's
graph assembled and prepared for it beside the path's walk, which also reads the measured window
parts (`att_graph`, `att_path`: two Reduces on two workers); what
travels into the correction's Reduce (`CorrectionInput`), its target (`correction_target`), the
Reduce itself on the run's graph (`att_correct`: `correction_replay.correct_first`) and the
identifiability check's two `plans.Fan`s: one task per rank (`att_identify_ends`), then one task
over every rank's interval (`att_identify_between`; docs/SCALE.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from tracekit.analyse.attribution.correction import identify_between, identify_ends
from tracekit.analyse.attribution.correction_replay import (
    calibrated_latencies,
    correct_first,
    measured_parts,
    prepare_graph,
    read_corrected,
)
from tracekit.analyse.attribution.reconcile import applied_dilation
from tracekit.analyse.path.critical_path import path_of_graph
from tracekit.analyse.path.graph import Graph, assemble
from tracekit.analyse.path.rank_forward import (
    RankRetime,
    RendezvousSolve,
    latest,
    measured_arrivals,
    with_retimed,
)
from tracekit.analyse.retime.calibrate import ProfilerCalibration, manifest_calibration

__all__ = [
    "CORRECT_TARGETS",
    "CorrectionInput",
    "RetimeRounds",
    "att_correct",
    "att_graph",
    "att_identify_between",
    "att_identify_ends",
    "att_path",
    "att_retime",
    "correction_target",
    "retime_after",
    "retime_again",
    "retime_skip",
]


#: `attribution_plan(correct=...)`: the target the profiler correction is computed to in the plan
#: (where the run's graph is): "applied", the traced per-token time / the applied dilation D
#: (`shortfall.applied_dilation`: what shortfall, diff and whatif correct to); "unprofiled", the
#: unprofiled rounds' mean (decompose's)
CORRECT_TARGETS = ("applied", "unprofiled")


@dataclass
class CorrectionInput:
    """What `correction.correct_run` reads of a run's RunParts, without its tables (what travels
    into the correction's Reduce, to the run's graph; the graph is set there)."""

    steady_steps: list[int]
    timeline: str
    ranks: list[int]
    profiler_calibration: ProfilerCalibration | None
    rank_steps: pd.DataFrame
    critical: Any
    per_rank: dict[int, dict[str, Any]]
    path_token: dict[str, Any]
    graph: Any = None
    #: the graph's reading of every (rank, step) at its measured times
    #: (`correction_replay.measured_parts`), computed beside the path's walk; None: computed here
    measured: Any = None


def correction_target(parts: Any, mode: str | None) -> Any:
    """The Fraction the plan corrects `parts` (a RunParts) to under `mode` (CORRECT_TARGETS), or
    None: nothing to correct (no unprofiled per-token time)."""
    from fractions import Fraction

    if mode is None:
        return None
    if mode == "applied":
        return applied_dilation(parts).target_ns
    u = parts.dilation.unprofiled
    return Fraction(u.mean_ns) if u is not None and u.n else None


@dataclass
class RetimeRounds:
    """The client's side of the correction's re-timing split per rank (`att_retime`, one round
    per task of the plan's `retime` stage; `path.rank_forward`): a first round of the ranks'
    measured arrivals, then rounds of rendezvous times until the ranks' arrivals reproduce them
    (`RendezvousSolve`), at most `MAX_ROUNDS` (then the correction re-times the run's graph)."""

    calibration: ProfilerCalibration
    n_ranks: int
    measured: dict[int, int] | None = None
    ranks: list[int] = field(default_factory=list)
    solve: Any = None

    #: rounds after which the re-timing is left to the run's graph (exact either way)
    MAX_ROUNDS = 64

    @classmethod
    def of(cls, manifest: Any, timeline: str, n_ranks: int, correct: bool) -> RetimeRounds | None:
        """The rounds for a run whose correction's latencies are known before its graph is (a
        manifest calibration, a GPU timeline, several ranks), else None; only where
        `TRACEKIT_PER_RANK_RETIME=1` asks for them: at 64 h200-tp2 ranks their 7 rounds cost
        more than the whole graph's pass they replace (docs/SCALE.md section Left). With them the
        graph's Reduce reads the corrected timeline ahead (`att_graph`)."""
        cal = manifest_calibration(manifest)
        if not correct or cal is None or timeline != "gpu" or n_ranks < 2:
            return None
        if os.environ.get("TRACEKIT_PER_RANK_RETIME") != "1":
            return None
        return cls(cal, n_ranks)

    def first(self) -> tuple[Any, ...]:
        return ("measure",)

    def combine(self, got: dict[int, Any]) -> bool:
        """One round's per-rank results; True when the rounds are over."""
        have = {r: v for r, v in got.items() if v is not None}
        if not have:
            return True
        if self.solve is None:
            self.measured = latest(have.values())
            self.ranks = sorted(have)
            self.solve = RendezvousSolve(self.measured)
            return False
        arrivals = [have[r][0] for r in sorted(have)]
        bounds = [b for r in sorted(have) for b in have[r][1]]
        return bool(self.solve.step(arrivals, bounds) or self.solve.rounds >= self.MAX_ROUNDS)

    def latencies(self) -> tuple[ProfilerCalibration, list[int], int]:
        """What the ranks' latencies are made from (`correction_replay.calibrated_latencies`)."""
        return self.calibration, self.ranks, self.n_ranks

    def arg(self) -> tuple[Any, ...]:
        if self.solve.rounds == 0:
            return ("cut", self.measured, *self.latencies(), self.solve.times)
        return ("at", self.solve.times)


def retime_after(st: Any, got: dict[int, Any]) -> Any:
    """The `retime` stage's combine on the attribution plan's state (`st.retime`, a RetimeRounds
    while the rounds run; `st.reduce_arg`, the graph's and the path's Reduces' argument): the
    next round's argument, or, once over, the Reduces' (with what the graph's reads ahead with)."""
    if st.retime is None or st.retime.combine(got):
        if st.retime is not None and st.retime.solve is not None:
            st.reduce_arg = (*st.reduce_arg[:3], (st.retime.calibration, st.retime.n_ranks))
        st.retime = None
        return st.reduce_arg
    return st.retime.arg()


def retime_again(st: Any) -> bool:
    """Whether the `retime` stage runs another round."""
    return st.retime is not None


def retime_skip(st: Any) -> Any:
    """The `retime` stage in one process: not run (one process re-times the run's graph at once)."""
    return st.reduce_arg


def att_retime(inp: Any, arg: tuple[Any, ...]) -> Any:
    """One rank's round of the re-timing (`RetimeRounds`): its measured arrivals, then its share
    of the run's graph cut at the rendezvous (built once, kept) re-timed at the round's times;
    the times kept on its graph piece (`RankGraph.retimed`) for the graph's Reduce."""
    from functools import partial

    piece = inp.keep.get("graph")
    if piece is None:
        return None
    if arg[0] == "measure":
        return measured_arrivals(piece)
    if arg[0] == "cut":
        _, measured, cal, ranks, n_ranks, times = arg
        lat = partial(calibrated_latencies, cal, ranks, n_ranks)
        inp.keep["retime"] = RankRetime.of(piece, measured, lat)
    else:
        times = arg[1]
    rt = inp.keep["retime"]
    arrivals, bounds = rt.at(times)
    piece.retimed = rt.t[: rt.n] if rt.t is not None else None
    return arrivals, bounds


def att_graph(graphs: list[Any], arg: tuple[dict[int, int], str, bool, Any]) -> tuple[None, Any]:
    """The run's dependency graph from the ranks' pieces (`path.graph.assemble`), kept where the
    task ran for the profiler correction's Reduce, with the times the ranks re-timed it to where
    they did (`rank_forward.with_retimed`); with a correction to come (`arg[2]`), its work that
    needs no target done here, beside the path's walk: after the ranks' re-timing (`arg[3]`: its
    calibration and the run's rank count) the corrected timeline read ahead
    (`correction_replay.read_corrected`), else the forward pass's structure
    (`correction_replay.prepare_graph`)."""
    offsets, _timeline, correct, ahead = arg
    graph = assemble(graphs, offsets)
    with_retimed(graph, graphs)
    if correct and ahead is not None:
        cal, n_ranks = ahead
        read_corrected(graph, cal, list(graph.ranks), n_ranks)
    if correct and "_corrected" not in graph.__dict__:
        prepare_graph(graph)
    return None, graph


def att_path(graphs: Any, arg: tuple[dict[int, int], str, bool, Any]) -> tuple[Any, Any]:
    """The critical path walked on the run's graph (`critical_path.path_of_graph`; the graph
    assembled from the ranks' pieces here, or `att_graph`'s in one process) and, with a
    correction to come, the graph's reading of every (rank, step) at the measured times
    (`correction_replay.measured_parts`: small, it travels to the correction's Reduce)."""
    offsets, timeline, correct, _retimed = arg
    graph = graphs if isinstance(graphs, Graph) else assemble(graphs, offsets)
    return path_of_graph(graph, timeline), (measured_parts(graph) if correct else None)


def att_correct(
    graph: Any, arg: tuple[CorrectionInput | None, Any, bool]
) -> tuple[tuple[Any, Any, Any, Any], CorrectionInput | None]:
    """The profiler correction of the run (`correction_replay.correct_first`) on its graph, where the
    graph is: ((target, Correction or None, the graph when the caller keeps it, the
    identifiability check's `IdentifyJob` or None), the correction's input with the graph, kept
    there for that check's tasks (`Fan`s))."""
    inp, target, keep = arg
    corr = job = None
    with_graph = None
    if inp is not None and target is not None:
        if inp.measured is not None:
            graph.__dict__.setdefault("_measured_parts", inp.measured)
        with_graph = replace(inp, graph=graph, measured=None)
        corr, job = correct_first(with_graph, target)  # type: ignore[arg-type]  # what it reads of a RunParts
    return (target, corr, (graph if keep else None), job), with_graph


def att_identify_ends(inp: CorrectionInput, arg: tuple[Any, int]) -> Any:
    """One rank's first round of the identifiability check (`correction.identify_ends`)."""
    job, r = arg
    return identify_ends(inp, job, r)  # type: ignore[arg-type]  # what it reads of a RunParts


def att_identify_between(inp: CorrectionInput, arg: tuple[Any, list[tuple[int, float, float]], Any]) -> Any:
    """The second round over every rank's interval (`correction.identify_between`: one task, the
    refinement's budget is shared by the intervals)."""
    job, intervals, known = arg
    return identify_between(inp, job, intervals, known)  # type: ignore[arg-type]  # what it reads of a RunParts
