"""The profiler correction of a run (docs/METHOD.md section Noise and the profiler correction):
`correct_run`, the correction through the replay (`correction_replay.correct_first`), then, where
its cost was solved on several ranks, whether that cost identifies the corrected per-rank figures
(`identify`: the correction redone with the cost on each rank alone over the interval of costs that
give the unprofiled time, read where the figures bend: `refine_splits`). The per-rank steps
(`identify_ends`, `identify_between`) are what a plan runs one task per rank (`plans.Fan`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

import numpy as np

from tracekit.analyse.attribution.correction_replay import (
    REPLAY,
    Correction,
    IdentifyJob,
    correct_first,
    run_model,
)
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.retime.calibrate import solve_decreasing
from tracekit.analyse.retime.model import RunModel
from tracekit.analyse.retime.setting import Setting


def correct_run(run: RunParts, target: Fraction) -> Correction:
    """`run`'s per-rank parts and critical path corrected to `target` (module doc); cached on the
    run per target (the shortfall, the what-if and diff ask for the same one)."""
    cache: dict[Fraction, Correction] = run.__dict__.setdefault("_corrections", {})
    if target not in cache:
        cache[target] = _correct(run, target)
    return cache[target]


def _correct(run: RunParts, target: Fraction, rank_cost: Mapping[int, float] | None = None) -> Correction:
    """The correction through the replay; `rank_cost`: a cost per runtime call for each rank
    instead of the calibration or the solved one (`identify`'s allocations)."""
    corr, job = correct_first(run, target, rank_cost)
    if job is not None:
        identify(run, job, corr)
    return corr


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


def alone(ranks: list[int], r: int, c: float) -> tuple[tuple[int, float], ...]:
    """The split that puts a cost of `c` per runtime call on rank `r` alone."""
    return tuple((q, c if q == r else 0.0) for q in ranks)


def _flat_end(means: Callable[[list[float]], list[float]], c0: float, tol: float, limit: float) -> float:
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


#: points of each rank's cost interval `identify` reads the corrected figures at first (the ends
#: included), before it bisects where the figures bend
IDENTIFY_POINTS = 4
#: the largest cost per call on one rank `identify` looks at, times the one solved for every rank
IDENTIFY_MAX_FACTOR = 8
#: the figures `identify` holds to one value: a spread beyond max(this, 1%) is not identified
IDENTIFY_NS = 1000
#: costs per forward pass of the search for the end of a rank's cost interval
IDENTIFY_GRID = 16
#: at most this many midpoints per cost interval `refine_splits` reads where the figures bend
IDENTIFY_REFINE = 48
#: the narrowest cost interval (ns per call) `refine_splits` still bisects
IDENTIFY_MIN_STEP = 50.0


def refine_splits(
    intervals: list[tuple[int, float, float]],
    evaluate: Callable[[list[tuple[int, float]]], Sequence[Sequence[float] | np.ndarray | None]],
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


#: the per-rank figures `identify` holds to one value, in `_figures`' order
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


def identify(run: RunParts, job: IdentifyJob, corr: Correction) -> None:
    """Whether a solved cost identifies the corrected per-rank figures (docs/METHOD.md section Noise
    and the profiler correction). One unprofiled per-token time is one equation: ranks held together
    by their collectives have one token time, so a cost solved from it cannot say which rank paid it.
    The correction is redone with the cost on each rank alone, at both ends of the interval of costs
    that give the unprofiled time (a rank that alone cannot reach it is left out); where a rank's
    wait, sync, idle or path part then moves by more than max(1 us, 1%), `corr` is marked not
    identified, with the ranges over these allocations, the one cost on every rank and points
    between the ends where the figures can reach their extremes (`refine_splits`). The replays of
    the search run several costs per forward pass (`retime.setting.Setting.rank_costs`). Rank by rank here, the
    refinement over every rank's interval at once; a plan runs the same functions, the per-rank
    ones one task per rank (`plans.Fan`)."""
    model = run_model(run, job.target)
    ends = [identify_ends(run, job, r, model) for r in job.ranks]
    figures = [corr, *(f for _iv, fs, _kn in ends for f in fs)]
    intervals = [iv for iv, _fs, _kn in ends if iv is not None]
    if identify_spread(job, figures):  # the figures need not be monotone: points between
        known = {p: v for _iv, _fs, kn in ends for p, v in kn.items()}
        figures.extend(identify_between(run, job, intervals, known))
    identify_finish(job, corr, figures, intervals)


def _errs(model: RunModel, tgt: float, splits: list[tuple[tuple[int, float], ...]]) -> list[float]:
    """The replayed mean's error against `tgt` under each split of the cost, in one forward pass."""
    settings = [Setting(host_deduct=max(c for _, c in sp), rank_costs=sp) for sp in splits]
    return [float(p.mean()) - tgt for p in model.replay_many(settings)]


def identify_interval(
    run: RunParts, job: IdentifyJob, r: int, model: RunModel | None = None
) -> tuple[int, float, float] | None:
    """The interval [lo, hi] of costs per call that, on rank `r` alone, give the unprofiled
    per-token time (as (r, lo, hi)), or None where that rank alone cannot reach it. `model`: the
    run's replay model (`correction_replay.run_model`; built here when None: a split's replay does not depend on
    the model's own calibration)."""
    if model is None:
        model = run_model(run, job.target)
    ranks = list(job.ranks)
    tgt = float(job.target)
    tol = max(1e-4 * tgt, 1.0)
    c_all = job.cost_ns
    limit = IDENTIFY_MAX_FACTOR * c_all

    # removing host time never slows the replay, so one rank alone needs at least the cost the solve
    # put on every rank, and a rank that cannot reach the target alone at the search's farthest cost
    # (c_all + 8 c_all: `solve_decreasing`'s last bracket) reaches it nowhere: both ends in one
    # forward pass, the solve only where the rank can
    far = c_all + IDENTIFY_MAX_FACTOR * c_all
    e0, e_far = _errs(model, tgt, [alone(ranks, r, c) for c in (c_all, far)])
    if abs(e0) > tol and e_far > 0:
        return None

    def err(c: float) -> float:
        return _errs(model, tgt, [alone(ranks, r, c)])[0]

    c_r = solve_decreasing(err, c_all, c_all / 4, tol, limit)
    if c_r is None or c_r < 0:
        return None
    # the token time stops falling once another rank is last: every cost up to where it
    # falls again gives the same time (within max(1 us, 1%)), so the data allow that interval
    flat = _flat_end(
        lambda cs: _errs(model, tgt, [alone(ranks, r, c) for c in cs]),
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
        other, _ = correct_first(run, job.target, dict(alone(ranks, r, c)))
        if other.method == REPLAY:
            other.rows = None
            figures.append(other)
            out.append(_figures(other, ranks))
        else:
            out.append(None)
    return out


def identify_ends(
    run: RunParts, job: IdentifyJob, r: int, model: RunModel | None = None
) -> tuple[tuple[int, float, float] | None, list[Correction], dict[tuple[int, float], np.ndarray | None]]:
    """Rank `r`'s share of `identify`, first round: its interval (`identify_interval`), the
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
    """`identify`'s second round (where the ends spread): the corrections `refine_splits` reads
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
