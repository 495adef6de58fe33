"""Top kernels per class (`tracekit.analyse.compute.kernels.top_kernels`), on event tables built in code
whose counts and times are known by construction, and on a committed trace against its breakdown."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tracekit.analyse.compute.kernels import top_kernels

ROOT = Path(__file__).resolve().parents[1]


def _events(rows: list[tuple]) -> pd.DataFrame:
    cols = ["rank", "stream", "kind", "name", "cls", "subclass", "start_ns", "end_ns"]
    return pd.DataFrame(rows, columns=cols)


def _windows(n_ranks: int, n_steps: int, length: int, skew: int = 0) -> pd.DataFrame:
    rows = []
    for r in range(n_ranks):
        for k in range(n_steps):
            start = k * 10_000 + r * skew
            rows.append((r, k, start, start + length + r * 100))
    return pd.DataFrame(rows, columns=["rank", "step", "start_ns", "end_ns"])


def test_counts_and_times_are_per_token_per_rank_over_the_steady_windows():
    # 2 ranks x 4 steps; step 0 is warm-up. Per steady window: two gemms of 300 ns and one of 100 ns
    # (rank 0) or 500 ns (rank 1), one all-reduce of 1000 ns; a copy of 50 ns on rank 1 only;
    # a gemm outside every window (between steps) that must not count
    rows: list[tuple] = []
    for r in range(2):
        for k in range(4):
            t = k * 10_000 + 100
            rows += [
                (r, 7, "kernel", "gemm_a", "compute", "matrix", t, t + 300),
                (r, 7, "kernel", "gemm_a", "compute", "matrix", t + 400, t + 700),
                (r, 7, "kernel", "ew", "compute", "vector", t + 800, t + 800 + (100 if r == 0 else 500)),
                (r, 7, "kernel", "ncclDevKernel_AllReduce", "collective", "nccl", t + 1500, t + 2500),
            ]
            if r == 1:
                rows.append((r, 7, "memcpy", "Memcpy DtoD", "memory", "", t + 2600, t + 2650))
        rows.append((r, 7, "kernel", "gemm_a", "compute", "matrix", 9_000, 9_900))  # outside
        rows.append((r, 7, "runtime", "cudaLaunchKernel", "host", "host", 150, 160))  # host: not a kernel
    steps = _windows(2, 4, 5_000)  # rank 1's windows are 100 ns longer: the step time is 5100 ns
    got = top_kernels(_events(rows), steps, skip_first=1).to_json()
    assert got["windows"] == 6  # 3 steady steps x 2 ranks
    assert got["step_ns_mean"] == pytest.approx(5100)
    c = got["classes"]
    assert list(c) == ["compute", "memory", "collective"]  # the report's class order
    gemm = c["compute"]["kernels"][0]
    assert gemm["name"] == "gemm_a" and gemm["subclass"] == "matrix"
    assert gemm["count"] == pytest.approx(2.0) and gemm["total_ns"] == pytest.approx(600)
    assert gemm["mean_ns"] == pytest.approx(300) and gemm["share"] == pytest.approx(600 / 5100)
    ew = c["compute"]["kernels"][1]
    assert ew["total_ns"] == pytest.approx((100 + 500) / 2) and ew["mean_ns"] == pytest.approx(300)
    assert c["compute"]["total_ns"] == pytest.approx(900) and c["compute"]["count"] == pytest.approx(3)
    assert c["memory"]["count"] == pytest.approx(0.5) and c["memory"]["total_ns"] == pytest.approx(25)
    assert c["collective"]["kernels"][0]["total_ns"] == pytest.approx(1000)


def test_top_n_and_the_rest_counted():
    rows = [
        (0, 7, "kernel", f"k{i:02d}", "compute", "vector", 1_000 + i * 100, 1_000 + i * 100 + 10 + i)
        for i in range(15)
    ]
    got = top_kernels(_events(rows), _windows(1, 1, 5_000), skip_first=1, top=10).to_json()  # one step: kept
    c = got["classes"]["compute"]
    assert [k["name"] for k in c["kernels"]] == [f"k{i:02d}" for i in range(14, 4, -1)]  # longest first
    assert c["more"] == 5 and c["count"] == 15


def test_host_timeline_counts_the_outermost_op_of_each_thread():
    # a CPU run: aten::linear (1000 ns) holds aten::mm (600 ns), which holds aten::as_strided; on
    # another thread a gloo collective op. Only the outermost op of a thread counts (a nested op's
    # time is inside its parent's), so the host ops sum to at most the thread's busy time
    rows = [
        (0, 1, "cpu_op", "aten::linear", "host", "host", 1_000, 2_000),
        (0, 1, "cpu_op", "aten::mm", "host", "host", 1_100, 1_700),
        (0, 1, "cpu_op", "aten::as_strided", "host", "host", 1_200, 1_250),
        (0, 1, "cpu_op", "aten::add", "host", "host", 2_000, 2_300),
        (0, 2, "cpu_op", "gloo:all_reduce", "collective", "pg_host", 2_500, 3_500),
    ]
    got = top_kernels(_events(rows), _windows(1, 1, 5_000), skip_first=0).to_json()
    host = got["classes"]["host ops"]
    assert [k["name"] for k in host["kernels"]] == ["aten::linear", "aten::add"]
    assert host["total_ns"] == pytest.approx(1300)
    assert got["classes"]["collective"]["kernels"][0]["name"] == "gloo:all_reduce"


def test_committed_h200_trace_agrees_with_its_breakdown():
    """On traces/h200-tp2, every steady step holds 16 all-reduces and 1 all-gather per rank (the
    decoder's 8 layers x 2 + the logits gather), and the compute kernels' time per token per rank is
    the breakdown's GPU compute time over those windows."""
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.read import read_run

    run = AnalysedRun.of(read_run([ROOT / "traces" / "h200-tp2"]))
    steps = run.steps(None).steps
    got = top_kernels(run.events, steps).to_json()
    coll = {k["name"].split("(")[0]: k for k in got["classes"]["collective"]["kernels"]}
    assert coll["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]["count"] == pytest.approx(16)
    assert coll["ncclDevKernel_AllGather_RING_LL"]["count"] == pytest.approx(1)
    ev = run.events
    win = (
        steps.sort_values(["rank", "step"]).groupby("rank").apply(lambda w: w.iloc[1:], include_groups=False)
    )
    win = win.reset_index(level=0)
    total = 0
    for r, w in win.groupby("rank"):
        k = ev[(ev["rank"] == r) & (ev["kind"] == "kernel") & (ev["cls"] == "compute")]
        for s, e in zip(w["start_ns"], w["end_ns"], strict=True):
            inside = k[(k["start_ns"] >= s) & (k["start_ns"] < e)]
            total += int((inside["end_ns"] - inside["start_ns"]).sum())
    assert got["classes"]["compute"]["total_ns"] == pytest.approx(total / len(win))


def test_per_rank_sums_assemble_to_the_whole_run():
    """The Dask engine computes each rank's sums where its events are and assembles them on the
    client: the same tables as the whole run at once (two ranks whose step windows differ)."""
    from tracekit.analyse.compute.kernels import assemble_top_kernels, rank_kernel_sums

    rows = []
    for r in range(2):
        for k in range(3):
            t = k * 10_000 + 100
            rows += [
                (r, 7, "kernel", "gemm", "compute", "matrix", t, t + 300 + 100 * r),
                (r, 7, "kernel", "nccl", "collective", "nccl", t + 400, t + 900),
            ]
    ev = _events(rows)
    steps = _windows(2, 3, 5_000)
    whole = top_kernels(ev, steps)
    per_rank = [rank_kernel_sums(ev[ev["rank"] == r], steps[steps["rank"] == r], r) for r in (0, 1)]
    assert assemble_top_kernels(per_rank, steps) == whole
    assert whole.classes["compute"].kernels[0].total_ns == pytest.approx(350)  # (300 + 400) / 2
