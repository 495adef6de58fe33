"""Steps matched across ranks by their collective sequence (docs/METHOD.md section Clocks and step
matching).

A run's ranks number their steps each on their own (a step annotation's number, or the order of
the windows on the rank), and nothing makes rank 1's step 7 the same token as rank 0's: a rank
whose profiler started one step later, or whose annotation counts from another base, is off by
one, and joining by number pairs a token with its neighbour. What does make two windows the same
token is the collectives in them: the k-th matched collective instance is the same call on every
rank (`tracekit.analyse.collectives`), so the window that holds it is the same step everywhere.

`step_tokens(windows, per_rank)` maps every (rank, step) window to a run-level token index:

1. per window, its *anchor*: the first matched collective instance (by start on the rank's own
   clock) whose start the window holds (`collectives.assign_steps`);
2. the reference rank is the lowest rank; a window of any rank whose anchor is the anchor of a
   reference window takes that window's step number as its token (so a run whose ranks agree
   keeps its numbers, and the figures of a run with renumbered ranks are those of the original);
3. a window without a collective takes the token of the reference window at the same distance
   (in windows) from its anchored neighbours, when the neighbours on both sides (or the one there
   is) agree on that distance and that reference window has no collective either;
4. every other window gets a token of its own, above every step number (it is then "not on every
   rank" and left out of the per-token figures, as the shortfall does with missing steps).

With one rank, or without matched collectives, the tokens are the step numbers (cross-rank
figures without collectives are refused: `collectives.require_aligned`).
`renumber_steps(frame, tokens)` puts the tokens in a frame's `step` column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.analyse.collectives import assign_steps

#: Columns of `StepTokens.table`.
TOKEN_COLUMNS: tuple[str, ...] = ("rank", "step", "token", "anchor")


@dataclass
class StepTokens:
    """`step_tokens`' result.

    - `table`: one row per window: rank, step (the rank's own number), token (the run-level index
      every rank's window of that token shares), anchor (the window's first matched collective
      instance, -1 when it holds none).
    - `method`: "collective sequence" | "step numbers" (one rank, or no matched collectives).
    - `renumbered`: rank -> how many of its windows' tokens differ from their step numbers.
    - `unmatched`: rank -> how many of its windows match no reference window (own tokens).
    - `reference`: the reference rank.
    """

    table: pd.DataFrame
    method: str
    reference: int | None
    renumbered: dict[int, int] = field(default_factory=dict)
    unmatched: dict[int, int] = field(default_factory=dict)

    def mapping(self) -> dict[tuple[int, int], int]:
        """(rank, step) -> token."""
        t = self.table
        return {
            (int(r), int(s)): int(k)
            for r, s, k in zip(t["rank"].to_numpy(), t["step"].to_numpy(), t["token"].to_numpy(), strict=True)
        }

    def notes(self) -> list[tuple[str, int, str]]:
        """(data-quality key, count, note) for what the matching changed or could not match."""
        out = []
        moved = {r: n for r, n in self.renumbered.items() if n}
        if moved:
            out.append(
                (
                    "steps_renumbered_by_collectives",
                    sum(moved.values()),
                    "step numbers differ across ranks for the same collectives ("
                    + ", ".join(f"rank {r}: {n} window(s)" for r, n in sorted(moved.items()))
                    + f"): steps are joined by their collective sequence, numbered as rank {self.reference}'s",
                )
            )
        lost = {r: n for r, n in self.unmatched.items() if n}
        if lost:
            out.append(
                (
                    "steps_unmatched_across_ranks",
                    sum(lost.values()),
                    "step windows whose collectives match no window of rank "
                    f"{self.reference} ("
                    + ", ".join(f"rank {r}: {n}" for r, n in sorted(lost.items()))
                    + "): they are steps of their own rank only, left out of the per-token figures",
                )
            )
        return out


def _identity(w: pd.DataFrame, method: str, reference: int | None) -> StepTokens:
    t = pd.DataFrame(
        {
            "rank": w["rank"].to_numpy(np.int64),
            "step": w["step"].to_numpy(np.int64),
            "token": w["step"].to_numpy(np.int64),
            "anchor": np.full(len(w), -1, dtype=np.int64),
        }
    )
    return StepTokens(t, method, reference)


def step_tokens(windows: pd.DataFrame, per_rank: pd.DataFrame) -> StepTokens:
    """Each rank's step windows mapped to run-level tokens by their collective sequence (module
    doc). `windows`: rank, step, start_ns, end_ns (each rank's own clock); `per_rank`: the matched
    collectives (`CollectiveInstances.per_rank`: instance, rank, raw_start_ns)."""
    w = windows[["rank", "step", "start_ns", "end_ns"]].reset_index(drop=True)
    ranks = sorted(int(r) for r in pd.unique(w["rank"]))
    if len(ranks) <= 1:
        return _identity(w, "step numbers", ranks[0] if ranks else None)
    if per_rank.empty:
        return _identity(w, "step numbers", ranks[0])
    pr = per_rank[["rank", "instance", "raw_start_ns"]]
    step_of = assign_steps(pr.assign(start_ns=pr["raw_start_ns"]), w)
    pr = pr.assign(step=step_of.to_numpy(np.int64))
    pr = pr[pr["step"] >= 0]
    first = pr.sort_values(["rank", "step", "raw_start_ns", "instance"]).drop_duplicates(["rank", "step"])
    anchor_of = {
        (int(r), int(s)): int(i)
        for r, s, i in zip(
            first["rank"].to_numpy(), first["step"].to_numpy(), first["instance"].to_numpy(), strict=True
        )
    }
    ref = ranks[0]
    w = w.sort_values(["rank", "start_ns", "step"], kind="stable").reset_index(drop=True)
    anchors = np.array(
        [
            anchor_of.get((int(r), int(s)), -1)
            for r, s in zip(w["rank"].to_numpy(), w["step"].to_numpy(), strict=True)
        ],
        dtype=np.int64,
    )
    w["anchor"] = anchors
    ref_w = w[w["rank"] == ref]
    ref_steps = ref_w["step"].to_numpy(np.int64)
    ref_anchor = ref_w["anchor"].to_numpy(np.int64)
    ref_by_anchor = {int(a): j for j, a in enumerate(ref_anchor) if a >= 0}
    if not ref_by_anchor:
        return _identity(w, "step numbers", ref)
    fresh = int(max(int(w["step"].max()), 0)) + 1
    token = np.full(len(w), -1, dtype=np.int64)
    renumbered: dict[int, int] = {}
    unmatched: dict[int, int] = {}
    for r in ranks:
        idx = np.flatnonzero(w["rank"].to_numpy() == r)
        if r == ref:
            token[idx] = ref_steps
            continue
        a = anchors[idx]
        # the reference window (by position) of each anchored window; -1 when its anchor is not one
        j_of = np.array([ref_by_anchor.get(int(x), -1) if x >= 0 else -1 for x in a], dtype=np.int64)
        pos = np.arange(len(idx))
        known = np.flatnonzero(j_of >= 0)
        d_known = j_of[known] - pos[known]
        used: set[int] = set(int(j) for j in j_of[known])
        for k in range(len(idx)):
            j = int(j_of[k])
            if j < 0 and a[k] < 0 and known.size:
                # a window without a collective: the distance its anchored neighbours agree on
                at = int(np.searchsorted(known, k))
                ds = {int(d_known[at - 1])} if at > 0 else set()
                if at < known.size:
                    ds.add(int(d_known[at]))
                if len(ds) == 1:
                    jj = k + ds.pop()
                    if 0 <= jj < len(ref_steps) and ref_anchor[jj] < 0 and jj not in used:
                        j = jj
                        used.add(jj)
            if j >= 0:
                token[idx[k]] = ref_steps[j]
            else:
                token[idx[k]] = fresh
                fresh += 1
                unmatched[r] = unmatched.get(r, 0) + 1
        steps_r = w["step"].to_numpy(np.int64)[idx]
        renumbered[r] = int((token[idx] != steps_r).sum()) - unmatched.get(r, 0)
    # unmatched reference windows: those no other rank's window took
    taken = {int(t) for r in ranks if r != ref for t in token[w["rank"].to_numpy() == r]}
    lost_ref = int(sum(1 for s in ref_steps if int(s) not in taken))
    if lost_ref:
        unmatched[ref] = lost_ref
    t = pd.DataFrame(
        {
            "rank": w["rank"].to_numpy(np.int64),
            "step": w["step"].to_numpy(np.int64),
            "token": token,
            "anchor": anchors,
        }
    )
    return StepTokens(t, "collective sequence", ref, renumbered, unmatched)


def renumber_steps(frame: pd.DataFrame, tokens: StepTokens) -> pd.DataFrame:
    """`frame` (with rank and step columns: windows, a partition table) with each (rank, step)
    replaced by its token; a copy. Rows whose window `tokens` does not know keep their number."""
    if frame.empty or tokens.method == "step numbers":
        return frame.copy()
    t = tokens.table
    key_t = t["rank"].to_numpy(np.int64) * (1 << 40) + t["step"].to_numpy(np.int64)
    mp = pd.Series(t["token"].to_numpy(np.int64), index=key_t)
    key_f = frame["rank"].to_numpy(np.int64) * (1 << 40) + frame["step"].to_numpy(np.int64)
    out = frame.copy()
    new = mp.reindex(key_f).to_numpy()
    out["step"] = np.where(pd.isna(new), frame["step"].to_numpy(np.int64), new).astype(np.int64)
    return out


def as_tokens(windows: pd.DataFrame, per_rank: pd.DataFrame) -> pd.DataFrame:
    """`windows` renumbered by `step_tokens(windows, per_rank)`: the steps as `attribute_run`
    joined them (for a caller that found the windows again from the events)."""
    return renumber_steps(windows, step_tokens(windows, per_rank))
