"""The profiler correction through the replay, one cost (docs/METHOD.md section Noise and the profiler
correction; `correction.correct_run` adds the identifiability check of a solved cost).

The proportional rule (`reconcile.reconcile`) takes the profiler's excess out of wait, sync and
idle in proportion. When the profiler's cost changes which rank arrives last at a collective, the
trace's wait and idle are the wrong way round (real wait has become idle on one rank and the other
rank's idle wait), and no rescaling of the totals brings them back. Here the profiler's cost is
removed call by call from the run's dependency graph (`tracekit.analyse.path`): the replay's
correction (`retime.calibrate.calibrate`: the manifest's `profiler_calibration`, else the one cost solved so
that the unchanged replay's mean is the unprofiled per-token time), and the graph re-timed with
the corrected latencies gives a corrected timeline, every node at the time it would have had
without the profiler. Each rank's parts are read from it, window by window, with the partition's
priority (compute > memory > collective > unknown > sync > idle; a collective's time before its
last rank arrived is wait, after it transfer): the corrected parts of a (rank, step) are its
measured parts plus what the corrected timeline changes in the graph's own reading of them, so a
correction of nothing changes nothing. The critical path is walked on the corrected timeline too.

The replayed per-token time is close to the corrected per-token time the accounting states (traced
/ D) but not equal (the solved cost matches the replay's period, a calibration is measured apart);
the small rest is idle when the replay is short of it (time it does not place; the device's parts
stay as read) and comes out of wait, sync and idle in proportion when it is over, so every rank's
parts still sum to the stated per-token time exactly, and the sentence says how large it was.

A run without its graph (a RunParts built elsewhere) or whose replay cannot be corrected (no cost
reaches the unprofiled time, a device-bound run whose device times were scaled) keeps the
proportional rule, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from tracekit.analyse.attribution.reconcile import reconcile, reconcile_path
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.intervals import covered_before, union
from tracekit.analyse.path.critical_path import path_of
from tracekit.analyse.path.forward import key_lookup
from tracekit.analyse.path.graph import Graph
from tracekit.analyse.path.rank_forward import retimed_times
from tracekit.analyse.path.roles import (
    K_COMPUTE,
    K_MEMORY,
    K_TRANSFER,
    K_UNKNOWN,
    ROLE_ARRIVE,
    ROLE_OP,
    ROLE_SYNC,
    ROLE_WORK,
    ROLE_XFER,
)
from tracekit.analyse.path.walk import PathWalk, walk_path
from tracekit.analyse.retime.calibrate import ProfilerCalibration, calibrate
from tracekit.analyse.retime.model import RunModel
from tracekit.model.parts import LEAF_PARTS

#: JSON / data_quality names of the two methods
REPLAY = "replay"
PROPORTIONAL = "proportional"


@dataclass
class Correction:
    """One run's parts corrected to `target` (its corrected per-token time).

    `per_rank`: rank -> LEAF_PARTS (Fractions) summing to `target` exactly; `path`: the per-token
    critical path ({"by_rank", "offset", "step"}) summing to `target`; `method`: REPLAY or
    PROPORTIONAL; `sentence`: what was done (rank-level), `notes`: why the replay was not used."""

    per_rank: dict[int, dict[str, Fraction]]
    path: dict[str, Any]
    method: str
    sentence: str
    cost_source: str | None = None  # the replay's: "manifest calibration" or "solved"
    per_call_ns: float | None = None
    per_collective_ns: float | None = None
    host_scale: float | None = None  # a host timeline's solved factor on host time (no per-call cost)
    replayed_ns: Fraction | None = None  # the corrected timeline's mean step time
    notes: list[str] = field(default_factory=list)
    #: [steady steps, ranks (sorted), LEAF_PARTS]: each (rank, step)'s parts on the corrected
    #: timeline (before the rest is reconciled): what the bootstrap resamples
    rows: np.ndarray | None = None
    #: False where a solved cost (no calibration) on several ranks cannot say which rank paid it
    #: and the corrected figures depend on that (`correction.identify`); then `ranges` holds what they can be
    identified: bool = True
    #: {"wait"|"sync"|"idle": {rank or "mean": [lo, hi]}, "path_<part>": {rank: [lo, hi]}} per token
    #: (ns, parts before the baseline's are subtracted), over the one cost on every rank and the cost
    #: on each rank alone at both ends of the interval that gives the unprofiled time
    ranges: dict[str, dict[str, list[int]]] | None = None
    #: where not identified: each rank's interval of costs per call that alone give the unprofiled
    #: time, (rank, lo, hi) ns (the what-if reads its predictions over the same splits)
    intervals: list[tuple[int, float, float]] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method}
        if self.method == REPLAY:
            out["cost_source"] = self.cost_source
            if self.per_call_ns is not None:
                out["per_call_ns"] = round(float(self.per_call_ns), 1)
            if self.per_collective_ns:
                out["per_collective_ns"] = round(float(self.per_collective_ns), 1)
            if self.host_scale is not None:
                out["host_scale"] = self.host_scale
            out["replayed_ns"] = int(round(self.replayed_ns)) if self.replayed_ns is not None else None
        if not self.identified:
            out["identified"] = False
            if self.ranges is not None:
                out["ranges"] = {k: {r: list(v) for r, v in d.items()} for k, d in self.ranges.items()}
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def proportional(run: RunParts, target: Fraction, notes: list[str]) -> Correction:
    """`run` corrected by the proportional rule (`reconcile.reconcile`, `reconcile.reconcile_path`)."""
    per_rank = {}
    sentence = ""
    for r, p in run.per_rank.items():
        per_rank[r], s = reconcile(p, target, run.timeline)
        if not sentence:
            sentence = s
    return Correction(
        per_rank, reconcile_path(run.path_token, target, run.timeline), PROPORTIONAL, sentence, notes=notes
    )


@dataclass(frozen=True)
class IdentifyJob:
    """What the identifiability check of a solved cost (`correction.identify`) needs besides the run and its
    graph: the corrected per-token time, the cost per call solved for every rank, the graph's
    ranks. Its per-rank work (`identify_ends`, `identify_between`) is independent rank by rank:
    a plan runs it as one task per rank (`plans.Fan`)."""

    target: Fraction
    cost_ns: float
    ranks: tuple[int, ...]


def run_model(run: RunParts, target: Fraction) -> RunModel:
    """The replay model `correct_first` corrects `run` with (its steady steps but the first), before
    any calibration."""
    steady = run.steady_steps
    used = list(steady[1:]) if len(steady) > 1 else list(steady)
    g = run.graph
    assert g is not None
    return RunModel(
        label="run",
        n_ranks=len(run.ranks),
        ranks=list(g.ranks),
        timeline="gpu",
        steps=used,
        graph=g,
        measured_ns=np.zeros(len(used), dtype=np.int64),
        compute_per_token={},
        target_ns=target,
        calibration=run.profiler_calibration,
    )


def calibrated_latencies(
    calibration: ProfilerCalibration, ranks: list[int], n_ranks: int, g: Graph
) -> np.ndarray:
    """The edge latencies of `g` (the run's graph or a rank's share of it, `rank_forward`) with a
    manifest calibration's cost removed, as `correct_first`'s model of the run gives them: each
    edge's from its own rank's edges alone (`RunModel.latencies`), so the same on a rank's share."""
    model = RunModel(
        label="run",
        n_ranks=n_ranks,
        ranks=list(ranks),
        timeline="gpu",
        steps=[],
        graph=g,
        measured_ns=np.zeros(0, dtype=np.int64),
        compute_per_token={},
        target_ns=None,
        calibration=calibration,
    )
    calibrate(model)
    return model.latencies(model.corrected())


@dataclass
class Corrected:
    """The corrected timeline's readings that need no target (`read_corrected`): the latencies,
    the node times, the graph's parts of every window (`graph_parts`) and the walk on it, and
    what the latencies were made from (`calibrated_latencies`' calibration, ranks and rank count)."""

    lat: np.ndarray
    t: np.ndarray
    parts: dict[str, np.ndarray]
    walk: PathWalk
    made_of: tuple[ProfilerCalibration, list[int], int] | None = None


def read_corrected(g: Graph, calibration: ProfilerCalibration, ranks: list[int], n_ranks: int) -> None:
    """`correct_first`'s work on the corrected timeline that its target does not change, done
    ahead where the graph is (the plan's graph Reduce, beside the path's walk): the graph
    re-timed at the calibration's latencies (where the ranks re-timed it, `rank_forward`, their
    times), each window's parts and the walk on it; kept on the graph, where `correct_first`
    takes them if its own latencies are these (its model's, when they were made from its
    calibration, ranks and rank count: `calibrated_latencies` is `run_model`'s at a calibration)."""
    lat = calibrated_latencies(calibration, ranks, n_ranks, g)
    t = retimed_times(g, lat)
    made_of = (calibration, list(ranks), n_ranks)
    g.__dict__["_corrected"] = Corrected(lat, t, graph_parts(g, t), walk_path(g, t, lat), made_of)


def correct_first(
    run: RunParts, target: Fraction, rank_cost: Mapping[int, float] | None = None
) -> tuple[Correction, IdentifyJob | None]:
    """`correction.correct_run` without the identifiability check of a solved cost: the Correction and, where
    that check applies (a cost solved on several ranks), its `IdentifyJob` (else None); the check
    is `identify_ends` per rank, `identify_between` per rank where the ends spread
    (`identify_spread`), then `identify_finish` on the Correction."""
    g = run.graph
    if g is None:
        return proportional(run, target, ["the run's dependency graph is not at hand"]), None
    steady = run.steady_steps
    pos = {s: i for i, s in enumerate(g.steps)}
    if any(s not in pos for s in steady) or not steady:
        return proportional(run, target, ["the dependency graph does not hold every steady step"]), None
    if run.timeline != "gpu":
        # a CPU-only run's host ops are dilated like its gaps: one factor on host time, which the
        # proportional rule already is (the replay's host correction is that same factor)
        return (
            proportional(run, target, ["a host timeline: every host-executed part scaled by one factor"]),
            None,
        )
    timeline = "gpu"
    # the first steady step's replay depends on what the trace holds before it (a rank whose earlier
    # window is missing starts its graph there): it is corrected by the other steps' mean correction
    used = list(steady[1:]) if len(steady) > 1 else list(steady)
    model = run_model(run, target)
    if rank_cost is None:
        calibrate(model)
    else:
        model.rank_deduct = {int(r): (float(c), 0.0) for r, c in rank_cost.items()}
        model.host_deduct = max(model.rank_deduct.values())[0]
        model.correction = "solved"
    if model.correction == "none" or model.device_scale != 1.0:
        why = (
            "the replay cannot reach the corrected per-token time by removing host time"
            if model.correction == "none"
            else "the device sets this run's time (the correction scales device times, not calls)"
        )
        return proportional(run, target, [why]), None
    pre = g.__dict__.get("_corrected")
    if (
        rank_cost is None
        and isinstance(pre, Corrected)
        and model.correction == "manifest calibration"
        and pre.made_of == (run.profiler_calibration, list(g.ranks), len(run.ranks))
    ):
        lat = pre.lat  # this model's latencies, made ahead (`calibrated_latencies`)
    else:
        lat = model.latencies(model.corrected())
    if isinstance(pre, Corrected) and np.array_equal(pre.lat, lat):  # read ahead (`read_corrected`)
        t_c, corr, walk = pre.t, pre.parts, pre.walk
    else:
        # the ranks' own re-timing (`rank_forward`, on Dask) where it is this pass' fixpoint, else the pass
        t_c = retimed_times(g, lat)
        corr, walk = graph_parts(g, t_c), walk_path(g, t_c, lat)
    meas = measured_parts(g)
    k_idx = np.asarray([pos[s] for s in steady], dtype=np.int64)
    r_idx = {r: i for i, r in enumerate(g.ranks)}
    ranks = sorted(run.ranks)
    missing = [r for r in ranks if r not in r_idx]
    if missing:
        return proportional(run, target, [f"rank(s) {missing} are not in the dependency graph"]), None
    rs = run.rank_steps.sort_values(["step", "rank"])
    cols = [f"{p}_ns" for p in LEAF_PARTS]
    acc = rs[cols].to_numpy(np.int64).reshape(len(steady), len(ranks), len(LEAF_PARTS))
    gi = np.asarray([r_idx[r] for r in ranks], dtype=np.int64)

    def at(parts: dict[str, np.ndarray]) -> np.ndarray:  # [steps, ranks, LEAF_PARTS]
        return np.stack([parts[p][np.ix_(gi, k_idx)].T for p in LEAF_PARTS], axis=-1)

    c_arr = at(corr)
    rows = acc + c_arr - at(meas)
    bad = (rows < 0).any(axis=-1)  # the graph reads this window otherwise than the partition
    rows[bad] = c_arr[bad]
    first = len(steady) - len(used)  # 1: the first steady step takes the others' mean correction
    replaced = int(bad[first:].sum())
    n, n_used = len(steady), len(used)
    delta = (rows[first:] - acc[first:]).sum(axis=0)  # [ranks, parts]: the used steps' correction
    per_rank = {
        r: {
            p: (
                Fraction(int(rows[first:, j, q].sum()) + int(acc[:first, j, q].sum()))
                + Fraction(int(delta[j, q]) * first, n_used)
            )
            / n
            for q, p in enumerate(LEAF_PARTS)
        }
        for j, r in enumerate(ranks)
    }
    rows_f = rows.astype(np.float64)
    if first:
        rows_f[0] = acc[0] + delta / n_used
    replayed = sum(per_rank[ranks[0]].values(), Fraction(0))
    cp = path_of(walk.rows, walk.segments, list(g.ranks), run.critical.timeline)
    path = cp.per_token(list(steady))
    if first:  # the first steady step: its measured path moved by the other steps' mean correction
        c_u, m_u = cp.per_token(used), run.critical.per_token(used)
        m_f = run.critical.per_token(list(steady[:first]))

        def mix(c: Fraction, m: Fraction, f: Fraction) -> Fraction:
            return (c * n_used + f + (c - m)) / n

        path = {
            "by_rank": {
                r: {k: mix(v, m_u["by_rank"][r][k], m_f["by_rank"][r][k]) for k, v in d.items()}
                for r, d in c_u["by_rank"].items()
            },
            "offset": mix(c_u["offset"], m_u["offset"], m_f["offset"]),
            "step": mix(c_u["step"], m_u["step"], m_f["step"]),
        }
    # the small rest between the replayed and the stated per-token time: the proportional rule
    out = {r: rest_to_target(p, target, run.timeline) for r, p in per_rank.items()}
    path = reconcile_path(path, target, run.timeline)
    rest = float((target - replayed) / target) if target else 0.0
    what = (
        f"{model.host_deduct:.0f} ns per runtime call"
        + (f" and {model.deduct_collective:.0f} ns per collective launch" if model.deduct_collective else "")
        if timeline == "gpu"
        else (
            f"{model.host_deduct:.0f} ns per host op"
            if model.correction == "manifest calibration"
            else f"host time scaled by {model.host_scale:.4f}"
        )
    )
    src = "the manifest's profiler_calibration" if model.correction == "manifest calibration" else "solved"
    how = "removed call by call" if model.host_scale == 1.0 else "removed"
    sentence = (
        f"the profiler's cost ({what}, {src}) was {how} in the replay of the dependency "
        f"graph and every rank's parts read from the corrected timeline ({float(replayed) / 1e6:.4f} ms per "
        f"token); the {rest:+.2%} left to the corrected per-token time is idle (when short) or came out of wait, "
        "sync and idle in proportion (when over)"
    )
    notes = [f"{replaced} (rank, step) window(s) read from the corrected timeline alone"] if replaced else []
    corr_out = Correction(
        out,
        path,
        REPLAY,
        sentence,
        cost_source=model.correction,
        per_call_ns=model.host_deduct if model.host_scale == 1.0 else None,
        per_collective_ns=model.deduct_collective,
        host_scale=model.host_scale if model.host_scale != 1.0 else None,
        replayed_ns=replayed,
        notes=notes,
        rows=rows_f,
    )
    if rank_cost is None and model.correction == "solved" and len(g.ranks) > 1 and model.host_deduct > 0:
        return corr_out, IdentifyJob(target, float(model.host_deduct), tuple(int(r) for r in g.ranks))
    return corr_out, None


def rest_to_target(parts: Mapping[str, Fraction], target: Fraction, timeline: str) -> dict[str, Fraction]:
    """The corrected timeline's parts brought to `target` exactly: time it leaves unexplained (its
    step time short of the target) is idle, the device's parts stay as read; an excess comes out of
    wait, sync and idle in proportion (`reconcile.reconcile`)."""
    total = sum((parts[p] for p in LEAF_PARTS), Fraction(0))
    if total <= target:
        out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
        out["idle"] += target - total
        return out
    return reconcile(parts, target, timeline)[0]


def measured_parts(g: Graph) -> dict[str, np.ndarray]:
    """`graph_parts` at the graph's measured times, kept on the graph (the same for every
    correction of it; a plan computes it beside the path's walk and hands it over)."""
    meas = g.__dict__.get("_measured_parts")
    if meas is None:
        meas = g.__dict__["_measured_parts"] = graph_parts(g, g.t)
    return meas


def prepare_graph(g: Graph) -> None:
    """The graph-only work of `correct_first`'s replay done ahead (a plan does it where the
    graph is assembled, beside the path's walk): the one-column forward pass's structure and the
    windows' end index, kept on the graph."""
    g.prepare_forward(1)
    g.windows(g.t)


def graph_parts(g: Graph, t: np.ndarray) -> dict[str, np.ndarray]:
    """Per [rank_i, step_i] of `g`, the leaf parts of each window at node times `t`, with the
    partition's priority (compute > memory > collective > unknown > sync > idle; an exposed
    collective's time after its instance's rendezvous is transfer, before it wait), each rank's
    window padded with idle to the step's longest: every row sums to the step time."""
    ws, we = g.windows(t)
    n_r, n_k = ws.shape
    out = {p: np.zeros((n_r, n_k), dtype=np.int64) for p in LEAF_PARTS}
    step = (we - ws).max(axis=0) if n_r else np.zeros(n_k, dtype=np.int64)
    src, dst = g.src, g.dst
    # each rank's edges once (in edge order), not a mask over every edge per rank: the loop is
    # linear in the graph, not in ranks x edges
    by_rank = np.argsort(g.erank, kind="stable")
    er_sorted = g.erank[by_rank]
    for i, r in enumerate(g.ranks):
        a, b = ws[i], we[i]
        ab = np.concatenate((b, a))  # `covered` of a union in the windows: covered before b - before a

        def covered(us: np.ndarray, ue: np.ndarray, ab: np.ndarray = ab) -> np.ndarray:
            c = covered_before(us, ue, ab)
            return c[:n_k] - c[n_k:]

        e = by_rank[np.searchsorted(er_sorted, r, "left") : np.searchsorted(er_sorted, r, "right")]
        role, kind = g.role[e], g.kind[e]
        work = (role == ROLE_OP) | (role == ROLE_WORK)
        xf = e[role == ROLE_XFER]
        ar = e[role == ROLE_ARRIVE]
        cb = _arrival_of(dst[ar], src[ar], src[xf])
        c_s, c_e, rv = t[cb], t[dst[xf]], t[src[xf]]

        def iv(mask: np.ndarray, e: np.ndarray = e) -> tuple[np.ndarray, np.ndarray]:
            sel = e[mask]
            return t[src[sel]], t[dst[sel]]

        un_coll = iv(work & (kind == K_TRANSFER))  # a collective the matching did not cover
        # the layers in priority order; each layer's union is the previous layer's with its own
        # pieces (a union is one sorted set of disjoint intervals, whatever it was made from)
        pieces: list[tuple[np.ndarray, np.ndarray]] = [
            iv(work & (kind == K_COMPUTE)),
            iv(work & (kind == K_MEMORY)),
            (np.concatenate((c_s, un_coll[0])), np.concatenate((c_e, un_coll[1]))),
            iv(work & (kind == K_UNKNOWN)),
            iv(role == ROLE_SYNC),  # a host timeline's host work's sync pieces are edges of the chain too
        ]
        layers = []
        unions = []
        us, ue = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        for s_, e_ in pieces:
            us, ue = union(np.concatenate((us, s_)), np.concatenate((ue, e_)))
            unions.append((us, ue))
            layers.append(covered(us, ue))
        compute, mem_c, coll_c, unk_c, sync_c = layers
        hs, he = unions[1]
        ts_, te_ = np.maximum(c_s, rv), c_e
        xs, xe = union(np.concatenate((hs, ts_)), np.concatenate((he, te_)))
        transfer = covered(xs, xe) - mem_c
        out["compute"][i] = compute
        out["memory"][i] = mem_c - compute
        out["transfer"][i] = transfer
        out["wait"][i] = coll_c - mem_c - transfer
        out["unknown"][i] = unk_c - coll_c
        out["sync"][i] = sync_c - unk_c
        out["idle"][i] = (b - a) - sync_c + (step - (b - a))
    return out


def _arrival_of(rv_of: np.ndarray, arrival: np.ndarray, rv: np.ndarray) -> np.ndarray:
    """Per rendezvous node in `rv`, the arrival node whose edge into it (`arrival` -> `rv_of`)
    comes last (the rendezvous itself where none does)."""
    ok, last = key_lookup(rv_of, arrival, rv, last=True)
    out = rv.astype(np.int64, copy=True)
    out[ok] = last
    return out


def correction_doc(corrections: Mapping[str, Correction | None]) -> dict[str, Any]:
    """JSON `dilation.correction`: per run label, its Correction's JSON (None: not corrected)."""
    return {k: (c.to_json() if c is not None else None) for k, c in corrections.items()}
