"""Real gloo sweeps (2 and 3 ranks) through `tracekit probe`, the copy probe on CPU, and
compare-links on CPU: results checked, output parsed back and checked against nccl-tests' formulas."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import SHARED_TRACES
from tracekit.cli.main import main
from tracekit.model.documents import to_builtins
from tracekit.model.documents.links import LinksMeta, ProbeRow
from tracekit.probe import spec
from tracekit.probe.results import rows_from_csv

FACTOR = {  # doc/PERFORMANCE.md
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
GATHERS = ("all_gather", "reduce_scatter", "alltoall")


def expected_bytes(op: str, size: int, n: int) -> int | None:
    """nccl-tests' size column for swept size `size` (float32): per-rank count x 4 x n for the
    gathers (count rounded down to a multiple of n), else the size; None when nothing moves."""
    count = size // 4
    if op in GATHERS:
        per = count // n
        return per * 4 * n if per else None
    return count * 4


def check_rows(rows: list[dict], n: int, sizes: list[int]) -> None:
    assert rows
    for r in rows:
        assert r["ranks"] == n and r["backend"] == "gloo" and r["device"] == "cpu"
        assert r["correct"] is True and r["wrong"] == 0, r
        assert r["time_us_min"] <= r["time_us"] <= r["time_us_max"]
        assert r["timer"] == "host" and r["time_us"] == r["host_time_us"]
        assert r["graph"] is False  # gloo/CPU never runs --graph (JSON and CSV alike)
        alg = r["bytes"] / (r["time_us"] * 1e3)
        assert r["algbw_gbps"] == pytest.approx(alg, rel=1e-9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * FACTOR[r["op"]](n), rel=1e-9)
        assert r["transport"] == "gloo/tcp"
    for op in {r["op"] for r in rows}:
        want = sorted({b for b in (expected_bytes(op, s, n) for s in sizes) if b})
        got = sorted({r["bytes"] for r in rows if r["op"] == op})
        assert got == want, op
        forms = {r["in_place"] for r in rows if r["op"] == op}
        assert forms == set(spec.variants(op)), op


@pytest.mark.slow
def test_probe_cli_gloo_two_ranks_all_ops_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracekit.capture.starter import Starter
    from tracekit.probe import sweep

    # the CLI forks the CPU ranks from the capture's fork server (torch imported once per process,
    # not once per rank): unset here, so that only this command can set it
    monkeypatch.setattr(sweep, "cpu_rank_starter", None)
    monkeypatch.delenv("TRACEKIT_CAPTURE_START", raising=False)
    out = tmp_path / "rows.json"
    rc = main(
        [
            "probe",
            "--op",
            "all",
            "--device",
            "cpu",
            "--ranks",
            "2",
            "--min",
            "8",
            "--max",
            "4K",
            "--factor",
            "8",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--no-progress",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    assert sweep.cpu_rank_starter is Starter
    rows = json.loads(out.read_text())
    check_rows(rows, 2, [8, 64, 512, 4096])
    assert {r["op"] for r in rows} == set(spec.COLLECTIVE_OPS)
    printed = capsys.readouterr()
    assert printed.out == ""  # the result went to -o; the table and the message to stderr
    assert "# Out of bounds values : 0 OK" in printed.err and f"wrote {out}" in printed.err


@pytest.mark.slow
def test_probe_cli_gloo_three_ranks_csv(tmp_path: Path) -> None:
    out = tmp_path / "rows.csv"
    rc = main(
        [
            "probe",
            "--op",
            "all_reduce,all_gather,reduce_scatter,alltoall,sendrecv",
            "--device",
            "cpu",
            "--ranks",
            "3",
            "--min",
            "8",
            "--max",
            "4K",
            "--factor",
            "8",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--no-progress",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    rows = to_builtins(rows_from_csv(out.read_text()))  # the typed rows, as the JSON holds them
    check_rows(rows, 3, [8, 64, 512, 4096])
    # 3 ranks do not divide 64 B of floats: all_gather's size is 5 x 4 x 3 = 60 B, as nccl-tests prints
    assert 60 in {r["bytes"] for r in rows if r["op"] == "all_gather"}


def test_probe_cli_bad_input_is_one_line() -> None:
    assert main(["probe", "--op", "allscatter", "--device", "cpu"]) == 2
    assert main(["probe", "--device", "cpu", "--min", "1T"]) == 2
    assert main(["probe", "--device", "cpu", "--backend", "nccl"]) == 2


def test_copy_probe_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "copy.json"
    rc = main(
        [
            "probe",
            "--op",
            "copy",
            "--device",
            "cpu",
            "--min",
            "1M",
            "--max",
            "4M",
            "--iters",
            "3",
            "--warmup",
            "1",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["bytes"] for r in rows] == [1 << 20, 2 << 20, 4 << 20]
    for r in rows:
        assert r["kind"] == "local" and r["correct"] is True
        assert r["gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e3), rel=1e-9)
        assert r["rw_gbps"] == pytest.approx(2 * r["gbps"])
        assert r["ratio"] == pytest.approx(r["gbps"] / r["baseline_gbps"])
    # with -o the result goes to the file; the table and its check line are a message for the
    # person watching, on stderr (tracekit.cli.options.message), and stdout stays empty
    captured = capsys.readouterr()
    assert "# check: local D2D copy at 4194304 B on CPU" in captured.err
    assert captured.out == ""


@pytest.mark.slow
def test_compare_links_cpu(tmp_path: Path) -> None:
    out = tmp_path / "links.json"
    # a real NCCL trace (A100, rank 0 of 2) when ../shared is there: its message sizes get marked
    nccl_trace = SHARED_TRACES / "external" / "hta" / "nccl_data.json.gz"
    extra = ["--trace", str(nccl_trace)] if nccl_trace.is_file() else []
    rc = main(
        [
            "compare-links",
            "--device",
            "cpu",
            "--ranks",
            "2",
            "--op",
            "all_reduce",
            "--min",
            "1K",
            "--max",
            "16K",
            "--factor",
            "4",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--no-progress",
            "-o",
            str(out),
            *extra,
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["kind"] == "tracekit.compare_links"
    assert [m["mode"] for m in res["modes"]] == ["nvlink", "pcie"]
    assert res["modes"][1]["env"] == {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}
    assert res["modes"][0]["env"] == {"NCCL_NVLS_ENABLE": "0"}
    assert {r["mode"] for r in res["rows"]} == {"nvlink", "pcie"}
    check_rows([r for r in res["rows"] if r["mode"] == "pcie"], 2, [1024, 4096, 16384])
    for mode in ("nvlink", "pcie"):
        assert res["transports"][mode]["uses_nvlink"] is None
        assert any("gloo" in n for n in res["transports"][mode]["notes"])
    by = {(r["mode"], r["bytes"]): r["busbw_gbps"] for r in res["rows"]}
    for e in res["side_by_side"]:
        assert e["ratio"] == pytest.approx(by[("nvlink", e["bytes"])] / by[("pcie", e["bytes"])])
        assert e["decode"] is False
    assert res["verdict"].startswith("CPU only (gloo)")
    assert isinstance(res["links"]["links"], list)
    if extra:
        assert res["trace"]["sizes"] and res["trace"]["source"] == "duration"
        assert "above the sweep" in json.dumps(res["verdict_details"])  # 8 MB+ messages vs a 16 KiB sweep
        assert "their ratio is noise" in res["verdict"] and "infinitely fast interconnect" in res["verdict"]
        assert res["verdict_details"]["modes"]["slow"] is None  # no k between two gloo runs
    else:
        assert res["trace"] is None
    assert all(math.isfinite(r["busbw_gbps"]) for r in res["rows"])
    # --load: the saved rows give the same verdict again, without a sweep
    again = tmp_path / "again.json"
    assert main(["compare-links", "--load", str(out), *extra, "-o", str(again)]) == 0
    res2 = json.loads(again.read_text())
    assert res2["loaded_from"] == str(out) and res2["rows"] == res["rows"]
    assert res2["verdict"] == res["verdict"]
    assert res2["side_by_side"] == res["side_by_side"]
    assert any("loaded from" in n for n in res2["notes"])


def test_check_counts_wrong_elements(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check iteration is not a formality: one in-process gloo rank, and a collective that does
    nothing leaves the zeroed output wrong in every element."""
    import torch.distributed as dist

    from tracekit.probe.sweep import SweepConfig
    from tracekit.probe.sweep_rank import Rank

    cfg = SweepConfig(
        ops=("all_gather",), min_bytes=64, max_bytes=64, iters=2, warmup=1, ranks=1, device="cpu"
    ).resolved()
    state = Rank(cfg, 0, 1, f"file://{tmp_path / 'store'}")
    try:
        lay = spec.layout("all_gather", 64, 1, 4)
        pool = state.pool_for("all_gather", [64])
        ok = state.measure("all_gather", lay, False, pool)
        assert ok.wrong == 0
        monkeypatch.setattr(state, "_call", lambda *a, **k: None)
        bad = state.measure("all_gather", lay, False, pool)
        assert bad.wrong == lay.recv_count == 16
    finally:
        state.close()
        assert not dist.is_initialized()


@pytest.mark.slow
def test_probe_under_torchrun(tmp_path: Path) -> None:
    """`tracekit probe` launched by torchrun: every rank runs it, rank 0 writes the rows."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "rows.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "-m",
        "tracekit.cli.main",
        "--",
        "probe",
        "--op",
        "all_reduce,sendrecv",
        "--device",
        "cpu",
        "--min",
        "8",
        "--max",
        "512",
        "--factor",
        "8",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--no-progress",
        "-o",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    check_rows(rows, 2, [8, 64, 512])
    assert proc.stderr.count(f"wrote {out}") == 1  # only rank 0 prints


def test_nccl_timed_sweep_logs_no_tuning_and_algo_comes_from_an_untimed_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NCCL path without GPUs: ranks are stood in for by a fake `_spawn` that writes what NCCL
    would log under each NCCL_DEBUG_SUBSYS. The timed sweep runs with INIT,GRAPH (no per-call
    TUNING lines); a second, un-timed pass (1 call per size, no warm-up, no check) logs TUNING, and
    algo/proto per row come from it."""
    from tracekit.probe import sweep
    from tracekit.probe.results import make_row

    calls: list[tuple[sweep.SweepConfig, str | None]] = []

    def fake_spawn(cfg: sweep.SweepConfig, log_dir: str | None) -> tuple[list[ProbeRow], LinksMeta]:
        calls.append((cfg, log_dir))
        env = sweep.rank_env(cfg, 0, log_dir)
        lines = ["host:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"]
        if "TUNING" in env["NCCL_DEBUG_SUBSYS"]:
            lines += [
                f"host:1:1 [0] NCCL INFO AllReduce: {b} Bytes -> Algo RING proto LL" for b in (1024, 4096)
            ]
        assert log_dir is not None
        Path(env["NCCL_DEBUG_FILE"]).write_text("\n".join(lines) + "\n")
        rows = [
            make_row(
                op="all_reduce",
                lay=spec.layout("all_reduce", b, 2, 4),
                backend="nccl",
                device="cuda",
                dtype="float32",
                in_place=True,
                time_us_per_rank=[10.0, 10.0],
                host_time_us_per_rank=[10.0, 10.0],
                timer="cuda_event",
                wrong=0,
                iters=cfg.iters,
                warmup=cfg.warmup,
                mode=cfg.mode,
            )
            for b in (1024, 4096)
        ]
        return rows, LinksMeta(torch="2", python="3", cuda="13")

    monkeypatch.setattr(sweep, "_cuda_device_count", lambda: 2)
    monkeypatch.setattr(sweep, "_spawn", fake_spawn)
    cfg = sweep.SweepConfig(ops=("all_reduce",), min_bytes=1024, max_bytes=4096, factor=4, device="cuda")
    assert cfg.nccl_debug == "init" and cfg.algo_pass  # the defaults
    res = sweep.run_sweep_detailed(replace(cfg, log_dir=str(tmp_path / "logs")))
    (timed, timed_dir), (untimed, untimed_dir) = calls
    assert sweep.rank_env(timed, 0, timed_dir)["NCCL_DEBUG_SUBSYS"] == "INIT,GRAPH"
    assert (timed.iters, timed.warmup, timed.check) == (20, 5, True)
    assert sweep.rank_env(untimed, 0, untimed_dir)["NCCL_DEBUG_SUBSYS"] == "INIT,GRAPH,TUNING"
    assert (untimed.iters, untimed.warmup, untimed.check, untimed.algo_pass) == (1, 0, False, False)
    assert untimed_dir == str(tmp_path / "logs" / "tuning")
    assert [(r.algo, r.proto, r.transport) for r in res.rows] == [("RING", "LL", "P2P/CUMEM")] * 2
    assert res.transport is not None and res.transport.algo_source == "un-timed TUNING pass"
    assert res.transport.nccl_debug_subsys == "INIT,GRAPH"
    assert res.transport.algos == {"all_reduce": {"RING/LL": 2}}

    calls.clear()  # without the pass: one spawn, no algo
    res = sweep.run_sweep_detailed(replace(cfg, log_dir=str(tmp_path / "l2"), algo_pass=False))
    assert len(calls) == 1 and all(r.algo == "" for r in res.rows)
    assert res.transport is not None and res.transport.algo_source is None

    calls.clear()  # --nccl-debug tuning: the timed run logs it, no second pass
    res = sweep.run_sweep_detailed(replace(cfg, log_dir=str(tmp_path / "l3"), nccl_debug="tuning"))
    assert len(calls) == 1 and res.transport is not None and res.transport.algo_source == "timed run"
    assert all(r.algo == "RING" for r in res.rows)


# ---------------------------------------------------------------------------------------------
# --graph (CUDA-graph timing): the CPU error, and the option's path to the ranks and the rows


def test_graph_on_cpu_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from tracekit.errors import ProbeError
    from tracekit.probe.sweep import SweepConfig

    assert main(["probe", "--device", "cpu", "--graph"]) == 2
    assert main(["probe", "--device", "auto", "--backend", "gloo", "--graph"]) == 2
    assert main(["compare-links", "--device", "cpu", "--graph"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("tracekit: error: --graph needs CUDA/NCCL") for e in err)
    with pytest.raises(ProbeError, match="--graph needs CUDA/NCCL"):
        SweepConfig(device="cpu", graph=True).resolved()
    assert SweepConfig(device="cpu").resolved().graph is False


def test_graph_reaches_the_rank_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--graph` on the CLI sets SweepConfig.graph for the timed sweep (as the ranks receive it:
    the config object is pickled to each spawned rank whole), while the un-timed algo pass stays eager."""
    import tracekit.probe.compare as compare
    import tracekit.probe.sweep as sweep
    from tracekit.probe.links import Topology

    seen: list[sweep.SweepConfig] = []

    def fake_run(cfg: sweep.SweepConfig) -> sweep.SweepResult:
        seen.append(cfg)
        return sweep.SweepResult([], None, None, None, [], cfg)

    monkeypatch.setattr(sweep, "run_sweep_detailed", fake_run)
    assert main(["probe", "--device", "cpu", "--no-progress"]) == 0  # no rows: a torchrun rank's path
    assert main(["probe", "--gpus", "0,1", "--graph", "--no-progress"]) == 0
    assert [c.graph for c in seen] == [False, True]
    assert sweep.algo_pass_config(seen[1]).graph is False
    # compare-links: every mode's sweep gets it, and the result's config records it
    monkeypatch.setattr(compare, "resolve_device", lambda device, backend: "cuda")  # compare's own name
    monkeypatch.setattr(compare, "run_sweep_detailed", fake_run)
    seen.clear()
    cfg = compare.CompareConfig(ops=("all_reduce",), gpus=(0, 1), graph=True)
    res = compare.compare_links(cfg, topology=Topology(links=[], gpus=[], source="", notes=[]))
    assert [(c.mode, c.graph) for c in seen] == [("nvlink", True), ("pcie", True)]
    assert res.config and res.config.graph is True
