"""Steps matched across ranks by their collective sequence (docs/METHOD.md section Clocks and step
matching).

A run's ranks number their steps each on their own (a step annotation's number, or the order of
the windows on the rank), and nothing makes rank 1's step 7 the same token as rank 0's: a rank
whose profiler started one step later, or whose annotation counts from another base, is off by
one, and joining by number pairs a token with its neighbour. What does make two windows the same
token is the collectives in them: the k-th matched collective instance is the same call on every
rank (`tracekit.analyse.collectives.matching`), so the window that holds it is the same step everywhere.

`step_tokens(windows, per_rank)` maps every (rank, step) window to a run-level token index:

1. per window, its *anchor*: the first matched collective instance (by start on the rank's own
   clock) whose start the window holds (`windows.assign_steps`);
2. the reference rank is the lowest rank, and its step numbers are the tokens (so a run whose
   ranks agree keeps its numbers, and the figures of a run with renumbered ranks are those of the
   original); the other ranks follow, each the one sharing the most instances with the ranks
   done: a window takes the token of the window (on a rank done) that holds the earliest of its
   instances any of them holds (a rank of another process group reaches the reference through a
   rank it shares calls with); a token already taken on the rank is not taken twice;
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

from tracekit.analyse.timeline.windows import assign_steps

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
        if moved := {r: n for r, n in self.renumbered.items() if n}:
            out.append(
                (
                    "steps_renumbered_by_collectives",
                    sum(moved.values()),
                    f"step numbers differ across ranks for the same collectives ({_per_rank(moved, ' window(s)')}): "
                    f"steps are joined by their collective sequence, numbered as rank {self.reference}'s",
                )
            )
        if lost := {r: n for r, n in self.unmatched.items() if n}:
            out.append(
                (
                    "steps_unmatched_across_ranks",
                    sum(lost.values()),
                    f"step windows whose collectives match no window of rank {self.reference} ({_per_rank(lost)}): "
                    "they are steps of their own rank only, left out of the per-token figures",
                )
            )
        return out


def _per_rank(counts: dict[int, int], unit: str = "") -> str:
    """ "rank 0: 2<unit>, rank 1: 1<unit>", by rank."""
    return ", ".join(f"rank {r}: {n}{unit}" for r, n in sorted(counts.items()))


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
    if len(ranks) <= 1 or per_rank.empty:
        return _identity(w, "step numbers", ranks[0] if ranks else None)
    w = w.sort_values(["rank", "start_ns", "step"], kind="stable").reset_index(drop=True)
    pr = per_rank[["rank", "instance", "raw_start_ns"]]
    pr = pr.assign(step=assign_steps(pr.assign(start_ns=pr["raw_start_ns"]), w).to_numpy(np.int64))
    pr = pr[pr["step"] >= 0].sort_values(["rank", "step", "raw_start_ns", "instance"])
    # per (rank, step) window: its matched instances in start order (the first is its anchor)
    held: dict[tuple[int, int], list[int]] = {}
    for r, st, i in zip(pr["rank"].to_numpy(), pr["step"].to_numpy(), pr["instance"].to_numpy(), strict=True):
        held.setdefault((int(r), int(st)), []).append(int(i))
    w_rank = w["rank"].to_numpy(np.int64)
    w_step = w["step"].to_numpy(np.int64)
    anchors = np.array([held.get((int(r), int(st)), [-1])[0] for r, st in zip(w_rank, w_step, strict=True)])
    ref = ranks[0]
    ref_idx = np.flatnonzero(w_rank == ref)
    ref_steps = w_step[ref_idx]
    if not (anchors[ref_idx] >= 0).any():
        return _identity(w, "step numbers", ref)
    ref_pos = {int(st): j for j, st in enumerate(ref_steps)}  # a reference token -> its position
    ref_held = anchors[ref_idx] >= 0
    token = np.full(len(w), -1, dtype=np.int64)
    token[ref_idx] = ref_steps
    # instance -> the token of the window holding it, on the ranks tokenized so far; per rank, how
    # many of its instances that map holds (counted as the map grows, not recounted per rank and
    # round: that was ranks^2 x instances on the client)
    inst_token: dict[int, int] = {}
    holders: dict[int, list[int]] = {}
    for rk, i in zip(pr["rank"].to_numpy(), pr["instance"].to_numpy(), strict=True):
        holders.setdefault(int(i), []).append(int(rk))
    shared = dict.fromkeys(ranks, 0)

    def learn(idx: np.ndarray) -> None:
        for k in idx:
            if token[k] >= 0:
                for i in held.get((int(w_rank[k]), int(w_step[k])), []):
                    if i not in inst_token:
                        inst_token[i] = int(token[k])
                        for q in holders.get(i, ()):
                            if q in shared:
                                shared[q] += 1

    learn(ref_idx)
    fresh = int(max(int(w_step.max()), 0)) + 1
    renumbered: dict[int, int] = {}
    unmatched: dict[int, int] = {}
    todo = [r for r in ranks if r != ref]
    while todo:
        # the next rank: the one sharing the most instances with the ranks tokenized (ties: lowest)
        r = max(todo, key=lambda x: (shared[x], -x))
        todo.remove(r)
        idx = np.flatnonzero(w_rank == r)
        # each window: the token of the earliest of its instances a tokenized window holds
        got = np.full(len(idx), -1, dtype=np.int64)
        used: set[int] = set()
        for k, wi in enumerate(idx):
            for i in held.get((r, int(w_step[wi])), []):
                t = inst_token.get(i)
                if t is not None:
                    if t not in used:
                        got[k] = t
                        used.add(t)
                    break
        # a window without a collective: the reference window at the distance (in windows) its
        # anchored neighbours agree on, when that window holds no collective either
        j_of = np.array([ref_pos.get(int(t), -1) if t >= 0 else -1 for t in got], dtype=np.int64)
        known = np.flatnonzero(j_of >= 0)
        d_known = j_of[known] - known
        for k, wi in enumerate(idx):
            if got[k] >= 0 or anchors[wi] >= 0 or not known.size:
                continue
            at = int(np.searchsorted(known, k))
            ds = {int(d_known[at - 1])} if at > 0 else set()
            if at < known.size:
                ds.add(int(d_known[at]))
            if len(ds) == 1:
                j = k + ds.pop()
                if 0 <= j < len(ref_steps) and not ref_held[j] and int(ref_steps[j]) not in used:
                    got[k] = int(ref_steps[j])
                    used.add(int(ref_steps[j]))
        lost = got < 0
        unmatched[r] = int(lost.sum())
        got[lost] = np.arange(fresh, fresh + int(lost.sum()), dtype=np.int64)
        fresh += int(lost.sum())
        token[idx] = got
        renumbered[r] = int(((got != w_step[idx]) & ~lost).sum())
        learn(idx)
    # reference windows no other rank's window took
    taken = {int(t) for t in token[w_rank != ref]}
    lost_ref = int(sum(1 for st in ref_steps if int(st) not in taken))
    if lost_ref:
        unmatched[ref] = lost_ref
    t = pd.DataFrame({"rank": w_rank, "step": w_step, "token": token, "anchor": anchors.astype(np.int64)})
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
