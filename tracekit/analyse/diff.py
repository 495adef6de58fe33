"""Two runs of the same workload side by side (issue 20): what moved per token, and a CI gate.

`diff(before, after)` attributes both runs as the shortfall does (`attribute_run`: per-rank
per-token leaf parts, exact Fractions; the critical path; the matched collectives) and compares:

1. **Per-token time.** T before / after as the shortfall corrects it when *both* captures measured
   their dilation D against unprofiled passes and neither run's profiled pass was clearly faster
   than its unprofiled one (the shortfall's rule): T = traced per-token time / D
   (`AppliedDilation.target_ns`); else the traced steady step times for both
   (`per_token_source`: never one of each). The change `T_after - T_before` gets a 95% percentile
   bootstrap interval (`BOOTSTRAP_RESAMPLES` resamples, seeded): each run's unprofiled tokens (or
   its traced steps) are resampled in two levels (its rounds with replacement, then the tokens
   within each drawn round), the two runs independently, and each resampled mean is carried onto
   T in proportion (the spread of the unprofiled rounds, host drift included, centred on T). The
   verdict is "slower" when the interval of the relative change lies above 0, "faster" below 0,
   "no significant change" when it holds 0, and "cannot judge" when there is no interval: a run
   with fewer than `MIN_TOKENS_TO_JUDGE` tokens to resample, or runs whose per-token steps are not
   alike (a serving engine's decode steps of another batch size, decode against prefill: docs/
   METHOD.md, Serving engines); never "no significant change" without an interval.
2. **The change by part**, exactly: each run's parts are the mean over ranks of every rank's
   per-token leaf parts (corrected to the corrected time when that is the source, as the shortfall
   does: `tracekit.analyse.correction.correct_run`), so they sum to T exactly, and their differences sum exactly to the
   change. On GPU timelines compute is split into matrix (GEMM / attention kernels) and vector
   (everything else the classifier calls compute): per window, the time a matrix kernel covers is
   matrix, the rest of the compute part is vector (matrix > vector, as compute > memory in the
   partition). Integers in the JSON: T rounded, the change = after - before, the leaf changes by
   largest remainder (they sum to the change exactly; so do every rank's and the critical path's).
   Each part's change has an interval: the bootstrap over the traced steady steps of the per-step
   difference of means (mean over ranks), shifted onto the reported figure.
3. **The cause**, from the critical path (`tracekit.analyse.critical_path`, reconciled like the
   parts): the path component that moved most in the direction of the change, and the rank it
   moved on; the per-rank parts say which ranks now wait for it.
4. **What moved**: kernels matched by (kind, name) (the event table carries no shapes) and
   collectives by (op, bytes), each with count and time per token per rank (traced durations),
   new and vanished names marked.
5. **Dilation** of both runs (the applied factor D, `shortfall.applied_dilation`). The profiler
   alone changes the traced per-token time by d_after / d_before - 1; a warning is raised when
   that differs from 0 beyond noise (the two intervals do not overlap, or it exceeds
   `DILATION_WARN`) and is at least half the traced change.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse import intervals
from tracekit.analyse.correction import correct_run
from tracekit.analyse.critical_path import PATH_PARTS
from tracekit.analyse.dilation import DEFAULT_THRESHOLD
from tracekit.analyse.shortfall import (
    COORDINATION,
    LEAF_PARTS,
    AppliedDilation,
    RunParts,
    _round,
    _round_to_sum,
    applied_dilation,
    attribute_run,
)
from tracekit.model import units
from tracekit.model.events import DataQuality, Run

_pct_signed = functools.partial(units.pct, sign=True, missing="?")

SCHEMA_VERSION = "1.0"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95
#: a dilation ratio (after / before) beyond 1 +- this counts as "differs", even with overlapping intervals
DILATION_WARN = 0.05
#: rows of the kernel and collective tables kept in the result (by |time change|)
TOP = 10
#: fewest tokens (steady steps, or unprofiled tokens) a run needs for an interval and a verdict. With
#: n samples the bootstrap draws the all-smallest resample with probability n^-(n-1): 0.5 at n = 2,
#: 0.11 at n = 3, above the 2.5% tail, so the "95%" interval is the samples' range; 0.016 at n = 4.
MIN_TOKENS_TO_JUDGE = 4
#: the verdict word when there is no interval
CANNOT_JUDGE = "cannot judge"

#: The diff's leaf parts, in report order (compute split into matrix and vector).
DIFF_PARTS: tuple[str, ...] = ("matrix", "vector", "memory", "transfer", "wait", "sync", "idle", "unknown")
#: How the summary names the per-token source.
_SOURCE_WORDS = {
    "unprofiled": "per-token times corrected for the profiler: traced / dilation",
    "trace": "traced per-token times, not corrected for the profiler",
}
#: Groups of leaf parts shown as one term.
GROUPS: dict[str, tuple[str, ...]] = {
    "compute": ("matrix", "vector"),
    "memory": ("memory",),
    "transfer": ("transfer",),
    "coordination": COORDINATION,
    "unknown": ("unknown",),
}


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
    from tracekit.classify.rules import GPU_KINDS

    rows = []
    ev_rank = classified["rank"].to_numpy(np.int64)
    kind = classified["kind"].astype(str).to_numpy()
    cls = classified["cls"].astype(str).to_numpy()
    sub = classified["subclass"].astype(str).to_numpy()
    mat = np.isin(kind, list(GPU_KINDS)) & (cls == "compute") & (sub == "matrix")
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
    from tracekit.classify.rules import GPU_KINDS

    ev_rank = classified["rank"].to_numpy(np.int64)
    kind = classified["kind"].astype(str).to_numpy()
    gpu = np.isin(kind, list(GPU_KINDS))
    coll = classified["cls"].astype(str).to_numpy() == "collective"
    cpu_op = kind == "cpu_op"
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
    from tracekit.analyse.collectives import assign_steps

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


def attribute_side(run: Run, *, label: str, path: str, **kw: Any) -> Side:
    """Attribute one run of the pair (`attribute_run`) and collect what the diff compares."""
    from tracekit.classify import classify

    classified = run.events if "cls" in run.events.columns else classify(run.events)
    run = dataclasses.replace(run, events=classified)
    parts = attribute_run(run, label=label, **kw)
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


def _settle(side: Side, source: str) -> None:
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


def _pooled_mean(rounds: Sequence[Sequence[int]]) -> float:
    n = sum(len(r) for r in rounds)
    return float(sum(sum(r) for r in rounds)) / n if n else float("nan")


# ------------------------------------------------------------------------------------------
# bootstrap


def _boot_means(rounds: Sequence[Sequence[int]], rng: np.random.Generator, b: int) -> np.ndarray:
    """b resampled pooled means: rounds with replacement, then each drawn round's tokens."""
    arrs = [np.asarray(r, dtype=np.float64) for r in rounds if len(r)]
    k = len(arrs)
    idx = rng.integers(0, k, size=(b, k))
    total = np.zeros(b)
    count = np.zeros(b)
    for slot in range(k):
        for j, r in enumerate(arrs):
            chosen = idx[:, slot] == j
            m = int(chosen.sum())
            if not m:
                continue
            total[chosen] += r[rng.integers(0, len(r), size=(m, len(r)))].sum(axis=1)
            count[chosen] += len(r)
    return total / count


def _boot_steps(values: np.ndarray, rng: np.random.Generator, b: int) -> np.ndarray:
    """b resampled means of one array (per column when 2-d)."""
    n = values.shape[0]
    idx = rng.integers(0, n, size=(b, n))
    return values[idx].mean(axis=1)


# ------------------------------------------------------------------------------------------
# the result


@dataclass
class Diff:
    """Two runs compared; `to_json()` per docs/JSON.md#diff."""

    before: Side
    after: Side
    per_token_source: str
    source_reason: str
    change_interval_ns: tuple[float, float]
    relative_interval: tuple[float, float]
    part_intervals_ns: dict[str, tuple[float, float]]
    #: each run's own per-token mean, 95% bootstrap interval (the same resamples as the change's)
    per_token_intervals_ns: dict[str, tuple[float, float]]
    data_quality: DataQuality
    top: int = TOP
    #: why there is no interval (too few tokens, steps not alike), "" when there is one
    cannot_judge: str = ""

    # ---- figures

    @property
    def change_ns(self) -> Fraction:
        return self.after.per_token_ns - self.before.per_token_ns

    @property
    def relative(self) -> float | None:
        b = self.before.per_token_ns
        return float(self.change_ns / b) if b else None

    @property
    def matrix_available(self) -> bool:
        return self.before.parts.timeline == "gpu" and self.after.parts.timeline == "gpu"

    def verdict_word(self) -> str:
        lo, hi = self.relative_interval
        if self.cannot_judge or not (math.isfinite(lo) and math.isfinite(hi)):
            return CANNOT_JUDGE
        if lo > 0:
            return "slower"
        if hi < 0:
            return "faster"
        return "no significant change"

    def integers(self) -> dict[str, Any]:
        """Per-token ns as ints: before, after, change = after - before, the leaf changes by largest
        remainder summing to the change; the groups are sums of leaves."""
        b = _round(self.before.per_token_ns)
        a = _round(self.after.per_token_ns)
        change = a - b
        leaf_d = {p: self.after.leaf[p] - self.before.leaf[p] for p in DIFF_PARTS}
        leaf = _round_to_sum(leaf_d, change)
        assert sum(leaf.values()) == change
        return {"before": b, "after": a, "change": change, "leaf": leaf}

    def _parts_json(self, leaf: Mapping[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for g, keys in GROUPS.items():
            if g == "unknown" and not any(leaf[k] for k in keys):
                continue
            out[g] = sum(leaf[k] for k in keys)
        return out

    def by_part(self) -> dict[str, Any]:
        ints = self.integers()
        leaf = ints["leaf"]
        terms = self._parts_json(leaf)
        before = {p: _round(self.before.leaf[p]) for p in DIFF_PARTS}
        after = {p: _round(self.after.leaf[p]) for p in DIFF_PARTS}
        iv = self.part_intervals_ns
        rows = {}
        for g, keys in GROUPS.items():
            if g not in terms:
                continue
            rows[g] = {
                "before_ns": sum(before[k] for k in keys),
                "after_ns": sum(after[k] for k in keys),
                "change_ns": terms[g],
                "interval_ns": [int(round(x)) for x in iv[g]] if g in iv else None,
            }
        subs = {}
        for k in DIFF_PARTS:
            if k in ("matrix", "vector") and not self.matrix_available:
                continue
            if k in ("memory", "transfer", "unknown"):
                continue
            subs[k] = {
                "before_ns": before[k],
                "after_ns": after[k],
                "change_ns": leaf[k],
                "interval_ns": [int(round(x)) for x in iv[k]] if k in iv else None,
            }
        return {"terms": rows, "leaves": subs}

    def per_rank(self) -> list[dict[str, Any]]:
        """Per rank present in both runs: its own parts' change (sums to its own rounding of the change)."""
        out = []
        common = sorted(set(self.before.per_rank) & set(self.after.per_rank))
        ints = self.integers()
        for r in common:
            d = {p: self.after.per_rank[r][p] - self.before.per_rank[r][p] for p in DIFF_PARTS}
            leaf = _round_to_sum(d, ints["change"])
            out.append(
                {
                    "rank": int(r),
                    "change_ns": {g: sum(leaf[k] for k in keys) for g, keys in GROUPS.items()},
                    "coordination_ns": {k: leaf[k] for k in COORDINATION},
                    "before_ns": {
                        g: _round(sum((self.before.per_rank[r][k] for k in keys), Fraction(0)))
                        for g, keys in GROUPS.items()
                    },
                    "after_ns": {
                        g: _round(sum((self.after.per_rank[r][k] for k in keys), Fraction(0)))
                        for g, keys in GROUPS.items()
                    },
                }
            )
        return out

    def path_change(self) -> dict[str, Any]:
        """The critical path per token, before, after and the change, per (rank, component) and
        the offset, as ints that sum to the per-token figures exactly."""

        def ints(path: Mapping[str, Any]) -> dict[str, int]:
            flat: dict[str, Fraction] = {"offset": Fraction(path["offset"])}
            for r, d in path["by_rank"].items():
                for p in PATH_PARTS:
                    flat[f"{r}:{p}"] = Fraction(d[p])
            return _round_to_sum(flat, _round(Fraction(path["step"])))

        b, a = ints(self.before.path_token), ints(self.after.path_token)
        keys = sorted(set(b) | set(a))
        flat_d = {k: Fraction(a.get(k, 0) - b.get(k, 0)) for k in keys}
        ranks = sorted({int(k.split(":")[0]) for k in keys if k != "offset"})

        def nest(x: Mapping[str, int | Fraction]) -> dict[str, dict[str, int]]:
            return {str(r): {f"{p}_ns": int(x.get(f"{r}:{p}", 0)) for p in PATH_PARTS} for r in ranks}

        by_comp = {p: sum(int(flat_d[f"{r}:{p}"]) for r in ranks if f"{r}:{p}" in flat_d) for p in PATH_PARTS}
        return {
            "before": {"by_rank": nest(b), "offset_ns": b["offset"], "step_ns": sum(b.values())},
            "after": {"by_rank": nest(a), "offset_ns": a["offset"], "step_ns": sum(a.values())},
            "change": {
                "by_rank": nest(flat_d),
                "offset_ns": int(flat_d["offset"]),
                "by_component_ns": by_comp,
                "step_ns": int(sum(flat_d.values())),
            },
        }

    def cause(self) -> dict[str, Any]:
        """The part of the critical path that moved most in the direction of the change: one of
        the path components (with the rank it moved on) or the path offset (the step time outside
        every rank's path: ranks opening their step windows at different times; no rank), and the
        ranks whose wait moved with it. `component` is None when nothing on the path moved in the
        direction of the change."""
        pc = self.path_change()
        ch = pc["change"]
        sign = 1 if self.change_ns >= 0 else -1
        comps = ch["by_component_ns"]
        moved = {**comps, "offset": ch["offset_ns"]}
        # the offset competes with the components: a change that sits in it is not a component's
        best = max((*PATH_PARTS, "offset"), key=lambda p: sign * moved[p])
        comp: str | None = best if sign * moved[best] > 0 else None
        per_rank = {int(r): d[f"{comp}_ns"] for r, d in ch["by_rank"].items()} if comp in PATH_PARTS else {}
        rank = max(per_rank, key=lambda r: sign * per_rank[r]) if per_rank else None
        waits = {
            int(r["rank"]): r["coordination_ns"]["wait"]
            for r in self.per_rank()
            if rank is None or r["rank"] != rank
        }
        return {
            "component": comp,
            "component_change_ns": moved[comp] if comp is not None else 0,
            "rank": rank,
            "rank_change_ns": per_rank.get(rank, 0) if rank is not None else 0,
            "by_rank_ns": {str(r): v for r, v in sorted(per_rank.items())},
            "offset_change_ns": int(ch["offset_ns"]),
            "wait_change_ns": {str(r): v for r, v in sorted(waits.items())},
        }

    def _component_words(self, comp: str) -> str:
        gpu = self.after.parts.timeline == "gpu"
        return {
            "host": "host time (launch gaps and host work before its collectives)"
            if gpu
            else "host time (time between its ops: Python, sleeps, scheduling)",
            "compute": "compute",
            "memory": "memory copies",
            "transfer": "collective transfer" if gpu else "gloo exchange",
            "sync": "host-device synchronisation",
            "unknown": "unclassified kernels",
        }[comp]

    def moved(self) -> str:
        """What moved, one clause: the dominant term and its coordination split."""
        terms = self.by_part()["terms"]
        sign = 1 if self.change_ns >= 0 else -1
        top = max(terms, key=lambda g: sign * terms[g]["change_ns"])
        text = f"{top} {units.ms_or_us_signed(terms[top]['change_ns'])}"
        if top == "coordination":
            leaves = self.integers()["leaf"]
            text += " (" + ", ".join(f"{k} {units.ms_or_us_signed(leaves[k])}" for k in COORDINATION) + ")"
        if top == "compute" and self.matrix_available:
            leaves = self.integers()["leaf"]
            text += f" (matrix {units.ms_or_us_signed(leaves['matrix'])}, vector {units.ms_or_us_signed(leaves['vector'])})"
        return text

    def cause_sentence(self) -> str:
        c = self.cause()
        if c["component"] == "offset":
            return (
                f"On the critical path, nothing moved: the change sits in the path offset "
                f"({units.ms_or_us_signed(c['component_change_ns'])} per token), the step time outside every rank's path "
                "(the ranks' step windows open at different times)."
            )
        if c["rank"] is None or c["component_change_ns"] == 0:
            return ""
        text = (
            f"On the critical path, {self._component_words(c['component'])} "
            f"{units.ms_or_us_signed(c['component_change_ns'])} per token, on rank {c['rank']} "
            f"({units.ms_or_us_signed(c['rank_change_ns'])}"
        )
        others = [
            f"rank {r} {units.ms_or_us_signed(v)}"
            for r, v in c["by_rank_ns"].items()
            if int(r) != c["rank"] and v
        ]
        text += ("; " + ", ".join(others) if others else "") + ")"
        sign = 1 if self.change_ns >= 0 else -1
        waits = [
            (r, v) for r, v in c["wait_change_ns"].items() if sign * v > 0.1 * abs(float(self.change_ns))
        ]
        if waits:
            verb = "waits" if sign > 0 else "waits less:"
            text += "; the consequence: " + ", ".join(
                f"rank {r} {verb} {units.ms_or_us_signed(v)}" for r, v in waits
            )
            text += " per token at the collectives"
        return text + "."

    def verdict(self) -> str:
        ints = self.integers()
        word = self.verdict_word()
        rel = self.relative
        lo, hi = self.relative_interval
        if word == CANNOT_JUDGE:
            why = self.cannot_judge or "no interval could be computed"
            return (
                f"Cannot judge: the runs have too few comparable steps ({why}): {units.ms_or_us(ints['after'])} per token "
                f"after vs {units.ms_or_us(ints['before'])} before ({units.ms_or_us_signed(ints['change'])}, {_pct_signed(rel)}), "
                "no interval; capture more steps of the same kind and batch size."
            )
        head = (
            f"{word.capitalize()}: {units.ms_or_us(ints['after'])} per token after vs {units.ms_or_us(ints['before'])} before "
            f"({units.ms_or_us_signed(ints['change'])}, {_pct_signed(rel)}; 95% interval {_pct_signed(lo)} to {_pct_signed(hi)}; "
            f"{_SOURCE_WORDS[self.per_token_source]})."
        )
        if word == "no significant change":
            return head
        tail = f" What moved: {self.moved()}."
        cause = self.cause_sentence()
        return head + tail + (f" {cause}" if cause else "")

    def gate_line(self, pct: float) -> str:
        """The one line `--fail-if-slower` prints."""
        lo = self.relative_interval[0]
        cause = self.cause()
        where = ""
        if cause["component"] == "offset":
            where = f"; critical path: the path offset {units.ms_or_us_signed(cause['component_change_ns'])}"
        elif cause["rank"] is not None and cause["component_change_ns"]:
            where = (
                f"; critical path: {cause['component']} time on rank {cause['rank']} "
                f"{units.ms_or_us_signed(cause['rank_change_ns'])}"
            )
        return (
            f"slower by {_pct_signed(self.relative)} per token ({units.ms_or_us(self.integers()['before'])} -> "
            f"{units.ms_or_us(self.integers()['after'])}; 95% lower bound {_pct_signed(lo)} > {pct:g}%): {self.moved()}{where}"
        )

    def fails(self, pct: float) -> bool:
        return self.relative_interval[0] * 100.0 > pct

    # ---- dilation

    def dilation(self) -> dict[str, Any]:
        ab, aa = self.before.applied, self.after.applied
        out: dict[str, Any] = {
            "definition": "profiled / unprofiled per-token time as the capture's alternating rounds measured it "
            "(the shortfall's applied factor D; the corrected per-token time is the traced one / D)",
            "before": ab.to_json(),
            "after": aa.to_json(),
            "ratio": None,
            "traced_change": None,
            "unprofiled_change": None,
            "warning": None,
        }
        if ab.unprofiled_mean_ns and aa.unprofiled_mean_ns:
            # the unprofiled passes' own means: a cross-check of the corrected change
            out["unprofiled_change"] = float(aa.unprofiled_mean_ns / ab.unprofiled_mean_ns) - 1.0
        tb, ta = self.before.parts.per_token["window"], self.after.parts.per_token["window"]
        traced_change = float(ta / tb - 1) if tb else None
        out["traced_change"] = traced_change
        if ab.factor is None or aa.factor is None:
            missing = [s.label for s, a in ((self.before, ab), (self.after, aa)) if a.factor is None]
            out["warning"] = (
                f"dilation unknown for the {' and '.join(missing)} run (no unprofiled timing): whether the "
                "profiler's cost differs between the runs cannot be checked"
            )
            return out
        ratio = aa.factor / ab.factor
        out["ratio"] = ratio
        effect = ratio - 1.0
        apart = False
        if ab.interval and aa.interval:
            apart = ab.interval[1] < aa.interval[0] or aa.interval[1] < ab.interval[0]
        differs = apart or abs(effect) > DILATION_WARN
        if differs and traced_change is not None and abs(effect) >= 0.5 * abs(traced_change):
            if self.per_token_source == "trace":
                consequence = (
                    "the per-token times here are the traced ones, so the change may be the profiler's"
                )
            else:
                consequence = (
                    "each run's per-token time is its traced time divided by its own dilation, so the change "
                    "rests on the two corrections (and the split by part on the reconciliation)"
                )
                ub, ua = ab.unprofiled_mean_ns, aa.unprofiled_mean_ns
                if ub and ua:
                    consequence += (
                        f"; cross-check: the unprofiled passes' own means change by {_pct_signed(float(ua / ub) - 1)} "
                        f"against {_pct_signed(self.relative)} reported"
                    )
            out["warning"] = (
                f"profiler dilation differs: before {ab.factor:.2f}x, after {aa.factor:.2f}x; the profiler "
                f"alone changes the traced per-token time by {_pct_signed(effect)}, against a traced change "
                f"of {_pct_signed(traced_change)}: {consequence}"
            )
        return out

    # ---- tables

    def kernels(self) -> list[dict[str, Any]]:
        return _moved_table(
            self.before.kernels,
            self.after.kernels,
            ["kind", "name"],
            ["count", "time_ns"],
            self.top,
            extra=["cls"],
        )

    def collectives(self) -> list[dict[str, Any]]:
        return _moved_table(
            self.before.collectives,
            self.after.collectives,
            ["op", "bytes"],
            ["count", "wait_ns", "transfer_ns", "time_ns"],
            self.top,
        )

    def to_json(self) -> dict[str, Any]:
        ints = self.integers()
        lo, hi = self.change_interval_ns
        rlo, rhi = self.relative_interval
        side = {}
        for s in (self.before, self.after):
            side[s.label] = {
                "path": s.path,
                "n_ranks": s.parts.n_ranks,
                "timeline": s.parts.timeline,
                "steady_steps": int(len(s.parts.steady)),
                "tokens": sum(len(r) for r in s.samples),
                "rounds": len(s.samples),
                "reconciliation": s.reconciliation,
            }
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "tracekit.diff",
            "runs": side,
            "per_token_source": self.per_token_source,
            "per_token_source_reason": self.source_reason,
            "per_token_ns": {"before": ints["before"], "after": ints["after"]},
            "per_token_interval_ns": {
                k: [int(round(v[0])), int(round(v[1]))] for k, v in self.per_token_intervals_ns.items()
            },
            "change_ns": ints["change"],
            "relative_change": self.relative,
            "interval": {
                "level": BOOTSTRAP_LEVEL,
                "resamples": BOOTSTRAP_RESAMPLES,
                "change_ns": [int(round(lo)), int(round(hi))] if math.isfinite(lo) else None,
                "relative": [rlo, rhi] if math.isfinite(rlo) else None,
            },
            "verdict": self.verdict_word(),
            "summary": self.verdict(),
            "matrix_vector": self.matrix_available,
            "by_part": self.by_part(),
            "per_rank": self.per_rank(),
            "critical_path": self.path_change(),
            "cause": {**self.cause(), "sentence": self.cause_sentence()},
            "kernels": self.kernels(),
            "collectives": self.collectives(),
            "dilation": self.dilation(),
            "data_quality": self.data_quality.to_dict(),
        }


def _moved_table(
    before: pd.DataFrame,
    after: pd.DataFrame,
    keys: list[str],
    values: list[str],
    top: int,
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Rows matched by `keys`, with before / after / change of each value, status new / vanished /
    both, the `top` with the largest |change| of the last value (time)."""
    b = before.set_index(keys) if len(before) else pd.DataFrame(columns=[*extra, *values])
    a = after.set_index(keys) if len(after) else pd.DataFrame(columns=[*extra, *values])
    idx = list(dict.fromkeys([*b.index.tolist(), *a.index.tolist()]))
    rows = []
    main = values[-1]
    for k in idx:
        kt = k if isinstance(k, tuple) else (k,)
        in_b, in_a = k in b.index, k in a.index
        row: dict[str, Any] = {
            key: (int(v) if isinstance(v, int | np.integer) else v) for key, v in zip(keys, kt, strict=True)
        }
        for e in extra:
            row[e] = str((a if in_a else b).loc[k, e])
        row["status"] = "both" if in_b and in_a else ("new" if in_a else "vanished")
        for v in values:
            vb = float(b.loc[k, v]) if in_b else 0.0
            va = float(a.loc[k, v]) if in_a else 0.0
            suffix = "" if v == "count" else ""
            row[f"{v}{suffix}_before"] = vb if v == "count" else int(round(vb))
            row[f"{v}{suffix}_after"] = va if v == "count" else int(round(va))
            row[f"{v}{suffix}_change"] = (va - vb) if v == "count" else int(round(va)) - int(round(vb))
        rows.append(row)
    rows.sort(key=lambda r: (-abs(r[f"{main}_change"]), -abs(r.get("count_change", 0))))
    return rows[:top]


# ------------------------------------------------------------------------------------------
# the comparison


def diff_sides(
    before: Side, after: Side, *, top: int = TOP, dilation_threshold: float = DEFAULT_THRESHOLD
) -> Diff:
    """Compare two attributed runs (module doc)."""
    dq = DataQuality()
    for side in (before, after):
        # counts summed over both runs; each note says which run it is about
        dq.counts.update(side.parts.data_quality.counts)
        for note in side.parts.data_quality.notes:
            dq.add(side.label, 0, note if note.startswith(f"{side.label} (") else f"{side.label}: {note}")
    missing = [s.label for s in (before, after) if s.applied.target_ns is None]
    faster = [
        (s.label, s.applied.factor)
        for s in (before, after)
        if s.applied.factor is not None and s.applied.factor < 1.0 / (1.0 + dilation_threshold)
    ]
    if missing:
        source = "trace"
        reason = (
            f"no unprofiled per-token times for the {' and '.join(missing)} run: both runs use their traced "
            "steady step times (like with like)"
        )
        dq.add("dilation_unknown", len(missing), reason)
    elif faster:
        source = "trace"
        reason = (
            "the unprofiled pass was slower than the traced one ("
            + ", ".join(f"{lbl} dilation {d:.2f}x" for lbl, d in faster)
            + "): a noisy host; both runs use their traced steady step times"
        )
        dq.add("unprofiled_slower_than_profiled", len(faster), reason)
    else:
        source = "unprofiled"
        reason = (
            "both captures measured their dilation D against unprofiled passes: T is the traced per-token time "
            "divided by D, each rank's traced parts reconciled to it (as the shortfall does); the interval's "
            "spread comes from the unprofiled rounds"
        )
        for s in (before, after):
            drift = s.applied.drift
            if drift is not None and abs(drift) > dilation_threshold:
                dq.add(
                    "host_drift_between_rounds",
                    1,
                    f"{s.label}: the traced pass with the profiler's factor removed is {drift:+.0%} off the mean of "
                    "the unprofiled rounds: the host's speed moved between rounds",
                )
    for s in (before, after):
        _settle(s, source)
    if before.parts.n_ranks != after.parts.n_ranks:
        dq.add(
            "rank_counts_differ",
            1,
            f"before has {before.parts.n_ranks} ranks, after {after.parts.n_ranks}: parts are per rank "
            "(mean over ranks); per-rank changes are shown for the ranks in both",
        )
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    # each run's resampled means, relative to its samples' own mean, carried onto its per-token time
    # (the samples are the unprofiled tokens; T is the traced time / D: the same spread, T's centre)
    mb = _boot_means(before.samples, rng, BOOTSTRAP_RESAMPLES) * (
        float(before.per_token_ns) / _pooled_mean(before.samples)
    )
    ma = _boot_means(after.samples, rng, BOOTSTRAP_RESAMPLES) * (
        float(after.per_token_ns) / _pooled_mean(after.samples)
    )
    alpha = (1.0 - BOOTSTRAP_LEVEL) / 2.0
    d = ma - mb
    lo, hi = np.quantile(d, [alpha, 1.0 - alpha])
    ok = mb > 0
    rel = ma[ok] / mb[ok] - 1.0
    rlo, rhi = np.quantile(rel, [alpha, 1.0 - alpha]) if ok.any() else (float("nan"), float("nan"))
    own = {
        "before": tuple(float(x) for x in np.quantile(mb, [alpha, 1.0 - alpha])),
        "after": tuple(float(x) for x in np.quantile(ma, [alpha, 1.0 - alpha])),
    }
    few = [s for s in (before, after) if sum(len(r) for r in s.samples) < MIN_TOKENS_TO_JUDGE]
    cannot = ""
    if few:
        # too few tokens have no meaningful spread: no interval, so no verdict either way (and the
        # gate cannot fail)
        cannot = "; ".join(f"{s.label}: {sum(len(r) for r in s.samples)} token(s)" for s in few) + (
            f", fewer than {MIN_TOKENS_TO_JUDGE}"
        )
        dq.add(
            "too_few_tokens_for_an_interval",
            len(few),
            f"the {' and '.join(s.label for s in few)} run has fewer than {MIN_TOKENS_TO_JUDGE} steady tokens "
            f"({cannot}): no interval, the runs cannot be judged",
        )
    unlike = _unlike_steps(before, after)
    if unlike:
        cannot = "; ".join(x for x in (cannot, unlike) if x)
        dq.add("steps_not_comparable", 1, f"{unlike}: no interval, the runs cannot be judged")
    if cannot:
        lo = hi = rlo = rhi = float("nan")
    part_iv = _part_intervals(before, after, rng)
    return Diff(
        before=before,
        after=after,
        per_token_source=source,
        source_reason=reason,
        change_interval_ns=(float(lo), float(hi)),
        relative_interval=(round(float(rlo), 6), round(float(rhi), 6)),
        part_intervals_ns=part_iv,
        per_token_intervals_ns={k: (v[0], v[1]) for k, v in own.items()},
        data_quality=dq,
        top=top,
        cannot_judge=cannot,
    )


def _token_words(side: Side) -> str:
    tok = side.parts.token_steps
    if tok is None:
        return "every step"
    return f"decode steps of batch size {tok.batch}" if tok.kind == "decode" else "steps of no one kind"


def _unlike_steps(before: Side, after: Side) -> str:
    """Why the two runs' per-token steps are not alike ("" when they are): like with like is decode
    with decode of one batch size (a serving engine's step names say it) or, where no step name
    says a kind, every step of each."""
    tb, ta = before.parts.token_steps, after.parts.token_steps
    key_b = None if tb is None else (tb.kind, tb.batch)
    key_a = None if ta is None else (ta.kind, ta.batch)
    if key_b == key_a and (key_b is None or key_b[0] == "decode"):
        return ""
    return (
        f"the before run's per-token steps are {_token_words(before)}, the after run's {_token_words(after)}: "
        "not like with like"
    )


def _per_step_parts(side: Side) -> pd.DataFrame:
    """Per steady step: each DIFF_PARTS leaf as the mean over ranks (traced)."""
    rs = side.parts.rank_steps.merge(side.steps_matrix, on=["rank", "step"], how="left")
    rs["matrix_ns"] = rs["matrix_ns"].fillna(0).clip(upper=rs["compute_ns"])
    rs["vector_ns"] = rs["compute_ns"] - rs["matrix_ns"]
    cols = [f"{p}_ns" for p in DIFF_PARTS]
    return rs.groupby("step", sort=True)[cols].mean()


def _part_intervals(before: Side, after: Side, rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """95% interval of each part's (and group's) change: bootstrap of the traced steady steps'
    per-step parts (mean over ranks), the difference of means shifted onto the reported change."""
    pb, pa = _per_step_parts(before), _per_step_parts(after)
    if not len(pb) or not len(pa):
        return {}
    names = list(DIFF_PARTS)
    cols = [f"{p}_ns" for p in names]
    vb, va = pb[cols].to_numpy(np.float64), pa[cols].to_numpy(np.float64)
    bb = _boot_steps(vb, rng, BOOTSTRAP_RESAMPLES)
    ba = _boot_steps(va, rng, BOOTSTRAP_RESAMPLES)
    diff_boot = ba - bb
    traced = va.mean(axis=0) - vb.mean(axis=0)
    alpha = (1.0 - BOOTSTRAP_LEVEL) / 2.0
    out: dict[str, tuple[float, float]] = {}
    groups = {**{p: (p,) for p in names}, **GROUPS}
    for g, keys in groups.items():
        j = [names.index(k) for k in keys]
        boot = diff_boot[:, j].sum(axis=1)
        t = float(traced[j].sum())
        rep = float(sum((after.leaf[k] - before.leaf[k] for k in keys), Fraction(0)))
        lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
        out[g] = (float(lo) - t + rep, float(hi) - t + rep)
    return out


def diff(
    before: Run,
    after: Run,
    *,
    before_path: str = "before",
    after_path: str = "after",
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float = DEFAULT_THRESHOLD,
    allow_partial: bool = False,
    top: int = TOP,
) -> Diff:
    """Compare two runs of the same workload (module doc)."""
    kw: dict[str, Any] = {
        "step_pattern": step_pattern,
        "skip_first": skip_first,
        "dilation_threshold": dilation_threshold,
        "allow_partial": allow_partial,
    }
    b = attribute_side(before, label=f"before ({before_path})", path=before_path, **kw)
    a = attribute_side(after, label=f"after ({after_path})", path=after_path, **kw)
    b.label, a.label = "before", "after"
    return diff_sides(b, a, top=top, dilation_threshold=dilation_threshold)
