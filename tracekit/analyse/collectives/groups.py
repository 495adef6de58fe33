"""Process groups, the ranks each expects, and matching within a group (docs/METHOD.md section Wait and transfer).

- matching across ranks within a process group (`coll_pg_name`, else `coll_pg_ranks`, else one
  `default` group): by `coll_seq` when every event of the group has one; else, for collective
  kernels when the step windows are given, by order within each rank's stream and step (`match_by_step_order`: the
  collectives without NCCL metadata, an engine's custom all-reduce, symmetric memory; docs/METHOD.md,
  Serving engines); else by order of start time on each rank. Different counts -> `MatchError`
  naming the groups (and step), ranks and counts.
  A group whose known size (process-group ranks, group size, or distributedInfo world size) names
  ranks that are not in the run is refused too: the last arrival cannot be known without them
  (`allow_partial=True` matches the ranks present anyway and says so in `data_quality`). So is a
  rank of the run that belongs to a group but recorded none of its collectives while others did
  (its arrivals are unknown: the others' waits would be taken for transfer); a group whose listed
  ranks or size leave that rank out is not refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.collectives.select import LEVEL_WORDS
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.errors import MatchError

# --------------------------------------------------------------------------------------------
# groups, expected ranks, matching


def _parse_ranks(text: str) -> tuple[int, ...] | None:
    nums = re.findall(r"-?\d+", text or "")
    return tuple(int(n) for n in nums) if nums else None


def world_size(rank_info: Mapping[int, Mapping[str, Any]] | None) -> int | None:
    if not rank_info:
        return None
    sizes = set()
    for info in rank_info.values():
        for src in (info, info.get("distributedInfo") or {}, info.get("distributed_info") or {}):
            ws = src.get("world_size") if isinstance(src, Mapping) else None
            if isinstance(ws, int) and ws > 0:
                sizes.add(ws)
    return max(sizes) if sizes else None


def group_keys(sel: pd.DataFrame) -> np.ndarray:
    pg_name = sel["coll_pg_name"].astype(str).to_numpy()
    pg_ranks = sel["coll_pg_ranks"].astype(str).to_numpy()
    return np.where(
        pg_name != "",
        "pg:" + pg_name.astype(object),
        np.where(pg_ranks != "", "ranks:" + pg_ranks.astype(object), "default"),
    )


def expected_ranks(
    group: str, rows: pd.DataFrame, run_ranks: list[int], world_size: int | None
) -> tuple[tuple[int, ...] | None, str]:
    """The ranks a group should have and where that came from (None when nothing says)."""
    pg_ranks = [p for p in rows["coll_pg_ranks"].astype(str).unique() if p]
    if pg_ranks:
        parsed = _parse_ranks(pg_ranks[0])
        if parsed:
            return parsed, "process-group ranks"
    sizes = rows["coll_group_size"].to_numpy()
    sizes = sizes[sizes > 0]
    if sizes.size:
        size = int(sizes.max())
        if size > len(run_ranks):
            return tuple(range(size)), "group size"
        return None, "group size"
    if group == "default" and world_size is not None and world_size > len(run_ranks):
        return tuple(range(world_size)), "distributedInfo world_size"
    return None, ""


def members_without_events(
    rows: pd.DataFrame, present: list[int], run_ranks: list[int], expected: tuple[int, ...] | None
) -> list[int]:
    """The run's ranks that belong to the group but recorded none of its collectives.

    Membership: the group's known ranks when there are any; else, when the group's size is known,
    a rank of the run without events is a member only if the ranks present are fewer than the size
    (which of the others are members is unknown: all are named); else (nothing says) every rank of
    the run is taken to be a member.
    """
    missing = sorted(set(run_ranks) - set(present))
    if not missing:
        return []
    if expected is not None:
        return sorted(set(missing) & set(expected))
    sizes = rows["coll_group_size"].to_numpy() if "coll_group_size" in rows.columns else np.zeros(0)
    sizes = sizes[sizes > 0]
    if sizes.size and int(sizes.max()) <= len(present):
        return []
    return missing


def without_events_message(group: str, rows: pd.DataFrame, missing: list[int], level: str) -> tuple[str, str]:
    """(what is wrong, a guess at why) for a group some of whose member ranks recorded nothing."""
    counts = rows.groupby("rank").size()
    what = LEVEL_WORDS.get(level, "collectives")
    one = len(missing) == 1
    who = f"{'rank' if one else 'ranks'} {', '.join(map(str, missing))}"
    has = ", ".join(f"rank {int(r)} has {int(c)}" for r, c in counts.items())
    hint = "kernels" if level == "gpu_kernel" else "its collective ops"
    return (
        f"collectives: {who} {'has' if one else 'have'} 0 {what} while {has} (group {group!r}): the last "
        "arrival cannot be known",
        f"was {who}'s trace captured without {hint}?",
    )


def instance_keys(group: str, rows: pd.DataFrame) -> tuple[pd.Series, str]:
    """Instance key within the group for each row: the seq number or the order on its rank."""
    seq = rows["coll_seq"].to_numpy()
    if (seq >= 0).all():
        dup = rows.duplicated(["rank", "coll_seq"]).any()
        if not dup:
            per_rank = rows.groupby("rank")["coll_seq"].apply(lambda s: frozenset(s.tolist()))
            all_seqs = frozenset().union(*per_rank.tolist())
            missing = {int(r): sorted(all_seqs - s) for r, s in per_rank.items() if s != all_seqs}
            if missing:
                parts = "; ".join(
                    f"rank {r} lacks {len(m)} (e.g. seq {', '.join(map(str, m[:5]))})"
                    for r, m in sorted(missing.items())
                )
                raise MatchError(
                    f"collectives of group {group!r} cannot be matched by sequence number: "
                    f"{len(all_seqs)} sequence numbers in all, but {parts}"
                )
            return pd.Series(seq, index=rows.index), "seq"
    if "step" in rows.columns and (rows["step"].to_numpy(np.int64) >= 0).any():
        return match_by_step_order(group, rows)
    counts = rows.groupby("rank").size()
    if counts.nunique() > 1:
        detail = ", ".join(f"rank {int(r)}: {int(c)}" for r, c in counts.items())
        raise OrderCountError(
            f"collectives of group {group!r} cannot be matched by order: the ranks recorded different "
            f"counts ({detail}); refusing to guess which calls correspond"
        )
    order = rows.sort_values(["rank", "start_ns", "end_ns"]).groupby("rank").cumcount()
    return order.reindex(rows.index), "order"


class OrderCountError(MatchError):
    """The ranks recorded different counts of a group's collectives, which have no sequence
    numbers (`_match_group` by order over the whole group). An engine that matched without the
    step windows (the Dask engine's bucket tasks) re-matches such a group by step
    (`rematch_by_step`), to refuse with the step the local engine names."""


def rematch_by_step(group: str, rows: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """A group's collective kernels matched by order over the whole group (or refused so), matched
    again as `match_collectives` does with the step windows: rows with `seq` from
    `match_by_step_order` (MatchError naming the step where the ranks disagree)."""
    rows = rows.assign(step=assign_steps(rows, window_ordinals(steps)).to_numpy(np.int64))
    key, how = instance_keys(group, rows)
    return rows.assign(seq=key.to_numpy()), how


def window_ordinals(steps: pd.DataFrame) -> pd.DataFrame:
    """The step windows with `step` replaced by each window's place among its rank's windows (0,
    1, 2, ... in start order): ranks whose step numbers differ (a rank numbering from 1, another
    from 2) still pair their k-th windows."""
    w = steps.sort_values(["rank", "start_ns"], kind="stable")
    return w.assign(step=w.groupby("rank").cumcount().to_numpy(np.int64))


def match_by_step_order(group: str, rows: pd.DataFrame) -> tuple[pd.Series, str]:
    """Instance keys of collectives that carry no NCCL metadata (no sequence number, no process
    group: an engine's custom all-reduce, symmetric-memory kernels), matched across ranks by their
    order within each rank's stream and step: the k-th collective of step window s on a rank's
    j-th collective stream (streams numbered per rank by their first collective; windows by their
    place on the rank, `window_ordinals`) is one instance on every rank. `rows` has `step`
    (`assign_steps`; -1 outside every window, matched as one more step). The ranks must agree on
    every (step, stream) count. Where they do not but agree on every stream's total (a collective
    the ranks' windows split differently), the collectives are matched by their order on each
    stream over the whole run ("order"); where the totals differ too, MatchError naming the first
    step that disagrees, every rank and its count (never a guess at which calls correspond).
    Returns the keys (the instance's place in (step, stream, order) order: 0, 1, 2, ...) and how
    ("step_order" | "order")."""
    step = rows["step"].to_numpy(np.int64)
    rank = rows["rank"].to_numpy(np.int64)
    stream = rows["stream"].to_numpy(np.int64)
    start = rows["start_ns"].to_numpy(np.int64)
    # each rank's collective streams numbered by their first collective (stream ids differ across ranks)
    first = (
        pd.DataFrame({"rank": rank, "stream": stream, "start": start})
        .groupby(["rank", "stream"])["start"]
        .min()
    )
    slot_of = first.groupby(level="rank").rank(method="first").astype(np.int64) - 1
    slot = slot_of.reindex(pd.MultiIndex.from_arrays([rank, stream])).to_numpy(np.int64)
    frame = pd.DataFrame(
        {"rank": rank, "step": step, "slot": slot, "start": start, "end": rows["end_ns"].to_numpy()}
    )
    ranks = sorted(set(rank.tolist()))
    counts = frame.groupby(["step", "slot", "rank"]).size().unstack("rank", fill_value=0)
    counts = counts.reindex(columns=ranks, fill_value=0)
    bad = counts[counts.nunique(axis=1) > 1]
    how = "step_order"
    if len(bad):
        totals = (
            frame.groupby(["slot", "rank"])
            .size()
            .unstack("rank", fill_value=0)
            .reindex(columns=ranks, fill_value=0)
        )
        if (totals.nunique(axis=1) > 1).any():
            (s_, j), row = next(iter(bad.iterrows()))
            where = f"step window {int(s_)} of each rank" if s_ >= 0 else "outside every step window"
            stream_words = (
                f", collective stream {int(j)} of each rank"
                if counts.index.get_level_values("slot").max() > 0
                else ""
            )
            detail = ", ".join(f"rank {int(r)}: {int(c)}" for r, c in row.items())
            raise MatchError(
                f"collectives of group {group!r} carry no sequence numbers and cannot be matched by their order in "
                f"{where}{stream_words}: the ranks recorded different counts ({detail}); "
                f"{len(bad)} (step, stream) cell(s) disagree; refusing to guess which calls correspond"
            )
        # every stream's total agrees: the windows split a collective differently on some rank
        frame["step"] = 0
        step = np.zeros(len(frame), dtype=np.int64)
        how = "order"
    order = (
        frame.sort_values(["rank", "step", "slot", "start", "end"])
        .groupby(["rank", "step", "slot"])
        .cumcount()
    )
    order = order.reindex(frame.index).to_numpy(np.int64)
    packed = ((step + 1) << 40) + (slot << 32) + order
    dense = np.unique(packed, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return pd.Series(dense, index=rows.index), how
