"""The exact wait / transfer split of the exposed collective time (docs/METHOD.md section Wait and transfer).

`split_exposed(...)` splits the exposed collective time of each (rank, step) window exactly into
wait and transfer (`collective_ns == wait_ns + transfer_ns`, integer ns), with the same priority as
the step partition (compute > memory > collective): see its doc.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tracekit.analyse import intervals

# --------------------------------------------------------------------------------------------
# the exact wait / transfer split of the exposed collective time


def inside_any(us: np.ndarray, ue: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For disjoint sorted [us, ue): is each point x inside one of them?"""
    return np.searchsorted(us, x, side="right") > np.searchsorted(ue, x, side="right")


def split_exposed(
    windows: pd.DataFrame,
    higher: pd.DataFrame,
    per_rank: pd.DataFrame,
    collective: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Exact exposed wait / transfer of the collective part, per (rank, step) window.

    - `windows`: rank, step, start_ns, end_ns (the step windows of the partition).
    - `higher`: rank, start_ns, end_ns: the intervals of the classes that outrank the collective
      in the partition (compute, memory) on each rank's timeline.
    - `per_rank`: `CollectiveInstances.per_rank`; the pieces are cut on each rank's own clock
      (`raw_*_ns`, `arrival_raw_ns`), where `windows`, `higher` and `collective` live.
    - `collective`: rank, start_ns, end_ns: the collective-class intervals of the partition's
      timeline; default: the matched collective intervals. Time under a collective interval but
      under no wait/transfer piece (a collective the matching did not cover) counts as wait.

    Each collective interval is cut at a (the last arrival) into a wait piece [s, min(e, a)) and a
    transfer piece [max(s, a), e). Within a window, a nanosecond is exposed collective when it is
    under a collective interval and under no `higher` interval; it is transfer when it is also under
    a transfer piece (a transfer on one stream outranks a wait on another), else wait. So
    `collective_ns == wait_ns + transfer_ns` exactly. Returns rank, step, collective_ns, wait_ns,
    transfer_ns (int64), one row per window.
    """
    rows = []
    pr = per_rank
    if "arrival_raw_ns" not in pr.columns:  # a bare table: compute a on its clock
        pr = pr.assign(
            arrival_raw_ns=pr.groupby("instance")["start_ns"].transform("max") if len(pr) else pr["start_ns"],
            raw_start_ns=pr["start_ns"],
            raw_end_ns=pr["end_ns"],
        )
    coll_src = (
        collective
        if collective is not None
        else pd.DataFrame({"rank": pr["rank"], "start_ns": pr["raw_start_ns"], "end_ns": pr["raw_end_ns"]})
    )
    for r, w in windows.groupby("rank", sort=True):
        w = w.sort_values("start_ns")
        ws = w["start_ns"].to_numpy(np.int64)
        we = w["end_ns"].to_numpy(np.int64)
        h = higher[higher["rank"] == r]
        hs, he = intervals.union(h["start_ns"].to_numpy(), h["end_ns"].to_numpy())
        c = coll_src[coll_src["rank"] == r]
        cs, ce = intervals.union(c["start_ns"].to_numpy(), c["end_ns"].to_numpy())
        p = pr[pr["rank"] == r]
        s = p["raw_start_ns"].to_numpy(np.int64)
        e = p["raw_end_ns"].to_numpy(np.int64)
        aa = p["arrival_raw_ns"].to_numpy(np.int64)
        ts, te = intervals.union(np.maximum(s, aa), e)
        pts = np.unique(np.concatenate([ws, we, hs, he, cs, ce, ts, te]))
        if pts.size < 2:
            seg_len = np.zeros(0, np.int64)
            x = np.zeros(0, np.int64)
        else:
            x = pts[:-1]
            seg_len = np.diff(pts)
        widx = np.searchsorted(ws, x, side="right") - 1
        in_w = (widx >= 0) & (x < we[np.clip(widx, 0, None)]) if x.size else np.zeros(0, bool)
        exposed = in_w & inside_any(cs, ce, x) & ~inside_any(hs, he, x)
        tr = exposed & inside_any(ts, te, x)
        wt = exposed & ~tr
        n = len(w)
        coll_ns = np.bincount(widx[exposed], weights=seg_len[exposed], minlength=n).astype(np.int64)
        tr_ns = np.bincount(widx[tr], weights=seg_len[tr], minlength=n).astype(np.int64)
        wt_ns = np.bincount(widx[wt], weights=seg_len[wt], minlength=n).astype(np.int64)
        rows.append(
            pd.DataFrame(
                {
                    "rank": np.full(n, r, dtype=np.int64),
                    "step": w["step"].to_numpy(np.int64),
                    "collective_ns": coll_ns,
                    "wait_ns": wt_ns,
                    "transfer_ns": tr_ns,
                }
            )
        )
    if not rows:
        return pd.DataFrame(
            {c: pd.Series(dtype="int64") for c in ("rank", "step", "collective_ns", "wait_ns", "transfer_ns")}
        )
    out = pd.concat(rows, ignore_index=True)
    assert (out["collective_ns"] == out["wait_ns"] + out["transfer_ns"]).all()
    return out
