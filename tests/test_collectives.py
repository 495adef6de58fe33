"""Collective matching, wait vs transfer, skew, stragglers, clock alignment, exposed split.

Synthetic tables: every expected figure is computed by hand from the intervals in the test
(docs/METHOD.md section Wait and transfer: a = max s; wait = min(e, a) - s; transfer = e - max(s, a)).
Their ends are not built to agree, so the arithmetic tests read them on one given clock
(`clock="shared"`); the clock tests estimate the offsets as the analysis does (docs/METHOD.md
section Clocks and step matching).
"""

from __future__ import annotations

import pandas as pd
import pytest

from tracekit.analyse.collectives.exposed import split_exposed
from tracekit.analyse.collectives.matching import match_collectives
from tracekit.analyse.collectives.select import normalise_op
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.errors import MatchError
from tracekit.model.events import make_events


def kernels(rows: list[tuple], **extra_cols) -> pd.DataFrame:
    """rows: (rank, start_ns, end_ns, name[, pg_name, seq]) -> a GPU-kernel event table with cls."""
    cols: dict[str, list] = {
        "rank": [r[0] for r in rows],
        "device": [r[0] for r in rows],
        "stream": [7] * len(rows),
        "kind": ["kernel"] * len(rows),
        "name": [r[3] for r in rows],
        "start_ns": [r[1] for r in rows],
        "end_ns": [r[2] for r in rows],
        "coll_pg_name": [r[4] if len(r) > 4 else "" for r in rows],
        "coll_seq": [r[5] if len(r) > 5 else -1 for r in rows],
        "coll_in_bytes": [4096] * len(rows),
        "coll_out_bytes": [4096] * len(rows),
    }
    df = make_events(cols)
    df["cls"] = pd.Categorical(["collective"] * len(rows))
    return df


AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def test_wait_transfer_skew_exact_to_the_ns():
    ev = kernels(
        [
            (0, 100, 500, AR),  # instance 0: rank 0 early
            (1, 300, 520, AR),  # rank 1 arrives last at a=300
            (0, 1_000, 1_100, AR),  # instance 1: rank 0 last at a=1000
            (1, 900, 1_105, AR),
        ]
    )
    ci = match_collectives(ev, clock="shared")
    pr = ci.per_rank.set_index(["instance", "rank"])
    # instance 0: a = 300
    assert pr.loc[(0, 0), "wait_ns"] == 200 and pr.loc[(0, 0), "transfer_ns"] == 200
    assert pr.loc[(0, 1), "wait_ns"] == 0 and pr.loc[(0, 1), "transfer_ns"] == 220
    # instance 1: a = 1000
    assert pr.loc[(1, 0), "wait_ns"] == 0 and pr.loc[(1, 0), "transfer_ns"] == 100
    assert pr.loc[(1, 1), "wait_ns"] == 100 and pr.loc[(1, 1), "transfer_ns"] == 105
    inst = ci.instances.set_index("instance")
    assert (
        inst.loc[0, "skew_ns"] == 200 and inst.loc[0, "last_rank"] == 1 and inst.loc[0, "arrival_ns"] == 300
    )
    assert inst.loc[1, "skew_ns"] == 100 and inst.loc[1, "last_rank"] == 0
    # the wait of the rank that waited (what the shortfall's wait_ns_median takes the median of)
    assert inst.loc[0, "wait_ns_max"] == 200 and inst.loc[1, "wait_ns_max"] == 100
    assert ci.level == "gpu_kernel" and ci.match_by == {"default": "order"}
    assert ci.clock.offsets_ns == {0: 0, 1: 0}
    st = ci.stragglers.set_index("rank")
    assert st.loc[0, "last_count"] == 1 and st.loc[1, "last_count"] == 1
    assert st.loc[1, "share"] == 0.5
    # realised bandwidth from the mean transfer time: all_reduce, 4096 B, n=2 -> busbw = algbw * 2(n-1)/n = algbw
    assert inst.loc[0, "op"] == "all_reduce"
    assert inst.loc[0, "algbw_gbps"] == pytest.approx(4096 / ((200 + 220) / 2))
    assert inst.loc[0, "busbw_gbps"] == pytest.approx(inst.loc[0, "algbw_gbps"] * 1.0)
    # every rank: wait + transfer == the collective's duration (consistent trace)
    dur = ci.per_rank["end_ns"] - ci.per_rank["start_ns"]
    assert (ci.per_rank["wait_ns"] + ci.per_rank["transfer_ns"] == dur).all()


def test_three_ranks_straggler_table():
    # rank 2 is last in all three instances; a = its start
    rows = []
    for i in range(3):
        base = i * 10_000
        rows += [
            (0, base + 0, base + 900, AR),
            (1, base + 50, base + 905, AR),
            (2, base + 400, base + 910, AR),
        ]
    ci = match_collectives(kernels(rows), clock="shared")
    st = ci.stragglers.set_index("rank")
    assert st.loc[2, "last_count"] == 3 and st.loc[2, "share"] == 1.0
    assert st.loc[0, "last_count"] == 0
    pr = ci.per_rank[ci.per_rank["instance"] == 1].set_index("rank")
    assert pr.loc[0, "wait_ns"] == 400 and pr.loc[1, "wait_ns"] == 350 and pr.loc[2, "wait_ns"] == 0
    assert (
        pr.loc[0, "transfer_ns"] == 500
        and pr.loc[1, "transfer_ns"] == 505
        and pr.loc[2, "transfer_ns"] == 510
    )
    assert ci.instances["skew_ns"].tolist() == [400, 400, 400]
    # all_reduce over 3 ranks: busbw = algbw * 2 * 2 / 3
    inst = ci.instances.iloc[0]
    assert inst["busbw_gbps"] == pytest.approx(inst["algbw_gbps"] * 4 / 3)


def test_seq_matching_beats_order():
    # rank 1 recorded seq 1 before seq 0 (e.g. two streams); by seq, instance of seq 0 is
    # r0 [100, 200) + r1 [500, 600); by order it would pair r0 [100,200) with r1 [50, 150)
    ev = kernels(
        [
            (0, 100, 200, AR, "tp", 0),
            (0, 300, 400, AR, "tp", 1),
            (1, 500, 600, AR, "tp", 0),
            (1, 50, 150, AR, "tp", 1),
        ]
    )
    ci = match_collectives(ev, clock="shared")
    assert ci.match_by == {"pg:tp": "seq"}
    inst = ci.instances.set_index("seq")
    assert inst.loc[0, "skew_ns"] == 400 and inst.loc[0, "last_rank"] == 1
    assert inst.loc[1, "skew_ns"] == 250 and inst.loc[1, "last_rank"] == 0
    # without seq numbers the same intervals are paired by order: skews 50 and 200
    ev2 = ev.copy()
    ev2["coll_seq"] = -1
    ci2 = match_collectives(ev2, clock="shared")
    assert ci2.match_by == {"pg:tp": "order"}
    assert sorted(ci2.instances["skew_ns"].tolist()) == [50, 200]


def test_order_within_each_group_not_globally():
    # two groups interleaved differently on the two ranks
    ev = kernels(
        [
            (0, 100, 300, AR, "A"),
            (0, 400, 600, AR, "B"),
            (1, 120, 320, AR, "B"),  # rank 1 runs B first
            (1, 450, 650, AR, "A"),
        ]
    )
    ci = match_collectives(ev, clock="shared")
    inst = ci.instances.set_index("group")
    assert inst.loc["pg:A", "skew_ns"] == 350 and inst.loc["pg:A", "last_rank"] == 1
    assert inst.loc["pg:B", "skew_ns"] == 280 and inst.loc["pg:B", "last_rank"] == 0


def test_refuses_when_counts_differ_and_names_who():
    ev = kernels([(0, 100, 200, AR, "tp"), (0, 300, 400, AR, "tp"), (1, 120, 220, AR, "tp")])
    with pytest.raises(MatchError) as exc:
        match_collectives(ev, clock="shared")
    msg = str(exc.value)
    assert "'pg:tp'" in msg and "rank 0: 2" in msg and "rank 1: 1" in msg


def test_refuses_a_rank_without_collectives_names_ranks_and_counts():
    # ranks 2 and 3 ran (a compute kernel each) but recorded no collective: their arrivals are unknown
    ev = kernels([(0, 100, 200, AR), (0, 300, 400, AR), (1, 120, 220, AR), (1, 320, 420, AR)])
    ev = pd.concat([ev, kernels([(2, 0, 50, "gemm"), (3, 0, 50, "gemm")])], ignore_index=True)
    ev["cls"] = pd.Categorical(["collective"] * 4 + ["compute"] * 2)
    with pytest.raises(
        MatchError,
        match=r"^collectives: ranks 2, 3 have 0 collective kernels while rank 0 has 2, rank 1 has 2 ",
    ):
        match_collectives(ev, clock="shared")
    ci = match_collectives(ev, allow_partial=True, clock="shared")
    assert ci.n_instances == 2 and ci.data_quality.counts["collective_group_ranks_without_events"] == 2
    # the group lists its ranks and 2, 3 are not among them: nothing is missing
    ev["coll_pg_ranks"] = ["[0, 1]"] * 4 + [""] * 2
    ci = match_collectives(ev, clock="shared")
    assert ci.n_instances == 2 and "collective_group_ranks_without_events" not in ci.data_quality.counts


def test_refuses_when_a_seq_is_missing_on_a_rank():
    ev = kernels(
        [
            (0, 100, 200, AR, "tp", 0),
            (0, 300, 400, AR, "tp", 1),
            (1, 120, 220, AR, "tp", 0),
            (1, 320, 420, AR, "tp", 2),
        ]
    )
    with pytest.raises(MatchError, match=r"rank 0 lacks 1 \(e\.g\. seq 2\).*rank 1 lacks 1 \(e\.g\. seq 1\)"):
        match_collectives(ev, clock="shared")


def test_inconsistent_end_before_arrival_is_counted_not_hidden():
    # rank 0 ends at 250 before rank 1 arrives at 300
    ev = kernels([(0, 100, 250, AR), (1, 300, 400, AR)])
    ci = match_collectives(ev, clock="shared")
    assert ci.data_quality.counts["collective_end_before_last_arrival"] == 1
    r0 = ci.per_rank.set_index("rank").loc[0]
    assert r0["wait_ns"] == 150 and r0["transfer_ns"] == 0


def test_clock_offsets_estimated_across_hosts():
    # rank 1's clock runs 1_000_000 ns ahead; the collectives end together in true time
    off = 1_000_000
    ev = kernels(
        [
            (0, 100, 500, AR),
            (1, 300 + off, 500 + off, AR),
            (0, 1_000, 1_400, AR),
            (1, 1_200 + off, 1_402 + off, AR),
            (0, 2_000, 2_400, AR),
            (1, 2_100 + off, 2_399 + off, AR),
        ]
    )
    info = {0: {"host_name": "a"}, 1: {"host_name": "b"}}
    ci = match_collectives(ev, rank_info=info)
    assert ci.clock.aligned and ci.clock.estimated
    assert ci.clock.offsets_ns == {0: 0, 1: off}  # median of (0, 2, -1) = 0 -> exactly off
    # residual: |(0, 2, -1) - 0| -> median 1, max 2, over 3 collectives
    assert ci.clock.residual_ns[1] == {"instances": 3, "median": 1, "max": 2}
    assert ci.clock.raw_instances_over == 3  # unaligned, all 3 end 1 ms apart: over the 10 us threshold
    pr = ci.per_rank.set_index(["instance", "rank"])
    assert pr.loc[(0, 0), "wait_ns"] == 200 and pr.loc[(0, 1), "start_ns"] == 300
    # the same host named for both ranks changes nothing: the offsets are a policy on the data
    ci2 = match_collectives(ev, rank_info={0: {"host_name": "a"}, 1: {"host_name": "a"}})
    assert ci2.clock.offsets_ns == {0: 0, 1: off} and ci2.instances["skew_ns"].iloc[0] == 200
    # an API caller who says the clocks are one gets them as they are
    ci3 = match_collectives(ev, clock="shared")
    assert ci3.clock.offsets_ns == {0: 0, 1: 0} and ci3.instances["skew_ns"].iloc[0] == off + 200


def test_even_count_median_moves_exactly_with_the_clock():
    """With an even number of collectives the median is the floor of the middle pair's mean, so
    moving one rank's clock by k ns moves its offset by exactly k (no round-half-to-even flip)."""
    rows = [(0, 100, 500, AR), (1, 300, 501, AR), (0, 1_000, 1_400, AR), (1, 1_200, 1_404, AR)]
    base = match_collectives(kernels(rows)).clock.offsets_ns[1]
    assert base == 2  # median of (1, 4) = 2.5 -> 2
    for k in (1, 3, -7):
        moved = [(r, s + k * r, e + k * r, n) for r, s, e, n in rows]
        assert match_collectives(kernels(moved)).clock.offsets_ns[1] == base + k


def test_group_with_ranks_outside_the_run_is_refused():
    ev = kernels([(0, 100, 200, AR), (1, 120, 220, AR)])
    info = {0: {"distributedInfo": {"world_size": 8}}, 1: {"distributedInfo": {"world_size": 8}}}
    with pytest.raises(MatchError, match=r"span 8 ranks \(distributedInfo world_size\).*ranks \[0, 1\]"):
        match_collectives(ev, rank_info=info)
    ci = match_collectives(ev, rank_info=info, allow_partial=True)
    assert ci.n_instances == 1 and ci.data_quality.counts["collective_group_partial"] == 1


def test_no_collectives_tp1():
    ev = make_events(
        {"rank": [0], "device": [0], "kind": ["kernel"], "name": ["gemm"], "start_ns": [0], "end_ns": [10]}
    )
    ev["cls"] = pd.Categorical(["compute"])
    ci = match_collectives(ev, clock="shared")
    assert ci.n_instances == 0 and ci.level == "none"
    assert ci.stragglers["last_count"].tolist() == [0]


def test_gloo_level_prefers_worker_ranges_and_host_op_level_drops_nested():
    # CPU-only run: c10d::allreduce_ on the main thread only enqueues; gloo:all_reduce is the exchange
    ev = make_events(
        {
            "rank": [0, 0, 1, 1],
            "stream": [1, 2, 1, 2],
            "kind": ["cpu_op", "annotation", "cpu_op", "annotation"],
            "name": ["c10d::allreduce_", "gloo:all_reduce", "c10d::allreduce_", "gloo:all_reduce"],
            "start_ns": [100, 150, 90, 130],
            "end_ns": [140, 900, 120, 910],
        }
    )
    ci = match_collectives(ev, clock="shared")
    assert ci.level == "gloo"
    assert ci.instances["skew_ns"].tolist() == [20] and ci.instances["op"].tolist() == ["all_reduce"]
    # without gloo ranges: outermost c10d op, the nested record_param_comms dropped
    ev2 = make_events(
        {
            "rank": [0, 0, 1, 1],
            "stream": [1, 1, 1, 1],
            "kind": ["cpu_op"] * 4,
            "name": ["c10d::allreduce_", "record_param_comms", "c10d::allreduce_", "record_param_comms"],
            "start_ns": [100, 110, 90, 95],
            "end_ns": [400, 390, 410, 400],
        }
    )
    ci2 = match_collectives(ev2, clock="shared")
    assert ci2.level == "host_op" and ci2.n_instances == 1
    assert ci2.instances["skew_ns"].tolist() == [10]


def test_normalise_op_names():
    names = pd.Series(
        [
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "ncclDevKernel_AllGather_RING_LL",
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
            "gloo:all_reduce",
            "c10d::_allgather_base_",
            "c10d::alltoall_base_",
            "c10d::broadcast_",
        ]
    )
    assert normalise_op(names).tolist() == [
        "send_recv",
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "all_gather",
        "all_to_all",
        "broadcast",
    ]


def test_split_exposed_exact_by_hand():
    # rank 0: window [0, 1000); collective [100, 500) with a = 300 (rank 1 starts at 300);
    # compute [250, 350) hides part of it.
    ev = kernels([(0, 100, 500, AR), (1, 300, 700, AR)])
    ci = match_collectives(ev, clock="shared")
    windows = pd.DataFrame({"rank": [0, 1], "step": [0, 0], "start_ns": [0, 0], "end_ns": [1000, 1000]})
    higher = pd.DataFrame({"rank": [0, 1], "start_ns": [250, 650], "end_ns": [350, 800]})
    out = split_exposed(windows, higher, ci.per_rank).set_index("rank")
    # rank 0: exposed = [100,250) + [350,500) = 300; wait piece [100,300) minus [250,300) -> 150;
    # transfer piece [300,500) minus [300,350) -> 150
    assert (
        out.loc[0, "collective_ns"] == 300
        and out.loc[0, "wait_ns"] == 150
        and out.loc[0, "transfer_ns"] == 150
    )
    # rank 1: no wait; transfer [300,700) minus compute [650,700) -> 350
    assert out.loc[1, "wait_ns"] == 0 and out.loc[1, "transfer_ns"] == 350
    # window boundaries clip: window [200, 400) on rank 0 -> wait [200,250) = 50, transfer [350,400) = 50
    w2 = pd.DataFrame({"rank": [0], "step": [3], "start_ns": [200], "end_ns": [400]})
    o2 = split_exposed(w2, higher, ci.per_rank).iloc[0]
    assert (o2["step"], o2["wait_ns"], o2["transfer_ns"], o2["collective_ns"]) == (3, 50, 50, 100)


def test_split_exposed_transfer_outranks_wait_of_another_stream():
    # rank 0 has two overlapping collectives: A's wait piece overlaps B's transfer piece
    ev = kernels(
        [
            (0, 0, 1000, AR, "A"),  # a_A = 600 (rank 1) -> wait [0,600), transfer [600,1000)
            (1, 600, 1000, AR, "A"),
            (0, 200, 400, AR, "B"),  # a_B = 200 -> transfer [200,400)
            (1, 100, 400, AR, "B"),
        ]
    )
    ci = match_collectives(ev, clock="shared")
    windows = pd.DataFrame({"rank": [0], "step": [0], "start_ns": [0], "end_ns": [1000]})
    higher = pd.DataFrame(
        {
            "rank": pd.Series([], dtype="int64"),
            "start_ns": pd.Series([], dtype="int64"),
            "end_ns": pd.Series([], dtype="int64"),
        }
    )
    o = split_exposed(windows, higher, ci.per_rank).iloc[0]
    # transfer = [200,400) + [600,1000) = 600; wait = [0,200) + [400,600) = 400
    assert (o["collective_ns"], o["wait_ns"], o["transfer_ns"]) == (1000, 400, 600)


def test_assign_steps():
    per_rank = pd.DataFrame({"rank": [0, 0, 1, 1], "start_ns": [50, 150, 10, 300]})
    windows = pd.DataFrame(
        {"rank": [0, 0, 1], "step": [0, 1, 0], "start_ns": [0, 100, 0], "end_ns": [100, 200, 200]}
    )
    assert assign_steps(per_rank, windows).tolist() == [0, 1, 0, -1]


def test_hta_sampled_two_ranks_refused_with_the_reason(shared_traces):
    """The HTA sampled traces are 2 ranks of a 128-rank job: their NCCL kernels carry no process
    group, so they belong to the world group, whose last arrival cannot be known from 2 ranks."""
    import gzip
    import json

    from tests.conftest import shared_trace
    from tracekit.classify import classify
    from tracekit.read import read_run

    paths = [shared_trace(shared_traces, f"external/hta/sampled_rank-{r}.json.gz") for r in (0, 1)]
    raw = [json.load(gzip.open(p)) for p in paths]
    world = {d["distributedInfo"]["world_size"] for d in raw}
    nccl = [
        sorted(
            (e["ts"], e["ts"] + e["dur"])
            for e in d["traceEvents"]
            if e.get("cat") == "kernel" and e["name"].startswith("nccl")
        )
        for d in raw
    ]
    assert world == {128} and [len(k) for k in nccl] == [10, 10]

    run = read_run(paths, cache=False)
    ev = classify(run.events)
    with pytest.raises(
        MatchError, match=r"span 128 ranks \(distributedInfo world_size\) but the run has only ranks \[0, 1\]"
    ):
        match_collectives(ev, ranks=run.ranks, rank_info=run.rank_info)
    # matched anyway, by order: 10 send/recv instances; the pairing is not trustworthy, and the
    # data says so: count (independently, in us) the pairs where one rank ends before the other starts
    ci = match_collectives(ev, ranks=run.ranks, rank_info=run.rank_info, allow_partial=True)
    assert ci.n_instances == 10 and set(ci.instances["op"]) == {"send_recv"}
    assert ci.match_by == {"default": "order"}
    inconsistent = 0
    for (s0, e0), (s1, e1) in zip(nccl[0], nccl[1], strict=True):
        a = max(s0, s1)
        inconsistent += (e0 < a) + (e1 < a)
    assert inconsistent > 0
    assert ci.data_quality.counts["collective_end_before_last_arrival"] == inconsistent
