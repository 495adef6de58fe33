"""Step windows and the exact partition: hand-computed synthetic tables, every step of every shared
real trace, a CPU gloo capture, and speed."""

from __future__ import annotations

import gzip
import io
import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import shared_params

from tracekit.analyse.timeline.partition import partition_steps
from tracekit.analyse.timeline.steps import find_steps, find_steps_detailed
from tracekit.classify import classify
from tracekit.errors import StepError
from tracekit.model.events import make_events
from tracekit.model.parts import PARTS

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "ampere_sgemm_32x128_nt"
VEC = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int)"


def _table(rows: list[tuple]) -> pd.DataFrame:
    """rows: (rank, kind, name, start, end, correlation[, stream])."""
    cols: dict[str, list] = {
        k: [] for k in ("rank", "kind", "name", "start_ns", "end_ns", "correlation", "stream")
    }
    for r in rows:
        rank, kind, name, s, e, corr, *rest = r
        cols["rank"].append(rank)
        cols["kind"].append(kind)
        cols["name"].append(name)
        cols["start_ns"].append(s)
        cols["end_ns"].append(e)
        cols["correlation"].append(corr)
        cols["stream"].append(rest[0] if rest else (7 if kind in ("kernel", "memcpy", "memset") else 100))
    return make_events(cols)


def _synthetic() -> pd.DataFrame:
    # rank 0, one step [0, 100) whose last launched kernel ends at 120:
    #   compute   [10, 40)  (GEMM, launched at 10, corr 1)
    #   collective[30, 70)  (NCCL, launched at 20, corr 2): 10 ns under compute, 5 under the memcpy
    #   memory    [60, 65)  (memcpy, launched at 30, corr 3)
    #   unknown   [80, 90)  (no launch record)
    #   sync      [70, 95)  cudaStreamSynchronize on the host; [80, 90) of it is under the unknown kernel
    #   compute   [110,120) (vector kernel launched at 50, corr 4) -> the window ends at 120
    # rank 1, step "decode_step#7" [1000, 1100): a collective [1000, 1100) entirely exposed
    return _table(
        [
            (0, "annotation", "decode_step#3", 0, 100, -1),
            (0, "runtime", "cudaLaunchKernel", 10, 12, 1),
            (0, "runtime", "cudaLaunchKernel", 20, 22, 2),
            (0, "runtime", "cudaMemcpyAsync", 30, 32, 3),
            (0, "runtime", "cudaLaunchKernel", 50, 52, 4),
            (0, "runtime", "cudaStreamSynchronize", 70, 95, -1),
            (0, "kernel", GEMM, 10, 40, 1),
            (0, "kernel", NCCL, 30, 70, 2, 9),
            (0, "memcpy", "Memcpy DtoD (Device -> Device)", 60, 65, 3, 8),
            (0, "kernel", "my_own_allreduce_kernel", 80, 90, -1),  # looks like communication: unknown
            (0, "kernel", VEC, 110, 120, 4),
            (0, "kernel", GEMM, 200, 300, 99),  # outside every step
            (1, "annotation", "decode_step#7", 1000, 1100, -1),
            (1, "runtime", "cudaLaunchKernel", 1000, 1001, 5),
            (1, "kernel", NCCL, 1000, 1100, 5),
        ]
    )


def test_synthetic_partition_hand_computed() -> None:
    ev = classify(_synthetic())
    steps = find_steps(ev)
    assert list(steps["step"]) == [3, 7]  # numbers from the names
    assert list(steps["end_ns"]) == [120, 1100]  # rank 0 extended to its last launched kernel
    assert list(steps["annotation_end_ns"]) == [100, 1100]
    p = partition_steps(ev, steps).set_index("rank")
    r0 = p.loc[0]
    assert r0["window_ns"] == 120
    assert (r0["compute_ns"], r0["memory_ns"], r0["collective_ns"]) == (30 + 10, 5, 25)
    assert (r0["unknown_ns"], r0["sync_ns"], r0["idle_ns"]) == (10, 15, 25)  # idle = [0,10) + [95,110)
    assert r0["overlapped_collective_ns"] == 15  # [30,40) under compute + [60,65) under memory
    assert r0["timeline"] == "gpu"
    r1 = p.loc[1]
    assert (r1["window_ns"], r1["collective_ns"], r1["idle_ns"], r1["overlapped_collective_ns"]) == (
        100,
        100,
        0,
        0,
    )
    for _, row in p.iterrows():
        assert sum(int(row[f"{k}_ns"]) for k in PARTS) == row["window_ns"]


def test_gpu_work_launched_before_the_step_is_clipped() -> None:
    ev = classify(
        _table(
            [
                (0, "runtime", "cudaLaunchKernel", 0, 1, 1),
                (0, "kernel", GEMM, 5, 60, 1),  # launched before the step, runs into it
                (0, "annotation", "decode_step", 50, 100, -1),
            ]
        )
    )
    steps = find_steps(ev)
    assert (steps["start_ns"].iat[0], steps["end_ns"].iat[0]) == (50, 100)  # not extended
    p = partition_steps(ev, steps)
    assert (p["compute_ns"].iat[0], p["idle_ns"].iat[0]) == (10, 40)


def test_step_numbering_and_default_patterns() -> None:
    ev = _table(
        [
            (0, "annotation", "ProfilerStep#12", 0, 100, -1),
            (0, "annotation", "decode_step", 10, 20, -1),
            (0, "annotation", "decode_step", 30, 40, -1),
            (0, "annotation", "ProfilerStep#13", 100, 200, -1),
        ]
    )
    d = find_steps_detailed(ev)
    assert d.pattern == "decode_step"  # preferred over ProfilerStep
    assert list(d.steps["step"]) == [0, 1]  # no numbers -> order
    p = find_steps(ev, r"ProfilerStep#\d+")
    assert list(p["step"]) == [12, 13]
    spaced = _table(
        [(0, "annotation", "decode_step 4", 0, 1, -1), (0, "annotation", "decode_step 5", 2, 3, -1)]
    )
    assert list(find_steps(spaced)["step"]) == [4, 5]


def test_duplicate_step_numbers_are_kept_in_time_order_with_a_note() -> None:
    # rank 0 holds two passes of decode_step#1..2 (the second starts at 100); rank 1 one pass
    ev = _table(
        [
            (0, "annotation", "decode_step#1", 0, 10, -1),
            (0, "annotation", "decode_step#2", 10, 20, -1),
            (0, "annotation", "decode_step#1", 100, 110, -1),
            (0, "annotation", "decode_step#2", 110, 125, -1),
            (1, "annotation", "decode_step#1", 0, 10, -1),
            (1, "annotation", "decode_step#2", 10, 20, -1),
        ]
    )
    d = find_steps_detailed(ev)
    r0 = d.steps[d.steps["rank"] == 0]
    assert list(r0["step"]) == [0, 1, 2, 3] and list(r0["start_ns"]) == [0, 10, 100, 110]
    assert list(r0["end_ns"]) == [10, 20, 110, 125]
    assert list(d.steps[d.steps["rank"] == 1]["step"]) == [0, 1]
    assert d.data_quality.counts["duplicate_step_numbers"] == 2
    assert any("more than one pass" in n for n in d.data_quality.notes)
    # unique numbers: no count, no note
    clean = find_steps_detailed(ev[ev["start_ns"] < 50])
    assert "duplicate_step_numbers" not in clean.data_quality.counts
    assert not any("more than one pass" in n for n in clean.data_quality.notes)
    assert clean.rule == "decode_step" and any("rule 'decode_step'" in n for n in clean.data_quality.notes)


def test_nsys_report_holds_one_pass_per_rank() -> None:
    """traces/h200-tp2-nsys was re-captured after the --nsys fix (the report held the unprofiled and
    the traced pass, decode_step#1..N twice per rank): now decode_step#1..N once per rank, in order,
    and no "more than one pass" note (the two-pass case itself: test_duplicate_step_numbers_are_kept_in_time_order_with_a_note)."""
    from tracekit.read import read_run

    d = Path(__file__).resolve().parents[1] / "traces" / "h200-tp2-nsys"
    tokens = json.loads((d / "manifest.json").read_text())["workload"]["tokens"]
    res = find_steps_detailed(read_run([d], cache=False).events)
    for r in (0, 1):
        st = res.steps[res.steps["rank"] == r]
        assert list(st["name"]) == [f"decode_step#{i}" for i in range(1, tokens + 1)]
        assert (np.diff(st["start_ns"].to_numpy()) > 0).all()
    assert "duplicate_step_numbers" not in res.data_quality.counts
    assert not any("more than one pass" in n for n in res.data_quality.notes)


def test_nested_matches_keep_the_outermost() -> None:
    ev = _table(
        [(0, "annotation", "decode_step", 0, 100, -1), (0, "annotation", "decode_step_inner", 10, 20, -1)]
    )
    d = find_steps_detailed(ev)
    assert len(d.steps) == 1 and d.data_quality.counts["nested_step_annotations"] == 1


def test_no_steps_error_lists_the_annotations() -> None:
    ev = _table(
        [
            (0, "annotation", "forward", 0, 1, -1),
            (0, "annotation", "forward", 2, 3, -1),
            (0, "annotation", "bwd", 4, 5, -1),
        ]
    )
    # a pattern asked for that matches nothing: the error lists what the trace has
    with pytest.raises(StepError, match=r"'forward' x2.*'bwd' x1"):
        find_steps(ev, "decode_step")
    with pytest.raises(StepError, match="invalid step pattern"):
        find_steps(ev, "(")
    # auto (issue 15) never refuses: here the repeated range 'forward' is the step
    found = find_steps_detailed(ev)
    assert found.rule == "repeated_range" and list(found.steps["start_ns"]) == [0, 2]


def test_host_timeline_nesting_and_threads() -> None:
    # a CPU-only rank: main thread 1 runs aten::mm [0,30), c10d::allreduce_ [30,40) containing a
    # nested aten::empty [32,34) (part of the collective), then waits; gloo thread 2 runs
    # gloo:all_reduce [31,80). A second mm [70,75) overlaps the tail of the all_reduce.
    ev = classify(
        _table(
            [
                (0, "annotation", "decode_step", 0, 100, -1, 1),
                (0, "cpu_op", "aten::mm", 0, 30, -1, 1),
                (0, "cpu_op", "c10d::allreduce_", 30, 40, -1, 1),
                (0, "cpu_op", "aten::empty", 32, 34, -1, 1),
                (0, "annotation", "gloo:all_reduce", 31, 80, -1, 2),
                (0, "cpu_op", "aten::mm", 70, 75, -1, 1),
                (0, "other", "python_function_frame", 0, 100, -1, 1),  # not activity
            ]
        )
    )
    p = partition_steps(ev, find_steps(ev))
    row = p.iloc[0]
    assert row["timeline"] == "host"
    assert (row["compute_ns"], row["collective_ns"], row["idle_ns"]) == (35, 45, 20)
    assert row["overlapped_collective_ns"] == 5  # [70,75)


# ------------------------------------------------------------------ real traces

REAL = [
    ("h200/kineto_decode_ws1.pt.trace.json.gz", None, None, 5),
    ("h200/nsys_matmul_nvtx.sqlite", None, None, 20),
    ("external/hta/nccl_data.json.gz", None, None, 3),
    ("external/hta/sampled_rank-0.json.gz", None, None, 2),
    ("external/hta/sampled_rank-1.json.gz", None, None, 2),
    ("external/hta/ns_resolution_rank-0.pt.trace.json.gz", None, None, 5),
    ("external/hta/cuda_event_sync_trace.json.gz", None, None, 1),
    ("external/hta/cpu_only_rank-34.pt.trace.json.gz", None, None, 1),
    ("external/hta/distributed_info_not_found.json.gz", None, 0, 1),
    ("external/hta/mi250_minitoy_rocm.json.gz", None, 0, 2),
    ("external/tracelens/sglang_qwen3-8b_decode.json.gz", r"step\[DECODE", None, 1),
    ("external/nsys/nsightful_power_iteration_t4_2025.3.sqlite", r"^Compute & Residual", 0, None),
]


@pytest.mark.parametrize(
    ("rel", "pattern", "rank", "n_steps"),
    shared_params(REAL, [r[0].split("/")[-1] for r in REAL], tuples=True),
)
def test_parts_sum_to_window_on_real_traces(
    shared_traces: Path, rel: str, pattern: str | None, rank: int | None, n_steps: int | None
) -> None:
    from tracekit.read import read_run

    path = shared_traces / rel
    if not path.exists():
        pytest.skip(f"{rel} absent")
    run = read_run([path], rank=rank, cache=False)
    ev = classify(run.events)
    steps = find_steps(ev, pattern)
    if n_steps is not None:
        assert len(steps) == n_steps
    assert len(steps) > 0
    p = partition_steps(ev, steps)
    parts = p[[f"{k}_ns" for k in PARTS]].to_numpy()
    assert parts.dtype == np.int64
    assert (parts >= 0).all()
    assert np.array_equal(parts.sum(axis=1), p["window_ns"].to_numpy())
    assert (p["window_ns"] > 0).all()


def test_h200_windows_match_an_independent_join(shared_traces: Path) -> None:
    """decode_step windows recomputed with plain json: start = the annotation, end = max(annotation
    end, end of every kernel whose correlation matches a cuda_runtime/cuda_driver call inside it)."""
    from tracekit.read import read_run

    path = shared_traces / "h200/kineto_decode_ws1.pt.trace.json.gz"
    if not path.exists():
        pytest.skip("h200 trace absent")
    with gzip.open(path) as f:
        doc = json.load(f, parse_float=Decimal)
    base = int(doc["baseTimeNanoseconds"])
    evs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]

    def ns(e: dict) -> tuple[int, int]:
        s = base + int(Decimal(e["ts"]) * 1000)
        return s, s + int((Decimal(e["dur"]) * 1000).to_integral_value())

    anns = sorted(ns(e) for e in evs if e.get("cat") == "user_annotation" and e["name"] == "decode_step")
    launches = [
        (ns(e)[0], e["args"]["correlation"]) for e in evs if e.get("cat") in ("cuda_runtime", "cuda_driver")
    ]
    kernel_end = {e["args"]["correlation"]: ns(e)[1] for e in evs if e.get("cat") == "kernel"}
    expect = []
    for a, b in anns:
        ends = [kernel_end[c] for t, c in launches if a <= t < b and c in kernel_end]
        expect.append((a, max([b, *ends])))
    steps = find_steps(read_run([path], cache=False).events)
    assert list(zip(steps["start_ns"], steps["end_ns"], strict=True)) == expect
    assert len(expect) == 5


def test_cpu_gloo_capture() -> None:
    """Two gloo ranks on CPU under plain torch.profiler (no tracekit capture, no manifest: committed
    as traces/cpu-gloo-plain by scripts/gloo_plain_capture.py), 3 decode steps each: host
    timeline, collectives found in every step."""
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.read import read_run

    run_dir = Path(__file__).resolve().parents[1] / "traces" / "cpu-gloo-plain"
    files = sorted(run_dir.glob("rank-*.pt.trace.json.gz"))
    assert [f.name for f in files] == ["rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]
    # independent: what the raw traces hold
    for f in files:
        names = [e.get("name") for e in json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]]
        assert names.count("decode_step") == 3
        assert names.count("gloo:all_reduce") == 3 and names.count("c10d::allreduce_") == 3
    b = breakdown(read_run([run_dir], cache=False))
    t = b.steps
    assert sorted(t.groupby("rank").size().to_dict().items()) == [(0, 3), (1, 3)]
    assert set(t["timeline"]) == {"host"}
    assert (t["collective_ns"] > 0).all() and (t["compute_ns"] > 0).all()
    parts = t[[f"{k}_ns" for k in PARTS]].to_numpy()
    assert np.array_equal(parts.sum(axis=1), t["window_ns"].to_numpy())
    assert b.to_json()["source"]["timeline"] == "host"


def test_partition_of_many_events() -> None:
    """~200k GPU events over 1,000 steps on 2 ranks: classify + find_steps + partition give one row
    per step. How fast at a million events and beyond is benchmarks/bench_read.py's (issue 24: speed
    belongs in benchmarks/; this was 1M events, ~8 CPU-s of the suite, for the same answer)."""
    rng = np.random.default_rng(1)
    per_rank_steps, per_step = 500, 100
    rows_rank, kinds, names, starts, ends, corrs = [], [], [], [], [], []
    for r in range(2):
        step_start = np.arange(per_rank_steps, dtype=np.int64) * 100_000
        s = (
            step_start[:, None] + np.sort(rng.integers(0, 90_000, (per_rank_steps, per_step)), axis=1)
        ).ravel()
        d = rng.integers(100, 3_000, s.size)
        corr = np.arange(s.size, dtype=np.int64)
        # kernels
        rows_rank.append(np.full(s.size, r))
        kinds.append(np.full(s.size, "kernel", dtype=object))
        names.append(np.array([GEMM, VEC, NCCL, "Memcpy DtoD (Device -> Device)"], dtype=object)[corr % 4])
        starts.append(s + 50)
        ends.append(s + 50 + d)
        corrs.append(corr)
        # their launches
        rows_rank.append(np.full(s.size, r))
        kinds.append(np.full(s.size, "runtime", dtype=object))
        names.append(np.full(s.size, "cudaLaunchKernel", dtype=object))
        starts.append(s)
        ends.append(s + 5)
        corrs.append(corr)
        # the steps
        rows_rank.append(np.full(per_rank_steps, r))
        kinds.append(np.full(per_rank_steps, "annotation", dtype=object))
        names.append(np.full(per_rank_steps, "decode_step", dtype=object))
        starts.append(step_start)
        ends.append(step_start + 95_000)
        corrs.append(np.full(per_rank_steps, -1))
    ev = make_events(
        {
            "rank": np.concatenate(rows_rank),
            "kind": np.concatenate(kinds),
            "name": np.concatenate(names),
            "start_ns": np.concatenate(starts),
            "end_ns": np.concatenate(ends),
            "correlation": np.concatenate(corrs),
        }
    )
    assert len(ev) > 200_000
    c = classify(ev)
    steps = find_steps(c)
    p = partition_steps(c, steps)
    assert len(p) == 2 * per_rank_steps


# ------------------------------------------------------------------ windows never overlap


def _gpu_behind_host(extra: tuple[tuple, ...] = ()) -> pd.DataFrame:
    # rank 0: three 10 ns annotations, each launching one 25 ns kernel that runs after it ends
    #   decode_step#0 [0,10)  -> GEMM [5,30)    (gpu end 30, next step starts at 10: clipped, 20 spill)
    #   decode_step#1 [10,20) -> NCCL [30,55)   (gpu end 55, next step starts at 20: clipped, 35 spill)
    #   decode_step#2 [20,30) -> GEMM [55,80)   (last step: not clipped, window [20,80))
    # rank 1: no overlap: decode_step#0 [0,50) -> GEMM [10,60) (window [0,60), next step at 100);
    #   decode_step#1 [100,150) -> GEMM [110,120)
    return _table(
        [
            (0, "annotation", "decode_step#0", 0, 10, -1),
            (0, "runtime", "cudaLaunchKernel", 1, 2, 1),
            (0, "kernel", GEMM, 5, 30, 1),
            (0, "annotation", "decode_step#1", 10, 20, -1),
            (0, "runtime", "cudaLaunchKernel", 11, 12, 2),
            (0, "kernel", NCCL, 30, 55, 2),
            (0, "annotation", "decode_step#2", 20, 30, -1),
            (0, "runtime", "cudaLaunchKernel", 21, 22, 3),
            (0, "kernel", GEMM, 55, 80, 3),
            (1, "annotation", "decode_step#0", 0, 50, -1),
            (1, "runtime", "cudaLaunchKernel", 5, 6, 4),
            (1, "kernel", GEMM, 10, 60, 4),
            (1, "annotation", "decode_step#1", 100, 150, -1),
            (1, "runtime", "cudaLaunchKernel", 105, 106, 5),
            (1, "kernel", GEMM, 110, 120, 5),
            *extra,
        ]
    )


def _no_double_count(ev: pd.DataFrame, p: pd.DataFrame) -> None:
    # checked nanosecond by nanosecond: the busy time summed over the windows of a rank equals the
    # kernel time inside the union of its windows, and no window overlaps another
    kernels = ev[ev["kind"] == "kernel"]
    for r in sorted(set(p["rank"])):
        win = [(int(a), int(b)) for a, b in p.loc[p["rank"] == r, ["start_ns", "end_ns"]].to_numpy()]
        assert all(b1 <= a2 for (_, b1), (a2, _) in zip(win, win[1:], strict=False))
        in_windows = {t for a, b in win for t in range(a, b)}
        k = kernels[kernels["rank"] == r]
        busy = {t for a, b in zip(k["start_ns"], k["end_ns"], strict=True) for t in range(int(a), int(b))}
        rp = p[p["rank"] == r]
        assert int((rp["compute_ns"] + rp["collective_ns"]).sum()) == len(busy & in_windows)
        assert int(rp["window_ns"].sum()) == len(in_windows)


def test_windows_follow_the_device_when_the_gpu_runs_behind_and_never_double_count() -> None:
    # issue 28: where the GPU runs behind the host's annotations (an engine's overlap scheduler),
    # rank 0's windows come from the device side: each step from its first kernel to the next
    # step's first kernel, so each window holds the work its own step launched
    ev = classify(_gpu_behind_host())
    d = find_steps_detailed(ev)
    s = d.steps
    r0, r1 = s[s["rank"] == 0], s[s["rank"] == 1]
    assert list(zip(r0["start_ns"], r0["end_ns"], strict=True)) == [(5, 30), (30, 55), (55, 80)]
    assert list(r0["gpu_end_ns"]) == [30, 55, 80] and list(r0["annotation_end_ns"]) == [10, 20, 30]
    assert list(zip(r1["start_ns"], r1["end_ns"], strict=True)) == [(0, 60), (100, 150)]  # extended, no clip
    assert d.data_quality.counts["step_windows_device_paced"] == 3
    assert "step_windows_clipped" not in d.data_quality.counts
    assert any(
        "55 ns of a step's work ran after the next step's annotation" in n for n in d.data_quality.notes
    )

    p = partition_steps(ev, s)
    got = {
        (int(r.rank), int(r.step)): (
            int(r.window_ns),
            int(r.compute_ns),
            int(r.collective_ns),
            int(r.idle_ns),
        )
        for r in p.itertuples()
    }
    assert got == {
        (0, 0): (25, 25, 0, 0),  # GEMM [5,30)
        (0, 1): (25, 0, 25, 0),  # NCCL [30,55)
        (0, 2): (25, 25, 0, 0),  # GEMM [55,80)
        (1, 0): (60, 50, 0, 10),
        (1, 1): (50, 10, 0, 40),
    }
    _no_double_count(ev, p)


def test_windows_are_clipped_at_the_next_step_when_the_device_cannot_pace_them() -> None:
    # the same, plus a fourth step on rank 0 that launched no GPU work: the device cannot pace the
    # windows, so they follow the host's annotations, clipped at the next step's start
    ev = classify(_gpu_behind_host(((0, "annotation", "decode_step#3", 30, 40, -1),)))
    d = find_steps_detailed(ev)
    s = d.steps
    r0 = s[s["rank"] == 0]
    assert list(zip(r0["start_ns"], r0["end_ns"], strict=True)) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert d.data_quality.counts["step_windows_clipped"] == 3
    assert d.data_quality.counts["step_window_spill_ns"] == 20 + 35 + 50
    assert any("clipped at the next step's start" in n for n in d.data_quality.notes)
    _no_double_count(ev, partition_steps(ev, s))


def test_windows_of_the_shared_traces_do_not_overlap(shared_traces: Path) -> None:
    from tracekit.read import read_run

    for rel in ("h200/kineto_decode_ws1.pt.trace.json.gz", "external/hta/nccl_data.json.gz"):
        path = shared_traces / rel
        if not path.exists():
            continue
        steps = find_steps(read_run([path], cache=False).events)
        for _, g in steps.groupby("rank"):
            assert (g["end_ns"].to_numpy()[:-1] <= g["start_ns"].to_numpy()[1:]).all()


TRACES = Path(__file__).resolve().parents[1] / "traces"
BEFORE_CLIP = Path(__file__).resolve().parent / "data" / "breakdown_before_clip"


@pytest.mark.parametrize("name", ["h200-tp2", "cpu-tp2"])
def test_committed_traces_unchanged_by_the_clip(name: str) -> None:
    """These runs' windows never overlapped: every window and part equals the breakdown computed
    before the clip existed (tests/data/breakdown_before_clip, commit 0ea6933), and nothing is clipped."""
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.read import read_run

    if not (TRACES / name / "manifest.json").exists():
        pytest.skip(f"traces/{name} absent")
    b = breakdown(read_run([TRACES / name], cache=False))
    assert "step_windows_clipped" not in b.data_quality.counts
    before = pd.read_csv(BEFORE_CLIP / f"{name}.csv")
    now = pd.read_csv(io.StringIO(b.to_csv()))
    pd.testing.assert_frame_equal(now, before)
