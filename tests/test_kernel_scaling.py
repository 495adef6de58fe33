"""The compute term split by kernel (tracekit/analyse/compute/kernel_scaling.py): truth by construction on
small kernel sequences, and the committed two-H200 pairs (eager and CUDA graphs)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest
from committed_pairs import committed_run, committed_shortfall

from tracekit.analyse.compute.kernel_scaling import compute_scaling, kernel_table

TRACES = Path(__file__).resolve().parents[1] / "traces"


def _events(
    rank: int, steps: list[list[tuple[str, str, int]]], gap: int = 1_000
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Classified-like rows: per step a list of (name, subclass, duration ns) kernels run back to back."""
    rows, windows, t = [], [], 1_000_000
    for st, kernels in enumerate(steps):
        w0 = t
        for name, sub, d in kernels:
            rows.append(
                {
                    "rank": rank,
                    "kind": "kernel",
                    "cls": "compute",
                    "subclass": sub,
                    "rule": "attention"
                    if name.startswith("attn")
                    else "gemm"
                    if sub == "matrix"
                    else "elementwise",
                    "name": name,
                    "start_ns": t,
                    "end_ns": t + d,
                }
            )
            t += d + gap
        # a collective kernel in the step is not compute: it must stay out of the table
        rows.append(
            {
                "rank": rank,
                "kind": "kernel",
                "cls": "collective",
                "subclass": "nccl",
                "rule": "nccl",
                "name": "ncclDevKernel_AllReduce",
                "start_ns": t,
                "end_ns": t + 5_000,
            }
        )
        t += 5_000 + gap
        windows.append({"step": st, "start_ns": w0, "end_ns": t})
        t += 10_000
    return pd.DataFrame(rows), pd.DataFrame(windows)


def test_classes_match_the_constructed_truth() -> None:
    # TP=1: norm 10 us, GEMM 100 us + split-K reduce 8 us, act 6 us; TP=2 per rank: norm 10 us (replicated),
    # another GEMM kernel 54 us alone (the GEMM unit: 108 -> 54, shrank 2-fold), act 4.5 us (partly: 0.75),
    # and a gather copy only at TP=2 (2 us)
    tp1 = [
        ("norm", "vector", 10_000),
        ("gemm_a", "matrix", 100_000),
        ("splitK", "matrix", 8_000),
        ("act", "vector", 6_000),
    ]
    tp2 = [
        ("norm", "vector", 10_000),
        ("gemm_b", "matrix", 54_000),
        ("act", "vector", 4_500),
        ("cat", "vector", 2_000),
    ]
    e1, w1 = _events(0, [tp1] * 4)
    k1 = kernel_table(e1, 0, w1)
    k2 = pd.concat([kernel_table(e, r, w) for r in (0, 1) for e, w in [_events(r, [tp2] * 4)]])
    assert set(k1["name"]) == {"norm", "gemm_a", "splitK", "act"}  # the collective is not compute
    # the compute term of this construction: per rank 70.5 us vs 124 / 2 = 62 us -> 8.5 us
    term = (10_000 + 54_000 + 4_500 + 2_000) - (10_000 + 108_000 + 6_000) // 2
    cs = msgspec.to_builtins(compute_scaling(k1, [1, 2, 3], k2, [1, 2, 3], 2, term))
    c = cs["classes"]
    assert c["replicated"]["lost_ns"] == 10_000 - 5_000
    assert c["shrank"]["lost_ns"] == 0  # 54 us against 108 / 2
    assert c["partly_shrank"]["lost_ns"] == 4_500 - 3_000
    assert c["added"]["lost_ns"] == 2_000
    assert cs["residual_ns"] == 0
    assert c["shrank"]["top"][0]["kernel_changed"] is True  # gemm_a + splitK became gemm_b
    assert cs["sequences"]["sharded"]["steps_following"] == 6  # 3 steps x 2 ranks


def test_a_step_off_the_sequence_goes_to_the_residual() -> None:
    base = [("norm", "vector", 10_000), ("gemm", "matrix", 100_000)]
    e1, w1 = _events(0, [base] * 3)
    odd = [("norm", "vector", 10_000), ("gemm", "matrix", 50_000), ("extra", "vector", 30_000)]
    e2, w2 = _events(0, [[("norm", "vector", 10_000), ("gemm", "matrix", 50_000)]] * 2 + [odd])
    k1, k2 = kernel_table(e1, 0, w1), kernel_table(e2, 0, w2)
    # compute term over all three steps: mean(60, 60, 90) - 110 / 2 = 15 us; the odd step is not canonical
    cs = msgspec.to_builtins(compute_scaling(k1, [0, 1, 2], k2, [0, 1, 2], 2, 15_000))
    assert cs["classes"]["replicated"]["lost_ns"] == 5_000
    assert cs["residual_ns"] == 10_000
    assert cs["sequences"]["sharded"] == {"units_per_step": 2, "steps_following": 2, "steps": 3}


def test_host_timeline_says_it_is_not_available() -> None:
    ev = pd.DataFrame(
        {
            "rank": [0],
            "kind": ["cpu_op"],
            "cls": ["compute"],
            "subclass": ["matrix"],
            "rule": ["host_matrix"],
            "name": ["aten::mm"],
            "start_ns": [10],
            "end_ns": [20],
        }
    )
    win = pd.DataFrame({"step": [0], "start_ns": [0], "end_ns": [100]})
    k = kernel_table(ev, 0, win)
    assert k.empty
    cs = msgspec.to_builtins(compute_scaling(k, [0], k, [0], 2, 0))
    assert cs["available"] is False and "host timeline" in cs["reason"]


@pytest.mark.parametrize("suffix", ["-graphs", ""])
def test_committed_h200_pairs(suffix: str) -> None:
    doc = committed_shortfall(f"h200x2-tp1-b1{suffix}", f"h200x2-tp2-b1{suffix}").to_json()
    cs = doc["compute_scaling"]
    term = doc["terms_ns"]["compute"]
    assert cs["available"] and cs["compute_term_ns"] == term
    assert sum(c["lost_ns"] for c in cs["classes"].values()) + cs["residual_ns"] == term
    # the residual is what kernel sums cannot see: small against the term on a one-stream decode
    assert abs(cs["residual_ns"]) < 0.02 * term
    # the matrix work is never "replicated": every GEMM unit shrank, fully or partly
    for c in ("replicated", "added", "removed"):
        assert not any(
            "nvjet" in k["name"] or "gemm" in k["name"].lower() for k in cs["classes"][c]["top"]
        ), c
    gemm = cs["classes"]["shrank"]["top"] + cs["classes"]["partly_shrank"]["top"]
    assert any("nvjet" in k["name"] for k in gemm)
    # the replicated vector work holds most of the term once the host is out of the way (graphs); ratio of
    # its TP=2 to TP=1 time is ~1 by the class's definition, and it is hundreds of kernels per token
    rep = cs["classes"]["replicated"]
    assert rep["kernels_per_token"] > 200
    assert rep["lost_ns"] > 0.5 * term
    assert 0.85 <= rep["sharded_ns"] / rep["baseline_ns"] <= 1.15
    if suffix == "-graphs":  # compute is the cause: the diagnosis names the class that loses most
        assert doc["diagnosis"].startswith("Compute did not shrink 2-fold")
        assert f"{rep['kernels_per_token']} kernels the TP layout repeats on every rank" in doc["diagnosis"]


def test_baseline_time_per_class_equals_the_kernels_in_the_trace() -> None:
    """The classes' TP=1 times sum to the baseline's compute-kernel time per canonical step, computed here
    from the raw events with plain pandas (no tracekit step or alignment code)."""
    base = committed_run("h200x2-tp1-b1-graphs")
    sf = committed_shortfall("h200x2-tp1-b1-graphs", "h200x2-tp2-b1-graphs")
    cs = sf.to_json()["compute_scaling"]
    steady = sf.baseline.steady_steps
    win = sf.baseline.steps[sf.baseline.steps["step"].isin(steady)]
    raw = base.events
    k = raw[(raw["kind"].astype(str) == "kernel")]
    total = 0
    for _, w in win.iterrows():
        inside = k[(k["start_ns"] >= w["start_ns"]) & (k["start_ns"] < w["end_ns"])]
        total += int((inside["end_ns"] - inside["start_ns"]).sum())
    per_token = total / len(win)
    # every graph replay is the same program
    assert cs["sequences"]["baseline"]["steps_following"] == len(win)
    classes = sum(c["baseline_ns"] for c in cs["classes"].values())
    assert classes == pytest.approx(per_token, abs=len(cs["classes"]))
    assert np.isfinite(per_token)


def test_compact_gathered_tables_hold_the_same_rows_and_give_the_same_split() -> None:
    """The ranks' kernel tables as the attribution plan moves them (`kernel_scaling.compact_kernels` per
    rank, `gather_kernels` on the client: names and units categorical, one run-level name
    numbering) hold the plain tables' rows, and the split by kernel is the plain tables' split. The
    two ranks run different sequences (rank 1's names partly its own, and it leads with another
    one on two steps), so the names' numbering must agree across the ranks for the most frequent
    sequence to be counted over both."""
    from tracekit.analyse.compute.kernel_scaling import compact_kernels, gather_kernels

    seq = [("norm", "vector", 10_000), ("gemm_b", "matrix", 54_000), ("act", "vector", 4_500)]
    other = [("cat", "vector", 2_000), *seq]
    plain = [
        kernel_table(e, r, w)
        for r, (e, w) in enumerate([_events(0, [seq] * 5), _events(1, [other, seq, other, seq, seq])])
    ]
    compact = gather_kernels([compact_kernels(k) for k in plain])
    assert all(isinstance(k["name"].dtype, pd.CategoricalDtype) for k in compact if k is not None)
    both = pd.concat(compact, ignore_index=True)
    assert isinstance(both["name"].dtype, pd.CategoricalDtype)  # one categorical for the run
    flat = pd.concat(plain, ignore_index=True)
    assert both.astype({"name": object, "unit": object}).astype(flat.dtypes.to_dict()).equals(flat)
    e0, w0 = _events(
        0, [[("norm", "vector", 10_000), ("gemm_a", "matrix", 108_000), ("act", "vector", 6_000)]] * 5
    )
    base = kernel_table(e0, 0, w0)
    term = 9_000
    want = msgspec.to_builtins(compute_scaling(base, [1, 2, 3, 4], flat, [1, 2, 3, 4], 2, term))
    got = msgspec.to_builtins(compute_scaling(base, [1, 2, 3, 4], both, [1, 2, 3, 4], 2, term))
    assert got == want
    # the sequence rank 0's four steps follow and rank 1's steps 1, 3 and 4 (not its step 2)
    assert got["sequences"]["sharded"]["steps_following"] == 7


def test_the_canonical_sequence_is_the_most_frequent_ties_to_the_first_and_a_prefix_is_another() -> None:
    """`canonical` over (rank, step) sequences by construction: two ranks whose steps run A, AB, AB
    (rank 0) and A, A, AB (rank 1), A a prefix of AB: 3 against 3, a tie, so the first in (rank,
    step) order (A) is canonical and only the three A steps follow it; with rank 1's last step A
    too, A is the most frequent (4 of 6); with both ranks AB AB AB, AB, its mean per kernel."""
    from tracekit.analyse.compute.kernel_scaling import canonical

    a = [("norm", "vector", 10_000)]
    ab = [("norm", "vector", 20_000), ("gemm", "matrix", 100_000)]

    def kernel_table_of(per_rank: list[list[list[tuple[str, str, int]]]]) -> pd.DataFrame:
        tables = []
        for r, steps in enumerate(per_rank):
            ev, win = _events(r, steps)
            tables.append(kernel_table(ev, r, win))
        return pd.concat(tables, ignore_index=True)

    tie = canonical(kernel_table_of([[a, ab, ab], [a, a, ab]]), [0, 1, 2])
    assert tie is not None and tie.names == ("norm",) and (tie.followed, tie.of) == (3, 6)
    most = canonical(kernel_table_of([[a, ab, ab], [a, a, a]]), [0, 1, 2])
    assert most is not None and most.names == ("norm",) and (most.followed, most.of) == (4, 6)
    full = canonical(kernel_table_of([[ab, ab, ab], [ab, ab, ab]]), [0, 1, 2])
    assert full is not None and full.followed == 6 and [int(x) for x in full.mean_ns] == [20_000, 100_000]


def test_a_runs_kept_canonical_sequence_is_the_one_of_its_steady_steps() -> None:
    """`document.run_canonical` keeps the run's canonical sequence (made ahead, beside the
    correction); a copy of the run that holds one steady step fewer (sharing what was kept) gets
    the sequence of its own steps, not the kept one: on h200-tp2, `of` one step's ranks fewer."""
    import copy

    from committed_pairs import committed_parts

    from tracekit.analyse.attribution.document import run_canonical
    from tracekit.analyse.compute.kernel_scaling import canonical

    parts = committed_parts("h200-tp2", "sharded")
    assert parts.kernels is not None
    whole = run_canonical(parts)
    assert whole == canonical(parts.kernels, parts.steady_steps)
    fewer = copy.copy(parts)  # the same kept readings
    slowest = parts.slowest.copy()
    slowest.loc[slowest["step"] == parts.steady_steps[-1], "steady"] = False
    fewer.slowest = slowest
    got = run_canonical(fewer)
    assert got == canonical(parts.kernels, parts.steady_steps[:-1])
    assert whole is not None and got is not None and got.of == whole.of - parts.n_ranks
