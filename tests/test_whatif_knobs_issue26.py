"""The what-if knobs of issue 26, `collective_latency=US[@GBPS]` and `allreduce_norm=fused`: on
simulated runs whose truth is a re-simulation of the knob's meaning (tests/groundtruth), and on a
committed H200 trace (docs/METHOD.md section Critical path and what-if)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from tests.groundtruth import sim
from tests.groundtruth.harness import _load, tolerance
from tests.groundtruth.kineto import write_run
from tests.groundtruth.sim import Coll, Host, Item, Kernel, RankSpec, RunSpec
from tracekit.analyse.whatif.knobs import ReplayError, parse_combination, parse_knob
from tracekit.analyse.whatif.pair import whatif

ROOT = Path(__file__).resolve().parents[1]


def _program(tp: int, transfer: int):
    """Per token: 2 layers of [GEMM, all-reduce, add, norm] x 2, an LM-head GEMM, an all-gather;
    the GEMMs shrink with tp, the adds and norms do not (replicated vector work)."""

    def program(k: int) -> list:
        ops: list = []

        def kern(name: str, dur: int, vector: bool = False) -> None:
            ops.append(Host(2000))
            ops.append(Kernel(name, dur if vector else dur // tp, ideal=dur // tp, vector=vector))

        for layer in range(2):
            for part in ("attn", "mlp"):
                kern(f"nvjet_sm90_tst_{part}{layer}_gemm", 60_000)
                if tp > 1:
                    ops.append(Host(2000))
                    ops.append(Coll("all_reduce", 8192, transfer))
                kern("vectorized_elementwise_kernel_add", 4000, vector=True)
                kern("rms_norm_kernel", 6000, vector=True)
        kern("nvjet_sm90_tst_lm_head_gemm", 40_000)
        if tp > 1:
            ops.append(Host(2000))
            ops.append(Coll("all_gather", 64000, transfer))
        ops.append(Host(2000))
        ops.append(Item())
        return ops

    return program


def _spec(tp: int, transfer: int = 15_000) -> RunSpec:
    return RunSpec(name=f"fused-tp{tp}", ranks=tuple(RankSpec(_program(tp, transfer)) for _ in range(tp)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("knobs26")
    base, shard = _spec(1), _spec(2)
    write_run(base, root / "tp1")
    write_run(shard, root / "tp2")
    bp, br = _load(root / "tp1", "baseline")
    sp, sr = _load(root / "tp2", "sharded")
    return base, shard, (bp, br, sp, sr)


@pytest.mark.parametrize(
    "knob",
    [
        "collective_latency=5@400",  # 5 us + 8 KiB at 400 GB/s: below NCCL's 15 us
        "collective_latency=0.5@2",  # the bytes' term dominates: 8192 B x 1 / 2 GB/s = 4.1 us
        "collective_latency=40@400",  # slower than the measured transfer: kept as it is
        "allreduce_norm=fused",
        "allreduce_norm=fused,collective_latency=5@400",
    ],
)
def test_knob_matches_the_resimulated_truth(knob: str, runs) -> None:
    base, shard, (bp, br, sp, sr) = runs
    ks = parse_combination(knob)
    doc = whatif(bp, br, sp, sr, list(ks) if len(ks) == 1 else [], [ks] if len(ks) > 1 else []).to_json()
    spec_key = ",".join(k.spec for k in ks)
    got = doc["predicted_ns"][spec_key]["2"]
    truth = sim.simulate(shard, knobs=frozenset(knob.split(","))).per_token_ns()
    plain = sim.simulate(shard).per_token_ns()
    assert abs(got - truth) <= tolerance(float(truth)), (knob, got, float(truth), float(plain))
    # TP=1 has no collectives: neither knob applies there
    assert doc["predicted_ns"][spec_key]["1"] == doc["predicted_ns"]["none"]["1"]
    if knob != "collective_latency=40@400":  # the knob moves the time by more than the tolerance
        assert plain - truth > tolerance(float(truth))
    else:
        assert truth == plain


def test_norm_fusion_removes_exactly_the_vector_kernels_after_each_all_reduce(runs) -> None:
    """4 all-reduces per token, each followed by an add and a norm (4 + 6 us): 40 us per token of
    device time, on a GPU-bound rank whose kernels run back to back: the token shrinks by 40 us."""
    base, shard, (bp, br, sp, sr) = runs
    truth = (
        sim.simulate(shard).per_token_ns()
        - sim.simulate(shard, knobs={"allreduce_norm=fused"}).per_token_ns()
    )
    assert truth == Fraction(40_000)
    doc = whatif(bp, br, sp, sr, [parse_knob("allreduce_norm=fused")]).to_json()
    saved = doc["predicted_ns"]["none"]["2"] - doc["predicted_ns"]["allreduce_norm=fused"]["2"]
    assert abs(saved - 40_000) <= 1000


def test_knob_parsing_says_what_is_wrong() -> None:
    k = parse_knob("collective_latency=5@400")
    assert k.latency_ns == 5000 and k.busbw_gbps == 400
    # all_reduce at 2 ranks: bus factor 2(n-1)/n = 1; 400 KB at 400 GB/s = 1 us
    assert k.transfer_ns("all_reduce", 400_000, 2) == pytest.approx(6000)
    assert k.transfer_ns("all_reduce", 400_000, 4) == pytest.approx(5000 + 1.5 * 1000)
    assert "lesser of its own and 5 us" in k.definition
    for bad in ("collective_latency=x", "collective_latency=-1@400", "collective_latency=5@0"):
        with pytest.raises(ReplayError):
            parse_knob(bad)
    with pytest.raises(ReplayError, match="needs a bandwidth"):
        parse_knob("collective_latency=5")
    with pytest.raises(ReplayError, match="allreduce_norm=fused"):
        parse_knob("allreduce_norm=on")
    probe = ROOT / "reports" / "multi-gpu" / "links-decode-sizes.json"
    kp = parse_knob("collective_latency=5", str(probe))
    assert kp.probe is not None and kp.busbw_gbps is None
    # the probe's best all-reduce algorithm bandwidth prices the bytes
    best = kp.probe.best_algbw("all_reduce")
    assert kp.transfer_ns("all_reduce", 1 << 20, 2) == pytest.approx(5000 + (1 << 20) / best)


@pytest.fixture(scope="module")
def h200_graph_model():
    """The committed two-H200 TP=2 CUDA-graph decode (traces/h200x2-tp2-b1-graphs), its replay model
    corrected to the unprofiled per-token time as `tracekit whatif` does."""
    from fractions import Fraction as F

    from committed_pairs import committed_analysed, committed_parts

    from tracekit.analyse.retime.calibrate import calibrate
    from tracekit.analyse.whatif.build import build_model

    # the process's one classification and attribution of the run (tests/committed_pairs.py)
    run = committed_analysed("h200x2-tp2-b1-graphs")
    parts = committed_parts("h200x2-tp2-b1-graphs", "sharded")
    u = parts.dilation.unprofiled
    model = build_model(parts, run, F(u.mean_ns), "sharded")
    calibrate(model)
    return model, run.events


def test_norm_fusion_on_a_committed_graph_trace(h200_graph_model) -> None:
    """In the reference decoder each all-reduce is followed by the residual add and an unfused
    RMSNorm (cast, pow, mean, add, rsqrt, mul, weight cast, mul, cast back: 10 kernels) before the
    next GEMM. Found by kernel name alone, independently of the classifier, they are exactly the
    operations the knob zeroes; the device runs the graph back to back, so the replayed token
    shrinks by their (calibrated) device time. Before the q_typ fix in graph.py an in-graph
    operation's queue edge from the operation before the replay held it at its measured offset
    and the replay gave back 57% of it."""
    import re

    import numpy as np

    from tracekit.analyse.path.roles import ROLE_XFER
    from tracekit.analyse.whatif.knobs import setting_for

    model, events = h200_graph_model
    g = model.graph
    mask = model.norm_after_all_reduce
    assert mask is not None
    k = events[events["kind"].astype(str) == "kernel"].sort_values(["rank", "start_ns"], kind="stable")
    found: set[tuple[int, int, int]] = set()
    for r, grp in k.groupby("rank"):
        armed = False
        for name, s, e in zip(grp["name"].astype(str), grp["start_ns"], grp["end_ns"], strict=True):
            if "AllReduce" in name:
                armed = True
            elif re.search(r"nvjet|gemm|cublas|nccl", name):
                armed = False
            elif armed:
                found.add((int(r), int(s), int(e)))
    edges = np.flatnonzero(mask)
    off = np.asarray([g.offsets.get(int(r), 0) for r in g.erank[edges]])
    chosen = set(
        zip(
            g.erank[edges].tolist(),
            (g.t[g.src[edges]] + off).tolist(),
            (g.t[g.dst[edges]] + off).tolist(),
            strict=True,
        )
    )
    in_graph = {x for x in found if g.t.min() <= x[1] - g.offsets.get(x[0], 0) <= g.t.max()}
    assert chosen == in_graph
    per_ar = len(chosen) / (2 * len(g.steps) * 16)  # 2 ranks, 8 layers x 2 all-reduces per step
    assert per_ar == 10
    plain = setting_for(model, [], None, 2)
    fused = setting_for(model, [parse_knob("allreduce_norm=fused")], None, 2)
    lat = model.latencies(plain)
    removed = lat[mask].sum() / (2 * len(g.steps))  # per rank and token
    saved = float(model.replay(plain).mean() - model.replay(fused).mean())
    assert saved == pytest.approx(removed, rel=0.03)
    # collective_latency: each all-reduce's transfer becomes min(its own, 5 us + 8 KiB at 400 GB/s)
    cl = setting_for(model, [parse_knob("collective_latency=5@400")], None, 2)
    x = g.role == ROLE_XFER
    new = model.latencies(cl)[x]
    ops = np.asarray(g.xfer_op)
    ar = ops == "all_reduce"
    expect = np.minimum(lat[x][ar], np.rint(5000 + g.xfer_bytes[ar] / 400.0))
    assert (g.xfer_bytes[ar] == 8192).all() and (new[ar] == expect).all()
    assert float(model.replay(cl).mean()) < float(model.replay(plain).mean())


def test_cli_bad_knob_is_one_line_and_exit_2(capsys) -> None:
    from tracekit.cli.main import main

    rc = main(["whatif", "--baseline", str(ROOT / "traces" / "cpu-tp1"), "--knob", "collective_latency=5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("tracekit: error:") and "@GBPS" in err[0]
    assert main(["whatif", "--help"]) == 0
    out = capsys.readouterr().out
    assert "collective_latency=US[@GBPS]" in out and "--knob allreduce_norm=fused" in out
