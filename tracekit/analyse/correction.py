"""The profiler correction through the replay (docs/METHOD.md section Noise and the profiler correction).

The proportional rule (`shortfall.reconcile`) takes the profiler's excess out of wait, sync and
idle in proportion. When the profiler's cost changes which rank arrives last at a collective, the
trace's wait and idle are the wrong way round (real wait has become idle on one rank and the other
rank's idle wait), and no rescaling of the totals brings them back. Here the profiler's cost is
removed call by call from the run's dependency graph (`tracekit.analyse.graph`): the replay's
correction (`replay.calibrate`: the manifest's `profiler_calibration`, else the one cost solved so
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
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.analyse import graph as G

if TYPE_CHECKING:
    from tracekit.analyse.attribution.run import RunParts

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
    #: and the corrected figures depend on that (`_identify`); then `ranges` holds what they can be
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


def correct_run(run: RunParts, target: Fraction) -> Correction:
    """`run`'s per-rank parts and critical path corrected to `target` (module doc); cached on the
    run per target (the shortfall, the what-if and diff ask for the same one)."""
    cache: dict[Fraction, Correction] = run.__dict__.setdefault("_corrections", {})
    if target not in cache:
        cache[target] = _correct(run, target)
    return cache[target]


def _proportional(run: RunParts, target: Fraction, notes: list[str]) -> Correction:
    from tracekit.analyse.attribution.reconcile import reconcile, reconcile_path

    per_rank = {}
    sentence = ""
    for r, p in run.per_rank.items():
        per_rank[r], s = reconcile(p, target, run.timeline)
        if not sentence:
            sentence = s
    return Correction(
        per_rank, reconcile_path(run.path_token, target, run.timeline), PROPORTIONAL, sentence, notes=notes
    )


def _correct(run: RunParts, target: Fraction, rank_cost: Mapping[int, float] | None = None) -> Correction:
    """The correction through the replay; `rank_cost`: a cost per runtime call for each rank
    instead of the calibration or the solved one (`_identify`'s allocations)."""
    corr, job = correct_first(run, target, rank_cost)
    if job is not None:
        _identify(run, job, corr)
    return corr


@dataclass(frozen=True)
class IdentifyJob:
    """What the identifiability check of a solved cost (`_identify`) needs besides the run and its
    graph: the corrected per-token time, the cost per call solved for every rank, the graph's
    ranks. Its per-rank work (`identify_ends`, `identify_between`) is independent rank by rank:
    a plan runs it as one task per rank (`plans.Fan`)."""

    target: Fraction
    cost_ns: float
    ranks: tuple[int, ...]


def _run_model(run: RunParts, target: Fraction) -> Any:
    """The replay model `_correct` corrects `run` with (its steady steps but the first), before
    any calibration."""
    from tracekit.analyse.replay import RunModel

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


def correct_first(
    run: RunParts, target: Fraction, rank_cost: Mapping[int, float] | None = None
) -> tuple[Correction, IdentifyJob | None]:
    """`_correct` without the identifiability check of a solved cost: the Correction and, where
    that check applies (a cost solved on several ranks), its `IdentifyJob` (else None); the check
    is `identify_ends` per rank, `identify_between` per rank where the ends spread
    (`identify_spread`), then `identify_finish` on the Correction."""
    from tracekit.analyse.attribution.reconcile import reconcile_path
    from tracekit.analyse.critical_path import path_of
    from tracekit.analyse.replay import calibrate, setting_for
    from tracekit.model.parts import LEAF_PARTS

    g = run.graph
    if g is None:
        return _proportional(run, target, ["the run's dependency graph is not at hand"]), None
    steady = run.steady_steps
    pos = {s: i for i, s in enumerate(g.steps)}
    if any(s not in pos for s in steady) or not steady:
        return _proportional(run, target, ["the dependency graph does not hold every steady step"]), None
    if run.timeline != "gpu":
        # a CPU-only run's host ops are dilated like its gaps: one factor on host time, which the
        # proportional rule already is (the replay's host correction is that same factor)
        return (
            _proportional(run, target, ["a host timeline: every host-executed part scaled by one factor"]),
            None,
        )
    timeline = "gpu"
    # the first steady step's replay depends on what the trace holds before it (a rank whose earlier
    # window is missing starts its graph there): it is corrected by the other steps' mean correction
    used = list(steady[1:]) if len(steady) > 1 else list(steady)
    model = _run_model(run, target)
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
        return _proportional(run, target, [why]), None
    lat = model.latencies(setting_for(model, (), None, model.n_ranks))
    t_c = g.times(lat)
    meas = g.__dict__.get("_measured_parts")  # the same for every correction of this graph
    if meas is None:
        meas = g.__dict__["_measured_parts"] = graph_parts(g, g.t)
    corr = graph_parts(g, t_c)
    k_idx = np.asarray([pos[s] for s in steady], dtype=np.int64)
    r_idx = {r: i for i, r in enumerate(g.ranks)}
    ranks = sorted(run.ranks)
    missing = [r for r in ranks if r not in r_idx]
    if missing:
        return _proportional(run, target, [f"rank(s) {missing} are not in the dependency graph"]), None
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
    walk = G.walk_path(g, t_c, lat)
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
    out = {r: _rest(p, target, run.timeline) for r, p in per_rank.items()}
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


def _spread(figures: list[Correction], ranks: list[int]) -> dict[str, dict[str, list[int]]] | None:
    """The ranges of the per-rank figures over `figures` when any spans more than max(1 us, 1%),
    else None."""
    if len(figures) < 2:
        return None

    def of(f: Correction, key: str, r: int | None) -> float:
        if key.startswith("path_"):
            return float(f.path["by_rank"].get(r, {}).get(key[len("path_") :], 0))
        if r is None:  # the mean over ranks (the run's term)
            return float(sum(f.per_rank[q][key] for q in ranks) / len(ranks))
        return float(f.per_rank[r][key])

    ranges: dict[str, dict[str, list[int]]] = {}
    spread = False
    for key in _KEYS:
        ranges[key] = {}
        for r in ranks if key.startswith("path_") else [*ranks, None]:
            vals = [of(f, key, r) for f in figures]
            lo, hi = min(vals), max(vals)
            ranges[key]["mean" if r is None else str(r)] = [int(np.floor(lo)), int(np.ceil(hi))]
            if hi - lo > max(IDENTIFY_NS, 0.01 * max(abs(lo), abs(hi))):
                spread = True
    return ranges if spread else None


def _alone(ranks: list[int], r: int, c: float) -> tuple[tuple[int, float], ...]:
    """The split that puts a cost of `c` per runtime call on rank `r` alone."""
    return tuple((q, c if q == r else 0.0) for q in ranks)


def _flat_end(means: Any, c0: float, tol: float, limit: float) -> float:
    """The largest cost c in [c0, `limit`] whose replayed mean is still within `tol` of the target
    (the error non-increasing in c): `means(costs)` gives the error at several costs in one forward
    pass; a grid of IDENTIFY_GRID costs over the bracket, then over the cell where it leaves `tol`,
    down to max(500 ns, 5% of c0)."""
    lo, hi = c0, limit
    if hi <= lo:
        return lo
    while True:
        grid = [lo + (hi - lo) * i / IDENTIFY_GRID for i in range(1, IDENTIFY_GRID + 1)]
        errs = means(grid)
        bad = [i for i, e in enumerate(errs) if abs(e) > tol]
        if not bad:
            return hi
        i = bad[0]
        lo, hi = (grid[i - 1] if i else lo), grid[i]
        if hi - lo <= max(500.0, 0.05 * c0):
            return lo


#: points of each rank's cost interval `_identify` reads the corrected figures at first (the ends
#: included), before it bisects where the figures bend
IDENTIFY_POINTS = 4
#: the largest cost per call on one rank `_identify` looks at, times the one solved for every rank
IDENTIFY_MAX_FACTOR = 8
#: the figures `_identify` holds to one value: a spread beyond max(this, 1%) is not identified
IDENTIFY_NS = 1000
#: costs per forward pass of the search for the end of a rank's cost interval
IDENTIFY_GRID = 16
#: at most this many midpoints per cost interval `refine_splits` reads where the figures bend
IDENTIFY_REFINE = 48
#: the narrowest cost interval (ns per call) `refine_splits` still bisects
IDENTIFY_MIN_STEP = 50.0


def refine_splits(
    intervals: list[tuple[int, float, float]],
    evaluate: Any,
    known: dict[tuple[int, float], np.ndarray | None] | None = None,
) -> dict[tuple[int, float], np.ndarray | None]:
    """Figures over each rank's cost interval (rank, lo, hi), read where they can reach their extremes.

    Every figure is piecewise linear in the cost (the replay is a longest-path pass: a maximum of
    sums), so its extremes lie at the ends or where it bends. `evaluate(points)` gives a vector of
    figures per (rank, cost) point (None: not read). Read at IDENTIFY_POINTS + 1 even points of each
    interval, then at the midpoint of every two neighbours, and where a midpoint leaves the chord
    between them by more than half of max(IDENTIFY_NS, 1%) in any figure, both halves again (a bend
    the midpoints miss moves an extreme by less than max(IDENTIFY_NS, 1%)), down to
    IDENTIFY_MIN_STEP ns per call, at most IDENTIFY_REFINE midpoints per interval. Returns every
    point read (with `known`'s)."""
    seen: dict[tuple[int, float], np.ndarray | None] = dict(known or {})

    def read(points: list[tuple[int, float]]) -> None:
        todo = [p for p in dict.fromkeys(points) if p not in seen]
        if todo:
            for p, v in zip(todo, evaluate(todo), strict=True):
                seen[p] = None if v is None else np.asarray(v, dtype=np.float64)

    first: list[tuple[int, float]] = []
    pairs: list[tuple[int, float, float]] = []
    n_pts = IDENTIFY_POINTS
    for r, lo, hi in intervals:
        cs = [lo + (hi - lo) * i / n_pts for i in range(n_pts + 1)] if hi > lo else [lo]
        first += [(r, c) for c in cs]
        pairs += [(r, a, b) for a, b in zip(cs, cs[1:], strict=False)]
    read(first)
    spent = 0
    while pairs and spent < IDENTIFY_REFINE * len(intervals):
        pairs = [(r, a, b) for r, a, b in pairs if b - a > IDENTIFY_MIN_STEP]
        pairs = [
            p for p in pairs if seen.get((p[0], p[1])) is not None and seen.get((p[0], p[2])) is not None
        ]
        read([(r, (a + b) / 2) for r, a, b in pairs])
        spent += len(pairs)
        bent: list[tuple[int, float, float]] = []
        for r, a, b in pairs:
            m = (a + b) / 2
            fa, fb, fm = seen[(r, a)], seen[(r, b)], seen[(r, m)]
            if fa is None or fb is None or fm is None:
                continue
            tol = np.maximum(IDENTIFY_NS, 0.01 * np.maximum(np.abs(fa), np.abs(fb))) / 2
            if (np.abs(fm - (fa + fb) / 2) > tol).any():
                bent += [(r, a, m), (r, m, b)]
        pairs = bent
    return seen


#: the per-rank figures `_identify` holds to one value, in `_figures`' order
_KEYS = ("wait", "sync", "idle", *(f"path_{p}" for p in ("host", "compute", "memory", "transfer", "sync")))


def _figures(f: Correction, ranks: list[int]) -> np.ndarray:
    """The figures `_spread` ranges over, as one vector (per key, per rank and the mean)."""
    out: list[float] = []
    for key in _KEYS:
        if key.startswith("path_"):
            out += [float(f.path["by_rank"].get(r, {}).get(key[len("path_") :], 0)) for r in ranks]
        else:
            out += [float(f.per_rank[r][key]) for r in ranks]
            out.append(float(sum(f.per_rank[q][key] for q in ranks) / len(ranks)))
    return np.asarray(out)


def _identify(run: RunParts, job: IdentifyJob, corr: Correction) -> None:
    """Whether a solved cost identifies the corrected per-rank figures (docs/METHOD.md section Noise
    and the profiler correction). One unprofiled per-token time is one equation: ranks held together
    by their collectives have one token time, so a cost solved from it cannot say which rank paid it.
    The correction is redone with the cost on each rank alone, at both ends of the interval of costs
    that give the unprofiled time (a rank that alone cannot reach it is left out); where a rank's
    wait, sync, idle or path part then moves by more than max(1 us, 1%), `corr` is marked not
    identified, with the ranges over these allocations, the one cost on every rank and points
    between the ends where the figures can reach their extremes (`refine_splits`). The replays of
    the search run several costs per forward pass (`_Setting.rank_costs`). Rank by rank here, the
    refinement over every rank's interval at once; a plan runs the same functions, the per-rank
    ones one task per rank (`plans.Fan`)."""
    model = _run_model(run, job.target)
    ends = [identify_ends(run, job, r, model) for r in job.ranks]
    figures = [corr, *(f for _iv, fs, _kn in ends for f in fs)]
    intervals = [iv for iv, _fs, _kn in ends if iv is not None]
    if identify_spread(job, figures):  # the figures need not be monotone: points between
        known = {p: v for _iv, _fs, kn in ends for p, v in kn.items()}
        figures.extend(identify_between(run, job, intervals, known))
    identify_finish(job, corr, figures, intervals)


def _errs(model: Any, tgt: float, splits: list[tuple[tuple[int, float], ...]]) -> list[float]:
    """The replayed mean's error against `tgt` under each split of the cost, in one forward pass."""
    from tracekit.analyse.replay import _Setting

    settings = [_Setting(host_deduct=max(c for _, c in sp), rank_costs=sp) for sp in splits]
    return [float(p.mean()) - tgt for p in model.replay_many(settings)]


def identify_interval(
    run: RunParts, job: IdentifyJob, r: int, model: Any = None
) -> tuple[int, float, float] | None:
    """The interval [lo, hi] of costs per call that, on rank `r` alone, give the unprofiled
    per-token time (as (r, lo, hi)), or None where that rank alone cannot reach it. `model`: the
    run's replay model (`_run_model`; built here when None: a split's replay does not depend on
    the model's own calibration)."""
    from tracekit.analyse.replay import _solve_decreasing

    if model is None:
        model = _run_model(run, job.target)
    ranks = list(job.ranks)
    tgt = float(job.target)
    tol = max(1e-4 * tgt, 1.0)
    c_all = job.cost_ns
    limit = IDENTIFY_MAX_FACTOR * c_all

    # removing host time never slows the replay, so one rank alone needs at least the cost the solve
    # put on every rank, and a rank that cannot reach the target alone at the search's farthest cost
    # (c_all + 8 c_all: `_solve_decreasing`'s last bracket) reaches it nowhere: both ends in one
    # forward pass, the solve only where the rank can
    far = c_all + IDENTIFY_MAX_FACTOR * c_all
    e0, e_far = _errs(model, tgt, [_alone(ranks, r, c) for c in (c_all, far)])
    if abs(e0) > tol and e_far > 0:
        return None

    def err(c: float) -> float:
        return _errs(model, tgt, [_alone(ranks, r, c)])[0]

    c_r = _solve_decreasing(err, c_all, c_all / 4, tol, limit)
    if c_r is None or c_r < 0:
        return None
    # the token time stops falling once another rank is last: every cost up to where it
    # falls again gives the same time (within max(1 us, 1%)), so the data allow that interval
    flat = _flat_end(
        lambda cs: _errs(model, tgt, [_alone(ranks, r, c) for c in cs]),
        c_r,
        max(IDENTIFY_NS, 0.01 * tgt),
        limit,
    )
    return r, c_r, flat


def _read_at(
    run: RunParts, job: IdentifyJob, points: list[tuple[int, float]], figures: list[Correction]
) -> list[np.ndarray | None]:
    """The correction with the cost `c` on rank `r` alone, for each (r, c): its figures as one
    vector (`_figures`; None where the replay does not correct it); the corrections the replay
    makes appended to `figures` (their per-rank parts and path, what `_spread` reads: not their
    rows)."""
    ranks = list(job.ranks)
    out: list[np.ndarray | None] = []
    for r, c in points:
        other, _ = correct_first(run, job.target, dict(_alone(ranks, r, c)))
        if other.method == REPLAY:
            other.rows = None
            figures.append(other)
            out.append(_figures(other, ranks))
        else:
            out.append(None)
    return out


def identify_ends(
    run: RunParts, job: IdentifyJob, r: int, model: Any = None
) -> tuple[tuple[int, float, float] | None, list[Correction], dict[tuple[int, float], np.ndarray | None]]:
    """Rank `r`'s share of `_identify`, first round: its interval (`identify_interval`), the
    corrections at the interval's ends and their figures per (rank, cost) read (what
    `refine_splits` starts from; none where the rank alone cannot reach the time)."""
    iv = identify_interval(run, job, r, model)
    if iv is None:
        return None, [], {}
    _, lo, hi = iv
    points = [(r, c) for c in ((lo, hi) if hi > lo else (lo,))]
    figures: list[Correction] = []
    known = dict(zip(points, _read_at(run, job, points, figures), strict=True))
    return iv, figures, known


def identify_between(
    run: RunParts,
    job: IdentifyJob,
    intervals: list[tuple[int, float, float]],
    known: dict[tuple[int, float], np.ndarray | None],
) -> list[Correction]:
    """`_identify`'s second round (where the ends spread): the corrections `refine_splits` reads
    between the ends of every rank's interval at once (its budget of midpoints is shared by the
    intervals, so this is one call, not one per rank), from the ends' figures `known`."""
    figures: list[Correction] = []
    refine_splits(intervals, lambda pts: _read_at(run, job, pts, figures), known)
    return figures


def identify_spread(job: IdentifyJob, figures: list[Correction]) -> bool:
    """Whether the figures so far spread (then the points between the ends are read too)."""
    return _spread(figures, list(job.ranks)) is not None


def identify_finish(
    job: IdentifyJob, corr: Correction, figures: list[Correction], intervals: list[tuple[int, float, float]]
) -> None:
    """`corr` marked not identified, with the ranges and each rank's cost interval (what the what-if
    reads its ranges over), where `figures` (it first, then every allocation read) spread beyond
    max(1 us, 1%)."""
    ranges = _spread(figures, list(job.ranks))
    if ranges is not None:
        corr.identified = False
        corr.ranges = ranges
        corr.intervals = intervals
        corr.notes.append(
            "the profiler's cost per rank is not identified (solved from one per-token time, no "
            "calibration): removed from each rank alone it gives each rank's wait, sync, idle and "
            "critical path within `ranges`; capture with a calibration to split it"
        )


def _rest(parts: Mapping[str, Fraction], target: Fraction, timeline: str) -> dict[str, Fraction]:
    """The corrected timeline's parts brought to `target` exactly: time it leaves unexplained (its
    step time short of the target) is idle, the device's parts stay as read; an excess comes out of
    wait, sync and idle in proportion (`shortfall.reconcile`)."""
    from tracekit.analyse.attribution.reconcile import reconcile
    from tracekit.model.parts import LEAF_PARTS

    total = sum((parts[p] for p in LEAF_PARTS), Fraction(0))
    if total <= target:
        out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
        out["idle"] += target - total
        return out
    return reconcile(parts, target, timeline)[0]


def graph_parts(g: G.Graph, t: np.ndarray) -> dict[str, np.ndarray]:
    """Per [rank_i, step_i] of `g`, the leaf parts of each window at node times `t`, with the
    partition's priority (compute > memory > collective > unknown > sync > idle; an exposed
    collective's time after its instance's rendezvous is transfer, before it wait), each rank's
    window padded with idle to the step's longest: every row sums to the step time."""
    from tracekit.analyse.intervals import covered as _measure
    from tracekit.analyse.intervals import union as union_intervals
    from tracekit.model.parts import LEAF_PARTS

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
        e = by_rank[np.searchsorted(er_sorted, r, "left") : np.searchsorted(er_sorted, r, "right")]
        role, kind = g.role[e], g.kind[e]
        work = np.isin(role, (G.ROLE_OP, G.ROLE_WORK))
        syn = role == G.ROLE_SYNC
        xf = e[role == G.ROLE_XFER]
        ar = e[role == G.ROLE_ARRIVE]
        begin_of = dict(zip(dst[ar].tolist(), src[ar].tolist(), strict=True))  # rendezvous -> arrival
        cb = np.asarray([begin_of.get(int(v), int(v)) for v in src[xf]], dtype=np.int64)
        c_s, c_e, rv = t[cb], t[dst[xf]], t[src[xf]]

        def iv(mask: np.ndarray, e: np.ndarray = e) -> tuple[np.ndarray, np.ndarray]:
            sel = e[mask]
            return t[src[sel]], t[dst[sel]]

        layers = []  # cumulative unions of the layers in priority order
        pieces: list[tuple[np.ndarray, np.ndarray]] = [
            iv(work & (kind == G.K_COMPUTE)),
            iv(work & (kind == G.K_MEMORY)),
        ]
        un_coll = iv(work & (kind == G.K_TRANSFER))  # a collective the matching did not cover
        pieces.append((np.concatenate((c_s, un_coll[0])), np.concatenate((c_e, un_coll[1]))))
        pieces.append(iv(work & (kind == G.K_UNKNOWN)))
        sync_iv = iv(syn)
        if g.timeline == "host":  # host work's sync pieces are edges of the chain too
            sync_iv = iv(role == G.ROLE_SYNC)
        pieces.append(sync_iv)
        acc_s: list[np.ndarray] = []
        acc_e: list[np.ndarray] = []
        for s_, e_ in pieces:
            acc_s.append(s_)
            acc_e.append(e_)
            us, ue = union_intervals(np.concatenate(acc_s), np.concatenate(acc_e))
            layers.append(_measure(us, ue, a, b))
        compute, mem_c, coll_c, unk_c, sync_c = layers
        hs, he = union_intervals(np.concatenate(acc_s[:2]), np.concatenate(acc_e[:2]))
        ts_, te_ = np.maximum(c_s, rv), c_e
        xs, xe = union_intervals(
            np.concatenate((acc_s[0], acc_s[1], ts_)), np.concatenate((acc_e[0], acc_e[1], te_))
        )
        transfer = _measure(xs, xe, a, b) - _measure(hs, he, a, b)
        out["compute"][i] = compute
        out["memory"][i] = mem_c - compute
        out["transfer"][i] = transfer
        out["wait"][i] = coll_c - mem_c - transfer
        out["unknown"][i] = unk_c - coll_c
        out["sync"][i] = sync_c - unk_c
        out["idle"][i] = (b - a) - sync_c + (step - (b - a))
    return out


def correction_doc(corrections: Mapping[str, Correction | None]) -> dict[str, Any]:
    """JSON `dilation.correction`: per run label, its Correction's JSON (None: not corrected)."""
    return {k: (c.to_json() if c is not None else None) for k, c in corrections.items()}
