"""Issue 15: every trace users bring reads, with no flags.

- every trace under ../shared/traces and traces/ reads with `tracekit breakdown PATH`; the rule
  that chose its steps is pinned per trace;
- the SGLang decode trace's whole-trace GPU timeline equals TraceLens's gpu_timeline (to the
  microsecond), and busy is recomputed independently (plain json, exact decimals);
- the cloverleaf nsys export equals `nsys stats` (cuda_gpu_trace, cuda_api_trace) to the ns;
- CUDA-graph launches: the graph's kernels belong to the launch and its step (periods of launches);
- runs as users lay them out: torchrun folder, rank-less files, HTA's rank-N subfolders, several
  nsys reports (aligned by session start), a .nsys-rep beside its export;
- the cache lives in the user's cache folder (--cache-dir), never beside the input.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import os
import re
import shutil
import sqlite3
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import shared_params, shared_trace
from tracekit.analyse.timeline.breakdown import breakdown
from tracekit.analyse.timeline.partition import partition_steps
from tracekit.analyse.timeline.rules import STEP_RULES
from tracekit.analyse.timeline.steps import find_steps_detailed
from tracekit.classify import classify
from tracekit.cli.main import main
from tracekit.model.events import Run, make_events
from tracekit.read import read_run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never write beside the traces (traces/ or ../shared): the cache goes to tmp."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TRACEKIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRACEKIT_NO_CACHE", raising=False)


def _breakdown_json(path: Path, *args: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["breakdown", str(path), "--format", "json", *args])
    assert rc == 0, path
    return json.loads(out.getvalue())


# ------------------------------------------------------------------ every trace, no flags

#: The rule that chooses each trace's steps, pinned (path relative to ../shared/traces or the repo).
SHARED_RULES: dict[str, str] = {
    "h200/kineto_decode_ws1.pt.trace.json.gz": "decode_step",
    "h200/nsys_matmul_nvtx.sqlite": "decode_step",
    "h200/nsys_matmul_nvtx.nsys-rep": "decode_step",  # read through its .sqlite export beside it
    "external/hta/nccl_data.json.gz": "profiler_step",
    "external/hta/sampled_rank-0.json.gz": "profiler_step",
    "external/hta/sampled_rank-1.json.gz": "profiler_step",
    "external/hta/ns_resolution_rank-0.pt.trace.json.gz": "profiler_step",
    "external/hta/cuda_event_sync_trace.json.gz": "profiler_step",
    "external/hta/cpu_only_rank-34.pt.trace.json.gz": "profiler_step",
    "external/hta/distributed_info_not_found.json.gz": "profiler_step",  # no rank: rank 0, noted
    "external/hta/mi250_minitoy_rocm.json.gz": "profiler_step",
    "external/tracelens/sglang_qwen3-8b_decode.json.gz": "serving_engine",  # execute_..._generation_32(...)
    "external/nsys/nsightful_power_iteration_t4_2025.3.sqlite": "repeated_range",  # 'Step 0 to 10' ...
    "external/nsys/pipit_cloverleaf_perlmutter-cloverleaf-cuda.sqlite": "whole_trace",  # no NVTX at all
}
REPO_RULES: dict[str, str] = {
    "traces/cpu-tp1": "decode_step",
    "traces/cpu-tp2": "decode_step",
    "traces/cpu-tp2-straggler": "decode_step",
    "traces/h200-tp1": "decode_step",
    "traces/h200-tp1-full": "decode_step",
    "traces/h200-tp1-nsys": "decode_step",
    "traces/h200-tp2": "decode_step",
    "traces/h200-tp2-full": "decode_step",
    "traces/h200-tp2-nsys": "decode_step",
    "traces/h200-tp2-straggler": "decode_step",
}


@pytest.mark.parametrize("rel", shared_params(sorted(SHARED_RULES)))
def test_shared_trace_reads_without_flags(shared_traces: Path, rel: str) -> None:
    path = shared_trace(shared_traces, rel)
    doc = _breakdown_json(path)
    assert doc["source"]["step_rule"] == SHARED_RULES[rel]
    assert doc["steps"] and any(f"rule '{SHARED_RULES[rel]}'" in n for n in doc["data_quality"]["notes"])
    for s in doc["steps"]:
        assert sum(s["parts_ns"].values()) == s["window_ns"]


@pytest.mark.parametrize("rel", sorted(REPO_RULES))
def test_committed_trace_reads_without_flags(rel: str) -> None:
    path = REPO / rel
    if not path.is_dir():
        pytest.skip(f"{rel} absent")
    doc = _breakdown_json(path)
    assert doc["source"]["step_rule"] == REPO_RULES[rel]


def test_every_trace_found_reads(shared_traces: Path) -> None:
    """Traces added later (not pinned above) must read too, with some rule of STEP_RULES."""
    found = [
        p
        for p in shared_traces.rglob("*")
        if p.is_file() and re.search(r"\.(json\.gz|sqlite|nsys-rep)$", p.name)
    ]
    found += [p for p in (REPO / "traces").iterdir() if p.is_dir()]
    assert len(found) >= len(SHARED_RULES) + len(REPO_RULES)
    pinned = {shared_traces / r for r in SHARED_RULES} | {REPO / r for r in REPO_RULES}
    for p in found:
        if p in pinned:  # read above, its rule pinned
            continue
        run = read_run([p])
        assert breakdown(run).step_rule in STEP_RULES, p


def test_no_cache_beside_inputs(real_kineto_file: Path, tmp_path: Path) -> None:
    d = tmp_path / "traces"
    d.mkdir()
    f = d / "one.json.gz"
    shutil.copy(real_kineto_file, f)
    _breakdown_json(f, "--cache-dir", str(tmp_path / "cc"))
    assert [p.name for p in d.iterdir()] == ["one.json.gz"]
    assert len(list((tmp_path / "cc").glob("*.parquet"))) == 1
    _breakdown_json(f)  # default: $XDG_CACHE_HOME/tracekit
    assert len(list((tmp_path / "xdg" / "tracekit").glob("*.parquet"))) == 1
    assert [p.name for p in d.iterdir()] == ["one.json.gz"]


@pytest.mark.parametrize(
    "command", ["breakdown", "shortfall", "report", "diff", "whatif", "export", "decompose", "roofline"]
)
def test_every_command_that_reads_traces_takes_the_cache_and_step_options(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user who passes --no-cache, --cache-dir or --steps to one command can pass it to all
    (report had no cache options: `tracekit report RUN -o r.md --no-cache` was a usage error;
    whatif had no --steps, diff only --step-pattern)."""
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    for opt in ("--no-cache", "--cache-dir", "--steps", "--step-pattern"):
        assert opt in text, (command, opt)


def test_whatif_steps_reach_the_analysis(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["whatif", "--baseline", str(REPO / "traces/cpu-tp1"), "--sharded", str(REPO / "traces/cpu-tp2")]
    assert main([*args, "--steps", "no_such_step", "--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no step annotations match 'no_such_step'" in err[0], err


def test_report_cache_options_take_effect_and_end_with_the_command(
    real_kineto_file: Path, tmp_path: Path
) -> None:
    f = tmp_path / "in" / real_kineto_file.name  # a copy: the cache entry is this test's own
    f.parent.mkdir()
    shutil.copy(real_kineto_file, f)
    assert main(["report", str(f), "-o", str(tmp_path / "a.md"), "--cache-dir", str(tmp_path / "cc")]) == 0
    assert len(list((tmp_path / "cc").glob("*.parquet"))) == 1
    assert (
        main(
            [
                "report",
                str(f),
                "-o",
                str(tmp_path / "b.md"),
                "--no-cache",
                "--cache-dir",
                str(tmp_path / "c2"),
            ]
        )
        == 0
    )
    assert not list((tmp_path / "c2").glob("*.parquet"))  # --no-cache: nothing written, anywhere
    assert "TRACEKIT_NO_CACHE" not in os.environ and "TRACEKIT_CACHE_DIR" not in os.environ
    assert (tmp_path / "a.md").read_text().splitlines()[0] == (tmp_path / "b.md").read_text().splitlines()[0]


# ------------------------------------------------------------------ whole-trace busy / idle (TraceLens)

#: TraceLens gpu_timeline for sglang_Qwen3-8B_decode (AMD-AGI/TraceLens), in ms (issue 15).
TRACELENS_GPU_TIMELINE_MS = {
    "busy": "9.759752",
    "exposed_memcpy": "0.013177",
    "idle": "463.977",
    "span": "473.750",
}


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0)


def test_sglang_trace_totals_equal_tracelens(shared_traces: Path) -> None:
    path = shared_trace(shared_traces, "external/tracelens/sglang_qwen3-8b_decode.json.gz")
    tt = _breakdown_json(path)["trace_totals"]
    for key, ours in (
        ("busy", tt["busy_ns"]),
        ("exposed_memcpy", tt["exposed_memcpy_ns"]),
        ("idle", tt["idle_ns"]),
        ("span", tt["span_ns"]),
    ):
        expect_ns = Decimal(TRACELENS_GPU_TIMELINE_MS[key]) * 1_000_000
        assert abs(Decimal(ours) - expect_ns) < 1000, (key, ours, expect_ns)  # to the microsecond
    assert tt["span_ns"] == tt["busy_ns"] + tt["exposed_memcpy_ns"] + tt["idle_ns"]
    # independent: the union of kernel intervals from the raw json, exact decimal microseconds
    with gzip.open(path) as f:
        evs = json.load(f, parse_float=Decimal)["traceEvents"]
    kernels = [
        (int(Decimal(e["ts"]) * 1000), int((Decimal(e["ts"]) + Decimal(e["dur"])) * 1000))
        for e in evs
        if e.get("ph") == "X" and e.get("cat") == "kernel"
    ]
    copies = [
        (int(Decimal(e["ts"]) * 1000), int((Decimal(e["ts"]) + Decimal(e["dur"])) * 1000))
        for e in evs
        if e.get("ph") == "X" and e.get("cat") in ("gpu_memcpy", "gpu_memset")
    ]
    assert len(kernels) == 555 and len(copies) == 3
    assert tt["busy_ns"] == _union_ns(kernels)
    assert tt["busy_ns"] + tt["exposed_memcpy_ns"] == _union_ns(kernels + copies)
    everything = kernels + copies
    assert tt["span_ns"] == max(e for _, e in everything) - min(s for s, _ in everything)


# ------------------------------------------------------------------ nsys == nsys stats


def _enter_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r["Event Type"] == "Enter"]


def test_cloverleaf_export_equals_nsys_stats(shared_traces: Path) -> None:
    db = shared_trace(shared_traces, "external/nsys/pipit_cloverleaf_perlmutter-cloverleaf-cuda.sqlite")
    gpu_csv = shared_trace(shared_traces, "external/nsys/pipit_cloverleaf_cloverleaf_gpu_trace.csv")
    api_csv = shared_trace(shared_traces, "external/nsys/pipit_cloverleaf_cloverleaf-cuda_api_trace.csv")
    ev = read_run([db], cache=False).events
    kind = ev["kind"].astype(str).to_numpy()
    name = ev["name"].astype(str).to_numpy()
    start = ev["start_ns"].to_numpy(np.int64)
    dur = ev["end_ns"].to_numpy(np.int64) - start
    stream = ev["stream"].to_numpy(np.int64)

    # cuda_gpu_trace: every kernel and memcpy, start and duration to the ns, stream and name
    ref_gpu = sorted(
        (
            int(r["Timestamp (ns)"]),
            int(r["_matching_timestamp"]) - int(r["Timestamp (ns)"]),
            int(r["streamId"]),
            r["Name"]
            if r["type"] == "kernel"
            else {"CUDA_MEMCPY_KIND_HTOD": "HtoD", "CUDA_MEMCPY_KIND_DTOH": "DtoH"}[r["Name"]],
        )
        for r in _enter_rows(gpu_csv)
    )
    gpu = np.isin(kind, ["kernel", "memcpy", "memset"])
    ours_gpu = []
    for s, d, st, k, n in zip(start[gpu], dur[gpu], stream[gpu], kind[gpu], name[gpu], strict=True):
        # nsys stats shows a kernel's short name; ours is the demangled name that contains it
        short = (
            re.sub(r"^void\s+", "", n).split("<")[0].split("(")[0].split("::")[-1]
            if k == "kernel"
            else n.split()[1]
        )
        ours_gpu.append((int(s), int(d), int(st), short))
    assert len(ref_gpu) == 1312 + 279
    assert sorted(ours_gpu) == ref_gpu

    # cuda_api_trace: every call, start and duration to the ns, name without nsys's _v<N> suffix
    ref_api = sorted(
        (
            int(r["Timestamp (ns)"]),
            int(r["_matching_timestamp"]) - int(r["Timestamp (ns)"]),
            re.sub(r"_v\d+$", "", r["Name"]),
        )
        for r in _enter_rows(api_csv)
    )
    rt = kind == "runtime"
    ours_api = sorted(zip(start[rt].tolist(), dur[rt].tolist(), name[rt].tolist(), strict=True))
    assert len(ref_api) == 3048 and ours_api == ref_api

    # and it breaks down with no flags: no NVTX, so the whole trace is the window, said so
    doc = _breakdown_json(db)
    assert doc["source"]["step_rule"] == "whole_trace" and len(doc["steps"]) == 1
    assert doc["trace_totals"]["kernels"] == 1312 and doc["trace_totals"]["memcpy_memset"] == 279
    assert doc["kernels_by_class"]["unknown"]["count"] == 0


# ------------------------------------------------------------------ H200: the two readers agree


def test_h200_tp1_per_step_compute_kineto_vs_nsys() -> None:
    """The same TP=1 decode (7b preset, 8 layers, bf16, H200) captured under torch.profiler and
    under Nsight Systems: per-step compute agrees within 2% between the two readers."""
    kin, nsys = REPO / "traces/h200-tp1", REPO / "traces/h200-tp1-nsys"
    if not (kin.is_dir() and nsys.is_dir()):
        pytest.skip("committed H200 traces absent")
    a = breakdown(read_run([kin]))
    b = breakdown(read_run([nsys]))
    ca = float(np.median(a.steps["compute_ns"]))
    cb = float(np.median(b.steps["compute_ns"]))
    assert a.step_rule == b.step_rule == "decode_step"
    assert abs(ca - cb) / ca < 0.02, (ca, cb)


# ------------------------------------------------------------------ CUDA graphs


def _graph_run(launches_per_step: int, steps: int) -> Run:
    """One rank: each step is `launches_per_step` cudaGraphLaunch calls (graph g has g+2 kernels),
    the graphs' kernels carry their launch's correlation id (as CUPTI records them), plus host gaps."""
    rows: list[tuple[str, str, int, int, int]] = []
    t, corr = 0, 1
    for _ in range(steps):
        for g in range(launches_per_step):
            rows.append(("runtime", "cudaGraphLaunch", t, t + 5, corr))
            k0 = t + 10
            for k in range(g + 2):
                rows.append(("kernel", f"void graph{g}_gemv_kernel_{k}<float>(float*)", k0, k0 + 20, corr))
                k0 += 20
            t += 100
            corr += 1
        t += 300  # host work between iterations (sampling, scheduling)
    kind, name, start, end, c = (list(x) for x in zip(*rows, strict=True))
    ev = make_events(
        {
            "rank": [0] * len(rows),
            "kind": kind,
            "name": name,
            "start_ns": start,
            "end_ns": end,
            "correlation": c,
            "stream": [7] * len(rows),
        }
    )
    return Run(events=ev, sources={0: "graphs.json"})


@pytest.mark.parametrize("per_step", [1, 3])
def test_cuda_graph_launch_periods_are_steps(per_step: int) -> None:
    run = _graph_run(per_step, steps=4)
    found = find_steps_detailed(run.events)
    assert found.rule == "cuda_graph_launch" and len(found.steps) == 4
    assert any(f"rank 0: {per_step}" in n for n in found.data_quality.notes)
    table = partition_steps(classify(run.events), found.steps)
    per_step_kernels_ns = sum((g + 2) * 20 for g in range(per_step))
    # every graph kernel lands in its launch's step, none twice, none lost
    assert table["compute_ns"].tolist() == [per_step_kernels_ns] * 4
    assert table["unknown_ns"].sum() == 0


def test_sglang_graph_kernels_belong_to_the_graph_launch(shared_traces: Path) -> None:
    """In the SGLang trace 544 of 555 kernels ran from one hipGraphLaunch: they share its correlation
    id, so they are inside the step that launched them."""
    path = shared_trace(shared_traces, "external/tracelens/sglang_qwen3-8b_decode.json.gz")
    ev = read_run([path]).events
    launch = ev[ev["name"].astype(str) == "hipGraphLaunch"]
    assert len(launch) == 1
    corr = int(launch["correlation"].iat[0])
    graph_kernels = ev[(ev["kind"] == "kernel") & (ev["correlation"] == corr)]
    assert len(graph_kernels) == 544
    steps = find_steps_detailed(ev).steps
    assert int(graph_kernels["end_ns"].max()) <= int(steps["end_ns"].iat[0])
    assert int(steps["gpu_end_ns"].iat[0]) >= int(graph_kernels["end_ns"].max())


# ------------------------------------------------------------------ layouts


def _kineto_with_rank(src: Path, dst: Path, rank: int | None) -> None:
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    if rank is None:
        doc.pop("distributedInfo", None)
    else:
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": rank}
    with gzip.open(dst, "wt") as f:
        f.write(json.dumps(doc))  # one C-encoded string: json.dump encodes in Python


def test_torchrun_profile_folder(shared_traces: Path, tmp_path: Path) -> None:
    """torch.profiler's tensorboard handler names files <host>_<pid>.<ts>.pt.trace.json: no rank in
    the name, no manifest; the rank comes from distributedInfo."""
    src = shared_trace(shared_traces, "h200/kineto_decode_ws1.pt.trace.json.gz")
    d = tmp_path / "profile"
    d.mkdir()
    _kineto_with_rank(src, d / "node7_4242.1733000000000.pt.trace.json.gz", 1)
    _kineto_with_rank(src, d / "node7_4241.1733000000001.pt.trace.json.gz", 0)
    doc = _breakdown_json(d)
    assert doc["source"]["ranks"] == [0, 1] and doc["source"]["step_rule"] == "decode_step"


def test_files_without_ranks_get_file_order(shared_traces: Path, tmp_path: Path) -> None:
    src = shared_trace(shared_traces, "external/hta/distributed_info_not_found.json.gz")
    d = tmp_path / "norank"
    d.mkdir()
    shutil.copy(src, d / "a.json.gz")
    shutil.copy(src, d / "b.json.gz")
    run = read_run([d])
    assert run.ranks == [0, 1] and run.sources[1].endswith("b.json.gz")
    assert run.data_quality.counts["ranks_from_file_order"] == 2


def test_hta_rank_subfolders(shared_traces: Path, tmp_path: Path) -> None:
    d = tmp_path / "hta"
    for r in (0, 1):
        sub = d / f"rank-{r}"
        sub.mkdir(parents=True)
        shutil.copy(
            shared_trace(shared_traces, f"external/hta/sampled_rank-{r}.json.gz"), sub / "trace.json.gz"
        )
    assert read_run([d]).ranks == [0, 1]


def test_nsys_reports_one_per_rank_aligned_by_session_start(shared_traces: Path, tmp_path: Path) -> None:
    src = shared_trace(shared_traces, "h200/nsys_matmul_nvtx.sqlite")
    d = tmp_path / "nsys"
    d.mkdir()
    a, b = d / "node0.sqlite", d / "node1.sqlite"
    shutil.copy(src, a)
    shutil.copy(src, b)
    con = sqlite3.connect(b)  # our own copy in tmp: the second report's session began 1.5 ms later
    (t0,) = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    con.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = ?", (t0 + 1_500_000,))
    con.commit()
    con.close()
    run = read_run([d], cache=False)
    assert run.ranks == [0, 1]
    ev = run.events
    k0 = ev[(ev["rank"] == 0) & (ev["kind"] == "kernel")]["start_ns"].to_numpy()
    k1 = ev[(ev["rank"] == 1) & (ev["kind"] == "kernel")]["start_ns"].to_numpy()
    assert (k1 - k0 == 1_500_000).all()
    assert run.data_quality.counts["nsys_sessions_aligned"] == 1


def test_nsys_rep_beside_its_export_is_read_once(shared_traces: Path, tmp_path: Path) -> None:
    d = tmp_path / "rep"
    d.mkdir()
    shutil.copy(shared_trace(shared_traces, "h200/nsys_matmul_nvtx.sqlite"), d / "nsys_matmul_nvtx.sqlite")
    shutil.copy(
        shared_trace(shared_traces, "h200/nsys_matmul_nvtx.nsys-rep"), d / "nsys_matmul_nvtx.nsys-rep"
    )
    assert read_run([d], cache=False).ranks == [0]


def test_nsys_graph_level_trace_rows_join_their_launch(shared_traces: Path, tmp_path: Path) -> None:
    """nsys --cuda-graph-trace=graph records one CUPTI_ACTIVITY_KIND_GRAPH_TRACE row per graph
    execution, with the correlationId of its cudaGraphLaunch: each is one GPU operation inside the
    step of its launch, and the launches' period makes the steps of a trace without NVTX."""
    db = tmp_path / "graphs.sqlite"
    shutil.copy(shared_trace(shared_traces, "h200/nsys_matmul_nvtx.sqlite"), db)
    con = sqlite3.connect(db)  # our own copy: NVTX dropped, four graph launches and executions added
    con.execute("DELETE FROM NVTX_EVENTS")
    (tid,) = con.execute("SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1").fetchone()
    (pid,) = con.execute("SELECT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()
    (name_id,) = con.execute("SELECT max(id) + 1 FROM StringIds").fetchone()
    con.execute("INSERT INTO StringIds VALUES (?, 'cudaGraphLaunch_v10000')", (name_id,))
    con.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INT NOT NULL, end INT NOT NULL, deviceId INT, "
        "contextId INT, greenContextId INT, streamId INT, correlationId INT, globalPid INT, graphId INT, graphExecId INT)"
    )
    t0 = 6_000_000_000
    for i in range(4):
        t = t0 + i * 1_000_000
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
            (t, t + 5000, tid, 990001 + i, name_id),
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, 0, 1, NULL, 7, ?, ?, 3, 3)",
            (t + 20_000, t + 420_000, 990001 + i, pid),
        )
    con.commit()
    con.close()
    run = read_run([db], cache=False)
    assert run.data_quality.counts["nsys_graph_level_trace"] == 4
    b = breakdown(run, "auto")
    assert b.step_rule == "cuda_graph_launch"
    graph_steps = b.steps[b.steps["start_ns"] >= t0]
    assert len(graph_steps) >= 3 and (graph_steps["compute_ns"].head(3) == 400_000).all()


def test_nccl_nvtx_payload_fills_the_collective_columns(tmp_path: Path) -> None:
    """NCCL's own NVTX domain: the range's payload gives op, bytes, communicator and rank count."""
    from tests.test_read_nsys import _make_db
    from tracekit.read.nsys import read_nsys

    db = tmp_path / "nccl.sqlite"
    _make_db(db, two_processes=False)
    con = sqlite3.connect(db)
    con.execute(
        "UPDATE NVTX_EVENTS SET jsonText = ? WHERE text = 'AllReduce'",
        (
            '{"NCCL communicator ID": 8817263541, "Message size [bytes]": 8192, "Reduction operation": "Sum", '
            '"No. of ranks": 2}',
        ),
    )
    con.commit()
    con.close()
    ev = read_nsys(db).events
    ar = ev[(ev["kind"] == "annotation") & (ev["name"] == "AllReduce")]
    assert len(ar) == 1
    row = ar.iloc[0]
    assert (row["coll_op"], int(row["coll_in_bytes"])) == ("all_reduce", 8192)
    assert (str(row["coll_pg_name"]), int(row["coll_group_size"])) == ("nccl-comm:8817263541", 2)
    ag = ev[(ev["kind"] == "annotation") & (ev["name"] == "ncclAllGather")].iloc[0]
    assert (str(ag["coll_pg_name"]), int(ag["coll_group_size"]), int(ag["coll_in_bytes"])) == ("", -1, -1)


@pytest.mark.parametrize(
    ("outer", "inner"),
    [
        ("execute_model", "gpu_model_runner: forward"),  # vLLM worker
        (
            "execute_8_context_0(sq0sk0sqsq0sqsk0)_generation_8(sq8sk512sqsq8sqsk512)",
            "attn",
        ),  # vLLM v1 runner
        ("step[DECODE bs=8]", "forward_batch"),  # SGLang
        ("_forward_step", "_prepare_inputs"),  # TensorRT-LLM PyExecutor
    ],
)
def test_serving_engine_iteration_ranges_are_steps(outer: str, inner: str) -> None:
    rows = []
    for i in range(3):
        t = i * 1000
        rows += [("annotation", outer, t, t + 800), ("annotation", inner, t + 100, t + 700)]
        rows += [("kernel", "void my_gemv_kernel<float>(float*)", t + 200, t + 600)]
    kind, name, start, end = (list(x) for x in zip(*rows, strict=True))
    ev = make_events(
        {
            "rank": [0] * len(rows),
            "kind": kind,
            "name": name,
            "start_ns": start,
            "end_ns": end,
            "stream": [7] * len(rows),
        }
    )
    found = find_steps_detailed(ev)
    assert found.rule == "serving_engine"
    assert list(found.steps["name"]) == [outer] * 3 and list(found.steps["start_ns"]) == [0, 1000, 2000]


def test_steps_whole_is_the_trace_totals_span(shared_traces: Path) -> None:
    """--steps whole: one window per rank, first to last GPU operation: the window is trace_totals'
    span, and its non-idle time the union of all GPU activity."""
    path = shared_trace(shared_traces, "h200/kineto_decode_ws1.pt.trace.json.gz")
    doc = _breakdown_json(path, "--steps", "whole")
    assert doc["source"]["step_rule"] == "whole_trace" and len(doc["steps"]) == 1
    step, tt = doc["steps"][0], doc["trace_totals"]
    assert step["window_ns"] == tt["span_ns"]
    gpu_parts = sum(step["parts_ns"][p] for p in ("compute", "memory", "collective", "unknown"))
    assert gpu_parts == tt["busy_ns"] + tt["exposed_memcpy_ns"]
