"""Shortfall attribution (docs/METHOD.md sections "Wait and transfer", "Shortfall attribution" and "Dilation").

`shortfall(baseline, sharded)` says where the per-token shortfall S = TN - T1/N of a run sharded
over N ranks goes, against a baseline of the same model on one rank (N_base ranks in general; the
ideal is then T1 * N_base / N).

Per run (`attribute_run`):
1. classify, find the step windows, partition each (rank, step) window exactly
   (`tracekit.analyse.steps`), match the collectives across ranks and split the exposed collective
   part of every window exactly into wait and transfer (`tracekit.analyse.collectives.split_exposed`:
   collective == wait + transfer, integer ns).
2. per step index, the step time is the longest window over ranks (the token is done when its
   last rank is); every rank's window is padded to it with idle, so each rank's leaf parts sum to
   the step time. No part is taken from whichever rank had the longest window.
3. the first `skip_first` steps are warm-up; steps missing on some rank are left out. Per rank, the
   per-token figure of every part is its **mean** over the steady steps, kept as an exact
   fraction; the run's figure is the **mean over ranks** (`mean_over_ranks`): symmetric in the
   ranks, and moved by at most d/N when one rank's part moves by d. Means are additive: the parts
   sum exactly to the per-token time, so the terms below sum exactly to S, for the run and for
   every rank (`per_rank`). Medians and p10/p90 over steps are reported beside (`spread_ns`).
4. the per-token critical path across ranks (`tracekit.analyse.critical_path`): which rank's
   compute, host gaps, sync and transfer the token waited on; the verdict names it, and the other
   ranks' wait as its consequence.

Terms (f = N_base / N):
    compute      = CN - f C1
    memory       = MN - f M1
    transfer     = XN - f X1
    coordination = (WN - f W1) + (YN - f Y1) + (IN - f I1)       wait + sync + idle
    unknown      = UN - f U1    (only in `terms_ns` when it is not zero)
Integers in the JSON: the per-token figures are rounded, S = sharded - ideal, and the leaf terms
are rounded by largest remainder to sum to S exactly (asserted).

Dilation (docs/METHOD.md section Dilation): when both runs' manifests carry unprofiled per-token times, T1 and TN come
from the unprofiled pass (the mean over the steady tokens of every unprofiled round), and each
rank's traced parts are reconciled to it (`reconcile`, docs/METHOD-NOTES.md), as is the critical
path (`reconcile_path`). The dilation stated is the factor applied: traced per-token mean /
unprofiled per-token mean (`applied_dilation`, with a bootstrap interval). The trace-only
attribution is kept under `uncorrected`.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse import prose
from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.collectives.clocks import require_aligned
from tracekit.analyse.collectives.exposed import split_exposed
from tracekit.analyse.collectives.instances import CollectiveInstances
from tracekit.analyse.compute.kernel_scaling import KERNEL_COLUMNS, compute_scaling, kernel_table
from tracekit.analyse.critical_path import PATH_PARTS, CriticalPath
from tracekit.analyse.dilation import DEFAULT_THRESHOLD, Dilation, dilation_of
from tracekit.analyse.exact import round_to_sum as _round_to_sum
from tracekit.analyse.graph import Graph, RankGraph, build_rank_graph
from tracekit.analyse.noise import Intervals, Reading, RunSample
from tracekit.analyse.noise import bootstrap as noise_bootstrap
from tracekit.analyse.noise import reading as noise_reading
from tracekit.analyse.timeline.kinds import TokenSteps, kinds_summary, token_steps
from tracekit.analyse.timeline.partition import LayerUnions
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.errors import MatchError, RankError, StepError
from tracekit.model.events import DataQuality, Run
from tracekit.model.parts import COORDINATION, LEAF_PARTS, term_words

#: 1.2: collectives.by_op[].bytes_source; 1.3: diagnosis; 1.4: collectives.by_op[].wait_ns_median is the
#: median over instances of the per-instance max wait (was: over every (instance, rank) row); 1.5: per_rank,
#: critical_path, straggler, term_words, aggregate; dilation stated = applied (traced/unprofiled means)
SCHEMA_VERSION = "1.5"


# ------------------------------------------------------------------------------------------
# one run


STRAGGLER_ALPHA = 0.01
"""A rank is last more often than chance only when `last_share_p_value` is below this."""


def last_share_p_value(last_count: int, instances: int, n_ranks: int) -> float:
    """How likely chance alone makes the most frequent last rank last at >= `last_count` of
    `instances` collectives, each instance's last rank uniform over `n_ranks`: the upper binomial
    tail at p = 1 / n_ranks, times n_ranks (any rank could have been the most frequent one:
    Bonferroni), capped at 1.

    The most frequent last rank of two is last at >= 50% by construction, so a share alone proves
    nothing at TP=2 (a loaded 2-core CI host: rank 0 last at 16 of 32, 0.82 ms late, was called a
    straggler); the share must be one that chance does not explain."""
    if instances <= 0 or n_ranks < 2:
        return 1.0
    p = 1.0 / n_ranks
    j = np.arange(max(last_count, 0), instances + 1, dtype=np.float64)
    if not len(j):
        return 0.0
    log_pmf = (
        math.lgamma(instances + 1)
        - np.array([math.lgamma(x + 1) + math.lgamma(instances - x + 1) for x in j])
        + j * math.log(p)
        + (instances - j) * math.log1p(-p)
    )
    return float(min(1.0, n_ranks * np.exp(log_pmf).sum()))


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
    step_kinds: list[dict[str, Any]] = field(default_factory=list)
    #: the run's dependency graph the critical path was walked on (`graph.assemble`): the profiler
    #: correction re-times it (`tracekit.analyse.correction`); None where it was not kept
    graph: Graph | None = None
    #: the manifest's `profiler_calibration` (`replay._manifest_calibration`), None without one
    profiler_calibration: dict[str, Any] | None = None

    @property
    def steady_steps(self) -> list[int]:
        return [int(x) for x in self.slowest.loc[self.slowest["steady"], "step"]]

    @property
    def steady(self) -> pd.DataFrame:
        """Per steady step: `step`, `window_ns` (the step time), `rank` (whose window was longest,
        for information) and each leaf part `<part>_ns` as the mean over ranks (floats)."""
        parts = [f"{p}_ns" for p in LEAF_PARTS]
        mean = self.rank_steps.groupby("step", sort=True)[parts].mean().reset_index()
        st = self.slowest[self.slowest["steady"]][["step", "rank", "window_ns"]]
        return st.merge(mean, on="step", how="left")


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
    m = run.manifest or {}
    tp = (m.get("workload") or {}).get("tp") if isinstance(m.get("workload"), Mapping) else None
    if isinstance(tp, int) and 0 < tp <= 1 << 16:  # a manifest's tp of 10**30 is not a degree
        present = set(run.ranks)
        missing = sorted(set(range(tp)) - present)
        if missing:
            raise RankError(
                f"{label}: the manifest says tp={tp} but there are no trace files for rank(s) "
                f"{', '.join(map(str, missing))} (found ranks {sorted(present)})"
            )


def ranks_without_kernels(classified: pd.DataFrame, ranks: list[int]) -> list[int]:
    """The ranks with GPU activity (a GPU timeline) but not one kernel: a trace that lost its kernels."""
    from tracekit.analyse.timeline.partition import cat_mask
    from tracekit.classify.rules import GPU_KINDS

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
    from tracekit.analyse.timeline.partition import LAYERS, rank_layers

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
    dq.merge(run.data_quality)  # what the readers counted (values dropped, manifest fields left out)
    if run.manifest and "workload" in run.manifest and not isinstance(run.manifest["workload"], Mapping):
        dq.add(
            "manifest_field_malformed",
            1,
            f"{label}: manifest.json field 'workload' is not an object; its tp, step pattern and "
            "collectives are ignored",
        )
    if step_pattern is None and run.manifest:
        wl = run.manifest.get("workload")
        sp = wl.get("step_pattern") if isinstance(wl, Mapping) else None
        step_pattern = sp if isinstance(sp, str) and sp else None
    return step_pattern, dq


@dataclass
class RankAttribution:
    """One rank's share of `attribute_run` (small; what a Dask per-rank task returns): its
    partition rows with the exposed collective split (`wait_ns`, `transfer_ns`, and the split's
    `collective_ns_split` for the run-level check), the timeline of its layers, whether it has GPU
    activity but no kernel, and (when graph windows were given) its share of the run's
    dependency graph (`graph.build_rank_graph`), which the critical path is walked on."""

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
    from tracekit.analyse.timeline.partition import layer_unions, partition_steps

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
    step_kinds: list[dict[str, Any]] = field(default_factory=list)


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
    from tracekit.analyse.replay import _manifest_calibration

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
    return RunParts(
        n_ranks=len(run.ranks),
        ranks=list(run.ranks),
        timeline=att.timeline,
        steps=att.table,
        slowest=att.slowest,
        rank_steps=att.rank_steps,
        per_rank=att.per_rank,
        per_token=att.per_token,
        critical=path,
        path_token=path_token,
        collectives=coll,
        dilation=dil,
        step_pattern=step_pattern,
        data_quality=dq,
        pairing=interleave_group(run.manifest),
        kernels=att.kernels,
        token_steps=att.token_steps,
        step_kinds=att.step_kinds,
        graph=graph,
        profiler_calibration=_manifest_calibration(run.manifest),
    )


def interleave_group(manifest: Mapping[str, Any] | None) -> str | None:
    """The manifest's `workload.interleaved.group` (a string), or None."""
    wl = (manifest or {}).get("workload") if isinstance(manifest, Mapping) else None
    il = wl.get("interleaved") if isinstance(wl, Mapping) else None
    g = il.get("group") if isinstance(il, Mapping) else None
    return g if isinstance(g, str) and g else None


def join_steps(steps: pd.DataFrame, coll: CollectiveInstances, label: str, dq: DataQuality) -> pd.DataFrame:
    """The step windows with each rank's step numbers replaced by the run's tokens
    (`align.step_tokens`: steps matched across ranks by their collective sequence, not by number),
    after refusing a run of several ranks whose clocks could not be aligned
    (`collectives.require_aligned`); what the matching changed goes into `dq`. Both engines call it
    between the matching and the partition."""
    from tracekit.analyse.timeline.align import renumber_steps, step_tokens

    if len(pd.unique(steps["rank"])) > 1:
        require_aligned(coll, label)
    tokens = step_tokens(steps, coll.per_rank)
    for key, n, note in tokens.notes():
        dq.add(key, n, f"{label}: {note}")
    return renumber_steps(steps, tokens)


def attribute_run(
    run: Run | AnalysedRun,
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float = DEFAULT_THRESHOLD,
    label: str = "run",
    allow_partial: bool = False,
) -> RunParts:
    """Per-step leaf parts of one run (see the module doc): `tracekit.analyse.plans.attribution_plan`
    run in this process, the plan every engine runs (`tracekit.engine`: locally, or on Dask with
    each rank's stages where its events are).

    The pieces: `attribute_setup` (run metadata) -> per rank the step rule and its collective rows
    -> the step windows -> the matched collectives -> `attribute_rank` per rank (partition, host
    layers, exposed split, ranks without kernels, graph piece) -> `assemble_attribution` (step
    time, per-rank parts, their mean) -> the critical path -> `finish_attribution` (path check,
    dilation)."""
    from tracekit.analyse.plans import attribution_plan, run_in_process

    ar = AnalysedRun.of(run)  # classified once; its partitions and layer unions shared (analysed.py)
    plan = attribution_plan(
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        label=label,
        allow_partial=allow_partial,
    )
    parts: RunParts = run_in_process(plan, ar)
    return parts


# ------------------------------------------------------------------------------------------
# reconciliation to the unprofiled per-token time


def reconcile(
    parts: Mapping[str, Fraction], target: Fraction, timeline: str
) -> tuple[dict[str, Fraction], str]:
    """Scale the traced per-token parts to sum to the unprofiled per-token time `target`, exactly.

    - device timeline ("gpu"): the profiler's cost is host time, which shows up between device
      work: as idle on the rank whose host it slowed and, at TP>1, as wait on the ranks that meet
      it at the next collective. Device-side parts (compute, memory, transfer, unknown) are kept as
      measured; the excess (traced - unprofiled) is taken out of wait, sync and idle in proportion
      to their traced sizes (one factor for the three). If it exceeds all three, they are emptied
      and the rest is taken from every part in proportion. A traced time *shorter* than the
      unprofiled one (no excess) scales every part in proportion.
    - host timeline ("host"/"mixed": CPU-only runs): the compute on the timeline is itself host
      time the profiler dilates (op callbacks land inside parent ops and between ops alike), so
      every host-executed part (all but transfer, whose gloo exchange records no ops) is scaled
      by one factor; transfer is kept.
    Returns the new parts and one sentence saying what was done.
    """
    traced = sum(parts[p] for p in LEAF_PARTS)
    out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
    if traced == target:
        return out, "the traced per-token time equals the unprofiled one; nothing to reconcile"
    excess = traced - target
    pct = float(excess / target) if target else float("nan")

    def proportional(keys: tuple[str, ...]) -> None:
        base = sum(out[k] for k in keys)
        rest = sum(out[k] for k in LEAF_PARTS if k not in keys)
        if base <= 0:
            keys_all = LEAF_PARTS
            base, rest = sum(out[k] for k in keys_all), Fraction(0)
            keys = keys_all
        factor = (target - rest) / base
        for k in keys:
            out[k] = out[k] * factor

    if timeline == "gpu":
        if excess < 0:
            proportional(LEAF_PARTS)
            return out, (
                f"the traced per-token time is {-pct:.1%} below the unprofiled one; every part was scaled up "
                "in proportion to match it"
            )
        coord = sum(out[k] for k in COORDINATION)
        if excess > coord:
            for k in COORDINATION:
                out[k] = Fraction(0)
            proportional(tuple(k for k in LEAF_PARTS if k not in COORDINATION))
            return out, (
                f"profiler excess of {pct:.1%} over the unprofiled per-token time exceeds wait + sync + idle; "
                "those were emptied and the rest scaled every part in proportion"
            )
        keep = 1 - excess / coord
        for k in COORDINATION:
            out[k] = out[k] * keep
        return out, (
            f"the profiler's excess ({pct:+.1%} over the unprofiled per-token time) is host time: it was taken "
            f"out of wait, sync and idle in proportion to their traced sizes (each kept at {float(keep):.1%}), "
            "on every rank: at TP>1 a rank's added host time also shows up as the other ranks' wait; compute, "
            "memory and transfer are kept as measured"
        )
    keys = tuple(k for k in LEAF_PARTS if k != "transfer")
    proportional(keys)
    return out, (
        f"CPU-only timeline: every host-executed part (all but transfer) was scaled by one factor to "
        f"remove the profiler's {pct:+.1%} on the per-token time (host ops are dilated as much as the gaps)"
    )


def reconcile_path(path: Mapping[str, Any], target: Fraction, timeline: str) -> dict[str, Any]:
    """The critical path's per-token components scaled to the unprofiled per-token time, exactly.

    The path's host time is where the profiler's cost lies on the path (the late rank's host was
    slower under the profiler). GPU timeline: the excess is taken out of every rank's host and
    sync time on the path in proportion to their sizes; if it exceeds them, every component (and
    the offset) is scaled in proportion. Host timeline: every component but transfer (and the
    offset) is scaled by one factor, as `reconcile` does."""
    by_rank = {r: dict(d) for r, d in path["by_rank"].items()}
    offset = Fraction(path["offset"])
    traced = Fraction(path["step"])
    excess = traced - target

    def scale_all(keys: tuple[str, ...], with_offset: bool) -> None:
        nonlocal offset
        base = sum(d[k] for d in by_rank.values() for k in keys) + (offset if with_offset else 0)
        rest = traced - base
        if base == 0:
            return
        f = (target - rest) / base
        for d in by_rank.values():
            for k in keys:
                d[k] *= f
        if with_offset:
            offset *= f

    if excess != 0:
        if timeline == "gpu":
            hostish = sum(d[k] for d in by_rank.values() for k in ("host", "sync"))
            if 0 < excess <= hostish:
                keep = 1 - excess / hostish
                for d in by_rank.values():
                    d["host"] *= keep
                    d["sync"] *= keep
            else:
                scale_all(PATH_PARTS, True)
        else:
            scale_all(tuple(k for k in PATH_PARTS if k != "transfer"), True)
    out = {"by_rank": by_rank, "offset": offset, "step": target}
    total = sum(sum(d.values()) for d in by_rank.values()) + offset
    if total != target:  # a degenerate case (nothing to scale): say so rather than hide it
        out["offset"] = offset + (target - total)
    return out


# ------------------------------------------------------------------------------------------
# the attribution


@dataclass
class Attribution:
    """Exact per-token figures of one attribution (Fractions) and their integer JSON form."""

    baseline_ns: Fraction
    sharded_ns: Fraction
    ideal_ns: Fraction
    leaf_terms: dict[str, Fraction]  # per LEAF_PARTS: PN - f P1

    @property
    def shortfall_ns(self) -> Fraction:
        return self.sharded_ns - self.ideal_ns

    def terms(self) -> dict[str, Fraction]:
        t = {
            "compute": self.leaf_terms["compute"],
            "memory": self.leaf_terms["memory"],
            "transfer": self.leaf_terms["transfer"],
            "coordination": sum((self.leaf_terms[k] for k in COORDINATION), Fraction(0)),
            "unknown": self.leaf_terms["unknown"],
        }
        assert sum(t.values()) == self.shortfall_ns, "terms do not sum to the shortfall"
        return t

    def integers(self) -> dict[str, Any]:
        """The JSON figures: ints that sum exactly (largest remainder on the leaf terms)."""
        base = _round(self.baseline_ns)
        sharded = _round(self.sharded_ns)
        ideal = _round(self.ideal_ns)
        s = sharded - ideal
        leaf = _round_to_sum(self.leaf_terms, s)
        terms = {
            "compute": leaf["compute"],
            "memory": leaf["memory"],
            "transfer": leaf["transfer"],
            "coordination": sum(leaf[k] for k in COORDINATION),
        }
        if self.leaf_terms["unknown"] != 0 or leaf["unknown"] != 0:
            terms["unknown"] = leaf["unknown"]
        assert sum(terms.values()) == s
        return {
            "per_token_ns": {"baseline": base, "sharded": sharded, "ideal": ideal},
            "shortfall_ns": s,
            "terms_ns": terms,
            "coordination_ns": {k: leaf[k] for k in COORDINATION},
        }


def _round(x: Fraction) -> int:
    return int(math.floor(x + Fraction(1, 2)))


def attribute(base: Mapping[str, Fraction], sharded: Mapping[str, Fraction], factor: Fraction) -> Attribution:
    """Terms from per-token leaf parts of the baseline and the sharded run; factor = N_base / N."""
    tb = sum(base[p] for p in LEAF_PARTS)
    tn = sum(sharded[p] for p in LEAF_PARTS)
    leaf = {p: sharded[p] - factor * base[p] for p in LEAF_PARTS}
    att = Attribution(Fraction(tb), Fraction(tn), factor * tb, leaf)
    att.terms()  # asserts the exact sum
    return att


# ------------------------------------------------------------------------------------------
# the result


@dataclass(frozen=True)
class Shortfall:
    """The attribution of S for one (baseline, sharded) pair; `to_json()` per docs/JSON.md#shortfall,
    `to_frame()` its attribution as a table."""

    n_ranks: int
    baseline: RunParts
    sharded: RunParts
    factor: Fraction
    corrected: Attribution
    uncorrected: Attribution
    per_token_source: str  # "unprofiled" | "trace"
    reconciliation: str
    spread_ns: dict[str, dict[str, int]]
    data_quality: DataQuality
    per_rank: dict[int, Attribution]  # each sharded rank's own parts (corrected) against the baseline
    per_rank_uncorrected: dict[int, Attribution]
    path: dict[str, Any]  # the sharded run's critical path per token (corrected): by_rank, offset, step
    path_uncorrected: dict[str, Any]
    base_path: dict[str, Any]  # the baseline's (one rank: its own host / compute split)
    applied: dict[str, AppliedDilation]
    rank_parts: dict[int, dict[str, Fraction]]  # each sharded rank's per-token leaf parts (as attributed)
    #: per run label, how its parts were corrected to its corrected per-token time
    #: (`tracekit.analyse.correction.Correction`; None: not corrected)
    corrections: dict[str, Any] = field(default_factory=dict)

    @property
    def attribution(self) -> Attribution:
        return self.corrected

    def __repr__(self) -> str:
        from tracekit.analyse.display import shortfall_repr

        return shortfall_repr(self)

    def _repr_html_(self) -> str:
        from tracekit.analyse.display import shortfall_html

        return shortfall_html(self)

    def shares(self) -> dict[str, float | None]:
        ints = self.corrected.integers()
        s = ints["shortfall_ns"]
        return {k: (v / s if s else None) for k, v in ints["terms_ns"].items()}

    def term_words(self) -> dict[str, str]:
        """What each term is, in words, for this run (on a CPU run the 'link' is gloo's exchange)."""
        return term_words(self.sharded.timeline)

    @functools.cached_property
    def intervals(self) -> Intervals:
        """95% bootstrap intervals of T1, TN, the ideal, S and every term (`tracekit.analyse.noise`):
        over the runs' rounds (paired when captured interleaved) and the traced passes' steps;
        over steps only when the manifests have no rounds. Deterministic (seed 0)."""
        corrected = self.per_token_source == "unprofiled"
        ints = self.corrected.integers()
        return noise_bootstrap(
            _run_sample(self.baseline, corrected, self.corrections.get("baseline")),
            _run_sample(self.sharded, corrected, self.corrections.get("sharded")),
            float(self.factor),
            dilations=(self.applied["baseline"].factor, self.applied["sharded"].factor),
            with_unknown="unknown" in ints["terms_ns"],
        )

    def noise(self) -> Reading:
        """What the intervals allow the verdict to say (`tracekit.analyse.noise.reading`)."""
        ints = self.corrected.integers()
        return noise_reading(ints["shortfall_ns"], ints["terms_ns"], self.intervals)

    def verdict(self) -> str:
        """`tracekit.analyse.prose.verdict` (the prose lives there)."""
        return prose.verdict(self)

    def _noise_checked_diagnosis(self) -> str:
        """`tracekit.analyse.prose.noise_checked_diagnosis` (the prose lives there)."""
        return prose.noise_checked_diagnosis(self)

    # ---- the critical path

    def path_ints(self, corrected: bool = True) -> dict[str, Any]:
        """The critical path per token as integers: by_rank -> {<part>_ns}, offset_ns, step_ns; the
        components and the offset are rounded by largest remainder to sum to step_ns exactly."""
        return _path_integers(self.path if corrected else self.path_uncorrected)

    def straggler(self) -> dict[str, Any]:
        """Is one rank late by more than symmetric launch-bound hosts explain? (docs/METHOD-NOTES.md)

        Per collective instance, the lateness of its last rank = last arrival - the arrival before
        it (how long that rank alone held the collective). The candidate is the rank that is last
        most often; its median lateness (over the instances where it is last) is compared with a
        threshold from the baseline: 3 x the baseline's host time per collective interval (its
        median per-step host gap / the collectives per step: the lead one symmetric launch-bound
        host can build over another between two collectives) + the baseline's host-gap spread per
        interval ((p90 - p10) / collectives per step). Both figures are traced ones (the profiler
        slows both runs' hosts alike)."""
        coll = self.sharded.collectives
        out: dict[str, Any] = {"rank": None, "is_straggler": False}
        pr = coll.per_rank
        if self.n_ranks < 2 or pr.empty:
            return out
        steady = set(self.sharded.steady["step"].tolist())
        windows = self.sharded.steps[["rank", "step", "start_ns", "end_ns"]]
        first = pr[pr["rank"] == pr["rank"].min()]
        inst_step = assign_steps(first.assign(start_ns=first["raw_start_ns"]), windows)
        per_step = float(inst_step.isin(steady).sum()) / max(len(steady), 1)
        srt = pr.sort_values(["instance", "start_ns", "rank"], ascending=[True, False, True])
        top2 = srt.groupby("instance", sort=True).head(2)
        g = top2.groupby("instance", sort=True)
        last_rank = g["rank"].first()
        late = (g["start_ns"].first() - g["start_ns"].last()).astype(np.int64)
        counts = last_rank.value_counts()
        cand = int(counts.index[0])
        share = float(counts.iloc[0]) / len(last_rank)
        lat = float(np.median(late[last_rank == cand]))
        base_idle = self.baseline.rank_steps.groupby("step")["idle_ns"].mean().to_numpy(np.float64)
        if per_step <= 0 or not len(base_idle):
            return out
        per_seg = float(np.median(base_idle)) / per_step
        spread = float(np.quantile(base_idle, 0.9) - np.quantile(base_idle, 0.1)) / per_step
        threshold = 3.0 * per_seg + spread
        p_chance = last_share_p_value(int(counts.iloc[0]), len(last_rank), self.n_ranks)
        out.update(
            {
                "rank": cand,
                "last_share": share,
                "last_share_p_value": p_chance,
                "lateness_ns_median": int(round(lat)),
                "threshold_ns": int(round(threshold)),
                "baseline_host_per_interval_ns": int(round(per_seg)),
                "collectives_per_step": per_step,
                "is_straggler": bool(share >= 0.5 and p_chance < STRAGGLER_ALPHA and lat > threshold),
            }
        )
        return out

    def _correction_json(self) -> dict[str, Any]:
        """Each run's correction; where the sharded one is not identified, its ranges of wait, sync
        and idle also as terms (`term_ranges`: less N1/N x the baseline's corrected part)."""
        out = {k: (c.to_json() if c is not None else None) for k, c in self.corrections.items()}
        cs, cb = self.corrections.get("sharded"), self.corrections.get("baseline")
        doc = out.get("sharded")
        if doc is not None and cs is not None and cs.ranges is not None and cb is not None:
            f = Fraction(self.factor)
            base = {
                k: sum((p[k] for p in cb.per_rank.values()), Fraction(0)) / max(len(cb.per_rank), 1)
                for k in ("wait", "sync", "idle")
            }
            doc["term_ranges"] = {
                k: {
                    who: [int(math.floor(lo - f * base[k])), int(math.ceil(hi - f * base[k]))]
                    for who, (lo, hi) in cs.ranges[k].items()
                }
                for k in ("wait", "sync", "idle")
            }
        return out

    def path_cause(self) -> str:
        """`tracekit.analyse.prose.path_cause` (the prose lives there)."""
        return prose.path_cause(self)

    def per_rank_parts(self, rank: int) -> dict[str, Fraction]:
        """Rank `rank`'s own per-token leaf parts (corrected when the attribution is)."""
        return self.rank_parts[rank]

    def diagnosis(self) -> str:
        """`tracekit.analyse.prose.diagnosis` (the prose lives there)."""
        return prose.diagnosis(self)

    def _one_host(self) -> bool:
        """`tracekit.analyse.prose.one_host` (the prose lives there)."""
        return prose.one_host(self)

    def _dilation_clause(self) -> str:
        """`tracekit.analyse.prose.dilation_clause` (the prose lives there)."""
        return prose.dilation_clause(self)

    def _inflated(self) -> bool | None:
        """`tracekit.analyse.prose.inflated` (the prose lives there)."""
        return prose.inflated(self)

    def compute_scaling(self) -> dict[str, Any]:
        """The compute term split by kernel: replicated, shrank N-fold, partly shrank, added,
        removed (`tracekit.analyse.kernel_scaling`), summing to the printed compute term."""
        empty = pd.DataFrame(columns=list(KERNEL_COLUMNS))
        return compute_scaling(
            self.baseline.kernels if self.baseline.kernels is not None else empty,
            self.baseline.steady_steps,
            self.sharded.kernels if self.sharded.kernels is not None else empty,
            self.sharded.steady_steps,
            max(1, round(1 / self.factor)),
            self.corrected.integers()["terms_ns"]["compute"],
        )

    def to_json(self) -> dict[str, Any]:
        ints = self.corrected.integers()
        unc = self.uncorrected.integers()
        s = ints["shortfall_ns"]
        coll = self.sharded.collectives
        d_b, d_s = self.baseline.dilation, self.sharded.dilation
        ad_b, ad_s = self.applied["baseline"], self.applied["sharded"]
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "tracekit.shortfall",
            "n_ranks": self.n_ranks,
            "baseline_ranks": self.baseline.n_ranks,
            "per_token_ns": ints["per_token_ns"],
            "per_token_source": self.per_token_source,
            "per_token_median_ns": {
                "baseline": _median_window(self.baseline, ad_b, self.per_token_source),
                "sharded": _median_window(self.sharded, ad_s, self.per_token_source),
            },
            "shortfall_ns": s,
            "terms_ns": ints["terms_ns"],
            "coordination_ns": ints["coordination_ns"],
            "shares": {k: (v / s if s else None) for k, v in ints["terms_ns"].items()},
            "term_words": {k: v for k, v in self.term_words().items() if k in ints["terms_ns"]},
            "aggregate": "mean over ranks of each rank's parts (each rank's window padded to the step time with idle)",
            "per_rank": _per_rank_json(self.per_rank, self.sharded),
            "critical_path": {
                **self.path_ints(),
                "cause": self.path_cause(),
                "hops_per_step_median": float(
                    self.sharded.critical.per_step.drop_duplicates("step")["hops"].median()
                )
                if len(self.sharded.critical.per_step)
                else 0.0,
                "baseline": self._base_path_ints(),
                "uncorrected": self.path_ints(corrected=False),
            },
            "straggler": self.straggler(),
            "compute_scaling": self.compute_scaling(),
            "spread_ns": self.spread_ns,
            "verdict": self.verdict(),
            "intervals": self.intervals.to_json(),
            "noise": self.noise().to_json(),
            "diagnosis": self._noise_checked_diagnosis(),
            "dilation": {
                "definition": "profiled / unprofiled per-token time, measured by the capture's alternating "
                "rounds (median of per-round ratios; one round: the mean ratio); the corrected per-token time is "
                "the trace's divided by exactly this factor",
                "baseline": ad_b.factor,
                "sharded": ad_s.factor,
                "interval": {
                    "baseline": list(ad_b.interval) if ad_b.interval else None,
                    "sharded": list(ad_s.interval) if ad_s.interval else None,
                },
                "applied": {"baseline": ad_b.to_json(), "sharded": ad_s.to_json()},
                "threshold": d_s.threshold,
                "inflated": self._inflated(),
                "reconciliation": self.reconciliation,
                "correction": self._correction_json(),
                "runs": {"baseline": d_b.to_json(), "sharded": d_s.to_json()},
            },
            "uncorrected": {
                "per_token_ns": unc["per_token_ns"],
                "shortfall_ns": unc["shortfall_ns"],
                "terms_ns": unc["terms_ns"],
                "coordination_ns": unc["coordination_ns"],
                "shares": {
                    k: (v / unc["shortfall_ns"] if unc["shortfall_ns"] else None)
                    for k, v in unc["terms_ns"].items()
                },
                "per_rank": _per_rank_json(self.per_rank_uncorrected, self.sharded),
            },
            "stragglers": coll.stragglers_json(),
            "collectives": _collectives_json(self.sharded),
            "clock": coll.clock.to_json(),
            "steps": {
                "baseline": _steps_json(self.baseline),
                "sharded": _steps_json(self.sharded),
            },
            "data_quality": self.data_quality.to_dict(),
        }
        return doc

    def to_frame(self) -> pd.DataFrame:
        """The attribution of S as a table, from `to_json()` (so the two agree): one row per term
        (`terms_ns`), then the coordination components (`parent` "coordination"); columns `ns`,
        `share` (of S), `p10_ns`, `median_ns`, `p90_ns` (spread over steps), `uncorrected_ns`."""
        doc = self.to_json()
        s = doc["shortfall_ns"]
        spread, unc = doc["spread_ns"], doc["uncorrected"]
        rows = []
        for parent, key in (("", "terms_ns"), ("coordination", "coordination_ns")):
            for term, ns in doc[key].items():
                sp = spread.get(term, {})
                rows.append(
                    {
                        "term": term,
                        "parent": parent,
                        "ns": ns,
                        "share": ns / s if s else None,
                        "p10_ns": sp.get("p10"),
                        "median_ns": sp.get("median"),
                        "p90_ns": sp.get("p90"),
                        "uncorrected_ns": unc[key].get(term),
                    }
                )
        return pd.DataFrame(rows)

    def _base_path_ints(self) -> dict[str, Any]:
        ints = _path_integers(self.base_path)
        return {
            "step_ns": ints["step_ns"],
            "by_rank": {
                r: {k: v for k, v in d.items() if k != "total_ns"} for r, d in ints["by_rank"].items()
            },
        }


def _path_integers(path: Mapping[str, Any]) -> dict[str, Any]:
    """A per-token critical path (by_rank Fractions, offset, step) as integers: by_rank ->
    {<part>_ns, total_ns}, offset_ns, step_ns; the components and the offset are rounded by largest
    remainder to sum to step_ns exactly."""
    total = _round(path["step"])
    flat: dict[str, Fraction] = {"offset": path["offset"]}
    for r, d in path["by_rank"].items():
        for p in PATH_PARTS:
            flat[f"{r}:{p}"] = d[p]
    ints = _round_to_sum(flat, total)
    by_rank = {str(r): {f"{p}_ns": ints[f"{r}:{p}"] for p in PATH_PARTS} for r in sorted(path["by_rank"])}
    for d in by_rank.values():
        d["total_ns"] = sum(d[f"{p}_ns"] for p in PATH_PARTS)
    return {"step_ns": total, "offset_ns": ints["offset"], "by_rank": by_rank}


def _per_rank_json(per_rank: Mapping[int, Attribution], run: RunParts) -> list[dict[str, Any]]:
    out = []
    for r in sorted(per_rank):
        i = per_rank[r].integers()
        pr = run.per_rank[r]
        out.append(
            {
                "rank": int(r),
                "terms_ns": i["terms_ns"],
                "coordination_ns": i["coordination_ns"],
                "own_window_ns": _round(pr["own_window"]),
                "pad_ns": _round(pr["pad"]),
            }
        )
    return out


def _any_true(*xs: bool | None) -> bool | None:
    if all(x is None for x in xs):
        return None
    return any(bool(x) for x in xs)


def _run_sample(run: RunParts, corrected: bool, correction: Any = None) -> RunSample:
    """The bootstrap's view of one run: [steady steps, ranks, parts] and the manifest's rounds;
    with a replay `correction`, its per-step parts on the corrected timeline beside the traced ones."""
    rs = run.rank_steps.sort_values(["step", "rank"])
    steps = sorted(rs["step"].unique())
    ranks = sorted(rs["rank"].unique())
    arr = (
        rs[[f"{p}_ns" for p in LEAF_PARTS]]
        .to_numpy(np.int64)
        .reshape(len(steps), len(ranks), len(LEAF_PARTS))
    )
    u, p = run.dilation.unprofiled, run.dilation.profiled
    return RunSample(
        steps=arr,
        timeline=run.timeline,
        unprofiled=u.rounds if u is not None else (),
        profiled=p.rounds if p is not None else (),
        corrected=corrected,
        pairing=run.pairing,
        replayed=correction.rows if correction is not None and correction.method == "replay" else None,
    )


def _median_window(run: RunParts, ad: AppliedDilation, source: str) -> int:
    """The median step time of the trace, divided by the applied dilation when corrected."""
    med = float(np.median(run.steady["window_ns"].to_numpy()))
    if source == "unprofiled" and ad.factor:
        med /= ad.factor
    return int(round(med))


def _steps_json(run: RunParts) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pattern": run.step_pattern,
        "total": int(len(run.slowest)),
        "steady": int(run.slowest["steady"].sum()),
        "timeline": run.timeline,
        "slowest_rank_counts": {
            str(int(k)): int(v) for k, v in run.steady["rank"].value_counts().sort_index().items()
        },
    }
    if run.token_steps is not None:
        # only where the step names say their kind (serving engines): which steps are tokens
        out["per_token_steps"] = {**run.token_steps.to_json(), "steady": int(run.slowest["steady"].sum())}
        out["kinds"] = run.step_kinds
    return out


def _collectives_json(run: RunParts) -> dict[str, Any]:
    coll = run.collectives
    inst = coll.instances
    pr = coll.per_rank
    steady_steps = set(run.steady["step"].tolist())
    if len(pr):
        min_rank = pr["rank"].min()
        windows = run.steps[["rank", "step", "start_ns", "end_ns"]]
        first = pr[pr["rank"] == min_rank]
        inst_step = pd.Series(assign_steps(first, windows).to_numpy(), index=first["instance"].to_numpy())
        in_steady = int(inst_step.isin(steady_steps).sum())
    else:
        in_steady = 0
    n_steady = max(len(steady_steps), 1)
    by_op = []
    if len(inst):
        src_col = inst["bytes_source"] if "bytes_source" in inst.columns else "unknown"
        inst = inst.assign(bytes_source=src_col)
        pr_i = pr.merge(
            inst[["instance", "op", "size_bytes", "bytes_source", "skew_ns", "busbw_gbps"]],
            on="instance",
            suffixes=("", "_i"),
        )
        for (op, size, src), g in pr_i.groupby(["op_i", "size_bytes", "bytes_source"], sort=True):
            ig = inst[(inst["op"] == op) & (inst["size_bytes"] == size) & (inst["bytes_source"] == src)]
            bw = ig["busbw_gbps"].dropna()
            by_op.append(
                {
                    "op": str(op),
                    "bytes": int(size),
                    "bytes_source": str(src),  # "trace" | "manifest" | "unknown"
                    "count": int(len(ig)),
                    # per instance the wait of the ranks that waited (the last arriver waits 0 by
                    # definition), then the median over instances
                    "wait_ns_median": int(round(float(ig["wait_ns_max"].median()))),
                    "transfer_ns_median": int(round(float(g["transfer_ns"].median()))),
                    "skew_ns_median": int(round(float(ig["skew_ns"].median()))),
                    "busbw_gbps_median": float(bw.median()) if len(bw) else None,
                }
            )
    return {
        "instances": int(len(inst)),
        "per_token": in_steady / n_steady,
        "level": coll.level,
        "match_by": coll.match_by,
        "by_op": by_op,
    }


def _spread(
    base: RunParts, sharded: RunParts, factor: Fraction, shift: Mapping[str, Fraction]
) -> dict[str, dict[str, int]]:
    """p10 / median / p90 over the sharded run's steady steps of each per-step term
    (PN_step - f * mean P1), shifted by the reconciliation (`shift`: corrected - uncorrected mean)."""
    st = sharded.steady
    per_step: dict[str, np.ndarray] = {}
    for p in LEAF_PARTS:
        per_step[p] = st[f"{p}_ns"].to_numpy(np.float64) - float(factor * base.per_token[p])
    groups = {
        "compute": ("compute",),
        "memory": ("memory",),
        "transfer": ("transfer",),
        "coordination": COORDINATION,
        "wait": ("wait",),
        "sync": ("sync",),
        "idle": ("idle",),
        "unknown": ("unknown",),
    }
    out: dict[str, dict[str, int]] = {}
    for name, keys in groups.items():
        vals = sum(per_step[k] for k in keys) + float(sum(shift[k] for k in keys))
        arr = np.asarray(vals, dtype=np.float64)
        out[name] = {
            "p10": int(round(float(np.quantile(arr, 0.1)))),
            "median": int(round(float(np.median(arr)))),
            "p90": int(round(float(np.quantile(arr, 0.9)))),
        }
    shortfall = (
        st["window_ns"].to_numpy(np.float64)
        - float(factor * base.per_token["window"])
        + float(sum(shift[k] for k in LEAF_PARTS))
    )
    out["shortfall"] = {
        "p10": int(round(float(np.quantile(shortfall, 0.1)))),
        "median": int(round(float(np.median(shortfall)))),
        "p90": int(round(float(np.quantile(shortfall, 0.9)))),
    }
    return out


@dataclass(frozen=True)
class AppliedDilation:
    """The dilation a shortfall states and applies (docs/METHOD.md section Dilation: the factor stated is the factor
    applied): D measured by the capture's alternating rounds (`tracekit.analyse.dilation`), and the
    corrected per-token time `target_ns` = traced per-token time (mean step time of the trace's
    steady steps) / D, exactly. `unprofiled_mean_ns` (the unprofiled passes' own mean) is a
    cross-check: it differs from `target_ns` where the host's speed moved between rounds (the
    traced pass ran at one speed; the corrected time is that pass's, not the rounds' average)."""

    factor: float | None
    interval: tuple[float, float] | None
    traced_mean_ns: Fraction
    unprofiled_mean_ns: Fraction | None
    rounds: int
    method: str = ""

    @property
    def target_ns(self) -> Fraction | None:
        if self.factor is None:
            return None
        return self.traced_mean_ns / Fraction(self.factor).limit_denominator(10**9)

    @property
    def drift(self) -> float | None:
        """target / unprofiled mean - 1: how far the traced pass's host speed was from the rounds'."""
        t = self.target_ns
        if t is None or not self.unprofiled_mean_ns:
            return None
        return float(t / self.unprofiled_mean_ns) - 1.0

    def to_json(self) -> dict[str, Any]:
        t = self.target_ns
        return {
            "factor": self.factor,
            "interval": list(self.interval) if self.interval else None,
            "method": self.method,
            "traced_mean_ns": _round(self.traced_mean_ns),
            "corrected_mean_ns": _round(t) if t is not None else None,
            "unprofiled_mean_ns": _round(self.unprofiled_mean_ns)
            if self.unprofiled_mean_ns is not None
            else None,
            "drift": self.drift,
            "unprofiled_rounds": self.rounds,
        }


def applied_dilation(run: RunParts) -> AppliedDilation:
    """The dilation the correction of `run` states and applies (see AppliedDilation): the run's
    measured dilation D (`tracekit.analyse.dilation.dilation_statistic`: the median of per-round
    profiled/unprofiled ratios, or the pooled mean ratio with one round) with its interval. The
    corrected per-token time is the traced one divided by exactly D (`target_ns`)."""
    traced = run.per_token["window"]
    d = run.dilation
    u = d.unprofiled
    if d.dilation is None or u is None or u.n == 0 or d.dilation <= 0:
        return AppliedDilation(None, None, traced, u.mean_ns if u is not None and u.n else None, 0)
    return AppliedDilation(d.dilation, d.interval, traced, u.mean_ns, len(u.rounds), d.method)


def _leaf_with_window(parts: Mapping[str, Fraction]) -> dict[str, Fraction]:
    out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
    out["window"] = sum((out[p] for p in LEAF_PARTS), Fraction(0))
    return out


def shortfall_from_parts(base: RunParts, sharded: RunParts) -> Shortfall:
    """The attribution from two attributed runs (see `shortfall`)."""
    n = sharded.n_ranks
    if base.n_ranks > n:
        raise RankError(
            f"the baseline has {base.n_ranks} ranks and the sharded run {n}: the baseline must be the "
            "run on fewer ranks (TP=1); were --baseline and --sharded swapped?"
        )
    if n > 1 and sharded.timeline == "gpu" and sharded.collectives.n_instances == 0:
        raise MatchError(
            f"the sharded run has {n} ranks on the GPU timeline but no collectives "
            "(kernels missing from the trace?): the wait and transfer between ranks cannot be attributed"
        )
    factor = Fraction(base.n_ranks, n)
    dq = DataQuality()
    dq.merge(base.data_quality).merge(sharded.data_quality)
    tb_, ts_ = base.token_steps, sharded.token_steps
    if (tb_ is None) != (ts_ is None) or (tb_ and ts_ and (tb_.kind, tb_.batch) != (ts_.kind, ts_.batch)):

        def words(t: TokenSteps | None) -> str:
            return "every step" if t is None else f"{t.kind or 'every'} steps of batch size {t.batch}"

        dq.add(
            "per_token_steps_differ",
            1,
            f"the baseline's per-token steps are {words(tb_)}, the sharded run's {words(ts_)}: T1 and TN are "
            "not like with like (capture both at one batch size; docs/METHOD.md, Serving engines)",
        )
    uncorrected = attribute(base.per_token, sharded.per_token, factor)
    ad_b, ad_s = applied_dilation(base), applied_dilation(sharded)

    ub, us = base.dilation.unprofiled, sharded.dilation.unprofiled
    # a profiler cannot make a run faster: a traced pass clearly faster than the unprofiled one
    # means the two ran under different conditions (a noisy host), and the unprofiled figure is
    # then no better a per-token time than the traced one
    threshold = sharded.dilation.threshold
    faster = [
        (lbl, ad.factor)
        for lbl, ad in (("baseline", ad_b), ("sharded", ad_s))
        if ad.factor is not None and ad.factor < 1.0 / (1.0 + threshold)
    ]
    if faster:
        dq.add(
            "unprofiled_slower_than_profiled",
            len(faster),
            "the unprofiled pass was slower than the traced one ("
            + ", ".join(f"{lbl} dilation {d:.2f}x" for lbl, d in faster)
            + "): the host was noisy; the attribution is not corrected",
        )
    per_rank_c: dict[int, dict[str, Fraction]]
    tb, ts = ad_b.target_ns, ad_s.target_ns
    if tb is not None and ts is not None and not faster:
        for lbl, ad in (("baseline", ad_b), ("sharded", ad_s)):
            if ad.drift is not None and abs(ad.drift) > threshold:
                dq.add(
                    "host_drift_between_rounds",
                    1,
                    f"{lbl}: the traced pass with the profiler's factor removed is {ad.drift:+.0%} off the mean of "
                    "the unprofiled rounds: the host's speed moved between rounds; the corrected per-token time is "
                    "the traced pass's",
                )
        from tracekit.analyse.correction import correct_run

        corr_b, corr_s = correct_run(base, tb), correct_run(sharded, ts)
        corrections: dict[str, Any] = {"baseline": corr_b, "sharded": corr_s}
        pb = mean_over_ranks({r: _leaf_with_window(v) for r, v in corr_b.per_rank.items()})
        per_rank_c = {r: _leaf_with_window(v) for r, v in corr_s.per_rank.items()}
        ps = mean_over_ranks(per_rank_c)
        corrected = attribute(pb, ps, factor)
        source = "unprofiled"
        reconciliation = (
            f"T1 and TN are the traced per-token times with the measured dilation removed (traced / D: the "
            f"unprofiled-equivalent of the traced pass); each rank's traced parts were corrected to them, then "
            f"averaged over ranks; baseline: {corr_b.sentence}; sharded (rank "
            f"{min(corr_s.per_rank)}): {corr_s.sentence}."
        )
        for lbl, c in corrections.items():
            why = "; ".join(c.notes)
            if c.method == "replay":
                dq.add(
                    "profiler_correction_replay",
                    0,
                    f"{lbl}: the profiler's cost per call ({c.cost_source}) was removed call by call in the "
                    "replay of the dependency graph; wait, sync and idle are read from the corrected timeline"
                    + (f" ({why})" if why else ""),
                )
            else:
                dq.add(
                    "profiler_correction_proportional",
                    1,
                    f"{lbl}: the profiler's excess was taken out of wait, sync and idle in proportion ({why}); "
                    "where the profiler changed which rank arrives last, wait and idle are not corrected",
                )
        shift = {p: ps[p] - sharded.per_token[p] for p in LEAF_PARTS}
        # the baseline's reconciliation moves every sharded per-step term by the same amount
        for p in LEAF_PARTS:
            shift[p] -= factor * (pb[p] - base.per_token[p])
        path = corr_s.path
        base_path = corr_b.path
    else:
        corrections = {"baseline": None, "sharded": None}
        corrected = uncorrected
        per_rank_c = {r: _leaf_with_window(p) for r, p in sharded.per_rank.items()}
        pb = base.per_token
        source = "trace"
        missing = [lbl for lbl, t in (("baseline", ub), ("sharded", us)) if t is None]
        if missing:
            reconciliation = (
                f"not corrected: no unprofiled per-token times for the {' and '.join(missing)} run "
                "(capture with `tracekit capture`); T1, TN and the parts are the traced ones"
            )
            dq.add(
                "dilation_unknown",
                1,
                "per-token times come from the trace; the profiler's dilation is not removed",
            )
        else:
            reconciliation = (
                "not corrected: the unprofiled pass was slower than the traced one (a noisy host), so it is no "
                "better a per-token time than the trace; T1, TN and the parts are the traced ones"
            )
        shift = {p: Fraction(0) for p in LEAF_PARTS}
        path = dict(sharded.path_token)
        base_path = dict(base.path_token)
    spread = _spread(base, sharded, factor, shift)
    per_rank_att = {r: attribute(pb, p, factor) for r, p in per_rank_c.items()}
    per_rank_unc = {
        r: attribute(base.per_token, _leaf_with_window(p), factor) for r, p in sharded.per_rank.items()
    }
    return Shortfall(
        n_ranks=n,
        baseline=base,
        sharded=sharded,
        factor=factor,
        corrected=corrected,
        uncorrected=uncorrected,
        per_token_source=source,
        reconciliation=reconciliation,
        spread_ns=spread,
        data_quality=dq,
        per_rank=per_rank_att,
        per_rank_uncorrected=per_rank_unc,
        path=path,
        path_uncorrected=dict(sharded.path_token),
        base_path=base_path,
        applied={"baseline": ad_b, "sharded": ad_s},
        rank_parts=per_rank_c,
        corrections=corrections,
    )


def shortfall(
    baseline: Run | AnalysedRun,
    sharded: Run | AnalysedRun,
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float = DEFAULT_THRESHOLD,
    allow_partial: bool = False,
) -> Shortfall:
    """Attribute the per-token shortfall of `sharded` against `baseline` (module doc)."""
    baseline, sharded = AnalysedRun.of(baseline), AnalysedRun.of(sharded)  # each classified once
    # a rank file missing is the real problem of a pair that looks wrong because of it: said first
    check_ranks(baseline.run, "baseline")
    check_ranks(sharded.run, "sharded")
    pair_notes = check_pair(baseline.run, sharded.run)
    base = attribute_run(
        baseline,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        label="baseline",
        allow_partial=allow_partial,
    )
    shard = attribute_run(
        sharded,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        label="sharded",
        allow_partial=allow_partial,
    )
    return shortfall_of_pair(base, shard, pair_notes)


def shortfall_of_pair(base: RunParts, shard: RunParts, pair_notes: list[tuple[str, str]]) -> Shortfall:
    """The attribution of two attributed runs with `check_pair`'s notes (made before the runs
    were attributed: its refusals come first) on the baseline's data quality; `shortfall`'s tail,
    and the Dask engine's."""
    for key, note in pair_notes:
        base.data_quality.add(key, 1, note)
    return shortfall_from_parts(base, shard)


#: workload fields that must agree between the baseline and the sharded run for S to mean anything
WORKLOAD_SHAPE_FIELDS = ("preset", "shape", "layers", "batch", "prompt", "dtype", "device")


def check_pair(baseline: Run, sharded: Run) -> list[tuple[str, str]]:
    """RankError when the two runs read the same trace files (the sharded run as its own baseline)
    or have as many ranks (no smaller baseline); notes when their manifests describe different
    workloads (shape, batch, prompt, dtype, device: the shortfall would compare two models)."""
    same = {os.path.realpath(s) for s in baseline.sources.values() if os.path.isfile(s)} & {
        os.path.realpath(s) for s in sharded.sources.values() if os.path.isfile(s)
    }
    if same:
        names = ", ".join(sorted(os.path.basename(s) for s in same)[:4])
        raise RankError(
            f"the baseline and the sharded run read the same trace file(s) ({names}): pass the run on "
            "fewer ranks (TP=1) as --baseline"
        )
    if len(baseline.ranks) == len(sharded.ranks):
        raise RankError(
            f"the baseline and the sharded run both have {len(sharded.ranks)} rank(s): the baseline must be "
            "the run on fewer ranks (TP=1)"
        )
    wb = (baseline.manifest or {}).get("workload")
    ws = (sharded.manifest or {}).get("workload")
    if not isinstance(wb, Mapping) or not isinstance(ws, Mapping):
        return []
    differ = [k for k in WORKLOAD_SHAPE_FIELDS if k in wb and k in ws and wb[k] != ws[k]]
    if not differ:
        return []
    shown = "; ".join(f"{k} {str(wb[k])[:60]} vs {str(ws[k])[:60]}" for k in differ)
    return [
        (
            "baseline_workload_differs",
            f"the baseline's manifest describes another workload than the sharded run's ({shown}): the "
            "shortfall compares two different decodes",
        )
    ]
