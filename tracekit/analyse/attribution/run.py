"""One run attributed (docs/METHOD.md section Shortfall attribution): per rank its step windows, their
exact partition, the exposed collective split into wait and transfer, its dependency-graph piece; the
steps joined across ranks, the step time, the per-rank parts and their mean over ranks, the critical
path and the dilation: the pieces `plan.attribution_plan` runs (`plan.attribute_run`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.collectives.clocks import require_aligned
from tracekit.analyse.collectives.exposed import split_exposed
from tracekit.analyse.collectives.instances import CollectiveInstances
from tracekit.analyse.compute.kernel_scaling import kernel_table
from tracekit.analyse.dilation import Dilation, dilation_of
from tracekit.analyse.path.build import build_rank_graph
from tracekit.analyse.path.critical_path import CriticalPath
from tracekit.analyse.path.graph import Graph
from tracekit.analyse.path.rank_graph import RankGraph
from tracekit.analyse.retime.calibrate import ProfilerCalibration, manifest_calibration
from tracekit.analyse.timeline.align import renumber_steps, step_tokens
from tracekit.analyse.timeline.kinds import TokenSteps, kinds_summary, token_steps
from tracekit.analyse.timeline.partition import (
    LAYERS,
    LayerUnions,
    cat_mask,
    layer_unions,
    partition_steps,
    rank_layers,
)
from tracekit.classify.rules import GPU_KINDS
from tracekit.errors import RankError, StepError
from tracekit.model.documents.base import given
from tracekit.model.documents.breakdown import BreakdownStepKind
from tracekit.model.documents.manifest import Manifest
from tracekit.model.events import DataQuality, Run
from tracekit.model.fields import copy_fields
from tracekit.model.parts import LEAF_PARTS
from tracekit.read.manifests import workload_step_pattern, workload_tp


@dataclass
class RunParts:
    """The per-step parts of one run and what they came from.

    - `steps`: per (rank, step): window and the partition parts, plus wait_ns / transfer_ns.
    - `slowest`: per step index (steady and warm-up): the slowest rank and its leaf parts
      (`<part>_ns` for LEAF_PARTS, `window_ns`), with `steady` True for the steps used.
    - `per_token`: exact mean per leaf part over the steady steps (Fractions) and "window".
    """

    n_ranks: int
    ranks: list[int]
    timeline: str
    steps: pd.DataFrame
    slowest: pd.DataFrame
    rank_steps: pd.DataFrame
    per_rank: dict[int, dict[str, Fraction]]
    per_token: dict[str, Fraction]
    critical: CriticalPath
    path_token: dict[str, Any]
    collectives: CollectiveInstances
    dilation: Dilation
    step_pattern: str | None
    data_quality: DataQuality = field(default_factory=DataQuality)
    #: the interleaving group of the capture (manifest `workload.interleaved.group`, written by
    #: `tracekit study`): two runs of one group had their rounds captured alternately
    pairing: str | None = None
    kernels: pd.DataFrame | None = None  # compute kernels per (rank, step) in launch order (kernel_scaling)
    #: the steps the per-token figures use when the step names carry kinds (decode of one batch size)
    token_steps: TokenSteps | None = None
    #: per step kind and batch size: steps, step time, mean parts (`steps.kinds_summary`); [] without kinds
    step_kinds: list[BreakdownStepKind] = field(default_factory=list)
    #: the run's dependency graph the critical path was walked on (`path.graph.assemble`): the profiler
    #: correction re-times it (`tracekit.analyse.attribution.correction`); None where it was not kept
    graph: Graph | None = None
    #: the manifest's `profiler_calibration` (`retime.calibrate.manifest_calibration`), None without one
    profiler_calibration: ProfilerCalibration | None = None

    @property
    def steady_steps(self) -> list[int]:
        return [int(x) for x in self.slowest.loc[self.slowest["steady"], "step"]]

    @property
    def steady(self) -> pd.DataFrame:
        """Per steady step: `step`, `window_ns` (the step time), `rank` (whose window was longest,
        for information) and each leaf part `<part>_ns` as the mean over ranks (floats)."""
        # made once per (rank_steps, slowest) pair (the shortfall's document, the what-if's model and
        # the straggler test each read it; a groupby and a merge every time were a tenth of a
        # simulated pair's analysis), handed out as a copy so no reader changes another's
        made = self.__dict__.get("_steady")
        if made is None or made[0] is not self.rank_steps or made[1] is not self.slowest:
            parts = [f"{p}_ns" for p in LEAF_PARTS]
            mean = self.rank_steps.groupby("step", sort=True)[parts].mean().reset_index()
            st = self.slowest[self.slowest["steady"]][["step", "rank", "window_ns"]]
            made = (self.rank_steps, self.slowest, st.merge(mean, on="step", how="left"))
            self.__dict__["_steady"] = made
        return made[2].copy()


def mean_over_ranks(per_rank: Mapping[int, Mapping[str, Fraction]]) -> dict[str, Fraction]:
    """The run's per-token parts: the exact mean over ranks of every rank's per-token parts.

    Every rank's parts sum to the same per-token step time, so the mean does too. The mean is
    symmetric in the ranks (relabelling them changes nothing) and moves by at most d / N when one
    rank's part moves by d: no tie-break between near-equal windows decides a figure."""
    ranks = list(per_rank)
    keys = [*LEAF_PARTS, "window"]
    return {k: sum((per_rank[r][k] for r in ranks), Fraction(0)) / len(ranks) for k in keys}


def check_ranks(run: Run, label: str) -> None:
    """RankError when the manifest names more ranks than the run has files for."""
    tp = workload_tp(run.manifest)  # a manifest's tp of 10**30 is not a degree: None
    if tp is not None:
        present = set(run.ranks)
        missing = sorted(set(range(tp)) - present)
        if missing:
            raise RankError(
                f"{label}: the manifest says tp={tp} but there are no trace files for rank(s) "
                f"{', '.join(map(str, missing))} (found ranks {sorted(present)})"
            )


def ranks_without_kernels(classified: pd.DataFrame, ranks: list[int]) -> list[int]:
    """The ranks with GPU activity (a GPU timeline) but not one kernel: a trace that lost its kernels."""
    ev_rank = classified["rank"].to_numpy(np.int64)
    gpu = cat_mask(classified["kind"], GPU_KINDS)
    kern = cat_mask(classified["kind"], {"kernel"})
    out = []
    for r in ranks:
        on = ev_rank == r
        if gpu[on].any() and not kern[on].any():
            out.append(int(r))
    return out


def _host_layers(classified: pd.DataFrame, ranks: list[int]) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Per rank, the partition's compute+memory intervals (`higher`) and collective intervals,
    from the same timeline the step partition uses."""
    layers = LAYERS
    coll_layer = layers.index("collective")
    hi, co = [], []
    timelines = set()
    ev_rank = classified["rank"].to_numpy(np.int64)
    for r in ranks:
        timeline, s, e, layer = rank_layers(classified[ev_rank == r])
        timelines.add(timeline)
        h = layer < coll_layer
        c = layer == coll_layer
        hi.append(pd.DataFrame({"rank": r, "start_ns": s[h], "end_ns": e[h]}))
        co.append(pd.DataFrame({"rank": r, "start_ns": s[c], "end_ns": e[c]}))
    timeline = "gpu" if timelines == {"gpu"} else ("host" if timelines == {"host"} else "mixed")
    return pd.concat(hi, ignore_index=True), pd.concat(co, ignore_index=True), timeline


def attribute_setup(run: Run, label: str, step_pattern: str | None) -> tuple[str | None, DataQuality]:
    """`attribute_run`'s run-level start, on the run's metadata only (ranks, manifest, the readers'
    notes): RankError when the manifest names missing ranks, the data quality so far, and the step
    pattern (the manifest's `workload.step_pattern` when none is given)."""
    check_ranks(run, label)
    dq = DataQuality()
    # what the readers counted (values dropped, manifest fields left out: a workload that is not an
    # object, so its tp, step pattern and collectives are not read)
    dq.merge(run.data_quality)
    if step_pattern is None:
        step_pattern = workload_step_pattern(run.manifest)
    return step_pattern, dq


@dataclass
class RankAttribution:
    """One rank's share of `attribute_run` (small; what a Dask per-rank task returns): its
    partition rows with the exposed collective split (`wait_ns`, `transfer_ns`, and the split's
    `collective_ns_split` for the run-level check), the timeline of its layers, whether it has GPU
    activity but no kernel, and (when graph windows were given) its share of the run's
    dependency graph (`path.build.build_rank_graph`), which the critical path is walked on."""

    rank: int
    table: pd.DataFrame
    timeline: str
    no_kernels: bool
    graph: RankGraph | None = None
    kernels: pd.DataFrame | None = None  # its compute kernels per step (`kernel_scaling.kernel_table`)


def attribute_rank(
    events: pd.DataFrame,
    rank: int,
    windows: pd.DataFrame,
    matched: pd.DataFrame,
    *,
    table: pd.DataFrame | None = None,
    unions: LayerUnions | None = None,
    graph_windows: pd.DataFrame | None = None,
    offset: int = 0,
) -> RankAttribution:
    """One rank's piece of `attribute_run`. `events`: the rank's classified rows (only);
    `windows`: its step windows (the run's step numbers); `matched`: its rows of the matched
    collectives (`CollectiveInstances.per_rank`); `table` / `unions`: its partition rows and layer
    unions when already built (the AnalysedRun's), else built here; `graph_windows`: its step
    windows as found (with `annotation_end_ns`) to build its share of the dependency graph on,
    `offset` its clock offset (raw = aligned + offset)."""
    if unions is None:
        unions = layer_unions(events)
    if table is None:
        table = partition_steps(events, windows, {rank: unions})
    higher, coll_iv, timeline = _host_layers(events, [rank])
    no_kernels = bool(ranks_without_kernels(events, [rank]))
    split = split_exposed(table[["rank", "step", "start_ns", "end_ns"]], higher, matched, collective=coll_iv)
    table = table.merge(
        split[["rank", "step", "collective_ns", "wait_ns", "transfer_ns"]],
        on=["rank", "step"],
        suffixes=("", "_split"),
    )
    graph = None
    if graph_windows is not None and len(graph_windows):
        # the step windows with the partition's ends (the annotation's end from the windows found)
        gw = graph_windows.drop(columns=["end_ns"]).merge(
            table[["rank", "step", "end_ns"]], on=["rank", "step"]
        )
        graph = build_rank_graph(
            events, int(rank), gw, matched, int(offset), "gpu" if timeline == "gpu" else "host", unions=unions
        )
    kernels = kernel_table(events, rank, windows)
    return RankAttribution(int(rank), table, timeline, no_kernels, graph, kernels)


@dataclass
class AttributedSteps:
    """`assemble_attribution`'s result: the run-level figures before the critical path."""

    table: pd.DataFrame
    slowest: pd.DataFrame
    rank_steps: pd.DataFrame
    per_rank: dict[int, dict[str, Fraction]]
    per_token: dict[str, Fraction]
    steady_steps: list[int]
    timeline: str
    kernels: pd.DataFrame | None = None  # every rank's compute kernels per step, in launch order
    token_steps: TokenSteps | None = None
    step_kinds: list[BreakdownStepKind] = field(default_factory=list)


def assemble_attribution(
    pieces: list[RankAttribution], *, label: str, skip_first: int, dq: DataQuality
) -> AttributedSteps:
    """The run-level assembly of the ranks' pieces (in rank order): the split checked against
    the partition, per step the step time (the longest window) and the steady steps, per rank
    its per-token parts padded to the step time, and their mean (small data only)."""
    ranks = [p.rank for p in pieces]
    timelines = {p.timeline for p in pieces}
    timeline = "gpu" if timelines == {"gpu"} else ("host" if timelines == {"host"} else "mixed")
    no_kernels = [p.rank for p in pieces if p.no_kernels]
    if no_kernels:
        dq.add(
            "ranks_without_kernels",
            len(no_kernels),
            f"{label}: rank(s) {', '.join(map(str, no_kernels))} have GPU activity (copies, sets) but no kernels: "
            "were kernels left out of the trace?",
        )
    if not any(len(p.table) for p in pieces):  # a clear line, not pandas' "No objects to concatenate"
        raise StepError(
            f"{label}: no step windows to attribute (pass --steps whole, or another --steps REGEX)"
        )
    table = pd.concat([p.table for p in pieces], ignore_index=True)
    if not (table["collective_ns"] == table["collective_ns_split"]).all():
        bad = table[table["collective_ns"] != table["collective_ns_split"]].iloc[0]
        raise AssertionError(
            f"{label}: exposed collective of rank {bad['rank']} step {bad['step']} is "
            f"{bad['collective_ns']} ns in the partition but {bad['collective_ns_split']} ns in the wait/transfer split"
        )
    table = table.drop(columns=["collective_ns_split"])

    # per step: the step time is the longest window (the token is done when its last rank is);
    # `slowest` keeps which rank that was, for information only: no part is taken from it
    srt = table.sort_values(["step", "window_ns", "rank"], ascending=[True, False, True])
    slowest = srt.drop_duplicates("step").sort_values("step").reset_index(drop=True)
    counts = table.groupby("step")["rank"].nunique()
    partial_steps = counts[counts < len(ranks)]
    if len(partial_steps):
        dq.add(
            "steps_missing_on_some_ranks",
            int(len(partial_steps)),
            f"{label}: {len(partial_steps)} step(s) are not on every rank; they are left out of the per-token "
            "figures (every rank's parts are averaged over the same steps)",
        )
    n_steps = len(slowest)
    skip = min(skip_first, max(n_steps - 1, 0))
    if skip < skip_first:
        dq.add(
            "too_few_steps",
            1,
            f"{label}: only {n_steps} step(s); skipped {skip} as warm-up instead of {skip_first}",
        )
    slowest["steady"] = (np.arange(n_steps) >= skip) & slowest["step"].isin(
        counts[counts == len(ranks)].index
    )
    # a serving engine's steps say their kind: per-token figures from decode steps of one batch
    # size (docs/METHOD.md, Serving engines: custom all-reduce and step kinds)
    tok = token_steps(table)
    if tok is not None:
        slowest["steady"] &= slowest["step"].isin(tok.steps)
        dq.add("per_token_steps", 0, f"{label}: {tok.statement}")
    steady_steps = [int(x) for x in slowest.loc[slowest["steady"], "step"]]
    if not steady_steps:
        what = f" (of the {len(tok.steps)} {tok.kind or 'chosen'} steps)" if tok is not None else ""
        raise StepError(f"{label}: no steps to attribute{what} (no step after the warm-up is on every rank)")

    # per rank: each (rank, step) window's leaf parts, padded to the step time with idle (a rank
    # whose window is shorter than the longest one is idle for the difference as far as the
    # token is concerned), so every rank's parts sum to the same step time
    step_ns = slowest.set_index("step")["window_ns"]
    rs = table[table["step"].isin(steady_steps)].copy()
    rs["step_ns"] = rs["step"].map(step_ns).astype(np.int64)
    rs["pad_ns"] = rs["step_ns"] - rs["window_ns"]
    rs["idle_ns"] = rs["idle_ns"] + rs["pad_ns"]
    leaf = rs[[f"{p}_ns" for p in LEAF_PARTS]].to_numpy(np.int64)
    if not np.array_equal(leaf.sum(axis=1), rs["step_ns"].to_numpy(np.int64)):
        raise AssertionError(f"{label}: leaf parts do not sum to the step time")
    n = len(steady_steps)
    per_rank: dict[int, dict[str, Fraction]] = {}
    for r in ranks:
        g = rs[rs["rank"] == r]
        per_rank[r] = {p: Fraction(int(g[f"{p}_ns"].sum()), n) for p in LEAF_PARTS}
        per_rank[r]["window"] = Fraction(int(g["step_ns"].sum()), n)
        per_rank[r]["pad"] = Fraction(int(g["pad_ns"].sum()), n)
        per_rank[r]["own_window"] = Fraction(int(g["window_ns"].sum()), n)
    per_token = mean_over_ranks(per_rank)
    assert sum(per_token[p] for p in LEAF_PARTS) == per_token["window"]
    kernels = [p.kernels for p in pieces if p.kernels is not None and len(p.kernels)]
    all_kernels = pd.concat(kernels, ignore_index=True) if kernels else None
    return AttributedSteps(
        table,
        slowest,
        rs,
        per_rank,
        per_token,
        steady_steps,
        timeline,
        all_kernels,
        tok,
        kinds_summary(table),
    )


def finish_attribution(
    run: Run,
    att: AttributedSteps,
    path: CriticalPath,
    coll: CollectiveInstances,
    *,
    step_pattern: str | None,
    label: str,
    skip_first: int,
    dilation_threshold: float,
    dq: DataQuality,
    graph: Graph | None = None,
) -> RunParts:
    """`attribute_run`'s tail: the critical path checked against the step time, the dilation
    (the manifest's unprofiled times), the RunParts. `run`: the run's metadata (no events needed);
    `graph`: the dependency graph the path was walked on (kept for the profiler correction)."""
    path_token = path.per_token(att.steady_steps)
    if graph is not None and len(graph.steps):
        pos = {s: i for i, s in enumerate(graph.steps)}
        span = graph.path_spans(graph.t)
        if all(s in pos for s in att.steady_steps) and path_token["step"] != Fraction(
            int(sum(int(span[pos[s]]) for s in att.steady_steps)), len(att.steady_steps)
        ):
            raise AssertionError(f"{label}: the critical path does not cover its steps' ranges")
    # a step's path covers the window of the rank that ends it, cut at the previous token's end
    # (`Graph.path_spans`), the partition the longest window: another rank's window opened earlier
    # (a noisy host, an early annotation) or one opened before the previous token ended is this
    # step's offset, so a change of the windows alone moves the offset, never a part of the path
    window = att.per_token["window"]
    if path_token["step"] != window:
        extra = window - path_token["step"]
        assert extra > 0, f"{label}: the critical path covers more than the step time"
        path_token = {**path_token, "offset": path_token["offset"] + extra, "step": window}

    dil = dilation_of(run.manifest, skip_first=skip_first, threshold=dilation_threshold)
    for note in dil.notes:
        dq.add("manifest_field_malformed", 1, f"{label}: {note}")
    # timeline, slowest, rank_steps, per_rank, per_token, kernels, token_steps, step_kinds: the
    # attribution's own
    return copy_fields(
        RunParts,
        att,
        n_ranks=len(run.ranks),
        ranks=list(run.ranks),
        steps=att.table,
        critical=path,
        path_token=path_token,
        collectives=coll,
        dilation=dil,
        step_pattern=step_pattern,
        data_quality=dq,
        pairing=interleave_group(run.manifest),
        graph=graph,
        profiler_calibration=manifest_calibration(run.manifest),
    )


def interleave_group(manifest: Manifest | None) -> str | None:
    """The manifest's `workload.interleaved.group` (a string), or None."""
    wl = given(manifest.workload) if manifest is not None else None
    il = given(wl.interleaved) if wl is not None else None
    return (given(il.group) or None) if il is not None else None


def join_steps(steps: pd.DataFrame, coll: CollectiveInstances, label: str, dq: DataQuality) -> pd.DataFrame:
    """The step windows with each rank's step numbers replaced by the run's tokens
    (`align.step_tokens`: steps matched across ranks by their collective sequence, not by number),
    after refusing a run of several ranks whose clocks could not be aligned
    (`collectives.require_aligned`); what the matching changed goes into `dq`. Both engines call it
    between the matching and the partition."""
    if len(pd.unique(steps["rank"])) > 1:
        require_aligned(coll, label)
    tokens = step_tokens(steps, coll.per_rank)
    for key, n, note in tokens.notes():
        dq.add(key, n, f"{label}: {note}")
    return renumber_steps(steps, tokens)
