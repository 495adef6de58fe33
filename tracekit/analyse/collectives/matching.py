"""One collective across ranks: matching, clock alignment, wait vs transfer (docs/METHOD.md section Wait and transfer).

`match_collectives(events)` takes a (classified or not) event table of one run and returns
`CollectiveInstances`:

- which events are the collective intervals (`level`): GPU collective kernels when the run has
  any; otherwise, on CPU-only (gloo) runs, the `gloo:<op>` ranges the gloo worker threads record
  around the actual exchange (the caller's `c10d::allreduce_` op only enqueues the work and
  returns); otherwise the outermost host collective ops (`c10d::*`, `record_param_comms`,
  `nccl:*`), nested ones dropped. One interval per rank per collective call.
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
- clock (docs/METHOD.md section Clocks and step matching): each rank's offset is always
  estimated as the median over shared instances of (end_r - end_ref) (collectives end together
  by construction; `estimate_offsets`) and subtracted, whatever the manifest or the host names
  say; offsets and residuals are stated (`clock`, `data_quality`). Where they cannot be
  estimated (several ranks, no collective matched across them, or host ops only, whose ends need
  not agree) `clock.refusal` says so and `require_aligned` refuses cross-rank figures in one
  line. Instances are numbered on the aligned clock. Then the clock check (`end_spread_check`):
  matched instances whose aligned ends differ by more than the level's threshold
  (`END_SPREAD_THRESHOLD_NS`) are counted (`collective_end_spread`), the worst named; the
  summary is `clock.check` (`clock.raw_instances_over`: the same count on the unaligned clocks).
- per instance: a = max_r s_r (last arrival), the last-arriving rank, skew = max s - min s;
  per rank wait = min(e_r, a) - s_r and transfer = e_r - max(s_r, a); bytes (nccl-tests size),
  realised algbw / busbw from the mean transfer time (`tracekit.analyse.collectives.bandwidth`).
  A rank whose collective ends before the last arrival (an inconsistent trace) gets transfer 0 and
  is counted in `data_quality` (`collective_end_before_last_arrival`): nothing is clamped silently.
- `stragglers`: per rank, how often it arrived last.
- bytes: from the trace where the collective interval carries them (NCCL kernel args, the gloo
  op's own shapes or its enqueue's `record_param_comms`: see `tracekit.read.kineto`); else, when
  the run's manifest lists the decoder's collectives (`workload.collectives`), from that list
  (`fill_bytes_from_manifest`); `instances.bytes_source` says which ("trace" | "manifest" |
  "unknown").

`split_exposed(...)` splits the exposed collective time of each (rank, step) window exactly into
wait and transfer (`collective_ns == wait_ns + transfer_ns`, integer ns), with the same priority as
the step partition (compute > memory > collective): see its doc.

Everything is vectorised over the table (numpy / pandas groupby); no Python loop per event.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse import intervals
from tracekit.analyse.collectives.bandwidth import bus_factor, nccl_tests_size
from tracekit.errors import MatchError
from tracekit.model.events import COLLECTIVE_OPS, DataQuality

#: Name patterns -> normalised op, tried in order (the first match wins). Used when `coll_op` is empty.
_OP_PATTERNS: tuple[tuple[str, str], ...] = (
    # custom all-reduce kernels whose names do not say all-reduce (vLLM / SGLang's
    # cross_device_reduce_1stage, TensorRT-LLM's Lamport kernels rmsNormLamport)
    (r"cross_device_reduce|lamport", "all_reduce"),
    (r"reduce_?scatter", "reduce_scatter"),
    (r"all_?gather", "all_gather"),
    (r"all_?reduce", "all_reduce"),
    (r"all_?to_?all", "all_to_all"),
    (r"send_?recv", "send_recv"),
    (r"broadcast", "broadcast"),
    (r"barrier", "barrier"),
    (r"(?<![a-z])reduce", "reduce"),
    (r"gather", "gather"),
    (r"scatter", "scatter"),
    (r"(?<![a-z])send", "send"),
    (r"(?<![a-z])recv", "recv"),
)

_GPU_COLLECTIVE_NAME = re.compile(
    r"nccl|rccl|cross_device_reduce|multimem_all_reduce|allreduce", re.IGNORECASE
)
_HOST_COLLECTIVE_NAME = re.compile(r"^(?:c10d::|record_param_comms$|nccl:|gloo:)")
_GPU_KINDS = ("kernel",)
_KNOWN_OPS = frozenset(COLLECTIVE_OPS)

#: Where an instance's message size came from (`CollectiveInstances.instances.bytes_source`).
BYTES_SOURCES = ("trace", "manifest", "unknown")

#: Default end-spread thresholds of the clock check, per level (`end_spread_check`). A collective
#: ends on every rank when its data has arrived everywhere, so matched instances end together on
#: one clock. Measured on the committed traces (docs/METHOD-NOTES.md, Collectives, "Clock check"):
#: NCCL kernels on one host end within 0.55 us (p99), 4.1 us at most (the first call of an nsys
#: capture); gloo worker ranges within 1.4 ms (p99), 4.4 ms at most (scheduler delay on a loaded
#: 2-core host). Each threshold is over twice the worst seen. Host ops (`host_op`: c10d / NCCL
#: ops on the calling thread) return once the work is enqueued, so their ends need not agree
#: (1.3 ms median apart on h200-tp2): no check there.
END_SPREAD_THRESHOLD_NS: dict[str, int] = {"gpu_kernel": 10_000, "gloo": 10_000_000}

#: What a level's collective interval is called in messages.
_LEVEL_WORDS = {
    "gpu_kernel": "collective kernels",
    "gloo": "gloo collective ranges",
    "host_op": "host collective ops",
}

#: Columns of `CollectiveInstances.per_rank`.
PER_RANK_COLUMNS = (
    "instance",
    "group",
    "rank",
    "op",
    "start_ns",
    "end_ns",
    "raw_start_ns",
    "raw_end_ns",
    "wait_ns",
    "transfer_ns",
    "in_bytes",
    "out_bytes",
    "event_index",
    "seq",
    "arrival_ns",
    "arrival_raw_ns",
)

#: how a refused partial group is matched anyway, in the words of both ways in (MatchError's hint)
PARTIAL_HINT = "pass --allow-partial (allow_partial=True from Python) to match the ranks present"


@dataclass
class ClockAlignment:
    """How the ranks' clocks were put on one time line (docs/METHOD.md section Clocks and step
    matching).

    `aligned`: the ranks are on one time line: one rank, or offsets estimated from the matched
    collectives (`estimate_offsets`) and subtracted (`offsets_ns[r]`: raw = aligned + offset), or
    one clock as an API caller said (`clock="shared"`). False when they cannot be aligned:
    `refusal` says why in one line. `residual_ns`: per rank, the end differences' median and
    largest deviation from its offset; `raw_instances_over`: the collectives the unaligned clocks
    put over the end-spread threshold (None where not checked).
    """

    aligned: bool
    offsets_ns: dict[int, int]
    method: str
    hosts: dict[int, str] = field(default_factory=dict)
    #: the end-spread check of the matched instances on the aligned clock (`end_spread_check`)
    check: dict[str, Any] = field(default_factory=dict)
    estimated: bool = False
    refusal: str | None = None
    residual_ns: dict[int, dict[str, int]] = field(default_factory=dict)
    raw_instances_over: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "aligned": self.aligned,
            "estimated": self.estimated,
            "offsets_applied": self.estimated and any(v != 0 for v in self.offsets_ns.values()),
            "offsets_ns": {str(r): int(v) for r, v in sorted(self.offsets_ns.items())},
            "residual_ns": {str(r): dict(v) for r, v in sorted(self.residual_ns.items())},
            "raw_instances_over": self.raw_instances_over,
            "method": self.method,
            "refusal": self.refusal,
            "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
            "check": dict(self.check),
        }


@dataclass
class CollectiveInstances:
    """Matched collective instances of one run.

    - `per_rank`: one row per (instance, rank), columns `PER_RANK_COLUMNS`; times aligned to one
      clock (`raw_*` as the trace had them); `event_index` is the row label in the event table.
    - `instances`: one row per instance: instance, group, seq (the sequence number or the order
      within the group), op, n_ranks, last_rank, arrival_ns (a), first_start_ns, skew_ns,
      end_ns (max e), size_bytes (nccl-tests size), bytes_source ("trace" | "manifest" |
      "unknown"), transfer_ns_mean, wait_ns_max, algbw_gbps, busbw_gbps, last_tie (more than one
      rank started at a), end_spread_ns (max e - min e on the aligned clock).
    - `stragglers`: per rank: rank, last_count, instances, share.
    - `clock_check` (= `clock.check`): the end-spread check (`end_spread_check`).
    """

    per_rank: pd.DataFrame
    instances: pd.DataFrame
    stragglers: pd.DataFrame
    clock: ClockAlignment
    level: str  # "gpu_kernel" | "gloo" | "host_op" | "none"
    match_by: dict[str, str]  # group -> "seq" | "step_order" | "order"
    data_quality: DataQuality = field(default_factory=DataQuality)

    @property
    def n_instances(self) -> int:
        return len(self.instances)

    @property
    def clock_check(self) -> dict[str, Any]:
        """threshold_ns, instances, instances_over, median_ns, p99_ns, max_ns, worst (see
        `end_spread_check`); also under "check" in `clock.to_json()`."""
        return self.clock.check

    def stragglers_json(self) -> list[dict[str, Any]]:
        return [
            {
                "rank": int(r.rank),
                "last_count": int(r.last_count),
                "instances": int(r.instances),
                "share": float(r.share),
            }
            for r in self.stragglers.itertuples(index=False)
        ]


# --------------------------------------------------------------------------------------------
# selecting one interval per rank per collective call


def normalise_op(names: pd.Series, coll_op: pd.Series | None = None) -> np.ndarray:
    """The normalised op per row: `coll_op` where set, else parsed from the name ("" if none)."""
    names_l = names.astype(str).str.lower()
    out = np.full(len(names), "", dtype=object)
    todo = np.ones(len(names), dtype=bool)
    if coll_op is not None:
        given = coll_op.astype(str).to_numpy()
        has = given != ""
        out[has] = given[has]
        todo &= ~has
    for pattern, op in _OP_PATTERNS:
        if not todo.any():
            break
        hit = todo & names_l.str.contains(pattern, regex=True).to_numpy()
        out[hit] = op
        todo &= ~hit
    return out


def _outermost(df: pd.DataFrame) -> np.ndarray:
    """Mask of rows not contained in an earlier row of the same (rank, stream). `df` sorted by
    rank, stream, start_ns, -end_ns."""
    if df.empty:
        return np.zeros(0, dtype=bool)
    keys = df["rank"].astype(np.int64).to_numpy() * (1 << 40) + pd.factorize(df["stream"])[0]
    end = pd.Series(df["end_ns"].to_numpy(np.int64))
    # the latest end among the earlier rows of the same (rank, stream); a row ending no later is
    # inside one of them (sorted by start, so that row started no later either)
    prev_max = end.groupby(keys).cummax().groupby(keys).shift(1)
    nested = (prev_max.notna() & (end <= prev_max.fillna(-1))).to_numpy()
    return ~nested


def select_collective_events(events: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The collective intervals of a run, one per rank per collective call, and the level used.

    Returns a frame with columns rank, stream, name, op, start_ns, end_ns, coll_* and `event_index`.
    """
    cls = events["cls"].astype(str) if "cls" in events.columns else None
    kind = events["kind"].astype(str)
    name = events["name"].astype(str)

    gpu = events["device"].to_numpy() >= 0
    gpu &= kind.isin(_GPU_KINDS).to_numpy()
    if cls is not None:
        gpu &= (cls == "collective").to_numpy()
    else:
        gpu &= name.str.contains(_GPU_COLLECTIVE_NAME).to_numpy()
    host = events["device"].to_numpy() < 0
    gloo = host & name.str.startswith("gloo:").to_numpy()
    hostop = host & name.str.contains(_HOST_COLLECTIVE_NAME).to_numpy() & ~gloo

    if gpu.any():
        sel, level = events[gpu], "gpu_kernel"
    elif gloo.any():
        sel, level = events[gloo], "gloo"
    elif hostop.any():
        sel = events[hostop].sort_values(
            ["rank", "stream", "start_ns", "end_ns"], ascending=[True, True, True, False]
        )
        sel, level = sel[_outermost(sel)], "host_op"
    else:
        sel, level = events.iloc[0:0], "none"
    out = sel.copy()
    out["event_index"] = out.index.to_numpy()
    out["op"] = normalise_op(out["name"], out["coll_op"])
    return out.reset_index(drop=True), level


# --------------------------------------------------------------------------------------------
# groups, expected ranks, matching


def _parse_ranks(text: str) -> tuple[int, ...] | None:
    nums = re.findall(r"-?\d+", text or "")
    return tuple(int(n) for n in nums) if nums else None


def _world_size(rank_info: Mapping[int, Mapping[str, Any]] | None) -> int | None:
    if not rank_info:
        return None
    sizes = set()
    for info in rank_info.values():
        for src in (info, info.get("distributedInfo") or {}, info.get("distributed_info") or {}):
            ws = src.get("world_size") if isinstance(src, Mapping) else None
            if isinstance(ws, int) and ws > 0:
                sizes.add(ws)
    return max(sizes) if sizes else None


def _group_keys(sel: pd.DataFrame) -> np.ndarray:
    pg_name = sel["coll_pg_name"].astype(str).to_numpy()
    pg_ranks = sel["coll_pg_ranks"].astype(str).to_numpy()
    return np.where(
        pg_name != "",
        "pg:" + pg_name.astype(object),
        np.where(pg_ranks != "", "ranks:" + pg_ranks.astype(object), "default"),
    )


def _expected_ranks(
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


def _members_without_events(
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


def _without_events_message(
    group: str, rows: pd.DataFrame, missing: list[int], level: str
) -> tuple[str, str]:
    """(what is wrong, a guess at why) for a group some of whose member ranks recorded nothing."""
    counts = rows.groupby("rank").size()
    what = _LEVEL_WORDS.get(level, "collectives")
    one = len(missing) == 1
    who = f"{'rank' if one else 'ranks'} {', '.join(map(str, missing))}"
    has = ", ".join(f"rank {int(r)} has {int(c)}" for r, c in counts.items())
    hint = "kernels" if level == "gpu_kernel" else "its collective ops"
    return (
        f"collectives: {who} {'has' if one else 'have'} 0 {what} while {has} (group {group!r}): the last "
        "arrival cannot be known",
        f"was {who}'s trace captured without {hint}?",
    )


def _match_group(group: str, rows: pd.DataFrame) -> tuple[pd.Series, str]:
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
    key, how = _match_group(group, rows)
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


# --------------------------------------------------------------------------------------------
# clocks (docs/METHOD.md section Clocks and step matching)


def _hosts(
    rank_info: Mapping[int, Mapping[str, Any]] | None, manifest: Mapping[str, Any] | None
) -> dict[int, str]:
    hosts: dict[int, str] = {}
    for r, info in (rank_info or {}).items():
        for key in ("host_name", "hostname", "host"):
            v = info.get(key)
            if isinstance(v, str) and v:
                hosts[int(r)] = v
                break
    if not hosts and isinstance((manifest or {}).get("host"), Mapping):
        # one capture writes one manifest, and runs its ranks on the host it names
        mhost = (manifest or {})["host"].get("hostname")
        if isinstance(mhost, str) and mhost:
            hosts = {int(r): mhost for r in (rank_info or {})}
    return hosts


def _median_int(d: np.ndarray) -> int:
    """The median of integers, as an integer: the middle value, or the floor of the two middle
    values' mean. Moving every value by an integer k moves it by exactly k."""
    s = np.sort(d.astype(np.int64))
    n = s.size
    if n % 2:
        return int(s[n // 2])
    return int((int(s[n // 2 - 1]) + int(s[n // 2])) // 2)


#: Levels whose matched intervals end together by construction (offsets can be estimated from them).
_ENDS_TOGETHER = ("gpu_kernel", "gloo")


@dataclass
class OffsetEstimate:
    """`estimate_offsets`' result: per rank its offset (raw = aligned + offset; 0 on the reference
    rank), the rank it was measured against, and the residual of the end differences around it."""

    reference: int
    offsets_ns: dict[int, int]
    against: dict[int, int]  # rank -> the rank its offset was measured against (itself on the reference)
    residual_ns: dict[int, dict[str, int]]  # rank -> {"instances", "median", "max"} (|d - offset|)
    unreached: list[
        int
    ]  # ranks sharing no matched collective, directly or through others, with the reference


def estimate_offsets(per_rank: pd.DataFrame, ranks: list[int]) -> OffsetEstimate | None:
    """Each rank's clock offset from matched collective instances that end together by
    construction: over the instances rank r shares with rank p, offset_r - offset_p is the median
    of (raw end_r - raw end_p) (`_median_int`). Ranks are reached breadth first from the lowest
    rank with instances, each measured against the lowest-numbered reached rank it shares the
    most instances with (one group: every rank against the reference). The residual per rank is
    the median and the largest |end difference - offset difference| over those instances. None
    when no rank has an instance; ranks no chain of shared instances reaches are in `unreached`.
    `per_rank`: instance, rank, raw_end_ns."""
    if per_rank.empty:
        return None
    ends = per_rank.pivot_table(index="instance", columns="rank", values="raw_end_ns", aggfunc="first")
    have = [r for r in ranks if r in ends.columns]
    if not have:
        return None
    ref = have[0]
    offsets = {ref: 0}
    against = {ref: ref}
    residual: dict[int, dict[str, int]] = {
        ref: {"instances": int(ends[ref].notna().sum()), "median": 0, "max": 0}
    }
    frontier = [ref]
    while frontier:
        nxt = []
        for r in have:
            if r in offsets:
                continue
            best, best_n = None, 0
            for p in sorted(offsets):
                n = int((ends[r].notna() & ends[p].notna()).sum())
                if n > best_n:
                    best, best_n = p, n
            if best is None:
                continue
            d = (ends[r] - ends[best]).dropna().to_numpy(np.int64)
            med = _median_int(d)
            offsets[r] = offsets[best] + med
            against[r] = best
            dev = np.abs(d - med)
            residual[r] = {"instances": int(d.size), "median": _median_int(dev), "max": int(dev.max())}
            nxt.append(r)
        frontier = nxt
    unreached = [r for r in ranks if r not in offsets]
    return OffsetEstimate(ref, offsets, against, residual, unreached)


def _raw_spread_over(per_rank: pd.DataFrame, threshold: int | None) -> int | None:
    """Instances of more than one rank whose raw (unaligned) ends differ by more than `threshold`."""
    if threshold is None or per_rank.empty:
        return None
    g = per_rank.groupby("instance")["raw_end_ns"]
    multi = g.size() > 1
    spread = (g.max() - g.min())[multi]
    return int((spread > threshold).sum())


def _clock(
    per_rank: pd.DataFrame,
    ranks: list[int],
    rank_info: Mapping[int, Mapping[str, Any]] | None,
    manifest: Mapping[str, Any] | None,
    dq: DataQuality,
    clock: str = "auto",
    level: str = "none",
    threshold_ns: int | None = None,
) -> ClockAlignment:
    """The ranks' clocks on one time line (docs/METHOD.md section Clocks and step matching).

    "auto" / "estimate": the offsets are always estimated from the matched collectives that end
    together by construction (`estimate_offsets`) and always subtracted, whatever the manifest or
    the host names say: a policy on the data, so moving one rank's clock by any amount moves its
    offset by exactly that and changes no cross-rank figure. The threshold only qualifies it:
    `raw_instances_over` (the instances the unaligned clocks would have put over it) says whether
    the offsets mattered, the end-spread check on the aligned clock (`check`) whether the
    alignment left any. Where the offsets cannot be estimated (one of several ranks has no
    collective, or its collectives' ends do not agree by construction: host ops), `refusal` says
    so in one line and the offsets are 0: cross-rank figures are refused (`require_aligned`).
    "shared": the ranks' clocks are used as they are (an API caller's statement)."""
    hosts = _hosts(rank_info, manifest)
    if not hosts and manifest is not None:
        hosts = {r: h for r, h in _hosts({r: {} for r in ranks}, manifest).items()}
    if len(ranks) <= 1:
        return ClockAlignment(True, {r: 0 for r in ranks}, "single rank", hosts, estimated=False)
    if clock == "shared":
        return ClockAlignment(True, {r: 0 for r in ranks}, "one clock (as asked)", hosts, estimated=False)
    zero = {r: 0 for r in ranks}
    if level not in _ENDS_TOGETHER or per_rank.empty:
        why = (
            "there are no collectives matched across ranks"
            if per_rank.empty
            else "their only collectives are host ops, which return once the work is enqueued, so their "
            "ends do not agree"
        )
        refusal = (
            f"the clocks of ranks {', '.join(map(str, ranks))} cannot be aligned: {why}; cross-rank figures "
            "(wait, transfer, the critical path, the step join) are refused (capture the GPU kernels or the "
            "gloo ranges, or analyse each rank alone)"
        )
        dq.add("clock_not_estimated", 1, refusal)
        return ClockAlignment(False, zero, "not estimated", hosts, estimated=False, refusal=refusal)
    est = estimate_offsets(per_rank, ranks)
    assert est is not None
    if est.unreached:
        refusal = (
            f"the clocks of rank(s) {', '.join(map(str, est.unreached))} cannot be aligned with rank "
            f"{est.reference}'s: they share no matched collective with it, directly or through other ranks; "
            "cross-rank figures are refused"
        )
        dq.add("clock_not_estimated", len(est.unreached), refusal)
        return ClockAlignment(
            False, zero, "not estimated", hosts, estimated=False, refusal=refusal, residual_ns=est.residual_ns
        )
    thr = int(threshold_ns) if threshold_ns is not None else END_SPREAD_THRESHOLD_NS.get(level)
    raw_over = _raw_spread_over(per_rank, thr)
    n_multi = int((per_rank.groupby("instance").size() > 1).sum())
    parts = []
    for r in ranks:
        if r == est.reference:
            continue
        res = est.residual_ns[r]
        vs = f" vs rank {est.against[r]}" if est.against[r] != est.reference else ""
        parts.append(
            f"rank {r}: {est.offsets_ns[r]:+d} ns{vs} (residual median {res['median']} ns, max "
            f"{res['max']} ns over {res['instances']} collectives)"
        )
    raw_words = (
        f"; on the unaligned clocks {raw_over} of {n_multi} collectives ended more than {thr / 1e3:g} us apart"
        if raw_over and thr is not None
        else ""
    )
    dq.add(
        "clock_offsets",
        len(ranks) - 1,
        f"rank clocks aligned to rank {est.reference}'s by offsets estimated from the collectives' end times "
        f"(they end together): {'; '.join(parts)}{raw_words}",
    )
    method = f"median of collective end-time differences to rank {est.reference}"
    return ClockAlignment(
        True,
        dict(est.offsets_ns),
        method,
        hosts,
        estimated=True,
        residual_ns=est.residual_ns,
        raw_instances_over=raw_over,
    )


def require_aligned(coll: CollectiveInstances, label: str) -> None:
    """MatchError (one line) when the run's ranks' clocks could not be aligned
    (`ClockAlignment.refusal`): the cross-rank figures would rest on unaligned clocks."""
    if coll.clock.refusal:
        raise MatchError(f"{label}: {coll.clock.refusal}")


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
    manifest: Mapping[str, Any] | None = None,
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
    sel["group"] = _group_keys(sel) if len(sel) else np.zeros(0, dtype=object)
    if steps is not None and len(sel) and len(steps) and level == "gpu_kernel":
        # collective kernels without sequence numbers are matched by their order within each
        # stream and step (`match_by_step_order`); the step of each is the window holding its
        # start. Not gloo's ranges: a rank's gloo work runs on whichever worker thread is free
        sel["step"] = assign_steps(sel, window_ordinals(steps)).to_numpy(np.int64)
    world = _world_size(rank_info)

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
    expected, source = _expected_ranks(group, rows, run_ranks, world)
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
    missing_ranks = _members_without_events(rows, present, run_ranks, expected)
    if missing_ranks:
        # a member that recorded none of the group's collectives: its arrivals are unknown, so
        # the others' waits would be taken for transfer (docs/METHOD.md section Wait and transfer: refuse when counts differ)
        msg, hint = _without_events_message(group, rows, missing_ranks, level)
        if not allow_partial:
            raise MatchError(f"{msg}; {hint} ({PARTIAL_HINT})")
        dq.add(
            "collective_group_ranks_without_events",
            len(missing_ranks),
            f"{msg}; matched the ranks present anyway ({', '.join(map(str, present))}): their waits "
            "count as transfer",
        )
    key, how = _match_group(group, rows)
    return rows.assign(seq=key.to_numpy(), group_index=gi), how


def matched_collectives(
    parts: list[pd.DataFrame],
    match_by: dict[str, str],
    level: str,
    dq: DataQuality,
    *,
    run_ranks: list[int],
    rank_info: Mapping[int, Mapping[str, Any]] | None = None,
    manifest: Mapping[str, Any] | None = None,
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
    clock_alignment = _clock(keyed, run_ranks, rank_info, manifest, dq, clock, level, end_spread_threshold_ns)
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
    stragglers = _stragglers(instances, per_rank, run_ranks)
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
        [_safe_factor(op, int(k)) for op, k in zip(ops, n, strict=True)],
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


def end_spread_check(
    per_rank: pd.DataFrame,
    instances: pd.DataFrame,
    level: str,
    dq: DataQuality,
    threshold_ns: int | None = None,
) -> dict[str, Any]:
    """The clock check: matched instances end together on every rank (a collective ends when its
    data has arrived everywhere), so their end spread (max e - min e on the aligned clock,
    `instances.end_spread_ns`) must stay small. Counts the instances of more than one rank whose
    spread exceeds the threshold (default by level, `END_SPREAD_THRESHOLD_NS`) and, when any does,
    adds `collective_end_spread` to `dq` naming the worst instance and the median spread.

    Returns threshold_ns (None where the level's ends need not agree: host ops), instances (of more
    than one rank), instances_over (None where not applied), median_ns, p99_ns, max_ns and worst
    (instance, op, group, spread_ns, first_rank (ends first), last_rank (ends last); None when
    there is no such instance).
    """
    thr = int(threshold_ns) if threshold_ns is not None else END_SPREAD_THRESHOLD_NS.get(level)
    multi = instances[instances["n_ranks"] > 1] if len(instances) else instances
    out: dict[str, Any] = {
        "level": level,
        "threshold_ns": thr,
        "instances": len(multi),
        "instances_over": 0 if thr is not None else None,
        "median_ns": None,
        "p99_ns": None,
        "max_ns": None,
        "worst": None,
    }
    if thr is None:
        out["note"] = (
            "not checked: host collective ops return once the work is enqueued, so their ends need not agree"
            if level == "host_op"
            else "not checked: no collectives"
        )
    if multi.empty:
        return out
    spread = multi["end_spread_ns"].to_numpy(np.int64)
    median_ns = int(np.rint(np.median(spread)))
    out["median_ns"] = median_ns
    out["p99_ns"] = int(np.rint(np.percentile(spread, 99)))
    out["max_ns"] = int(spread.max())
    w = multi.iloc[int(np.argmax(spread))]
    rows = per_rank[per_rank["instance"] == int(w["instance"])].sort_values(["end_ns", "rank"])
    worst: dict[str, Any] = {
        "instance": int(w["instance"]),
        "op": str(w["op"]),
        "group": str(w["group"]),
        "spread_ns": int(w["end_spread_ns"]),
        "first_rank": int(rows["rank"].iloc[0]),
        "last_rank": int(rows["rank"].iloc[-1]),
    }
    out["worst"] = worst
    if thr is None:
        return out
    over = int((spread > thr).sum())
    out["instances_over"] = over
    if over:
        dq.add(
            "collective_end_spread",
            over,
            f"{over} of {len(multi)} matched collective instances end more than {thr / 1e3:g} us apart across "
            f"ranks (they should end together: clocks disagree or a trace is inconsistent); worst: "
            f"{worst['op']} instance {worst['instance']} ({worst['group']}), {worst['spread_ns'] / 1e3:.1f} us "
            f"(rank {worst['last_rank']} ends after rank {worst['first_rank']}); median spread "
            f"{median_ns / 1e3:.2f} us",
        )
    return out


def _safe_factor(op: str, n: int) -> float:
    try:
        return bus_factor(op, n)
    except ValueError:
        return float("nan")


def _stragglers(instances: pd.DataFrame, per_rank: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    if instances.empty:
        return pd.DataFrame({"rank": ranks, "last_count": 0, "instances": 0, "share": 0.0})
    # only instances with more than one rank can have a straggler
    multi = instances[instances["n_ranks"] > 1]
    last = multi["last_rank"].value_counts()
    in_rank = per_rank[per_rank["instance"].isin(multi["instance"])].groupby("rank")["instance"].nunique()
    out = pd.DataFrame({"rank": ranks})
    out["last_count"] = out["rank"].map(last).fillna(0).astype(np.int64)
    out["instances"] = out["rank"].map(in_rank).fillna(0).astype(np.int64)
    out["share"] = np.where(out["instances"] > 0, out["last_count"] / out["instances"].clip(lower=1), 0.0)
    return out


# --------------------------------------------------------------------------------------------
# message sizes from the capture manifest (the decoder's shapes) where the trace has none


@dataclass(frozen=True)
class ManifestCollective:
    """One entry of the manifest's `workload.collectives`: a collective the decoder makes
    `per_token` times per decode step, with its per-rank input / output bytes."""

    op: str
    name: str
    in_bytes: int
    out_bytes: int
    per_token: int


def manifest_collectives(manifest: Mapping[str, Any] | None) -> list[ManifestCollective]:
    """The `workload.collectives` list of a capture manifest ([] when absent); entries without a
    known op or with no byte count are left out."""
    wl = (manifest or {}).get("workload")
    raw = wl.get("collectives") if isinstance(wl, Mapping) else None
    out: list[ManifestCollective] = []
    for e in raw if isinstance(raw, list) else []:
        if not isinstance(e, Mapping):
            continue
        op = str(e.get("op") or "")
        op = op if op in _KNOWN_OPS else normalise_op(pd.Series([op])).tolist()[0]
        try:
            in_b, out_b = int(e.get("in_bytes", -1)), int(e.get("out_bytes", -1))
            per_token = int(e.get("per_token", 1))
        except (TypeError, ValueError):
            continue
        if (
            op and (in_b >= 0 or out_b >= 0) and 1 <= per_token <= 100_000
        ):  # 1e9 per token: not a list to build
            out.append(ManifestCollective(op, str(e.get("name") or ""), in_b, out_b, per_token))
    return out


def step_sequence(entries: list[ManifestCollective]) -> list[ManifestCollective]:
    """The calls of one decode step, in order, for entries of one op: round by round (round i holds,
    in list order, every entry whose per_token > i), i.e. layer-major for per-layer entries
    (o_proj, down_proj, o_proj, down_proj, ...)."""
    rounds = max((e.per_token for e in entries), default=0)
    return [e for i in range(rounds) for e in entries if e.per_token > i]


def fill_bytes_from_manifest(
    per_rank: pd.DataFrame,
    manifest: Mapping[str, Any] | None,
    events: pd.DataFrame | None,
    steps: pd.DataFrame | None,
    dq: DataQuality,
) -> dict[int, str]:
    """Fill `in_bytes` / `out_bytes` of the per-rank rows (in place) of instances the trace left
    without a size, from the manifest's `workload.collectives`; returns instance -> bytes source.

    Only instances inside a step window are filled (the list describes one decode step; a
    prefill's collectives differ). Per op: when the list has exactly one size for it, every such
    instance takes it; otherwise the op's instances of each step, in order (on the lowest rank),
    take the sizes of `step_sequence` position by position, and a step whose count differs from
    the list is left unknown. Instances that do have trace bytes are checked against the same
    expectation (`collective_bytes_manifest_disagrees`), never overwritten.
    """
    source: dict[int, str] = {}
    if per_rank.empty:
        return source
    has = (per_rank["in_bytes"].to_numpy(np.int64) >= 0) | (per_rank["out_bytes"].to_numpy(np.int64) >= 0)
    inst_has = pd.Series(has, index=per_rank.index).groupby(per_rank["instance"]).any()
    source = {int(i): ("trace" if h else "unknown") for i, h in inst_has.items()}
    entries = manifest_collectives(manifest)
    if not entries:
        return source
    if steps is None and events is not None:
        from tracekit.analyse.timeline.steps import find_steps
        from tracekit.errors import StepError

        pattern = ((manifest or {}).get("workload") or {}).get("step_pattern") or None
        try:
            steps = find_steps(events, pattern)
        except StepError:
            steps = None
    if steps is None or steps.empty:
        dq.add(
            "collective_manifest_without_steps",
            1,
            "the manifest lists the decoder's collectives but the trace has no step windows to place "
            "them in: message sizes not filled from the manifest",
        )
        return source
    # one row per instance: its op and its step / start on the lowest rank of the instance
    first = per_rank.sort_values(["instance", "rank"]).drop_duplicates("instance")
    first = first.assign(start_ns=first["raw_start_ns"].to_numpy(np.int64))
    windows = steps[["rank", "step", "start_ns", "end_ns"]]
    first = first.assign(step=assign_steps(first, windows).to_numpy(np.int64))
    first = first.sort_values(["step", "raw_start_ns", "instance"])
    inst_max = per_rank.groupby("instance")[["in_bytes", "out_bytes"]].max()

    expected: dict[int, tuple[int, int]] = {}
    by_op: dict[str, list[ManifestCollective]] = {}
    for e in entries:
        by_op.setdefault(e.op, []).append(e)
    count_mismatch = 0
    for op, ents in by_op.items():
        rows = first[(first["op"].astype(str) == op) & (first["step"] >= 0)]
        if rows.empty:
            continue
        sizes = {(e.in_bytes, e.out_bytes) for e in ents}
        seq = step_sequence(ents)
        for _, g in rows.groupby("step", sort=True):
            same_count = len(g) == len(seq)
            count_mismatch += not same_count
            if len(sizes) == 1:
                size = next(iter(sizes))
                for i in g["instance"].tolist():
                    expected[int(i)] = size
            elif same_count:
                for i, e in zip(g["instance"].tolist(), seq, strict=True):
                    expected[int(i)] = (e.in_bytes, e.out_bytes)
    if count_mismatch:
        dq.add(
            "collective_manifest_count_mismatch",
            count_mismatch,
            "steps whose number of collectives of an op differs from the manifest's per-token list (sizes "
            "filled only where the op has one size)",
        )
    filled, disagree = [], 0
    for i, (in_b, out_b) in expected.items():
        if source.get(i) == "trace":
            t_in, t_out = (int(x) for x in inst_max.loc[i])
            if (t_in >= 0 and in_b >= 0 and t_in != in_b) or (t_out >= 0 and out_b >= 0 and t_out != out_b):
                disagree += 1
            continue
        filled.append((i, in_b, out_b))
        source[i] = "manifest"
    if disagree:
        dq.add(
            "collective_bytes_manifest_disagrees",
            disagree,
            f"{disagree} collective instance(s) carry bytes in the trace that differ from the manifest's "
            "list; the trace's are kept",
        )
    if filled:
        fill = pd.DataFrame(filled, columns=["instance", "in_b", "out_b"]).set_index("instance")
        hit = per_rank["instance"].isin(fill.index).to_numpy()
        inst = per_rank.loc[hit, "instance"]
        per_rank.loc[hit, "in_bytes"] = fill["in_b"].reindex(inst).to_numpy(np.int64)
        per_rank.loc[hit, "out_bytes"] = fill["out_b"].reindex(inst).to_numpy(np.int64)
        dq.add(
            "collective_bytes_from_manifest",
            len(filled),
            f"{len(filled)} collective instance(s) without message sizes in the trace took them from the "
            "manifest's workload.collectives (the decoder's shapes)",
        )
    return source


# --------------------------------------------------------------------------------------------
# steps and the exact wait / transfer split of the exposed collective time


def assign_steps(per_rank: pd.DataFrame, windows: pd.DataFrame) -> pd.Series:
    """The step index of each per-rank collective row: the window of its rank that contains its
    start (windows: rank, step, start_ns, end_ns; half-open [start, end)); -1 when none."""
    out = np.full(len(per_rank), -1, dtype=np.int64)
    if per_rank.empty or windows.empty:
        return pd.Series(out, index=per_rank.index)
    for r, w in windows.sort_values(["rank", "start_ns"]).groupby("rank"):
        mask = (per_rank["rank"] == r).to_numpy()
        if not mask.any():
            continue
        s = per_rank.loc[mask, "start_ns"].to_numpy(np.int64)
        ws = w["start_ns"].to_numpy(np.int64)
        we = w["end_ns"].to_numpy(np.int64)
        i = np.searchsorted(ws, s, side="right") - 1
        ok = (i >= 0) & (s < we[np.clip(i, 0, None)])
        out[np.flatnonzero(mask)[ok]] = w["step"].to_numpy(np.int64)[i[ok]]
    return pd.Series(out, index=per_rank.index)


def _inside(us: np.ndarray, ue: np.ndarray, x: np.ndarray) -> np.ndarray:
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
        exposed = in_w & _inside(cs, ce, x) & ~_inside(hs, he, x)
        tr = exposed & _inside(ts, te, x)
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
