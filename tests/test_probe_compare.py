"""compare-links' pieces: probe curves at a size, the link verdict (docs/METHOD.md section Bandwidth and the link verdict) on known numbers,
transport judgement, and the message sizes read from a real NCCL trace."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from msgspec import UNSET, structs

from tests.conftest import shared_trace
from tracekit.analyse.links.curves import busbw_at, probe_timing, regime_at, side_by_side, timing_sentence
from tracekit.analyse.links.trace import trace_collectives, trace_mode
from tracekit.analyse.links.verdict import load_compare, recompute
from tracekit.analyse.links.verdict import verdict as typed_verdict
from tracekit.cli.main import main
from tracekit.errors import ProbeError
from tracekit.model.documents import Links, convert, decode_document, to_builtins
from tracekit.model.documents.links import (
    LinksShortfall,
    LinksTrace,
    LinksTransportsValue,
    NcclSummary,
    ProbeRow,
)
from tracekit.probe import spec
from tracekit.probe.compare import judge_transport, mode_env
from tracekit.probe.links import Link, Topology
from tracekit.probe.results import make_row


def verdict(
    rows: list[ProbeRow],
    modes: list[str],
    trace: dict | None,
    cpu_only: bool,
    *,
    shortfall: dict | None = None,
    transports: dict | None = None,
) -> tuple[str, dict]:
    """The verdict on the figures these tests write as JSON values (decoded into the typed inputs
    it takes, the fields a test does not set filled); its details as the JSON they are written as."""
    tr = None
    if trace is not None:
        sizes = [{"coll_op": s["op"], **s} for s in trace["sizes"]]
        tr = convert(
            {"path": "t", "ranks": [0, 1], "level": "gpu_kernel", "notes": [], **trace, "sizes": sizes},
            LinksTrace,
        )
    sf = None
    if shortfall is not None:
        base = {"sharded": "tp2", "per_token_source": None, "terms_ns": {}, "shares": {}, "verdict": None}
        sf = convert({**base, **shortfall}, LinksShortfall)
    tt = {
        m: convert({"notes": [], "log_dir": None, **x}, LinksTransportsValue)
        for m, x in (transports or {}).items()
    }
    text, details = typed_verdict(
        rows, modes, tr, cpu_only, shortfall=sf, transports=tt if transports else None
    )
    return text, to_builtins(details)


def rows_with(busbw: dict[str, dict[int, float]], op: str = "all_reduce", n: int = 2) -> list[ProbeRow]:
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


# ---------------------------------------------------------------------------------------------
# the verdict on synthetic probe curves: t(size) = t0 + size / bw per mode (all_reduce, 2 ranks:
# bus factor 1, so busbw = size / t), a decode trace's figures and its shortfall


SIZES = [1024 * 2**i for i in range(21)]  # 1 KiB .. 1 GiB
#: (t0 us, bandwidth GB/s): NVLink-like and PCIe/SHM-like, the fixed costs close, the bandwidths 12x apart
MODEL = {"nvlink": (20.0, 300.0), "pcie": (22.0, 25.0)}


def t_us(mode: str, size: int) -> float:
    t0, bw = MODEL[mode]
    return t0 + size / (bw * 1e3)  # bytes / (GB/s) = ns; / 1e3 = us


def model_rows() -> list[ProbeRow]:
    return rows_with({m: {b: b / (t_us(m, b) * 1e3) for b in SIZES} for m in MODEL})


TRANSPORTS = {
    "nvlink": {
        "uses_nvlink": True,
        "wire": "nvlink",
        "p2p": True,
        "algos": {},
        "nccl_debug_subsys": "INIT,GRAPH",
    },
    "pcie": {
        "uses_nvlink": False,
        "wire": "host_memory",
        "p2p": False,
        "algos": {},
        "nccl_debug_subsys": "INIT,GRAPH",
    },
}


def decode(op_sizes: list[tuple[int, float, float]], steps: int = 10, mode: str | None = "nvlink") -> dict:
    """A trace_collectives()-like dict: (bytes, per_token, transfer ns per call) per all_reduce size."""
    sizes = [
        {
            "op": "all_reduce",
            "bytes": b,
            "n_ranks": 2,
            "count": int(pt * steps),
            "per_token": pt,
            "time_ns_median": t,
            "time_ns_total": t * pt * steps,
            "busbw_gbps": b / t,  # all_reduce on 2 ranks: factor 1
        }
        for b, pt, t in op_sizes
    ]
    total = sum(x["time_ns_total"] for x in sizes)
    return {
        "source": "transfer",
        "mode": mode,
        "steps": steps,
        "sizes": sizes,
        "transfer_ns_total": total,
        "transfer_ns_per_token": total / steps,
    }


def shortfall_of(s_ns: float, transfer_ns: float) -> dict:
    return {
        "baseline": "tp1",
        "n_ranks": 2,
        "shortfall_ns": round(s_ns),  # integer ns, as the shortfall writes them
        "transfer_ns": round(transfer_ns),
        "per_token_ns": {"baseline": 1, "sharded": 1, "ideal": 1},
    }


def test_regime_latency_and_bandwidth() -> None:
    rows = model_rows()
    # 8 KiB: the bytes add 0.03 / 0.33 us to a ~20 us fixed cost; 64 MiB: 224 / 2684 us on top of it
    assert regime_at(rows, "all_reduce", ["nvlink", "pcie"], 8192) == "latency"
    assert regime_at(rows, "all_reduce", ["nvlink", "pcie"], 64 << 20) == "bandwidth"
    # 2 MiB: NVLink is still latency-bound (27 us < 2 x 20), the PCIe/SHM path is not (106 us)
    assert regime_at(rows, "all_reduce", ["nvlink"], 2 << 20) == "latency"
    assert regime_at(rows, "all_reduce", ["nvlink", "pcie"], 2 << 20) == "bandwidth"
    assert regime_at(rows, "all_reduce", ["nvlink"], 4 << 30) == "unknown"  # beyond the sweep


def test_verdict_latency_bound_small_share() -> None:
    """The H200 case in miniature: 16 x 8 KiB all_reduce per token, 6 us transfer each; S 8 ms."""
    rows = model_rows()
    tr = decode([(8192, 16, 6000.0)])
    xn = 16 * 6000.0  # 96 us per token
    text, d = verdict(
        rows, ["nvlink", "pcie"], tr, cpu_only=False, shortfall=shortfall_of(8e6, xn), transports=TRANSPORTS
    )
    k = t_us("pcie", 8192) / t_us("nvlink", 8192)  # busbw ratio = inverse time ratio, ~1.115
    (p,) = d["per_size"]
    assert p["regime"] == "latency" and p["k"] == pytest.approx(k)
    assert p["probe_busbw_gbps"]["nvlink"] == pytest.approx(8192 / (t_us("nvlink", 8192) * 1e3))
    # latency-bound: each of the 16 calls saves the probe's per-call time difference, which here
    # exceeds the ratio model's XN (1 - 1/k) (the trace's 6 us transfer leaves the fixed cost out)
    per_call = 16 * (t_us("pcie", 8192) - t_us("nvlink", 8192)) * 1e3
    assert per_call > xn * (1 - 1 / k)
    assert d["bound_ns_per_token"] == pytest.approx(per_call)
    assert p["bound_ratio_ns_per_token"] == pytest.approx(xn * (1 - 1 / k))
    assert d["bound_inf_ns_per_token"] == pytest.approx(xn)
    assert d["k"] == pytest.approx(k)
    assert d["transfer_share_of_shortfall"] == pytest.approx(0.012)
    assert d["answer"] == "no" and d["modes"] == {"fast": "nvlink", "slow": "pcie"}
    assert text.startswith(
        "Link bandwidth does not explain this run's shortfall: collective transfer is 96.0 us of the "
        "8.00 ms per-token shortfall (1.2%); even an infinitely fast link would remove at most 96.0 us."
    )
    assert f"removes at most {per_call / 1e3:.1f} us per token (each call saves" in text
    assert "all_reduce 8 KiB x16 per token" in text
    assert "NVLink and the PCIe/SHM path realise similar busbw" in text and "latency-bound" in text
    big_k = t_us("pcie", 1 << 30) / t_us("nvlink", 1 << 30)  # ~11.9
    assert f"at 1 GiB NVLink is {big_k:.0f}x faster" in text
    # realised 1.37 GB/s > probe 0.41 GB/s: said to be the launch latency, not "explains"
    assert "can exceed the probe" in text and "explains" not in text


def test_verdict_latency_bound_large_share_barely_helps() -> None:
    """Transfer is most of S, but at latency-bound sizes NVLink buys ~10% of it: 'barely'."""
    rows = model_rows()
    tr = decode([(8192, 100, 30000.0)])
    xn = 100 * 30000.0  # 3 ms of a 5 ms shortfall
    text, d = verdict(
        rows, ["nvlink", "pcie"], tr, cpu_only=False, shortfall=shortfall_of(5e6, xn), transports=TRANSPORTS
    )
    k = t_us("pcie", 8192) / t_us("nvlink", 8192)
    assert xn * (1 - 1 / k) / 5e6 < 0.10  # the premise: the bound is under 10% of S
    assert d["answer"] == "little"
    assert text.startswith("A faster link would barely shrink this run's shortfall")
    assert "(60%)" in text and "an infinitely fast link at most 3.00 ms" in text


def test_verdict_link_bound() -> None:
    """2 x 64 MiB all_reduce per token at 250 GB/s over NVLink: bandwidth-bound, the link matters."""
    rows = model_rows()
    size = 64 << 20
    t_call = size / 250.0  # ns
    tr = decode([(size, 2, t_call)])
    xn = 2 * t_call  # ~479 us
    text, d = verdict(
        rows, ["nvlink", "pcie"], tr, cpu_only=False, shortfall=shortfall_of(1e6, xn), transports=TRANSPORTS
    )
    k = t_us("pcie", size) / t_us("nvlink", size)  # ~11.3
    (p,) = d["per_size"]
    assert p["regime"] == "bandwidth" and p["k"] == pytest.approx(k)
    assert d["bound_ns_per_token"] == pytest.approx(xn * (1 - 1 / k))
    assert d["answer"] == "yes"
    assert text.startswith("Link bandwidth explains part of this run's shortfall")
    assert f"NVLink is {k:.0f}x faster than the PCIe/SHM path" in text
    assert f"{xn * (1 - 1 / k) / 1e6:.2f} ms per token" in text
    # 250 GB/s against the probe's ~275 at 64 MiB: near what the link gives
    share = 250.0 / (size / (t_us("nvlink", size) * 1e3))
    assert share > 0.9 and f"{share * 100:.0f}% of the probe's" in text and "near what the link gives" in text
    # the same sizes realised at 100 GB/s: something else slows them
    slow = decode([(size, 2, size / 100.0)])
    text2, _ = verdict(rows, ["nvlink", "pcie"], slow, cpu_only=False, transports=TRANSPORTS)
    assert "only 36% of the probe's" in text2 and "Give --baseline" in text2
    # above the probe at a bandwidth-bound size by a little: the launch latency; by a lot: suspicious
    text3, _ = verdict(rows, ["nvlink", "pcie"], decode([(size, 2, size / 290.0)]), cpu_only=False)
    assert "105% of the probe's" in text3 and "run at what the link gives" in text3
    text4, _ = verdict(rows, ["nvlink", "pcie"], decode([(size, 2, size / 600.0)]), cpu_only=False)
    assert "check the message size" in text4


def test_verdict_per_size_bounds_and_unswept_ops() -> None:
    """Two sizes: each shrinks by its own k; an op the probe did not sweep counts in full."""
    rows = model_rows()
    tr = decode([(8192, 16, 6000.0), (64 << 20, 1, 250000.0)])
    tr["sizes"].append(
        {
            "op": "broadcast",
            "bytes": 4096,
            "n_ranks": 2,
            "count": 10,
            "per_token": 1.0,
            "time_ns_median": 4000.0,
            "time_ns_total": 40000.0,
            "busbw_gbps": 1.0,
        }
    )
    xn = 16 * 6000.0 + 250000.0 + 4000.0
    _, d = verdict(
        rows, ["nvlink", "pcie"], dict(tr, transfer_ns_per_token=xn), cpu_only=False, transports=TRANSPORTS
    )
    k_small = t_us("pcie", 8192) / t_us("nvlink", 8192)
    k_big = t_us("pcie", 64 << 20) / t_us("nvlink", 64 << 20)
    ratio = 96000.0 * (1 - 1 / k_small) + 250000.0 * (1 - 1 / k_big) + 4000.0
    # the latency-bound 8 KiB calls: the larger of the ratio model and the per-call difference
    small = max(96000.0 * (1 - 1 / k_small), 16 * (t_us("pcie", 8192) - t_us("nvlink", 8192)) * 1e3)
    want = small + 250000.0 * (1 - 1 / k_big) + 4000.0
    assert d["bound_ns_per_token"] == pytest.approx(want)
    assert d["k"] == pytest.approx(xn / (xn - ratio))  # the busbw ratio: XN (1 - 1/k) == ratio bound
    assert d["regime"] == "mixed"
    assert [e["bytes"] for e in d["per_size"]] == [64 << 20, 8192, 4096]  # by transfer time


def test_verdict_when_the_slow_mode_is_faster_at_the_decode_sizes() -> None:
    """PCIe/SHM faster at small sizes (k < 1 there): a move to NVLink removes nothing."""
    rows = rows_with(
        {
            "nvlink": {4096: 0.20, 8192: 0.40, 1 << 30: 300.0},
            "pcie": {4096: 0.25, 8192: 0.50, 1 << 30: 25.0},
        }
    )
    _, d = verdict(
        rows, ["nvlink", "pcie"], decode([(8192, 16, 6000.0)]), cpu_only=False, transports=TRANSPORTS
    )
    assert d["modes"]["fast"] == "nvlink"  # by the largest size
    assert d["per_size"][0]["k"] == pytest.approx(0.8) and d["bound_ns_per_token"] == 0.0


def test_verdict_says_when_timed_loops_logged_tuning() -> None:
    rows = model_rows()
    old = {m: {k: v for k, v in t.items() if k != "nccl_debug_subsys"} for m, t in TRANSPORTS.items()}
    for t in old.values():
        t["algos"] = {"all_reduce": {"RING/LL": 40}}  # 1.0 results: tuning lines from the timed run
    text, d = verdict(rows, ["nvlink", "pcie"], decode([(8192, 16, 6000.0)]), cpu_only=False, transports=old)
    assert d["tuning_in_timed_loop"] == ["nvlink", "pcie"] and "logged NCCL TUNING" in text
    _, d = verdict(
        rows, ["nvlink", "pcie"], decode([(8192, 16, 6000.0)]), cpu_only=False, transports=TRANSPORTS
    )
    assert d["tuning_in_timed_loop"] == []


def test_verdict_cpu_only_makes_no_link_claim() -> None:
    """Two gloo 'modes' are the same path: no k, no 'faster link', the k->inf bound only."""
    rows = model_rows()
    text, d = verdict(
        rows,
        ["nvlink", "pcie"],
        decode([(8192, 16, 6000.0)]),
        cpu_only=True,
        shortfall=shortfall_of(1e6, 96000.0),
    )
    assert text.startswith(
        "CPU only (gloo): there are no GPU links to compare; the modes ran the same gloo path"
    )
    assert "faster than" not in text and "infinitely fast interconnect would remove at most 96.0 us" in text
    assert d["modes"]["slow"] is None and d["bound_ns_per_token"] == pytest.approx(96000.0)
    assert d["answer"] == "no"  # 9.6% of S


def test_verdict_without_trace_compares_modes() -> None:
    text, d = verdict(ROWS, ["nvlink", "pcie"], None, cpu_only=False)
    assert "nvlink 40.00 GB/s vs pcie 10.00 GB/s (x4.00)" in text and "--trace" in text
    assert d["per_size"][0]["ratio"] == pytest.approx(4.0)
    # on the CPU the two "modes" are one gloo sweep run twice: no ratio as a finding, no link words
    text, d = verdict(ROWS, ["nvlink", "pcie"], None, cpu_only=True)
    assert text.startswith("CPU only (gloo)") and "busbw at 16 KiB 40 / 10 GB/s" in text
    assert "(x4.00)" not in text and "nvlink" not in text.lower() and "pcie" not in text.lower()


def test_trace_mode_from_manifest() -> None:
    from tracekit.read.manifests import manifest_from_json

    def mode(doc: dict) -> str | None:
        return trace_mode(manifest_from_json(doc).manifest)[0]

    nccl = {"workload": {"backend": "nccl"}}
    assert mode({**nccl, "nccl_env": {"NCCL_NVLS_ENABLE": "0"}}) == "nvlink"
    assert mode({**nccl, "nccl_env": {"NCCL_P2P_DISABLE": "1"}}) == "pcie"
    assert mode({**nccl, "nccl_env": {"NCCL_P2P_LEVEL": "PHB"}}) == "pcie"
    assert mode({"workload": {"backend": "gloo"}, "nccl_env": {}}) is None
    assert mode(nccl) is None  # no NCCL variables recorded
    assert trace_mode(None)[0] is None


def test_load_compare_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ProbeError, match=r"x.json at byte 1: the compare-links result is not valid JSON"):
        load_compare(bad)
    bad.write_text(json.dumps([{"op": "all_reduce"}]))
    with pytest.raises(ProbeError, match="not a compare-links result"):
        load_compare(bad)
    bad.write_text(
        json.dumps({"kind": "tracekit.compare_links", "modes": [], "rows": [{"op": "all_reduce"}]})
    )
    with pytest.raises(
        ProbeError, match=r"x.json at \$.rows\[0\]: not a compare-links result \(Object missing"
    ):
        load_compare(bad)


REPO = Path(__file__).resolve().parents[1]


def test_h200_links_reloaded_against_the_committed_traces(tmp_path: Path) -> None:
    """The committed H200 sweep (reports/h200/links.json) with the committed TP=2/TP=1 decode runs:
    recomputed on a machine without GPUs. Oracles: the decoder's shapes (7b, 8 layers, bf16: 2
    all_reduces of hidden x 2 bytes per layer, 1 all_gather of vocab x 4 bytes) and S from
    `tracekit shortfall` on the same runs."""
    links, tp2, tp1 = REPO / "reports/h200/links.json", REPO / "traces/h200-tp2", REPO / "traces/h200-tp1"
    if not (links.is_file() and tp2.is_dir() and tp1.is_dir()):
        pytest.skip("the H200 results are not in this checkout")
    from committed_pairs import committed_shortfall

    out = tmp_path / "v.json"
    assert (
        main(
            [
                "compare-links",
                "--load",
                str(links),
                "--trace",
                str(tp2),
                "--baseline",
                str(tp1),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    d = res["verdict_details"]
    sizes = {(e["op"], e["bytes"]): e["per_token"] for e in d["per_size"]}
    assert sizes == {("all_reduce", 4096 * 2): 16, ("all_gather", 32000 * 4): 1}
    sf = committed_shortfall("h200-tp1", "h200-tp2").to_json()
    assert (
        d["shortfall_ns"] == sf["shortfall_ns"] and d["transfer_ns_per_token"] == sf["terms_ns"]["transfer"]
    )
    assert d["answer"] == "no" and d["trace_mode"] == "nvlink"
    assert all(e["regime"] == "latency" for e in d["per_size"])
    assert res["verdict"].startswith("Link bandwidth does not explain this run's shortfall")
    assert "can exceed the probe" in res["verdict"]
    # that sweep predates --graph: one Python call per iteration, so the verdict says so
    assert "Probe timing: eager" in res["verdict"] and d["timing"] == {"nvlink": "eager", "pcie": "eager"}
    # the caveat about per-call TUNING logging appears exactly when the saved sweep's timed loops logged it
    saved = json.loads(links.read_text())
    logged = [m for m, t in saved["transports"].items() if "TUNING" in str(t.get("nccl_debug_subsys", ""))]
    assert ("logged NCCL TUNING" in res["verdict"]) == bool(logged)
    # the rows are the saved ones, the decode sizes marked
    assert res["rows"] == json.loads(links.read_text())["rows"]
    assert {(e["op"], e["bytes"]) for e in res["side_by_side"] if e["decode"]} == {("all_reduce", 8192)}


def test_side_by_side_marks_decode_sizes() -> None:
    sbs = side_by_side(ROWS, ["nvlink", "pcie"], {"all_reduce": {16384}})
    assert [(e.bytes, e.decode) for e in sbs] == [(4096, False), (16384, True)]
    assert sbs[1].ratio == pytest.approx(4.0)


def test_mode_env() -> None:
    assert mode_env("pcie") == {"NCCL_P2P_DISABLE": "1"}
    assert mode_env("pcie", "PHB") == {"NCCL_P2P_LEVEL": "PHB"}
    assert mode_env("nvlink") == {}


def _summary(kinds: dict, graph: list, wire: str, transport: str, n_ranks: int = 2) -> NcclSummary:
    return NcclSummary(
        connections=sum(kinds.values()),
        kinds=kinds,
        p2p="P2P" in kinds,
        wire=wire,
        graph_types=graph,
        transport=transport,
        transports={transport: sum(kinds.values())} if kinds else {},
        nvls_available=False,
        nvls_used=False,
        collnet=False,
        rings_connected=bool(kinds),
        algos={},
        nccl_version="2.28.9",
        n_ranks=n_ranks,
        lines=10,
    )


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
    used, notes = judge_transport("nvlink", _summary({}, [], "unknown", "", n_ranks=1), nv, [0], "nccl")
    assert used is None and "one rank" in notes[0]
    used, notes = judge_transport("nvlink", None, nv, [0, 1], "nccl")  # no NCCL log read
    assert used is None and "logged no connection lines" in notes[0]


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
    got = {s.bytes for s in t.sizes if s.op == "all_reduce"}
    assert want and got == want
    assert t.source == "duration"  # rank 0 of 2 only: wait cannot be separated, and it says so
    assert any("lower bound" in n for n in t.notes)
    for s in t.sizes:
        assert s.n_ranks == 2 and s.bytes and s.time_ns_median
        assert s.busbw_gbps == pytest.approx(s.bytes / s.time_ns_median * 1.0)  # all_reduce, n=2: factor 1


# ---------------------------------------------------------------------------------------------
# --graph: which timing the probe used, in the verdict


def graph_rows(graph_modes: set[str], iters: int = 20) -> list[ProbeRow]:
    """model_rows() with `graph`/`iters` set per mode as the sweep writes them."""
    rows = model_rows()
    for r in rows:
        r.graph = r.mode in graph_modes
        r.iters = iters
    return rows


def test_probe_timing_per_mode() -> None:
    modes = ["nvlink", "pcie"]
    assert probe_timing(graph_rows({"nvlink", "pcie"}), modes) == {"nvlink": "graph", "pcie": "graph"}
    assert probe_timing(graph_rows(set()), modes) == {"nvlink": "eager", "pcie": "eager"}
    assert probe_timing(graph_rows({"pcie"}), modes) == {"nvlink": "eager", "pcie": "graph"}
    # rows written before the field existed are eager; gloo rows are the host clock
    old = [structs.replace(r, graph=UNSET) for r in model_rows()]
    assert probe_timing(old, modes) == {"nvlink": "eager", "pcie": "eager"}
    cpu = [structs.replace(r, device="cpu", timer="host", graph=False) for r in model_rows()]
    assert probe_timing(cpu, modes)["nvlink"] == "host"
    mixed = graph_rows({"nvlink"}) + [structs.replace(graph_rows(set())[0], mode="nvlink")]
    assert probe_timing(mixed, ["nvlink", "other"]) == {"nvlink": "mixed", "other": "none"}


def test_timing_sentence() -> None:
    assert "CUDA-graph replay of 20 collectives" in timing_sentence({"a": "graph", "b": "graph"}, 20)
    assert "host launch overhead" not in timing_sentence({"a": "graph"}, 20)
    eager = timing_sentence({"a": "eager", "b": "eager"})
    assert "eager" in eager and "small-size times include host launch overhead" in eager
    assert "differs between modes (a graph, b eager)" in timing_sentence({"a": "graph", "b": "eager"})
    assert timing_sentence({"a": "none"}) == ""


def test_verdict_says_which_timing_and_drops_the_launch_caveat_under_graph() -> None:
    tr = decode([(8192, 16, 6000.0)])
    args = (["nvlink", "pcie"], tr)
    sf = shortfall_of(8e6, 16 * 6000.0)
    eager_text, d = verdict(graph_rows(set()), *args, cpu_only=False, shortfall=sf, transports=TRANSPORTS)
    assert d["timing"] == {"nvlink": "eager", "pcie": "eager"}
    assert "Probe timing: eager" in eager_text and "host launch overhead" in eager_text
    assert "leaves out the launch latency" in eager_text
    graph_text, d = verdict(
        graph_rows({"nvlink", "pcie"}), *args, cpu_only=False, shortfall=sf, transports=TRANSPORTS
    )
    assert d["timing"] == {"nvlink": "graph", "pcie": "graph"}
    assert "Probe timing: CUDA-graph replay of 20 collectives" in graph_text
    assert "host launch" not in graph_text.replace("no host launch per call", "")
    assert "launch latency" not in graph_text and "gap between back-to-back kernels" in graph_text
    # TUNING logged under --graph goes to the capture, not the timed replay: no TUNING caveat
    tuning = {m: {**t, "nccl_debug_subsys": "INIT,GRAPH,TUNING"} for m, t in TRANSPORTS.items()}
    text, d = verdict(graph_rows({"nvlink", "pcie"}), *args, cpu_only=False, transports=tuning)
    assert d["tuning_in_timed_loop"] == [] and "logged NCCL TUNING" not in text
    text, d = verdict(graph_rows({"pcie"}), *args, cpu_only=False, transports=tuning)
    assert d["tuning_in_timed_loop"] == ["nvlink"] and "logged NCCL TUNING" in text
    # without a trace the probe-only verdict says it too
    text, d = verdict(graph_rows({"nvlink", "pcie"}), ["nvlink", "pcie"], None, cpu_only=False)
    assert "Probe timing: CUDA-graph replay" in text and d["timing"]["pcie"] == "graph"


def test_compare_links_without_gpus_is_one_refusal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine without CUDA GPUs a plain `tracekit compare-links` measures nothing and says
    why in one line (it used to print gloo figures under nvlink / pcie headings, exit 0)."""
    from tracekit.cli import compare_links as cl

    monkeypatch.setattr(cl, "_have_cuda_gpus", lambda: False)
    capsys.readouterr()
    assert main(["compare-links", "--op", "all_reduce", "--max", "64K"]) == 2
    got = capsys.readouterr()
    lines = got.err.strip().splitlines()
    assert got.out == "" and len(lines) == 1, got.err
    assert lines[0].startswith("tracekit: error: ") and "no CUDA GPU" in lines[0]
    assert "tracekit probe --device cpu" in lines[0]


def _as_schema_1_0(doc: dict) -> dict:
    """A 1.1 compare-links result written the way tracekit wrote 1.0: no config, no probe_notes
    (notes = the sweep's + the trace's), no shortfall, rows without `graph`, the saved trace
    without its mode and its per-size totals."""
    old = {k: v for k, v in doc.items() if k not in ("config", "probe_notes", "shortfall")}
    old["schema_version"] = "1.0"
    old["rows"] = [{k: v for k, v in r.items() if k != "graph"} for r in doc["rows"]]
    if doc.get("trace"):
        gone = ("time_ns_total", "transfer_ns_per_token", "bytes_source")
        tr = {k: v for k, v in doc["trace"].items() if k not in ("mode", "mode_source")}
        tr["sizes"] = [{k: v for k, v in s.items() if k not in gone} for s in tr["sizes"]]
        old["trace"] = tr
        old["notes"] = doc["probe_notes"] + tr["notes"]
    else:
        old["notes"] = list(doc["probe_notes"])
    return old


@pytest.mark.parametrize("name", ["tests/data/links-cpu-gloo.json", "reports/h200/links.json"])
def test_a_result_an_older_tracekit_wrote_still_loads(tmp_path: Path, name: str) -> None:
    """--load of a schema 1.0 file (decoded once into the typed probe part, its absent fields
    optional): the verdict is recomputed, the sweep's notes come back out of `notes`, and the
    result is a whole Links document. Without its trace's time_ns_total the sizes weigh count x
    median; without the trace's mode the reference is the faster mode."""
    if not (REPO / name).is_file():
        pytest.skip(f"{name} is not in this checkout")
    doc = json.loads((REPO / name).read_text())
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_as_schema_1_0(doc)))
    out = tmp_path / "again.json"
    assert main(["compare-links", "--load", str(old), "-o", str(out)]) == 0
    again = decode_document(out.read_bytes())
    assert isinstance(again, Links) and again.schema_version == "1.1" and again.config is UNSET
    assert again.probe_notes == doc["probe_notes"]
    assert [to_builtins(r) for r in again.rows] == [
        {k: v for k, v in r.items() if k != "graph"} for r in doc["rows"]
    ]
    d = again.verdict_details
    if doc.get("trace"):
        assert d.trace_mode is None and d.reference_mode == d.modes.fast == "nvlink"
        assert again.trace is not None and again.trace.mode is UNSET
        per_size = {(e.op, e.bytes): e.transfer_weight for e in d.per_size}
        med = {(s["op"], s["bytes"]): s["count"] * s["time_ns_median"] for s in doc["trace"]["sizes"]}
        assert per_size == pytest.approx({k: v / sum(med.values()) for k, v in med.items()})
        assert d.answer == "unknown"  # no shortfall without --baseline
    else:
        assert again.trace is None and [e.op for e in d.per_size] == ["all_gather", "all_reduce"]


def test_a_damaged_probe_file_is_refused_where_it_is_and_null_reads_as_nan(tmp_path: Path) -> None:
    doc = json.loads((REPO / "tests/data/links-cpu-gloo.json").read_text())
    bad = tmp_path / "bad.json"
    doc["rows"][2]["bytes"] = "8"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ProbeError) as err:
        load_compare(bad)
    assert (
        str(err.value) == f"{bad} at $.rows[2].bytes: not a compare-links result (Expected `int`, got `str`)"
    )
    doc["rows"][2]["bytes"] = 8
    doc["modes"][1]["device"] = None
    bad.write_text(json.dumps(doc))
    with pytest.raises(ProbeError, match=r"at \$\.modes\[1\]\.device: not a compare-links result"):
        load_compare(bad)
    # JSON null in a number field is how NaN is written: it reads back as NaN, and is judged as one
    doc = json.loads((REPO / "tests/data/links-cpu-gloo.json").read_text())
    first = doc["rows"][0]
    first["busbw_gbps"] = first["time_us"] = None
    ok = tmp_path / "nan.json"
    ok.write_text(json.dumps(doc))
    saved = load_compare(ok)
    assert math.isnan(saved.rows[0].busbw_gbps) and math.isnan(saved.rows[0].time_us)
    assert all(math.isfinite(r.busbw_gbps) for r in saved.rows[1:])
    res = recompute(saved)
    (entry,) = [
        e
        for e in res.side_by_side
        if (e.op, e.bytes, e.in_place) == (first["op"], first["bytes"], first["in_place"])
    ]
    assert math.isnan(entry.busbw_gbps[first["mode"]])
