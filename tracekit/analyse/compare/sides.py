"""One side of a diff (docs/METHOD.md section Comparing two runs): a run attributed as the shortfall
does (`attribute_side`), its per-token time and source settled (`settle`), compute split into
matrix and vector, and its kernel and collective tables (its tokens are resampled with
`tracekit.analyse.resample`). The comparison: `tracekit.analyse.compare.diff`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse import intervals
from tracekit.analyse.attribution.correction import correct_run
from tracekit.analyse.attribution.options import DEFAULT_OPTIONS, AttributionOptions
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.reconcile import AppliedDilation, applied_dilation
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.classify import classify
from tracekit.classify.rules import GPU_KINDS
from tracekit.model.events import Run
from tracekit.model.parts import LEAF_PARTS
from tracekit.model.strings import str_isin

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95

#: The diff's leaf parts, in report order (compute split into matrix and vector).
DIFF_PARTS: tuple[str, ...] = ("matrix", "vector", "memory", "transfer", "wait", "sync", "idle", "unknown")


# ------------------------------------------------------------------------------------------
# one side


@dataclass
class Side:
    """One run of the pair, attributed."""

    label: str  # "before" | "after"
    path: str
    parts: RunParts
    applied: AppliedDilation
    matrix_ns: dict[int, Fraction]  # per rank: per-token matrix part (traced), inside compute
    steps_matrix: pd.DataFrame  # per (rank, steady step): matrix_ns
    kernels: pd.DataFrame  # key, kind, name, count, time_ns (per token per rank)
    collectives: pd.DataFrame  # op, bytes, count, wait_ns, transfer_ns, time_ns (per token per rank)
    # filled by `diff` once the source is decided
    per_token_ns: Fraction = Fraction(0)
    per_rank: dict[int, dict[str, Fraction]] = field(default_factory=dict)
    leaf: dict[str, Fraction] = field(default_factory=dict)
    path_token: dict[str, Any] = field(default_factory=dict)
    samples: list[list[int]] = field(default_factory=list)
    reconciliation: str = ""


def _split_compute(parts: Mapping[str, Fraction], matrix: Fraction) -> dict[str, Fraction]:
    """LEAF_PARTS -> DIFF_PARTS: compute into matrix and vector; `matrix` is the traced matrix
    time, scaled with compute when the reconciliation scaled compute."""
    out = {p: Fraction(parts[p]) for p in LEAF_PARTS if p != "compute"}
    out["matrix"] = min(matrix, Fraction(parts["compute"]))
    out["vector"] = Fraction(parts["compute"]) - out["matrix"]
    return {p: out[p] for p in DIFF_PARTS}


def _matrix_per_step(classified: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step) window: the time covered by matrix kernels (GPU timeline only; 0 on a
    host timeline, whose compute is host op time). Compute is the partition's first priority, so
    this is the part of the window's compute part that a matrix kernel covers."""

    rows = []
    ev_rank = classified["rank"].to_numpy(np.int64)
    mat = (
        str_isin(classified["kind"], GPU_KINDS)
        & str_isin(classified["cls"], {"compute"})
        & str_isin(classified["subclass"], {"matrix"})
    )
    start = classified["start_ns"].to_numpy(np.int64)
    end = classified["end_ns"].to_numpy(np.int64)
    for r, w in windows.groupby("rank", sort=True):
        on = (ev_rank == int(r)) & mat
        us, ue = intervals.union(start[on], end[on])
        m = intervals.covered(us, ue, w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64))
        rows.append(pd.DataFrame({"rank": int(r), "step": w["step"].to_numpy(np.int64), "matrix_ns": m}))
    if not rows:
        return pd.DataFrame({"rank": [], "step": [], "matrix_ns": []})
    return pd.concat(rows, ignore_index=True)


def _kernel_table(
    classified: pd.DataFrame, windows: pd.DataFrame, n_steps: int, n_ranks: int
) -> pd.DataFrame:
    """Count and traced time per token per rank of every kernel name inside the steady windows.

    GPU ranks: kernels, copies and sets that are not collectives. Host ranks (CPU runs): CPU ops
    that are not collectives (inclusive durations: a parent op's time contains its children's)."""

    ev_rank = classified["rank"].to_numpy(np.int64)
    gpu = str_isin(classified["kind"], GPU_KINDS)
    coll = str_isin(classified["cls"], {"collective"})
    cpu_op = str_isin(classified["kind"], {"cpu_op"})
    start = classified["start_ns"].to_numpy(np.int64)
    keep = np.zeros(len(classified), dtype=bool)
    for r, w in windows.sort_values(["rank", "start_ns"]).groupby("rank", sort=True):
        on = ev_rank == int(r)
        sel = on & ~coll & (gpu if gpu[on].any() else cpu_op)
        idx = np.flatnonzero(sel)
        ws = w["start_ns"].to_numpy(np.int64)
        we = w["end_ns"].to_numpy(np.int64)
        i = np.searchsorted(ws, start[idx], side="right") - 1
        ok = (i >= 0) & (start[idx] < we[np.clip(i, 0, None)])
        keep[idx[ok]] = True
    ev = classified.loc[keep, ["kind", "name", "cls", "start_ns", "end_ns"]]
    if ev.empty:
        return pd.DataFrame(columns=["kind", "name", "cls", "count", "time_ns"])
    ev = ev.assign(
        kind=ev["kind"].astype(str),
        name=ev["name"].astype(str),
        cls=ev["cls"].astype(str),
        dur=(ev["end_ns"] - ev["start_ns"]).astype(np.int64),
    )
    g = (
        ev.groupby(["kind", "name", "cls"], sort=True, observed=True)["dur"]
        .agg(["count", "sum"])
        .reset_index()
    )
    denom = float(max(n_steps, 1) * max(n_ranks, 1))
    return pd.DataFrame(
        {
            "kind": g["kind"],
            "name": g["name"],
            "cls": g["cls"],
            "count": g["count"].astype(np.float64) / denom,
            "time_ns": g["sum"].astype(np.float64) / denom,
        }
    )


def _collective_table(run: RunParts, steady: set[int]) -> pd.DataFrame:
    """Per (op, bytes): count, wait, transfer and duration per token per rank over the steady steps."""

    cols = ["op", "bytes", "count", "wait_ns", "transfer_ns", "time_ns"]
    pr = run.collectives.per_rank
    inst = run.collectives.instances
    if pr.empty or inst.empty:
        return pd.DataFrame(columns=cols)
    windows = run.steps[["rank", "step", "start_ns", "end_ns"]]
    step = assign_steps(pr.assign(start_ns=pr["raw_start_ns"]), windows)
    p = pr.assign(step=step.to_numpy()).merge(inst[["instance", "size_bytes"]], on="instance")
    p = p[p["step"].isin(steady)]
    if p.empty:
        return pd.DataFrame(columns=cols)
    p = p.assign(op=p["op"].astype(str), dur=(p["end_ns"] - p["start_ns"]).astype(np.int64))
    g = (
        p.groupby(["op", "size_bytes"], sort=True, observed=True)
        .agg(
            count=("instance", "size"),
            wait_ns=("wait_ns", "sum"),
            transfer_ns=("transfer_ns", "sum"),
            time_ns=("dur", "sum"),
        )
        .reset_index()
        .rename(columns={"size_bytes": "bytes"})
    )
    denom = float(max(len(steady), 1) * max(run.n_ranks, 1))
    for c in ("count", "wait_ns", "transfer_ns", "time_ns"):
        g[c] = g[c].astype(np.float64) / denom
    g["bytes"] = g["bytes"].astype(np.int64)
    return g[cols]


def attribute_side(run: Run, *, label: str, path: str, options: AttributionOptions = DEFAULT_OPTIONS) -> Side:
    """Attribute one run of the pair (`attribute_run` with `options`) and collect what the diff
    compares."""
    classified = run.events if "cls" in run.events.columns else classify(run.events)
    run = dataclasses.replace(run, events=classified)
    parts = attribute_run(run, options, label=label)
    return side_of(parts, label, path, *rank_side_tables(classified, side_windows(parts)))


def side_windows(parts: RunParts) -> pd.DataFrame:
    """The steady (rank, step) windows the diff's matrix and kernel tables read."""
    steady = [int(s) for s in parts.steady["step"]]
    return parts.steps[parts.steps["step"].isin(steady)][["rank", "step", "start_ns", "end_ns"]]


def rank_side_tables(classified: pd.DataFrame, windows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One rank's share of a side (its events and steady windows; on Dask where its events are):
    its matrix time per step and its kernel table's integer sums (`_kernel_table` over one step and
    one rank: `side_of` divides)."""
    return _matrix_per_step(classified, windows), _kernel_table(classified, windows, 1, 1)


def _add_kernel_tables(tables: list[pd.DataFrame]) -> pd.DataFrame:
    keys = ["kind", "name", "cls"]
    return (
        pd.concat(tables, ignore_index=True)
        .groupby(keys, sort=True)[["count", "time_ns"]]
        .sum()
        .reset_index()
    )


def side_of(
    parts: RunParts,
    label: str,
    path: str,
    steps_matrix: pd.DataFrame,
    kernels: pd.DataFrame | list[pd.DataFrame],
) -> Side:
    """The Side of an attributed run from its matrix time per (rank, step) and its kernel table's
    integer sums (`rank_side_tables`), or the ranks' tables to add up: counts and times are
    integers until the one division by steps x ranks, so adding the ranks' tables first is exact."""
    steady = [int(s) for s in parts.steady["step"]]
    sm = steps_matrix
    n = len(steady)
    matrix = {int(r): Fraction(int(sm.loc[sm["rank"] == r, "matrix_ns"].sum()), n) for r in parts.per_rank}
    tables = [t for t in (kernels if isinstance(kernels, list) else [kernels]) if not t.empty]
    if not tables:
        ktab = pd.DataFrame(columns=["kind", "name", "cls", "count", "time_ns"])
    else:
        ktab = tables[0] if len(tables) == 1 else _add_kernel_tables(tables)
        denom = float(max(n, 1) * max(len(parts.per_rank), 1))
        ktab = ktab.assign(count=ktab["count"] / denom, time_ns=ktab["time_ns"] / denom)
    return Side(
        label=label,
        path=path,
        parts=parts,
        applied=applied_dilation(parts),
        matrix_ns=matrix,
        steps_matrix=sm,
        kernels=ktab,
        collectives=_collective_table(parts, set(steady)),
    )


def _mean_ranks(per_rank: Mapping[int, Mapping[str, Fraction]], keys: Sequence[str]) -> dict[str, Fraction]:
    ranks = list(per_rank)
    return {k: sum((per_rank[r][k] for r in ranks), Fraction(0)) / len(ranks) for k in keys}


def settle(side: Side, source: str) -> None:
    """Per-token figures of `side` from `source`: "unprofiled" (the shortfall's corrected time: the
    traced per-token time divided by the applied dilation D, `AppliedDilation.target_ns`, every
    rank's parts and the critical path reconciled to it) or "trace" (as measured)."""
    parts = side.parts
    u = parts.dilation.unprofiled
    target = side.applied.target_ns if source == "unprofiled" else None
    per_rank: dict[int, dict[str, Fraction]] = {}
    notes = []
    corr = correct_run(parts, target) if target is not None else None
    for r, p in parts.per_rank.items():
        if corr is not None:
            rec = corr.per_rank[r]
            notes.append(corr.sentence)
            scale = rec["compute"] / p["compute"] if p["compute"] else Fraction(1)
            per_rank[r] = _split_compute(rec, side.matrix_ns.get(r, Fraction(0)) * scale)
        else:
            per_rank[r] = _split_compute(p, side.matrix_ns.get(r, Fraction(0)))
    side.per_rank = per_rank
    side.leaf = _mean_ranks(per_rank, DIFF_PARTS)
    side.per_token_ns = sum(side.leaf.values(), Fraction(0))
    if target is not None and u is not None and u.n:
        assert side.per_token_ns == target, "reconciled parts do not sum to the corrected time"
        assert corr is not None
        side.path_token = corr.path
        # the interval's spread: the unprofiled rounds (host drift between rounds widens it)
        side.samples = [list(r) for r in u.rounds if len(r)] or [list(u.per_token_ns)]
        side.reconciliation = notes[0] if notes else ""
    else:
        assert side.per_token_ns == parts.per_token["window"]
        side.path_token = dict(parts.path_token)
        side.samples = [[int(x) for x in parts.steady["window_ns"].to_numpy(np.int64)]]
        side.reconciliation = "traced parts as measured"


def pooled_mean(rounds: Sequence[Sequence[int]]) -> float:
    n = sum(len(r) for r in rounds)
    return float(sum(sum(r) for r in rounds)) / n if n else float("nan")
