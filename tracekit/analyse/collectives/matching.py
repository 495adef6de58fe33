"""One collective across ranks: matching, clock alignment, wait vs transfer (docs/METHOD.md section Wait and transfer).

`match_collectives(events)` takes a (classified or not) event table of one run and returns
`CollectiveInstances`:

- per instance: a = max_r s_r (last arrival), the last-arriving rank, skew = max s - min s;
  per rank wait = min(e_r, a) - s_r and transfer = e_r - max(s_r, a); bytes (nccl-tests size),
  realised algbw / busbw from the mean transfer time (`tracekit.analyse.collectives.bandwidth`).
  A rank whose collective ends before the last arrival (an inconsistent trace) gets transfer 0 and
  is counted in `data_quality` (`collective_end_before_last_arrival`): nothing is clamped silently.
- `stragglers`: per rank, how often it arrived last.

The pieces: which events are the collective intervals (`select`), the groups and the matching
within a group (`groups`), the clocks (`clocks`), the clock check and the stragglers (`checks`),
the message sizes from the manifest (`sizes`), the result (`instances`); the exact wait /
transfer split of the exposed time (`exposed`).

Everything is vectorised over the table (numpy / pandas groupby); no Python loop per event.

"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.collectives.bandwidth import nccl_tests_size, safe_bus_factor
from tracekit.analyse.collectives.checks import end_spread_check, straggler_counts
from tracekit.analyse.collectives.clocks import align_clocks
from tracekit.analyse.collectives.groups import (
    expected_ranks,
    group_keys,
    instance_keys,
    members_without_events,
    window_ordinals,
    without_events_message,
    world_size,
)
from tracekit.analyse.collectives.instances import PARTIAL_HINT, PER_RANK_COLUMNS, CollectiveInstances
from tracekit.analyse.collectives.select import select_collective_events
from tracekit.analyse.collectives.sizes import fill_bytes_from_manifest
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.errors import MatchError
from tracekit.model.documents.manifest import Manifest
from tracekit.model.events import DataQuality

# --------------------------------------------------------------------------------------------
# the main entry


def _empty_per_rank() -> pd.DataFrame:
    return pd.DataFrame(
        {c: pd.Series(dtype="object" if c in ("group", "op") else "int64") for c in PER_RANK_COLUMNS}
    )


def match_collectives(
    events: pd.DataFrame,
    *,
    ranks: list[int] | None = None,
    rank_info: Mapping[int, Mapping[str, Any]] | None = None,
    manifest: Manifest | None = None,
    allow_partial: bool = False,
    clock: str = "auto",
    steps: pd.DataFrame | None = None,
    end_spread_threshold_ns: int | None = None,
) -> CollectiveInstances:
    """Match the collectives of one run across its ranks and compute wait/transfer per rank.

    `ranks`: the run's ranks (default: those in the table); `rank_info` / `manifest`: the Run's,
    used for the hosts (clock), the world size and the decoder's collectives (bytes the trace
    lacks, `fill_bytes_from_manifest`). `clock`: "auto" / "estimate" (the offsets estimated from
    the matched collectives and applied: `_clock`), "shared" (the clocks used as they are: the
    caller states they are one).
    `steps`: the step windows (rank, step, start_ns, end_ns) when the caller has them; found in
    `events` when the manifest fill needs them. Raises MatchError when counts differ, when a rank
    of the run that belongs to a group recorded none of its collectives while others did, or when a
    group names ranks that are not in the run (the last two unless `allow_partial`).
    `end_spread_threshold_ns`: the clock check's threshold (default by level,
    `END_SPREAD_THRESHOLD_NS`; see `end_spread_check`).
    """
    dq = DataQuality()
    run_ranks = sorted(ranks) if ranks is not None else sorted(int(r) for r in events["rank"].unique())
    sel, level = select_collective_events(events)
    sel["group"] = group_keys(sel) if len(sel) else np.zeros(0, dtype=object)
    if steps is not None and len(sel) and len(steps) and level == "gpu_kernel":
        # collective kernels without sequence numbers are matched by their order within each
        # stream and step (`match_by_step_order`); the step of each is the window holding its
        # start. Not gloo's ranges: a rank's gloo work runs on whichever worker thread is free
        sel["step"] = assign_steps(sel, window_ordinals(steps)).to_numpy(np.int64)
    world = world_size(rank_info)

    parts = []
    match_by: dict[str, str] = {}
    for gi, (group, rows) in enumerate(sel.groupby("group", sort=True, observed=True)):
        matched, how = match_group(str(group), gi, rows, run_ranks, world, level, allow_partial, dq)
        match_by[str(group)] = how
        parts.append(matched)
    return matched_collectives(
        parts,
        match_by,
        level,
        dq,
        run_ranks=run_ranks,
        rank_info=rank_info,
        manifest=manifest,
        events=events,
        steps=steps,
        clock=clock,
        end_spread_threshold_ns=end_spread_threshold_ns,
    )


def match_group(
    group: str,
    gi: int,
    rows: pd.DataFrame,
    run_ranks: list[int],
    world: int | None,
    level: str,
    allow_partial: bool,
    dq: DataQuality,
) -> tuple[pd.DataFrame, str]:
    """One process group's collective rows (`select_collective_events`' rows of every rank, in
    the run's row order) matched across ranks: the rows with `seq` (the instance key within the
    group) and `group_index` (`gi`: the group's place among the run's groups, sorted), and how
    they were matched ("seq" | "order"). MatchError (or a note in `dq` with `allow_partial`) for
    a group whose ranks are not all in the run or some of whose members recorded none of its
    collectives. Needs only the group's rows: the Dask engine runs it in tasks that each own a
    hash-partition of the groups."""
    expected, source = expected_ranks(group, rows, run_ranks, world)
    present = sorted(int(r) for r in rows["rank"].unique())
    if expected is not None:
        absent = sorted(set(expected) - set(run_ranks))
        if absent:
            msg = (
                f"collectives of group {group!r} span {len(expected)} ranks ({source}) but the run has only "
                f"ranks {run_ranks}; the last arrival of a collective cannot be known without the other "
                f"{len(absent)} ranks"
            )
            if not allow_partial:
                raise MatchError(msg + f" ({PARTIAL_HINT})")
            dq.add("collective_group_partial", 1, msg + "; matched the ranks present anyway")
    missing_ranks = members_without_events(rows, present, run_ranks, expected)
    if missing_ranks:
        # a member that recorded none of the group's collectives: its arrivals are unknown, so
        # the others' waits would be taken for transfer (docs/METHOD.md section Wait and transfer: refuse when counts differ)
        msg, hint = without_events_message(group, rows, missing_ranks, level)
        if not allow_partial:
            raise MatchError(f"{msg}; {hint} ({PARTIAL_HINT})")
        dq.add(
            "collective_group_ranks_without_events",
            len(missing_ranks),
            f"{msg}; matched the ranks present anyway ({', '.join(map(str, present))}): their waits "
            "count as transfer",
        )
    key, how = instance_keys(group, rows)
    return rows.assign(seq=key.to_numpy(), group_index=gi), how


def matched_collectives(
    parts: list[pd.DataFrame],
    match_by: dict[str, str],
    level: str,
    dq: DataQuality,
    *,
    run_ranks: list[int],
    rank_info: Mapping[int, Mapping[str, Any]] | None = None,
    manifest: Manifest | None = None,
    events: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
    clock: str = "auto",
    end_spread_threshold_ns: int | None = None,
) -> CollectiveInstances:
    """`match_collectives` after the groups are matched (`match_group`, one frame per group in
    group order): instances numbered by their earliest start, bytes from the manifest, clocks,
    wait / transfer per rank, the instance table, stragglers, the clock check. Reads only the
    matched rows (per-collective, a small part of the run); `events` only when the manifest fill
    needs step windows and `steps` is None."""
    if clock not in ("auto", "shared", "estimate"):
        raise ValueError(f"clock must be 'auto', 'shared' or 'estimate', got {clock!r}")
    if parts:
        m = pd.concat(parts, ignore_index=True)
        m["instance_key"] = m["group_index"].astype(np.int64) * (1 << 40) + m["seq"].astype(np.int64)
        keyed = pd.DataFrame(
            {
                "instance": m["instance_key"].to_numpy(np.int64),
                "rank": m["rank"].to_numpy(np.int64),
                "raw_end_ns": m["end_ns"].to_numpy(np.int64),
            }
        )
    else:
        keyed = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("instance", "rank", "raw_end_ns")})
    # the clocks first (they need only the matched keys and ends), so that instances are numbered
    # on the aligned clock: the numbering does not move with one rank's clock
    clock_alignment = align_clocks(
        keyed, run_ranks, rank_info, manifest, dq, clock, level, end_spread_threshold_ns
    )
    if parts:
        off = m["rank"].map(clock_alignment.offsets_ns).fillna(0).astype(np.int64).to_numpy()
        # instances numbered by the earliest start (aligned) of the instance
        m["_first"] = (
            pd.Series(m["start_ns"].to_numpy(np.int64) - off)
            .groupby(m["instance_key"].to_numpy())
            .transform("min")
            .to_numpy()
        )
        order = m.drop_duplicates("instance_key").sort_values(["_first", "instance_key"])["instance_key"]
        m["instance"] = (
            m["instance_key"].map(pd.Series(np.arange(len(order)), index=order.to_numpy())).astype(np.int64)
        )
        per_rank = pd.DataFrame(
            {
                "instance": m["instance"].to_numpy(np.int64),
                "group": m["group"].astype(str).to_numpy(object),
                "rank": m["rank"].to_numpy(np.int64),
                "op": m["op"].to_numpy(object),
                "raw_start_ns": m["start_ns"].to_numpy(np.int64),
                "raw_end_ns": m["end_ns"].to_numpy(np.int64),
                "in_bytes": m["coll_in_bytes"].to_numpy(np.int64),
                "out_bytes": m["coll_out_bytes"].to_numpy(np.int64),
                "event_index": m["event_index"].to_numpy(np.int64),
                "seq": m["seq"].to_numpy(np.int64),
            }
        )
    else:
        per_rank = _empty_per_rank().drop(columns=["start_ns", "end_ns", "wait_ns", "transfer_ns"])
        per_rank = per_rank.drop(columns=["arrival_ns", "arrival_raw_ns"])

    bytes_source = fill_bytes_from_manifest(per_rank, manifest, events, steps, dq)

    offset = (
        per_rank["rank"].map(clock_alignment.offsets_ns).fillna(0).astype(np.int64).to_numpy()
        if len(per_rank)
        else 0
    )
    per_rank["start_ns"] = per_rank["raw_start_ns"].to_numpy(np.int64) - offset
    per_rank["end_ns"] = per_rank["raw_end_ns"].to_numpy(np.int64) - offset

    g = per_rank.groupby("instance", sort=True)
    a = g["start_ns"].transform("max").to_numpy(np.int64)
    s = per_rank["start_ns"].to_numpy(np.int64)
    e = per_rank["end_ns"].to_numpy(np.int64)
    per_rank["wait_ns"] = np.minimum(e, a) - s
    transfer = e - np.maximum(s, a)
    bad = transfer < 0
    if bad.any():
        dq.add(
            "collective_end_before_last_arrival",
            int(bad.sum()),
            f"{int(bad.sum())} collective intervals end before the last rank arrived (inconsistent trace or "
            "clocks); their transfer is counted as 0 and their whole interval as wait",
        )
    per_rank["transfer_ns"] = np.where(bad, 0, transfer).astype(np.int64)
    per_rank["arrival_ns"] = a
    # the last arrival on each rank's own (raw) clock, where the partition of that rank lives
    per_rank["arrival_raw_ns"] = a + offset
    per_rank = per_rank.sort_values(["instance", "rank"], ignore_index=True)

    instances = _instances_table(per_rank, dq)
    instances.insert(
        instances.columns.get_loc("size_bytes") + 1,
        "bytes_source",
        instances["instance"].map(bytes_source).fillna("unknown").astype(object).to_numpy()
        if len(instances)
        else np.zeros(0, dtype=object),
    )
    unknown = int((instances["bytes_source"] == "unknown").sum()) if len(instances) else 0
    if unknown:
        ops = sorted(set(instances.loc[instances["bytes_source"] == "unknown", "op"].astype(str)))
        dq.add(
            "collective_bytes_unknown",
            unknown,
            f"{unknown} collective instance(s) ({', '.join(ops)}) carry no message size in the trace and the "
            "manifest gives none: no realised bandwidth for them",
        )
    stragglers = straggler_counts(instances, per_rank, run_ranks)
    clock_alignment.check = end_spread_check(per_rank, instances, level, dq, end_spread_threshold_ns)
    cols = list(PER_RANK_COLUMNS)
    return CollectiveInstances(
        per_rank=per_rank[cols],
        instances=instances,
        stragglers=stragglers,
        clock=clock_alignment,
        level=level,
        match_by=match_by,
        data_quality=dq,
    )


def _instances_table(per_rank: pd.DataFrame, dq: DataQuality) -> pd.DataFrame:
    cols = [
        "instance",
        "group",
        "seq",
        "op",
        "n_ranks",
        "last_rank",
        "last_tie",
        "arrival_ns",
        "first_start_ns",
        "skew_ns",
        "end_ns",
        "size_bytes",
        "transfer_ns_mean",
        "wait_ns_max",
        "algbw_gbps",
        "busbw_gbps",
        "end_spread_ns",
    ]
    if per_rank.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    g = per_rank.groupby("instance", sort=True)
    # the last-arriving rank: the row with the latest start; ties -> the lowest rank, counted
    srt = per_rank.sort_values(["instance", "start_ns", "rank"], ascending=[True, False, True])
    last = srt.drop_duplicates("instance").set_index("instance")
    n_at_max = (per_rank["start_ns"] == g["start_ns"].transform("max")).groupby(per_rank["instance"]).sum()
    ops = g["op"].agg(lambda x: x.iloc[0])
    if (g["op"].nunique() > 1).any():
        dq.add(
            "collective_op_mismatch",
            int((g["op"].nunique() > 1).sum()),
            "matched instances whose ranks disagree on the op",
        )
    in_b = g["in_bytes"].max()
    out_b = g["out_bytes"].max()
    size = np.array(
        [nccl_tests_size(op, int(i), int(o)) for op, i, o in zip(ops, in_b, out_b, strict=True)],
        dtype=np.int64,
    )
    n = g["rank"].nunique()
    tmean = g["transfer_ns"].mean()
    algbw = np.where((tmean > 0) & (size > 0), size / tmean.replace(0, np.nan), np.nan)
    factor = np.array(
        [safe_bus_factor(op, int(k)) for op, k in zip(ops, n, strict=True)],
        dtype=float,
    )
    ties = n_at_max > 1
    if ties.any():
        dq.add(
            "collective_arrival_ties",
            int(ties.sum()),
            "instances where several ranks arrived last at the same ns (the lowest rank is named)",
        )
    inst = pd.DataFrame(
        {
            "instance": g["instance"].first().index.to_numpy(np.int64),
            "group": g["group"].first().to_numpy(object),
            "seq": g["seq"].first().to_numpy(np.int64),
            "op": ops.to_numpy(object),
            "n_ranks": n.to_numpy(np.int64),
            "last_rank": last["rank"].reindex(ops.index).to_numpy(np.int64),
            "last_tie": ties.reindex(ops.index).to_numpy(bool),
            "arrival_ns": g["start_ns"].max().to_numpy(np.int64),
            "first_start_ns": g["start_ns"].min().to_numpy(np.int64),
            "skew_ns": (g["start_ns"].max() - g["start_ns"].min()).to_numpy(np.int64),
            "end_ns": g["end_ns"].max().to_numpy(np.int64),
            "size_bytes": size,
            "transfer_ns_mean": tmean.to_numpy(float),
            "wait_ns_max": g["wait_ns"].max().to_numpy(np.int64),
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "end_spread_ns": (g["end_ns"].max() - g["end_ns"].min()).to_numpy(np.int64),
        }
    )
    return inst
