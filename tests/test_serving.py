"""Serving-engine TP runs as they are (issue 28), on faithful traces built in code with known truth
(`tests/serving_traces.py`: SGLang's step ranges, custom all-reduce op and kernels, Kineto's
argument layout), plus the launching-op rule on small tables and the SGLang trace in shared/.

- custom all-reduces are collectives, by the launching op first and the name rules second;
- they are matched across 4 ranks by order within each step, counts checked, split into wait and
  transfer as the construction says, bytes from the op's record_shapes;
- steps told apart by kind; per-token figures from decode steps of one batch size;
- `diff` with too few comparable steps cannot judge;
- the overlap scheduler's windows come from the device side;
- CUDA-graph replays' concurrent branches are not "damaged timestamps".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import serving_traces as st

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.options import AttributionOptions
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.collectives.matching import match_collectives
from tracekit.analyse.compare.diff import diff
from tracekit.analyse.compare.result import CANNOT_JUDGE
from tracekit.analyse.timeline.breakdown import breakdown
from tracekit.analyse.timeline.kinds import step_kind
from tracekit.classify import classify, classify_name
from tracekit.cli.main import main
from tracekit.errors import MatchError
from tracekit.model.documents import to_builtins
from tracekit.model.events import make_events
from tracekit.model.launch import graph_replay_mask
from tracekit.read import read_run

MIXED = (
    ["step[EXTEND bs=1 toks=128]"]
    + ["step[DECODE bs=1]"] * 5
    + ["step[EXTEND bs=1 toks=128]"]
    + ["step[DECODE bs=2]"] * 3
)


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))


def _run(tmp_path: Path, names: list[str], name: str = "run", **kw):  # type: ignore[no-untyped-def]
    d = tmp_path / name
    truth = st.build(d, names, **kw)
    return d, truth, read_run([d], cache=False)


# ------------------------------------------------------------------ classification


@pytest.mark.parametrize(
    "name",
    [
        st.ONE_SHOT,
        st.TWO_SHOT,
        "void (anonymous namespace)::all_reduce_2shot_pull_kernel<__nv_bfloat16, 8u>(Params)",
    ],
)
def test_sglang_kernel_names_are_custom_allreduce(name: str) -> None:
    # all-reduce first, then the shot count: the rule used to expect `one_shot_all_reduce` order
    assert classify_name("kernel", name) == ("collective", "custom_allreduce", "custom_allreduce")


def _launched(
    op: str, kernel: str, inner: str | None = None, op_kind: str = "cpu_op"
) -> tuple[str, str, str, str]:
    """One kernel launched inside host op `op` (optionally inside a nested `inner` op)."""
    rows = [(op_kind, op, 0, 100, -1, 1, -1)]
    if inner:
        rows.append(("cpu_op", inner, 10, 90, -1, 1, -1))
    rows += [("runtime", "cudaLaunchKernel", 20, 30, 5, 1, -1), ("kernel", kernel, 40, 60, 5, 7, 0)]
    kind, name, s, e, c, stream, dev = (list(x) for x in zip(*rows, strict=True))
    ev = make_events(
        {"rank": [0] * len(rows), "kind": kind, "name": name, "start_ns": s, "end_ns": e, "correlation": c}
        | {"stream": stream, "device": dev}
    )
    k = classify(ev).iloc[-1]
    return str(k["cls"]), str(k["subclass"]), str(k["rule"]), str(k["decided_by"])


@pytest.mark.parametrize(
    "op",
    [
        "vllm::all_reduce",
        "_C_custom_ar::all_reduce",
        "sglang::inplace_all_reduce",
        "trtllm::allreduce",
        "symm_mem::two_shot_all_reduce_",
    ],
)
def test_a_kernel_launched_by_an_all_reduce_op_is_a_collective_whatever_its_name(op: str) -> None:
    # a kernel name no rule knows (it would be compute "other"), launched by the engine's op
    assert classify_name("kernel", "void my_engine::ar_kernel<8>(float*)")[0] == "compute"
    assert _launched(op, "void my_engine::ar_kernel<8>(float*)") == (
        "collective",
        "custom_allreduce",
        "launching_op",
        "launch_op",
    )


def test_the_innermost_launching_op_decides() -> None:
    # _c10d_functional::all_reduce clones its input first: the copy kernel is aten::copy_'s
    copy = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)"
    assert _launched("_c10d_functional::all_reduce", copy, inner="aten::copy_")[::3] == ("compute", "name")
    # and a c10d op's own kernel keeps its name rule, decided by the launching op
    assert _launched(
        "c10d::allreduce_", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    ) == (
        "collective",
        "nccl",
        "nccl",
        "launch_op",
    )
    # an NVTX / ProcessGroup range (as nsys records it) is a launching op too
    assert _launched("nccl:all_reduce", "void my_engine::ar_kernel<8>(float*)", op_kind="annotation") == (
        "collective",
        "c10d",
        "launching_op",
        "launch_op",
    )
    # an op that is no collective launches compute
    assert _launched("aten::mm", "void my_engine::ar_kernel<8>(float*)")[::3] == ("compute", "name")


def test_a_table_without_device_or_collective_columns_classifies_by_the_launching_op() -> None:
    # a hand-built table (plain pandas, not make_events) lacks device and the coll_* columns:
    # they read as missing, so the host op is still a host op and the kernel its collective
    import pandas as pd

    ev = pd.DataFrame(
        {
            "rank": [0, 0, 0],
            "kind": ["cpu_op", "runtime", "kernel"],
            "name": ["vllm::all_reduce", "cudaLaunchKernel", "void my_engine::ar_kernel<8>(float*)"],
            "start_ns": [0, 20, 40],
            "end_ns": [100, 30, 60],
            "stream": [1, 1, 7],
            "correlation": [-1, 5, 5],
        }
    )
    k = classify(ev).iloc[-1]
    assert (k["cls"], k["subclass"], k["decided_by"], k["coll_op"]) == (
        "collective",
        "custom_allreduce",
        "launch_op",
        "all_reduce",
    )
    # and without correlation there is no launch to follow: the name rules decide
    k = classify(ev.drop(columns="correlation")).iloc[-1]
    assert (k["cls"], k["decided_by"]) == ("compute", "name")


# ------------------------------------------------------------------ 4 ranks of custom all-reduce


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_sglang_custom_allreduce_on_4_ranks(tmp_path: Path, mode: str) -> None:
    _, truth, run = _run(tmp_path, MIXED, mode=mode)
    ar = AnalysedRun.of(run)
    ev = ar.events
    k = ev[ev["kind"] == "kernel"]
    shots = k[k["name"].isin([st.ONE_SHOT, st.TWO_SHOT])]
    assert len(shots) == 4 * len(truth.ar_ends) == 4 * 2 * len(MIXED)
    assert set(shots["cls"]) == {"collective"} and set(shots["subclass"]) == {"custom_allreduce"}
    # eager: the launching op (sglang::outplace_all_reduce) decided; graph replays have no launching
    # op per kernel: the name rules decided
    assert set(shots["decided_by"]) == {"launch_op" if mode == "eager" else "name"}
    assert (ev["cls"] == "unknown").sum() == 0
    b = breakdown(ar)
    assert b.unknown_kernels == [] and b.kernels_by_class["unknown"]["count"] == 0
    source = "launch_op" if mode == "eager" else "name"
    assert b.collectives_by_source[source]["count"] == len(shots)

    steps = ar.steps(None)
    ci = match_collectives(ev, ranks=run.ranks, rank_info=run.rank_info, steps=steps.steps)
    assert ci.match_by == {"default": "step_order"} and ci.n_instances == len(truth.ar_ends)
    pr = ci.per_rank.sort_values(["instance", "rank"])
    got_wait = pr["wait_ns"].to_numpy().reshape(-1, 4)
    got_transfer = pr["transfer_ns"].to_numpy().reshape(-1, 4)
    want_wait = np.array([[truth.wait(i, r) for r in range(4)] for i in range(len(truth.ar_ends))])
    want_transfer = np.array([[truth.transfer(i)] * 4 for i in range(len(truth.ar_ends))])
    assert (got_wait == want_wait).all() and (got_transfer == want_transfer).all()
    assert (got_wait[:, 3] == 0).all() and (got_wait[:, 0] > 0).all()  # rank 3 arrives last
    assert set(ci.stragglers.loc[ci.stragglers["last_count"] > 0, "rank"]) == {3}
    if mode == "eager":  # bytes from the op's record_shapes: [tokens, 4096] bf16
        assert ci.instances["size_bytes"].tolist() == truth.ar_bytes
        assert set(ci.instances["bytes_source"]) == {"trace"}
    else:
        assert set(ci.instances["bytes_source"]) == {"unknown"}


def test_counts_that_disagree_in_a_step_are_refused_naming_rank_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_dir, _, run = _run(tmp_path, ["step[DECODE bs=1]"] * 5, drop=(2, 3, 1))
    ar = AnalysedRun.of(run)
    with pytest.raises(MatchError) as exc:
        match_collectives(ar.events, ranks=run.ranks, steps=ar.steps(None).steps)
    msg = str(exc.value)
    assert "in step window 3 of each rank" in msg and "rank 2: 1" in msg and "rank 0: 2" in msg
    # the command: one line, exit 2
    base_dir, _, _ = _run(tmp_path, ["step[DECODE bs=1]"] * 5, name="tp1", ranks=1)
    assert main(["shortfall", "--baseline", str(base_dir), "--sharded", str(bad_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error:") and "in step window 3" in err and err.count("\n") == 1


# ------------------------------------------------------------------ step kinds


def test_step_kinds_from_engine_range_names() -> None:
    assert step_kind("step[DECODE bs=2]") == ("decode", 2, 2)
    assert step_kind("step[EXTEND bs=1 toks=128]") == ("prefill", 1, 128)
    assert step_kind("execute_8_context_0(sq0sk0sqsq0sqsk0)_generation_8(sq8sk512sqsq8sqsk512)") == (
        "decode",
        8,
        8,
    )
    assert step_kind("execute_130_context_1(sq128sk128)_generation_2(sq2sk40)")[0] == "mixed"
    assert step_kind("decode_step") == ("", -1, -1)


def test_mixed_steps_reported_per_kind_per_token_from_one_decode_batch(tmp_path: Path) -> None:
    _, truth, run = _run(tmp_path, MIXED)
    ar = AnalysedRun.of(run)
    parts = attribute_run(ar, AttributionOptions(skip_first=1))
    # by construction every step's window is its annotation: the decode bs=1 steps are steps 1-5
    windows = [e - s for s, e in truth.step_host_window]
    tok = parts.token_steps
    assert tok is not None and (tok.kind, tok.batch) == ("decode", 1) and tok.steps == frozenset(range(1, 6))
    assert parts.steady["step"].tolist() == [1, 2, 3, 4, 5]  # step 0 (extend) was the warm-up anyway
    assert parts.per_token["window"] == sum(windows[1:6]) / 5
    kinds = {(k["kind"], k["batch"]): k for k in to_builtins(parts.step_kinds)}
    assert {key: k["steps"] for key, k in kinds.items()} == {
        ("decode", 1): 5,
        ("decode", 2): 3,
        ("prefill", 1): 2,
    }
    assert kinds[("prefill", 1)]["tokens"] == 128
    assert kinds[("decode", 2)]["step_ns_mean"] == round(sum(windows[7:]) / 3)
    b = breakdown(ar)
    assert b.per_token.steps_used.batch == 1 and b.per_token.step_ns.n == 5
    assert {(k["kind"], k["batch"]) for k in to_builtins(b.step_kinds)} == set(kinds)
    assert any("decode steps of batch size 1" in n for n in b.data_quality.notes)


# ------------------------------------------------------------------ diff


def test_diff_with_one_or_two_steps_cannot_judge(tmp_path: Path) -> None:
    _, _, before = _run(tmp_path, ["step[DECODE bs=1]"] * 2, name="before")
    _, _, after = _run(tmp_path, ["step[DECODE bs=1]"] * 3, name="after", layers=3)
    d = diff(before, after, options=AttributionOptions(skip_first=0))
    doc = d.to_json()
    assert doc["verdict"] == CANNOT_JUDGE and doc["interval"]["relative"] is None
    assert doc["summary"].startswith("Cannot judge: the runs have too few comparable steps")
    assert "no significant change" not in doc["summary"].lower()
    assert not d.fails(0.0)


def test_diff_compares_decode_of_one_batch_size_only(tmp_path: Path) -> None:
    _, _, before = _run(tmp_path, ["step[DECODE bs=1]"] * 6, name="before")
    _, _, after = _run(tmp_path, ["step[DECODE bs=2]"] * 6, name="after")
    doc = diff(before, after).to_json()
    assert doc["verdict"] == CANNOT_JUDGE
    assert "decode steps of batch size 1" in doc["summary"] and "batch size 2" in doc["summary"]
    # like with like: enough decode steps of one batch size are judged
    _, _, again = _run(tmp_path, ["step[DECODE bs=1]"] * 6, name="again", layers=4)
    assert diff(before, again).to_json()["verdict"] == "slower"


# ------------------------------------------------------------------ overlap scheduling, graphs


def test_overlap_scheduler_windows_from_the_device_side(tmp_path: Path) -> None:
    names = ["step[DECODE bs=1]", "step[DECODE bs=2]"] * 3
    _, truth, run = _run(tmp_path, names, overlap=True)
    ar = AnalysedRun.of(run)
    found = ar.steps(None)
    assert found.data_quality.counts["step_windows_device_paced"] == 4 * len(names)
    assert "step_windows_clipped" not in found.data_quality.counts
    table = ar.partition(found.steps)
    r0 = table[table["rank"] == 0].sort_values("step")
    assert r0["start_ns"].tolist() == truth.step_device_start
    # each window holds the work its own step launched: rank 0's GEMMs of that step
    assert r0["compute_ns"].tolist() == [k[0] for k in truth.step_kernel_ns]
    # the host's annotations would have mixed neighbouring steps
    host_start = [s for s, _ in truth.step_host_window]
    assert host_start != truth.step_device_start


def test_graph_replay_branches_are_not_damaged_timestamps(tmp_path: Path) -> None:
    _, _, run = _run(tmp_path, ["step[DECODE bs=1]"] * 3, mode="graph")
    counts = run.data_quality.counts
    assert "gpu_stream_overlaps" not in counts and counts["graph_replay_concurrent"] == 4 * 3
    mask = graph_replay_mask(run.events)
    gpu = run.events["kind"].isin(["kernel"]).to_numpy()
    assert mask[gpu].all() and not mask[~gpu].any()
    # eager kernels are no graph replay's
    _, _, eager = _run(tmp_path, ["step[DECODE bs=1]"] * 3, name="eager")
    assert not graph_replay_mask(eager.events).any()


def test_shared_sglang_trace_graph_kernels_are_marked(shared_traces: Path) -> None:
    path = shared_traces / "external/tracelens/sglang_qwen3-8b_decode.json.gz"
    if not path.exists():
        pytest.skip("shared trace absent")
    ev = read_run([path], cache=False).events
    # 544 of its 555 kernels ran from one hipGraphLaunch (tests/test_any_trace.py)
    assert int(graph_replay_mask(ev).sum()) == 544


# ------------------------------------------------------------------ the commands follow


def test_commands_on_the_serving_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, truth, _ = _run(tmp_path, MIXED)
    base_dir, _, _ = _run(tmp_path, MIXED, name="tp1", ranks=1)
    assert main(["breakdown", str(run_dir), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unknown_kernels"] == [] and doc["per_token"]["steps_used"]["kind"] == "decode"
    assert doc["collectives_by_source"]["launch_op"]["count"] == 4 * len(truth.ar_ends)
    assert (
        main(["shortfall", "--baseline", str(base_dir), "--sharded", str(run_dir), "--format", "json"]) == 0
    )
    sf = json.loads(capsys.readouterr().out)
    steps = sf["sharded"]["steps"] if "sharded" in sf else sf["steps"]["sharded"]
    assert steps["per_token_steps"]["batch"] == 1 and {k["kind"] for k in steps["kinds"]} == {
        "decode",
        "prefill",
    }
    out = tmp_path / "trace.perfetto.json"
    assert main(["export", str(run_dir), "--perfetto", str(out)]) == 0
    exported = json.loads(out.read_text())
    evs = exported["traceEvents"] if isinstance(exported, dict) else exported
    shots = [e for e in evs if e.get("name") in (st.ONE_SHOT, st.TWO_SHOT)]
    assert shots and all(e["args"]["class"] == "collective" for e in shots if "class" in e.get("args", {}))


def test_shared_sglang_trace_step_kind(shared_traces: Path) -> None:
    """The real SGLang decode trace (TraceLens, AMD): its `step[DECODE bs=32]` is one decode step of
    batch 32 (the vLLM-style `execute_32_context_0(...)_generation_32(...)` inside it says the same)."""
    path = shared_traces / "external/tracelens/sglang_qwen3-8b_decode.json.gz"
    if not path.exists():
        pytest.skip("shared trace absent")
    run = read_run([path], cache=False)
    inner = [n for n in run.events["name"].astype(str).unique() if n.startswith("execute_")]
    assert [step_kind(n)[:2] for n in inner] == [("decode", 32)]
    b = breakdown(run)
    assert [(k["kind"], k["batch"], k["tokens"], k["steps"]) for k in to_builtins(b.step_kinds)] == [
        ("decode", 32, 32, 1)
    ]
    assert b.per_token.steps_used.batch == 32


def test_dask_engine_matches_by_step_as_the_local_engine(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The Dask engine's bucket tasks match before the windows exist: the client re-matches the
    order-matched kernels by step, so its JSON is the local engine's, and a count that disagrees in
    one step is refused with the same message. On the session's two-worker cluster (conftest's
    `dask`: the Dask engine's tests share it)."""
    pytest.importorskip("distributed")
    from tracekit.engine import shortfall_paths

    run_dir, _, _ = _run(tmp_path, MIXED)
    base_dir, _, _ = _run(tmp_path, MIXED, name="tp1", ranks=1)
    bad_dir, _, _ = _run(tmp_path, ["step[DECODE bs=1]"] * 5, name="bad", drop=(2, 3, 1))
    local = shortfall_paths(base_dir, run_dir).to_json()
    assert local["collectives"]["match_by"] == {"default": "step_order"}
    with pytest.raises(MatchError) as local_exc:
        shortfall_paths(base_dir, bad_dir)
    eng = request.getfixturevalue("dask")
    assert json.dumps(shortfall_paths(base_dir, run_dir, eng).to_json()) == json.dumps(local)
    with pytest.raises(MatchError) as dask_exc:
        shortfall_paths(base_dir, bad_dir, eng)
    assert str(dask_exc.value) == str(local_exc.value) and "in step window 3" in str(local_exc.value)


def test_shortfall_says_when_baseline_and_sharded_token_steps_differ(tmp_path: Path) -> None:
    from tracekit.engine import shortfall_paths

    run_dir, _, _ = _run(tmp_path, MIXED)  # decode bs=1 has the most steps
    base_dir, _, _ = _run(tmp_path, ["step[DECODE bs=2]"] * 4, name="tp1", ranks=1)
    same_dir, _, _ = _run(tmp_path, MIXED, name="tp1same", ranks=1)
    doc = shortfall_paths(base_dir, run_dir).to_json()
    assert doc["data_quality"]["counts"]["per_token_steps_differ"] == 1
    assert (
        "per_token_steps_differ" not in shortfall_paths(same_dir, run_dir).to_json()["data_quality"]["counts"]
    )


def test_custom_allreduce_kernel_names_are_all_reduces() -> None:
    import pandas as pd

    from tracekit.analyse.collectives.select import normalise_op

    names = pd.Series(
        [
            "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 4>(vllm::RankData*, vllm::RankSignals, int)",
            st.TWO_SHOT,
            st.ONE_SHOT,
            "void tensorrt_llm::kernels::rmsNormLamport<__nv_bfloat16>(float*, int)",
            "void at::native::reduce_kernel<512, 1>(int)",
        ]
    )
    assert normalise_op(names).tolist() == ["all_reduce"] * 4 + ["reduce"]


def test_step_order_falls_back_to_the_run_order_only_when_every_stream_total_agrees() -> None:
    import pandas as pd

    from tracekit.analyse.collectives.groups import match_by_step_order

    def rows(steps_r0: list[int], steps_r1: list[int]) -> pd.DataFrame:
        out = []
        for r, steps in ((0, steps_r0), (1, steps_r1)):
            for i, s_ in enumerate(steps):
                out.append(
                    {"rank": r, "stream": 7 + r, "start_ns": 100 * i, "end_ns": 100 * i + 50, "step": s_}
                )
        return pd.DataFrame(out)

    key, how = match_by_step_order("default", rows([0, 0, 1, 1], [0, 0, 1, 1]))
    assert how == "step_order" and key.tolist() == [0, 1, 2, 3] * 2
    # rank 1's windows put its third collective in step 0: the totals agree, so the run order pairs them
    key, how = match_by_step_order("default", rows([0, 0, 1, 1], [0, 0, 0, 1]))
    assert how == "order" and key.tolist() == [0, 1, 2, 3] * 2
    with pytest.raises(MatchError, match="step window 1 of each rank.*rank 0: 2, rank 1: 1"):
        match_by_step_order("default", rows([0, 0, 1, 1], [0, 0, 1]))


def test_zero_length_ops_at_one_timestamp_launch_nothing() -> None:
    # a simulated trace with free launches writes every host event at one timestamp: no nesting is
    # known, so the c10d op there does not make the next GEMM a collective; a launch at an op's end
    # belongs to what follows
    rows = [
        ("cpu_op", "c10d::allreduce_", 100, 100, -1, 1, -1),
        ("runtime", "cudaLaunchKernel", 100, 100, 5, 1, -1),
        ("cpu_op", "vllm::all_reduce", 200, 300, -1, 1, -1),
        ("runtime", "cudaLaunchKernel", 300, 300, 6, 1, -1),
        ("kernel", "void my_engine::gemv_kernel<8>(float*)", 400, 500, 5, 7, 0),
        ("kernel", "void my_engine::gemv_kernel<8>(float*)", 500, 600, 6, 7, 0),
    ]
    kind, name, s, e, c, stream, dev = (list(x) for x in zip(*rows, strict=True))
    ev = make_events(
        {"rank": [0] * len(rows), "kind": kind, "name": name, "start_ns": s, "end_ns": e, "correlation": c}
        | {"stream": stream, "device": dev}
    )
    k = classify(ev)
    assert k.loc[k["kind"] == "kernel", "cls"].tolist() == ["compute", "compute"]
