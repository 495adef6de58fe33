"""breakdown(): summaries with known answers, the JSON contract, and the `tracekit breakdown` CLI."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

import msgspec
import numpy as np
import pytest

from tracekit.analyse.timeline.breakdown import CSV_COLUMNS, breakdown
from tracekit.classify.rules import COMM_LIKE_HINT
from tracekit.cli.main import main
from tracekit.errors import StepError
from tracekit.model.documents import to_builtins
from tracekit.model.events import DataQuality, Run, make_events
from tracekit.read.manifests import attach_manifest

PARTS = ("compute", "memory", "collective", "unknown", "sync", "idle")
GEMM = "ampere_sgemm_32x128_nt"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
H200 = "h200/kineto_decode_ws1.pt.trace.json.gz"


def _two_rank_run() -> Run:
    """Two ranks, 4 steps each. Rank r, step i: window [1000 i, 1000 i + w) with w = 100 + 10 i + 50 r
    (rank 1 is always slower), one GEMM [start, start + 20 + r) and one NCCL kernel right after it
    lasting 30 ns. So per step the slowest rank is rank 1: windows 150, 160, 170, 180."""
    rows: dict[str, list] = {k: [] for k in ("rank", "kind", "name", "start_ns", "end_ns", "stream")}

    def add(rank: int, kind: str, name: str, s: int, e: int) -> None:
        for k, v in zip(rows, (rank, kind, name, s, e, 7 if kind == "kernel" else 1), strict=True):
            rows[k].append(v)

    for r in (0, 1):
        for i in range(4):
            s = 1000 * i
            add(r, "annotation", f"decode_step#{i}", s, s + 100 + 10 * i + 50 * r)
            add(r, "kernel", GEMM, s, s + 20 + r)
            add(r, "kernel", NCCL, s + 20 + r, s + 50 + r)
        add(r, "kernel", "weird_allreduce_kernel", 5000, 5007)  # looks like communication: unknown
    dq = DataQuality()
    dq.add("events_without_ts", 3, "3 events had no ts")
    return attach_manifest(
        Run(events=make_events(rows), sources={0: "rank-0.json", 1: "rank-1.json"}, data_quality=dq),
        {"dilation": 1.5},
    )


def test_per_token_step_is_the_slowest_rank_parts_the_mean_over_ranks() -> None:
    b = breakdown(_two_rank_run())
    assert len(b.steps) == 8
    pt = msgspec.to_builtins(b.per_token)  # as its JSON
    # slowest rank per step: rank 1, windows 150..180
    windows = [150, 160, 170, 180]
    assert pt["step_ns"]["n"] == 4
    assert pt["step_ns"]["median"] == 165
    assert pt["step_ns"]["p10"] == round(float(np.percentile(windows, 10)))
    assert pt["step_ns"]["p90"] == round(float(np.percentile(windows, 90)))
    assert pt["step_ns"]["mean"] == 165
    # parts: the mean over both ranks, rank 0's window padded with 50 ns of idle to rank 1's:
    # compute (20 + 21)/2 = 20.5, collective 30, idle ((100+10i-50+50) + (150+10i-51))/2 = 99.5+10i
    # -> medians 20.5 (rounded half to even: 20) and 114.5 (114); per step they sum to the window
    assert pt["parts_ns"]["compute"]["median"] == 20 and pt["parts_ns"]["compute"]["mean"] == 20
    assert pt["parts_ns"]["collective"]["median"] == 30
    assert pt["parts_ns"]["idle"]["median"] == 114
    assert pt["parts_ns"]["idle"]["p10"] == round(99.5 + 3)  # p10 of 99.5, 109.5, 119.5, 129.5
    assert pt["slowest_rank_counts"] == {"1": 4}
    per_rank = {r["rank"]: r for r in msgspec.to_builtins(b.per_rank)}
    assert per_rank[0]["step_ns_median"] == 115 and per_rank[1]["step_ns_median"] == 165
    assert per_rank[0]["parts_ns_median"]["compute"] == 20


def test_kernels_by_class_unknown_dq_and_dilation() -> None:
    b = breakdown(_two_rank_run())
    assert b.kernels_by_class["compute"] == {"count": 8, "total_ns": 4 * 20 + 4 * 21}
    assert b.kernels_by_class["collective"] == {"count": 8, "total_ns": 8 * 30}
    assert b.kernels_by_class["memory"] == {"count": 0, "total_ns": 0}
    assert b.kernels_by_class["unknown"] == {"count": 2, "total_ns": 14}
    assert b.kernels_by_subclass["matrix"]["count"] == 8 and b.kernels_by_subclass["nccl"]["count"] == 8
    assert to_builtins(b.unknown_kernels) == [
        {"name": "weird_allreduce_kernel", "count": 2, "total_ns": 14, "hint": COMM_LIKE_HINT}
    ]
    assert b.data_quality.counts["events_without_ts"] == 3  # merged from the run
    assert b.data_quality.counts["unknown_kernel_events"] == 2
    assert b.dilation == 1.5


def test_skip_first_and_rank_filter() -> None:
    b = breakdown(_two_rank_run(), skip_first=1)
    assert sorted(b.steps["step"].unique()) == [1, 2, 3]
    assert b.per_token.step_ns.median == 170
    assert b.data_quality.counts["skipped_warmup_steps"] == 2
    one = breakdown(_two_rank_run(), rank=0)
    assert set(one.steps["rank"]) == {0} and one.ranks == [0] and one.paths == ["rank-0.json"]
    with pytest.raises(StepError, match="rank 5 is not in this run"):
        breakdown(_two_rank_run(), rank=5)
    with pytest.raises(StepError, match="skipped"):
        breakdown(_two_rank_run(), skip_first=10)


def test_json_contract_and_csv() -> None:
    b = breakdown(_two_rank_run())
    doc = json.loads(json.dumps(b.to_json()))  # JSON-serialisable
    assert doc["schema_version"] == "1.0" and doc["kind"] == "tracekit.breakdown"
    assert doc["source"]["ranks"] == [0, 1] and doc["source"]["timeline"] == "gpu"
    assert doc["source"]["step_pattern"] == "decode_step"
    for key in (
        "steps",
        "per_token",
        "per_rank",
        "kernels_by_class",
        "kernels_by_subclass",
        "unknown_kernels",
        "data_quality",
        "dilation",
    ):
        assert key in doc
    for s in doc["steps"]:
        assert set(s) >= {
            "rank",
            "step",
            "name",
            "start_ns",
            "window_ns",
            "parts_ns",
            "overlapped_collective_ns",
        }
        assert set(s["parts_ns"]) == set(PARTS)
        assert sum(s["parts_ns"].values()) == s["window_ns"]
    assert set(doc["kernels_by_class"]) == {"compute", "memory", "collective", "unknown"}
    assert set(doc["data_quality"]) == {"counts", "notes"}
    rows = list(csv.DictReader(io.StringIO(b.to_csv())))
    assert len(rows) == 8 and tuple(rows[0]) == CSV_COLUMNS
    for r in rows:
        assert sum(int(r[f"{p}_ns"]) for p in PARTS) == int(r["window_ns"])


# ------------------------------------------------------------------ the CLI on the real H200 trace


def _h200(shared_traces: Path) -> Path:
    p = shared_traces / H200
    if not p.exists():
        pytest.skip(f"{H200} absent")
    return p


def test_cli_table_shows_five_decode_steps(shared_traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _h200(shared_traces)
    assert main(["breakdown", str(path), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "'decode_step'" in out
    steps_table = out[out.index("Steps (ms)") : out.index("Per rank")]
    step_rows = [line.split("│")[1:4] for line in steps_table.splitlines() if line.startswith("│")]
    # rank 0, steps 0..4, windows 4.623 1.508 1.738 1.654 2.150 ms (the annotations, see the JSON test)
    assert [(int(r), int(s), w.strip()) for r, s, w in step_rows] == [
        (0, 0, "4.623"),
        (0, 1, "1.508"),
        (0, 2, "1.738"),
        (0, 3, "1.654"),
        (0, 4, "2.150"),
    ]
    assert "Per token" in out and "p10" in out and "Data quality" in out


def test_cli_json_parts_sum_to_step_times(
    shared_traces: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import gzip
    from decimal import Decimal

    path = _h200(shared_traces)
    out_file = tmp_path / "b.json"
    assert main(["breakdown", str(path), "--format", "json", "--out", str(out_file), "--no-cache"]) == 0
    doc = json.loads(out_file.read_text())
    assert len(doc["steps"]) == 5 and doc["source"]["step_pattern"] == "decode_step"
    for s in doc["steps"]:
        assert sum(s["parts_ns"].values()) == s["window_ns"]
    # independent: the decode_step annotations with plain json (the GPU work ends inside them here)
    with gzip.open(path) as f:
        raw = json.load(f, parse_float=Decimal)
    base = int(raw["baseTimeNanoseconds"])
    anns = sorted(
        (base + int(Decimal(e["ts"]) * 1000), int((Decimal(e["dur"]) * 1000).to_integral_value()))
        for e in raw["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("name") == "decode_step"
    )
    assert [(s["start_ns"], s["window_ns"]) for s in doc["steps"]] == anns
    assert doc["per_token"]["step_ns"]["median"] == statistics.median(w for _, w in anns)
    # no NCCL kernel runs with world_size 1, and the GEMMs are matrix compute
    assert doc["kernels_by_class"]["collective"]["count"] == 0
    assert doc["kernels_by_subclass"]["matrix"]["count"] == 60


def test_cli_csv(shared_traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _h200(shared_traces)
    assert main(["breakdown", str(path), "--format", "csv", "--no-cache"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 5
    assert all(sum(int(r[f"{p}_ns"]) for p in PARTS) == int(r["window_ns"]) for r in rows)


def test_cli_errors_are_one_line(
    shared_traces: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sglang = shared_traces / "external/tracelens/sglang_qwen3-8b_decode.json.gz"
    if not sglang.exists():
        pytest.skip("sglang trace absent")
    # issue 15: no markers of tracekit's own is no refusal: the serving engine's iteration range is the step
    assert main(["breakdown", str(sglang), "--no-cache", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"]["step_rule"] == "serving_engine"
    # a pattern the user asks for that matches nothing is still one line and exit 2
    assert main(["breakdown", str(sglang), "--no-cache", "--steps", "no_such_range"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error: no step annotations match") and "step[DECODE bs=32]" in err
    assert err.count("\n") == 1
    assert (
        main(["breakdown", str(sglang), "--step-pattern", r"step\[DECODE", "--format", "json", "--no-cache"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["steps"]) == 1
    assert main(["breakdown", str(tmp_path / "nothing-here"), "--no-cache"]) == 2
    assert capsys.readouterr().err.startswith("tracekit: error:")


def test_cli_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["breakdown", "--help"]) == 0
    out = capsys.readouterr().out
    assert "Example" in out and "tracekit breakdown" in out and "--step-pattern" in out


# ------------------------------------------------------------------ review fixes


def _gpu_behind_host_run() -> Run:
    """One rank, three 10 us decode_step annotations each launching one 25 us kernel that runs after
    the annotation ends: kernels [5,30), [30,55), [55,80) us; annotations at 0, 10, 20 us."""
    rows: dict[str, list] = {
        k: [] for k in ("rank", "kind", "name", "start_ns", "end_ns", "correlation", "stream")
    }

    def add(kind: str, name: str, s: int, e: int, corr: int, stream: int) -> None:
        for k, v in zip(rows, (0, kind, name, s, e, corr, stream), strict=True):
            rows[k].append(v)

    for i, k_start in enumerate((5_000, 30_000, 55_000)):
        add("annotation", f"decode_step#{i}", 10_000 * i, 10_000 * i + 10_000, -1, 1)
        add("runtime", "cudaLaunchKernel", 10_000 * i + 1_000, 10_000 * i + 2_000, 100 + i, 1)
        add("kernel", GEMM, k_start, k_start + 25_000, 100 + i, 7)
    return Run(events=make_events(rows), sources={0: "rank-0.json"})


def test_gpu_behind_host_is_not_double_counted() -> None:
    b = breakdown(_gpu_behind_host_run())
    # the GPU runs behind the host: the windows come from the device side (issue 28), each from its
    # step's kernel to the next step's: [5,30) [30,55) [55,80) us; the GPU's 75 us counted once
    assert list(b.steps["start_ns"]) == [5_000, 30_000, 55_000]
    assert list(b.steps["window_ns"]) == [25_000, 25_000, 25_000]
    assert list(b.steps["compute_ns"]) == [25_000, 25_000, 25_000]
    assert int(b.steps["compute_ns"].sum()) == 3 * 25_000
    assert b.per_token.step_ns.mean == 25_000  # the device's pace, not the host's 10 us
    assert b.data_quality.counts["step_windows_device_paced"] == 3
    assert "step_windows_clipped" not in b.data_quality.counts


@pytest.mark.parametrize(
    ("manifest", "want", "noted"),
    [
        ({"dilation": 1.5}, 1.5, None),
        ({"dilation": 2}, 2.0, None),
        ({"dilation": None}, None, None),
        ({}, None, None),
        # not a number: left out where the manifest is read (a manifest that is not an object is
        # not read at all: tests/test_read_run.py)
        ({"dilation": "fast"}, None, "manifest_field_malformed"),
        ({"dilation": "1.5"}, None, "manifest_field_malformed"),
        ({"dilation": True}, None, "manifest_field_malformed"),
        ({"dilation": float("nan")}, None, "manifest_field_malformed"),
        ({"dilation": [1.5]}, None, "manifest_field_malformed"),
        # a number, not a dilation: the breakdown says so
        ({"dilation": 5000.0}, None, "manifest_dilation_not_a_number"),
        ({"dilation": 0.0}, None, "manifest_dilation_not_a_number"),
    ],
)
def test_manifest_dilation_only_a_real_number(manifest: dict, want: float | None, noted: str | None) -> None:
    run = _two_rank_run()
    run.manifest = None
    run.data_quality = DataQuality()
    attach_manifest(run, manifest)
    b = breakdown(run)
    assert b.dilation == want
    if noted is None:
        assert not any(k.startswith("manifest_") for k in b.data_quality.counts)
    else:
        assert b.data_quality.counts[noted] == 1
    json.dumps(b.to_json(), allow_nan=False)


def _copy_cpu_tp2(tmp_path: Path) -> Path:
    import shutil

    src = Path(__file__).resolve().parents[1] / "traces" / "cpu-tp2"
    if not (src / "manifest.json").exists():
        pytest.skip("traces/cpu-tp2 absent")
    dst = tmp_path / "cpu-tp2"
    shutil.copytree(src, dst)
    return dst


def test_cli_manifest_with_a_string_dilation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _copy_cpu_tp2(tmp_path)
    m = json.loads((run_dir / "manifest.json").read_text())
    m["dilation"] = "fast"
    (run_dir / "manifest.json").write_text(json.dumps(m))
    assert main(["breakdown", str(run_dir), "--format", "json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dilation"] is None
    # not a number: the reader leaves it out, naming the field; the rest of the manifest is read
    assert doc["data_quality"]["counts"]["manifest_field_malformed"] == 1
    assert any("field 'dilation' does not fit" in n for n in doc["data_quality"]["notes"])
    assert "manifest_dilation_not_a_number" not in doc["data_quality"]["counts"]


def test_cli_rank_overrides_the_file_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    f = Path(__file__).resolve().parents[1] / "traces" / "cpu-tp2" / "rank-1.pt.trace.json.gz"
    if not f.exists():
        pytest.skip("traces/cpu-tp2 absent")
    with gzip.open(f) as fh:
        own = json.load(fh)["distributedInfo"]["rank"]
    assert own == 1
    assert main(["breakdown", str(f), "--rank", "0", "--format", "json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["ranks"] == [0]
    assert doc["data_quality"]["counts"]["rank_overridden"] == 1
    assert any("says rank 1" in n and "rank 0 was given" in n for n in doc["data_quality"]["notes"])
    # the same rank as the file's: nothing to say
    assert main(["breakdown", str(f), "--rank", "1", "--format", "json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["ranks"] == [1] and "rank_overridden" not in doc["data_quality"]["counts"]


def test_cli_help_says_rank_overrides_and_skip_first_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["breakdown", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "overriding the rank the file says" in out
    assert "per-token figures include the first step unless --skip-first 1" in out
