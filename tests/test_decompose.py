"""`tracekit decompose` (docs/METHOD.md section Speedup decomposition): the per-token speedup A/C split on a log scale through B.

Ground truth from fresh CPU captures (tiny preset, gloo, TP=2, 8 tokens): A sleeps 30 ms on rank 1
before each all-reduce, B 10 ms, C not at all. Each token has 4 all-reduces (2 per layer), so
A = C + 120 ms and B = C + 40 ms per token by construction: with C measured, the runtime part is
log((C + 120) / (C + 40)) / log((C + 120) / C). The decomposition must recover it within 10%,
and put the saving of both parts in coordination (the waiting the sleep causes), not compute.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from tracekit.analyse.compare.decompose import CLASSES, bootstrap, log_shares
from tracekit.analyse.timeline.compute_split import compute_split
from tracekit.cli.main import main

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"


def test_log_parts_sum_to_one_and_follow_the_definition():
    rt, kn = log_shares(100.0, 50.0, 25.0)
    assert rt == pytest.approx(0.5) and kn == pytest.approx(0.5)
    rt, kn = log_shares(8.0, 4.0, 1.0)
    assert rt == pytest.approx(math.log(2) / math.log(8)) and rt + kn == pytest.approx(1.0)
    assert log_shares(5.0, 3.0, 5.0) is None  # no speedup to split
    rt, kn = log_shares(10.0, 12.0, 5.0)  # the intermediate is slower than the baseline: reported as is
    assert rt < 0 < 1 < kn


def test_bootstrap_is_deterministic_and_brackets_the_point_estimate():
    a, b, c = [100, 104, 98, 101] * 5, [50, 51, 49, 52] * 5, [20, 21, 19, 20] * 5
    one, two = bootstrap([a, b, c]), bootstrap([a, b, c])
    assert one == two
    rt, _ = log_shares(sum(a) / len(a), sum(b) / len(b), sum(c) / len(c))
    lo, hi = one["runtime_part"]
    assert lo <= rt <= hi


def test_compute_split_is_exact_and_inside_compute():
    import pandas as pd

    from tracekit.classify import classify

    ev = pd.DataFrame(
        {
            "rank": [0, 0, 0],
            "kind": ["kernel", "kernel", "kernel"],
            "name": [
                "ampere_bf16_s16816gemm_bf16_128x64",
                "at::native::vectorized_elementwise_kernel",
                "rms_norm_kernel",
            ],
            "start_ns": [100, 300, 350],
            "end_ns": [300, 350, 400],
            "stream": [7, 7, 7],
        }
    )
    ev["kind"] = ev["kind"].astype("category")
    ev["name"] = ev["name"].astype("category")
    cl = classify(ev)
    steps = pd.DataFrame({"rank": [0], "step": [1], "start_ns": [0], "end_ns": [500], "compute_ns": [300]})
    out = compute_split(cl, steps)
    assert out.loc[0, "matrix_ns"] == 200 and out.loc[0, "vector_ns"] == 100


def test_cli_on_the_committed_cpu_traces(tmp_path, capsys):
    out = tmp_path / "d.json"
    rc = main(
        [
            "decompose",
            "--baseline",
            str(TRACES / "cpu-tp2-straggler"),
            "--intermediate",
            str(TRACES / "cpu-tp2"),
            "--full",
            str(TRACES / "cpu-tp1"),
            "--format",
            "json",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "tracekit.decompose"
    assert doc["parts"]["runtime"] + doc["parts"]["kernel"] == pytest.approx(1.0)
    for part, (x, y) in {"runtime": ("baseline", "intermediate"), "kernel": ("intermediate", "full")}.items():
        mv = doc["moved"][part]
        assert sum(mv["saved_by_class_ns"].values()) == mv["saved_ns"]
        assert mv["saved_ns"] == doc["runs"][x]["per_token_ns"] - doc["runs"][y]["per_token_ns"]
    for r in doc["runs"].values():
        assert sum(r["classes_ns"].values()) == r["per_token_ns"]
        assert set(r["classes_ns"]) == set(CLASSES)
    # the straggler's 80 ms of sleep per token is coordination
    assert doc["moved"]["runtime"]["top"] == "coordination"
    lo, hi = doc["intervals"]["runtime_part"]
    assert lo <= doc["parts"]["runtime"] <= hi
    assert main(["decompose", "--help"]) == 0
    assert "Examples" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------
# ground truth on fresh captures

DELAY_A_MS, DELAY_B_MS = 30.0, 10.0
ALL_REDUCES_PER_TOKEN = 4  # tiny preset: 2 layers x (attention + MLP)
TOKENS = 8


@pytest.fixture(scope="module")
def three_runs():
    """The committed set (scripts/capture_cpu_test_traces.py, set `decompose`): the three TP=2
    captures taken back to back and kept only because the host ran at one speed throughout (a
    live capture on a loaded host moved the share by more than the 10% this test allows)."""
    import json

    from tracekit.read import read_run

    probes = json.loads((TRACES / "cpu-decompose-probes.json").read_text())["before_after_s"]
    runs = {}
    speed = []  # the host-speed probe before and after each capture
    for name in ("baseline", "intermediate", "full"):
        folder = f"cpu-decompose-{name}"
        speed.extend(probes[folder])
        runs[name] = read_run([TRACES / folder])
    runs["_speed"] = speed
    return runs


def test_injected_stage_share_is_recovered_within_10_percent(three_runs):
    from tracekit.analyse.compare.decompose import decompose_runs

    d = decompose_runs({k: v for k, v in three_runs.items() if not k.startswith("_")})
    doc = d.to_json()
    c = doc["runs"]["full"]["per_token_ns"]
    inj_a = DELAY_A_MS * 1e6 * ALL_REDUCES_PER_TOKEN
    inj_b = DELAY_B_MS * 1e6 * ALL_REDUCES_PER_TOKEN
    assert doc["runs"]["baseline"]["per_token_source"] == "unprofiled"
    # the saving of both parts is the sleep's waiting: coordination, not compute (the sleeps are
    # wall time: this holds whatever speed the host runs at)
    for part, injected in (("runtime", inj_a - inj_b), ("kernel", inj_b)):
        mv = doc["moved"][part]
        assert mv["top"] == "coordination"
        assert mv["saved_by_class_ns"]["coordination"] == pytest.approx(injected, rel=0.15)
        compute_moved = abs(mv["saved_by_class_ns"]["matrix"]) + abs(mv["saved_by_class_ns"]["vector"])
        assert compute_moved < 0.1 * injected
    assert Fraction(sum(d.moved().runtime.saved_by_class_ns.values())) == doc["moved"]["runtime"]["saved_ns"]
    # the shares' truth assumes one host speed for the three captures: the compute part c scales
    # with it and the log shares move with every ms of it (this 2-core VM switches between two
    # speeds, a pure-Python probe taking ~12 or ~21 ms, for minutes at a time; seen: the
    # intermediate run 7.4 ms per token slower than its injected 40 ms, runtime share 0.33 vs 0.39)
    speed = three_runs["_speed"]
    per_capture = [(a + b) / 2 for a, b in zip(speed[::2], speed[1::2], strict=True)]
    moved = max(per_capture) / min(per_capture)
    if moved > 1.25:
        pytest.skip(
            f"host speed moved {moved:.2f}x across the captures (probe before/after each "
            + ", ".join(f"{t * 1e3:.0f}" for t in speed)
            + " ms): the shares' truth needs one speed; the class checks above passed"
        )
    truth_runtime, truth_kernel = log_shares(c + inj_a, c + inj_b, c)
    got_runtime, got_kernel = doc["parts"]["runtime"], doc["parts"]["kernel"]
    assert got_runtime == pytest.approx(truth_runtime, rel=0.10), (got_runtime, truth_runtime, doc["verdict"])
    assert got_kernel == pytest.approx(truth_kernel, rel=0.10)


@pytest.mark.parametrize("trace", ["h200-tp1", "cpu-tp2"])
def test_breakdown_shows_matrix_and_vector_compute_per_step(trace):
    from tracekit.analyse.timeline.breakdown import breakdown
    from tracekit.read import read_run

    doc = breakdown(read_run([TRACES / trace])).to_json()
    for st in doc["steps"]:
        split = st["compute_split_ns"]
        assert split["matrix"] + split["vector"] == st["parts_ns"]["compute"]
        assert split["matrix"] >= 0 and split["vector"] >= 0
    # the eager 7b step: GEMMs and attention are most, not all, of the compute
    matrix = sum(s["compute_split_ns"]["matrix"] for s in doc["steps"])
    compute = sum(s["parts_ns"]["compute"] for s in doc["steps"])
    assert 0.2 < matrix / compute < 0.9


def test_h200_eager_to_cuda_graphs_to_compile():
    """The committed H200 runs (7b shape, 8 layers, TP=1, batch 1): eager -> CUDA graphs (the new
    runtime: same kernels, no per-kernel launch from Python) -> torch.compile inside the graph (new
    kernels: the elementwise work fused). Known answer: the runtime part is host gaps
    (coordination) and leaves the matrix work alone; the kernel part is vector compute."""
    from tracekit.analyse.compare.decompose import decompose_runs
    from tracekit.read import read_run

    names = {
        "baseline": "h200-tp1-eager-whatif",
        "intermediate": "h200-tp1-graphs",
        "full": "h200-tp1-graphs-compile",
    }
    for n in names.values():
        if not (TRACES / n).is_dir():
            pytest.skip(f"traces/{n} not committed")
    doc = decompose_runs({k: read_run([TRACES / n]) for k, n in names.items()}).to_json()
    assert all(r["per_token_source"] == "unprofiled" for r in doc["runs"].values())
    rt, kn = doc["moved"]["runtime"], doc["moved"]["kernel"]
    assert rt["top"] == "coordination" and rt["share_of_saving"]["coordination"] > 0.9
    assert abs(rt["saved_by_class_ns"]["matrix"]) < 0.02 * rt["saved_ns"]
    assert kn["top"] == "vector" and kn["share_of_saving"]["vector"] > 0.6
    assert abs(kn["saved_by_class_ns"]["matrix"]) < 0.1 * kn["saved_ns"]
    assert 0.6 < doc["parts"]["runtime"] < 0.85  # 72.5% when committed
