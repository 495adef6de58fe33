"""compare-links' pieces: probe curves at a size, the METHOD.md section 7 verdict on known numbers,
transport judgement, and the message sizes read from a real NCCL trace."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from tests.conftest import shared_trace
from tracekit.probe import spec
from tracekit.probe.compare import (
    busbw_at,
    judge_transport,
    mode_env,
    side_by_side,
    trace_collectives,
    verdict,
)
from tracekit.probe.links import Link, Topology
from tracekit.probe.results import make_row


def rows_with(busbw: dict[str, dict[int, float]], op: str = "all_reduce", n: int = 2) -> list[dict]:
    """Probe rows whose busbw is exactly the given value per (mode, size)."""
    rows = []
    f = 2 * (n - 1) / n
    for mode, curve in busbw.items():
        for size, bw in curve.items():
            lay = spec.layout(op, size, n, 4)
            t_us = size / (bw / f) / 1e3  # busbw = size / t * f
            row = make_row(
                op=op,
                lay=lay,
                backend="nccl",
                device="cuda",
                dtype="float32",
                in_place=True,
                time_us_per_rank=[t_us] * n,
                host_time_us_per_rank=[t_us] * n,
                timer="cuda_event",
                wrong=0,
                iters=1,
                warmup=0,
                mode=mode,
            )
            rows.append(row)
    return rows


ROWS = rows_with({"nvlink": {4096: 10.0, 16384: 40.0}, "pcie": {4096: 5.0, 16384: 10.0}})


def test_busbw_at_interpolates_in_log_size() -> None:
    v, how = busbw_at(ROWS, "all_reduce", "nvlink", 8192)  # half way in log2 between 4 KiB and 16 KiB
    assert v == pytest.approx(25.0) and how.startswith("interpolated")
    assert busbw_at(ROWS, "all_reduce", "nvlink", 4096) == (pytest.approx(10.0), "exact")
    v, how = busbw_at(ROWS, "all_reduce", "pcie", 1 << 30)
    assert v == pytest.approx(10.0) and "above the sweep" in how
    assert math.isnan(busbw_at(ROWS, "all_gather", "pcie", 4096)[0])


def trace(realised: float, xn_ns: float | None = 50_000.0) -> dict:
    return {
        "source": "transfer",
        "transfer_ns_per_token": xn_ns,
        "sizes": [
            {"op": "all_reduce", "bytes": 8192, "count": 100, "per_token": 10.0, "busbw_gbps": realised}
        ],
    }


def test_verdict_link_does_not_explain() -> None:
    text, d = verdict(ROWS, ["nvlink", "pcie"], trace(5.0), cpu_only=False)
    (p,) = d["per_size"]
    assert p["probe_busbw_gbps"] == {"nvlink": pytest.approx(25.0), "pcie": pytest.approx(7.5)}
    k = 25.0 / 7.5
    assert p["k"] == pytest.approx(k) and p["realised_share"] == pytest.approx(0.2)
    assert d["bound_ns_per_token"] == pytest.approx(50_000.0 * (1 - 1 / k))  # XN (1 - 1/k) = 35 us
    assert text.startswith("Link bandwidth does not explain the transfer time")
    assert "at most 35.0 us per token" in text and "8 KiB" in text


def test_verdict_link_can_explain_and_similar_modes() -> None:
    rows = rows_with({"nvlink": {4096: 10.0, 16384: 10.0}, "pcie": {4096: 9.0, 16384: 9.0}})
    text, d = verdict(rows, ["nvlink", "pcie"], trace(9.5, xn_ns=None), cpu_only=False)
    assert text.startswith("Link bandwidth can explain the transfer time")
    assert d["bound_ns_per_token"] is None and "per-token transfer is unknown" in text
    assert "similar bandwidth" in text


def test_verdict_without_trace_compares_modes() -> None:
    text, d = verdict(ROWS, ["nvlink", "pcie"], None, cpu_only=True)
    assert text.startswith("CPU only (gloo)")
    assert "(x4.00)" in text and "--trace" in text
    assert d["per_size"][0]["ratio"] == pytest.approx(4.0)


def test_side_by_side_marks_decode_sizes() -> None:
    sbs = side_by_side(ROWS, ["nvlink", "pcie"], {"all_reduce": {16384}})
    assert [(e["bytes"], e["decode"]) for e in sbs] == [(4096, False), (16384, True)]
    assert sbs[1]["ratio"] == pytest.approx(4.0)


def test_mode_env() -> None:
    assert mode_env("pcie") == {"NCCL_P2P_DISABLE": "1"}
    assert mode_env("pcie", "PHB") == {"NCCL_P2P_LEVEL": "PHB"}
    assert mode_env("nvlink") == {}


def _summary(kinds: dict, graph: list, wire: str, transport: str) -> dict:
    return {
        "connections": sum(kinds.values()),
        "kinds": kinds,
        "p2p": "P2P" in kinds,
        "wire": wire,
        "graph_types": graph,
        "transport": transport,
        "nvls_used": False,
        "n_ranks": 2,
    }


def test_judge_transport_says_it_plainly() -> None:
    nv = Topology(links=[Link(0, 1, "nvlink", 18, True, False, "SYS", True, "nvml")], source="nvml")
    pcie = Topology(links=[Link(0, 1, "pcie", 0, False, False, "PHB", True, "nvml")], source="nvml")
    used, notes = judge_transport(
        "pcie", _summary({"P2P": 24}, ["NVL/PIX"], "nvlink", "P2P/CUMEM"), nv, [0, 1], "nccl"
    )
    assert used is True and "STILL used P2P over NVLink" in notes[0]
    used, notes = judge_transport(
        "pcie", _summary({"SHM": 24}, [], "host_memory", "SHM/direct/direct"), nv, [0, 1], "nccl"
    )
    assert used is False and "host memory" in notes[0]
    used, notes = judge_transport(
        "nvlink", _summary({"P2P": 4}, [], "unknown", "P2P/CUMEM"), pcie, [0, 1], "nccl"
    )
    assert used is False and "no NVLink between them" in notes[0]
    used, notes = judge_transport("nvlink", {"connections": 0, "n_ranks": 1}, nv, [0], "nccl")
    assert used is None and "one rank" in notes[0]


def test_trace_sizes_from_real_nccl_trace(shared_traces: Path) -> None:
    path = shared_trace(shared_traces, "external/hta/nccl_data.json.gz")
    t = trace_collectives(path)
    # oracle: the NCCL kernels' own args in the raw JSON
    with gzip.open(path, "rt") as fh:
        raw = json.load(fh)
    sizes = {"Float": 4, "c10::Half": 2, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8}
    want = set()
    for e in raw["traceEvents"]:
        a = e.get("args") or {}
        if (
            e.get("cat") == "kernel"
            and "In msg nelems" in a
            and str(a.get("Collective name")).lower() == "allreduce"
        ):
            want.add(int(a["In msg nelems"]) * sizes[a["dtype"]])
    got = {s["bytes"] for s in t["sizes"] if s["op"] == "all_reduce"}
    assert want and got == want
    assert t["source"] == "duration"  # rank 0 of 2 only: wait cannot be separated, and it says so
    assert any("lower bound" in n for n in t["notes"])
    for s in t["sizes"]:
        assert s["n_ranks"] == 2
        assert s["busbw_gbps"] == pytest.approx(
            s["bytes"] / s["time_ns_median"] * 1.0
        )  # all_reduce, n=2: factor 1
