"""Issue 25: traces users bring, round 3.

- repeated ranges whose names hold `#` (torch.compile's `## Call CompiledFxGraph <hash> ##`, the
  DataLoader's `enumerate(DataLoader)#...`) are steps with no flag; 0 windows is never silent;
- PyTorch 1.8/1.9-era Kineto traces (`ProfilerStep#N` as an `Operator`) get their steps;
- an output naming an input (or a file of an input folder, or an input's cache entry) is refused
  before anything is written, on every command that writes;
- an nsys export without its kernel table is refused; its text cells (BLOB, invalid UTF-8) read;
- every number of a manifest is bounded where it is read (per_token_ns 1e30 overflowed int64);
- trace_totals offers TraceLens's gpu_timeline by its own definitions, and says how they differ;
- the partial-group refusal names --allow-partial.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from msgspec import UNSET

from tests.conftest import shared_trace
from tests.faithful_traces import (
    BASE_NS,
    DATALOADER,
    compiled_decode_rank,
    compiled_range,
    legacy_kineto_trace,
)
from tracekit.analyse.timeline.rules import StepChoice, range_key
from tracekit.analyse.timeline.steps import assemble_steps, find_steps_detailed
from tracekit.analyse.timeline.trace_totals import rank_tracelens_timeline
from tracekit.analyse.timeline.windows import RankWindows, empty_step_rows
from tracekit.cli.main import main
from tracekit.errors import StepError, TraceFormatError
from tracekit.model.documents import to_builtins
from tracekit.model.events import make_events
from tracekit.read import read_file, read_run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACEKIT_NO_CACHE", raising=False)


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _json(argv: list[str]) -> dict[str, Any]:
    rc, out, err = _cli([*argv, "--format", "json"])
    assert rc == 0, err
    return json.loads(out)


def _write_compiled_runs(root: Path) -> tuple[Path, Path]:
    runs = []
    for name, world in (("tp1", 1), ("tp2", 2)):
        d = root / name
        d.mkdir()
        for r in range(world):
            (d / f"rank-{r}.pt.trace.json").write_text(json.dumps(compiled_decode_rank(r, world)))
        runs.append(d)
    return runs[0], runs[1]


# ------------------------------------------------------------------ 1. names holding '#'


@pytest.mark.parametrize(
    "name",
    [
        compiled_range("c3a9x2"),
        DATALOADER,
        "Optimizer.step#AdamW.step",
        r"a\#b \d+ [x] (y)? *+ $^ 12 #3",
        "step 7 of 10 #",
    ],
)
def test_range_key_matches_its_own_names_and_no_others(name: str) -> None:
    """The key is a regex of the name, digits generalised: it matches the name and the name with
    other numbers, never a name whose '#' or other characters differ."""
    rx = re.compile("^" + range_key(name) + "$")
    assert rx.search(name)
    renumbered = re.sub(r"\d+", lambda m: str(int(m.group()) + 41), name)
    assert rx.search(renumbered)
    if "#" in name:
        assert not rx.search(name.replace("#", "7"))  # the old placeholder made '#' match digits
    assert not rx.search(name + "x") and not rx.search("x" + name)


def test_compiled_graph_ranges_are_steps_with_no_flag(tmp_path: Path) -> None:
    """A vLLM-style decode through torch.compile: the only repeated ranges are Inductor's
    `## Call CompiledFxGraph <hash> ##` (and the shorter DataLoader fetch): the graph calls are the
    steps, and breakdown, export, diff and shortfall run on the trace."""
    tp1, tp2 = _write_compiled_runs(tmp_path)
    doc = _json(["breakdown", str(tp2)])
    src = doc["source"]
    assert src["step_rule"] == "repeated_range" and src["ranks"] == [0, 1]
    assert re.search(src["step_pattern"], compiled_range()) and "#" in src["step_pattern"]
    # the builder's layout: step i's graph call at 1000 + 400 i + 50 us; its 4 kernels (the last an
    # NCCL all-reduce) start 10 us in, 40 us each, 2 us apart: the window ends with the last one
    for r in (0, 1):
        steps = [s for s in doc["steps"] if s["rank"] == r]
        assert [s["start_ns"] - BASE_NS for s in steps] == [(1050 + 400 * i) * 1000 for i in range(6)]
        assert all(s["window_ns"] == (10 + 3 * 42 + 40) * 1000 for s in steps)
        assert all(s["parts_ns"]["collective"] == 40_000 for s in steps)
    out = tmp_path / "tp2.perfetto.json"
    rc, _o, err = _cli(["export", "--perfetto", str(out), str(tp2)])
    assert rc == 0 and out.stat().st_size > 0, err
    diff = _json(["diff", str(tp1), str(tp2), "--allow-tp-change"])
    assert diff["kind"] == "tracekit.diff"
    sf = _json(["shortfall", "--baseline", str(tp1), "--sharded", str(tp2)])
    assert sf["kind"] == "tracekit.shortfall"


def test_dataloader_ranges_alone_are_steps() -> None:
    rows = []
    for i in range(3):
        t = i * 1000
        rows += [
            ("annotation", DATALOADER, t, t + 600),
            ("kernel", "void k<float>(float*)", t + 100, t + 500),
        ]
    kind, name, start, end = (list(x) for x in zip(*rows, strict=True))
    ev = make_events(
        {
            "rank": [0] * len(rows),
            "kind": kind,
            "name": name,
            "start_ns": start,
            "end_ns": end,
            "stream": [7] * 6,
        }
    )
    found = find_steps_detailed(ev)
    assert found.rule == "repeated_range" and list(found.steps["start_ns"]) == [0, 1000, 2000]


def test_zero_windows_under_an_annotation_rule_is_an_error() -> None:
    """Never 0 steps silently (was: breakdown exit 0 with `ranks: []`, then pandas' 'No objects to
    concatenate' in shortfall, export and diff)."""
    empty = RankWindows(0, empty_step_rows(), np.zeros(0, dtype=np.int64))
    with pytest.raises(StepError, match="no rank has a window"):
        assemble_steps(StepChoice("repeated_range", "^x$"), [empty])


# ------------------------------------------------------------------ 2. 2021-era Kineto traces


def test_pytorch_1_8_kineto_trace_gets_its_profiler_steps(tmp_path: Path) -> None:
    p = tmp_path / "worker0.pt.trace.json"
    p.write_text(json.dumps(legacy_kineto_trace(steps=4, kernel_us=30)))
    run = read_file(p, cache=False)
    kinds = dict(zip(run.events["name"].astype(str), run.events["kind"].astype(str), strict=True))
    assert kinds["ProfilerStep#1"] == "annotation" and kinds["aten::mm"] == "cpu_op"
    assert kinds["volta_sgemm_128x32_nt"] == "kernel"
    for argv in ([], ["--steps", r"ProfilerStep#\d+"]):
        doc = _json(["breakdown", str(p), *argv])
        assert doc["source"]["step_rule"] == ("profiler_step" if not argv else "pattern")
        steps = doc["steps"]
        assert [s["name"] for s in steps] == [f"ProfilerStep#{i}" for i in (1, 2, 3, 4)]
        assert [s["step"] for s in steps] == [1, 2, 3, 4]
        # per step: the 500 us ProfilerStep, one 30 us kernel and one 2 us H2D copy inside it
        assert all(s["window_ns"] == 500_000 for s in steps)
        assert all((s["parts_ns"]["compute"], s["parts_ns"]["memory"]) == (30_000, 2_000) for s in steps)


# ------------------------------------------------------------------ 3. outputs never overwrite inputs


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "argv",
    [
        ["breakdown", "{t}", "--format", "json", "--out", "{t}"],
        ["export", "--perfetto", "{t}", "{t}"],
        ["report", "{t}", "-o", "{t}"],
        ["diff", "{t}", "{d}", "--out", "{t}"],
        ["shortfall", "--baseline", "{d1}", "--sharded", "{d}", "--out", "{d}/rank-1.pt.trace.json"],
        ["whatif", "--baseline", "{d1}", "--sharded", "{d}", "--out", "{d}/manifest.json"],
        ["breakdown", "{d}", "--out", "{link}"],
    ],
)
def test_an_output_naming_an_input_is_refused(tmp_path: Path, argv: list[str]) -> None:
    tp1, tp2 = _write_compiled_runs(tmp_path)
    (tp2 / "manifest.json").write_text(json.dumps({"schema_version": "1.2", "kind": "tracekit.capture"}))
    t = tmp_path / "one.pt.trace.json"
    shutil.copy(tp1 / "rank-0.pt.trace.json", t)
    link = tmp_path / "link.json"
    link.symlink_to(tp2 / "rank-0.pt.trace.json")
    subs = {"{t}": str(t), "{d}": str(tp2), "{d1}": str(tp1), "{link}": str(link)}
    args = [next((a.replace(k, v) for k, v in subs.items() if k in a), a) for a in argv]
    files = [t, *tp1.iterdir(), *tp2.iterdir()]
    before = {f: _digest(f) for f in files}
    rc, _out, err = _cli(args)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("tracekit: error: ")
    assert "names an input" in err or "names the manifest of an input" in err
    assert {f: _digest(f) for f in files} == before


def test_an_output_naming_an_inputs_cache_entry_is_refused(tmp_path: Path) -> None:
    from tracekit.read.cache import cache_path_for

    t = tmp_path / "one.pt.trace.json"
    t.write_text(json.dumps(compiled_decode_rank(0, 1)))
    assert _cli(["breakdown", str(t)])[0] == 0  # writes the cache entry
    entry = cache_path_for(t)
    assert entry is not None and entry.exists()
    before = _digest(entry)
    rc, _out, err = _cli(["breakdown", str(t), "--out", str(entry)])
    assert rc == 2 and "cache entry of the input" in err and _digest(entry) == before


def test_a_new_output_beside_the_inputs_is_written(tmp_path: Path) -> None:
    tp1, _tp2 = _write_compiled_runs(tmp_path)
    out = tp1 / "breakdown.json"
    rc, _o, err = _cli(["breakdown", str(tp1), "--format", "json", "--out", str(out)])
    assert rc == 0 and json.loads(out.read_text())["kind"] == "tracekit.breakdown", err


# ------------------------------------------------------------------ 4, 5. damaged nsys exports

NSYS = "h200/nsys_matmul_nvtx.sqlite"


def _nsys_copy(shared_traces: Path, tmp_path: Path, *sql: str) -> Path:
    p = tmp_path / "rank-0.sqlite"
    shutil.copy(shared_trace(shared_traces, NSYS), p)
    p.chmod(0o644)
    con = sqlite3.connect(p)
    for q in sql:
        con.execute(q)
    con.commit()
    con.close()
    return p


def test_nsys_export_without_its_kernel_table_is_refused(shared_traces: Path, tmp_path: Path) -> None:
    p = _nsys_copy(shared_traces, tmp_path, "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(TraceFormatError, match="kernel launches .* but no CUPTI_ACTIVITY_KIND_KERNEL"):
        read_file(p, cache=False)
    rc, _o, err = _cli(["breakdown", str(p)])
    assert rc == 2 and err.count("\n") == 1


def test_nsys_export_with_its_kernels_deleted_is_flagged(shared_traces: Path, tmp_path: Path) -> None:
    p = _nsys_copy(shared_traces, tmp_path, "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    run = read_file(p, cache=False)
    # the pristine export's 21 kernel launches (20 matmuls and one warm-up), none with a kernel now
    assert run.data_quality.counts["nsys_kernels_missing"] == 21


def test_nsys_text_cells_as_blob_or_invalid_utf8_read(shared_traces: Path, tmp_path: Path) -> None:
    """NVTX text stored as BLOB (was a UnicodeDecodeError in the step rules) reads as the text the
    bytes spell; invalid UTF-8 in StringIds (was a one-line SQLite error) reads with U+FFFD."""
    ref = read_file(shared_trace(shared_traces, NSYS), cache=False)
    p = _nsys_copy(
        shared_traces,
        tmp_path,
        "UPDATE NVTX_EVENTS SET text = CAST(text AS BLOB) WHERE text IS NOT NULL",
        "UPDATE StringIds SET value = CAST(X'ff' || CAST(value AS BLOB) AS TEXT) WHERE value LIKE 'cuda%'",
    )
    run = read_file(p, cache=False)
    blobs = (
        sqlite3.connect(p)
        .execute("SELECT count(*) FROM NVTX_EVENTS WHERE typeof(text) = 'blob'")
        .fetchone()[0]
    )
    assert blobs > 0 and run.data_quality.counts["nsys_text_not_text"] == blobs
    assert run.data_quality.counts["nsys_text_invalid_utf8"] > 0
    ann = lambda r: r.events[r.events["kind"] == "annotation"]["name"].astype(str).tolist()  # noqa: E731
    assert ann(run) == ann(ref)
    rt = run.events[run.events["kind"] == "runtime"]["name"].astype(str)
    assert rt.str.startswith("\ufffdcuda").any()
    assert find_steps_detailed(run.events).steps.shape[0] == find_steps_detailed(ref.events).steps.shape[0]


# ------------------------------------------------------------------ 6. manifest numbers bounded


def _manifest_runs(tmp_path: Path, edit: Any) -> tuple[Path, Path]:
    out = []
    for name in ("cpu-tp1", "cpu-tp2"):
        d = tmp_path / name
        shutil.copytree(REPO / "traces" / name, d)
        m = json.loads((d / "manifest.json").read_text())
        edit(m)
        (d / "manifest.json").write_text(json.dumps(m))
        out.append(d)
    return out[0], out[1]


def test_manifest_numbers_beyond_bounds_are_treated_as_missing(tmp_path: Path) -> None:
    """Four numbers beyond bounds in the TP=2 run's manifest: per-token times of 1e30 and inf, a
    dilation of 1e300, 10**30 tokens. The bound is applied where the manifest is read, to each
    number independently of the others: each is dropped (checked one by one), the note counts all
    four, and the shortfall and `tracekit dilation` of the run end normally and say so. One
    manifest holds the four (each was a whole shortfall of its own: the four checks are of one rule
    on independent fields, and each field's removal is asserted at the reading)."""

    def edit(m: dict[str, Any]) -> None:
        for rnd in [m["unprofiled"]["per_token_ns"], *(m["unprofiled"].get("rounds") or [])]:
            rnd["0"][1], rnd["0"][2] = 1e30, float("inf")
        m["dilation"] = 1e300
        m["workload"]["tokens"] = 10**30

    tp1, tp2 = _manifest_runs(tmp_path, edit)
    run = read_run([str(tp2)])
    m = run.manifest
    raw = json.loads((tp2 / "manifest.json").read_text())
    rounds = [raw["unprofiled"]["per_token_ns"], *(raw["unprofiled"].get("rounds") or [])]
    assert m is not None and m.workload and m.unprofiled and m.profiled
    # the typed manifest: a per-token list holding such a number cannot keep its tokens' places, so
    # the times it is in are left out whole (unprofiled.per_token_ns and rounds), the others kept
    assert m.unprofiled.per_token_ns is UNSET and m.unprofiled.rounds is UNSET
    assert m.profiled.per_token_ns == raw["profiled"]["per_token_ns"]
    assert m.dilation is UNSET and m.workload.tokens is UNSET and m.workload.tp == 2
    assert run.data_quality.counts["manifest_field_malformed"] >= 1
    n = 2 * len(rounds) + 2
    assert any(f"{n} number(s) not finite or beyond" in note for note in run.data_quality.notes), (
        run.data_quality.notes
    )
    sf = _json(["shortfall", "--baseline", str(tp1), "--sharded", str(tp2), "--no-cache"])
    assert "manifest_field_malformed" in json.dumps(sf["data_quality"])
    rc, _out, err = _cli(["dilation", str(tp2)])
    assert rc == 0 and "Traceback" not in err


def test_dilation_bounds_the_numbers_it_reads() -> None:
    """A manifest's JSON object built in code goes through the reader's rules (`manifest_from_json`,
    what read_manifest applies to the file): the number beyond 2**62 is treated as missing there
    (its per-token list with it), the implausible dilation where dilation_of reads it."""
    from tracekit.analyse.dilation import dilation_of
    from tracekit.read.manifests import manifest_from_json

    read = manifest_from_json({"unprofiled": {"per_token_ns": {"0": [100, 1e30]}}, "dilation": 1e-300})
    d = dilation_of(read.manifest)
    assert d.unprofiled is None and d.manifest_dilation is None
    assert any("2**62" in n for _, n in read.notes) and any("dilation" in n for n in d.notes)


# ------------------------------------------------------------------ 7. TraceLens's gpu_timeline

#: TraceLens's gpu_timeline of the SGLang trace (its own output, ms; tests/test_any_trace.py)
TRACELENS_SGLANG_MS = {
    "computation": "9.759752",
    "exposed_memcpy": "0.013177",
    "idle": "463.977",
    "total": "473.750",
}


def test_sglang_include_unlinked_variant_equals_tracelens(shared_traces: Path) -> None:
    path = shared_trace(shared_traces, "external/tracelens/sglang_qwen3-8b_decode.json.gz")
    rc, out, err = _cli(["breakdown", str(path), "--format", "json"])
    assert rc == 0, err
    tt = json.loads(out)["trace_totals"]
    tl = tt["tracelens_gpu_timeline"]["include_unlinked_kernels"]
    for key, ms in TRACELENS_SGLANG_MS.items():
        assert abs(Decimal(tl[f"{key}_ns"]) - Decimal(ms) * 1_000_000) < 1000, (key, tl)
    assert (
        tl["computation_ns"] + tl["exposed_comm_ns"] + tl["exposed_memcpy_ns"] + tl["idle_ns"]
        == tl["total_ns"]
    )
    assert "memset" in tt["differences_from_tracelens"] and "TraceLens" not in tt["rule"].split("(")[0]


def test_tracelens_definitions_differ_from_tracekits_where_they_should() -> None:
    """Hand-built rank: kernel A [0, 100) launched by call 1; a memset [100, 150) by call 2; an NCCL
    kernel [120, 200) by call 3; a memcpy [300, 310) by call 4; kernel B [400, 500) with no launch
    call (unlinked); a graph launch (call 5) running kernels [600, 650) and [650, 700)."""
    rows = [
        ("runtime", "cudaLaunchKernel", 0, 5, 1),
        ("runtime", "cudaMemsetAsync", 90, 95, 2),
        ("runtime", "cudaLaunchKernel", 110, 115, 3),
        ("runtime", "cudaMemcpyAsync", 290, 295, 4),
        ("runtime", "cudaGraphLaunch", 590, 595, 5),
        ("kernel", "void a<float>(float*)", 0, 100, 1),
        ("memset", "Memset (Device)", 100, 150, 2),
        ("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 120, 200, 3),
        ("memcpy", "Memcpy HtoD (Pageable -> Device)", 300, 310, 4),
        ("kernel", "void b<float>(float*)", 400, 500, 77),
        ("kernel", "void g0<float>(float*)", 600, 650, 5),
        ("kernel", "void g1<float>(float*)", 650, 700, 5),
    ]
    kind, name, start, end, corr = (list(x) for x in zip(*rows, strict=True))
    n = len(rows)
    ev = make_events(
        {
            "rank": [0] * n,
            "kind": kind,
            "name": name,
            "start_ns": start,
            "end_ns": end,
            "correlation": corr,
            "stream": [7] * n,
        }
    )
    tl = to_builtins(rank_tracelens_timeline(ev))
    full = tl["include_unlinked_kernels"]
    # computation: A, the memset, B, g0, g1 = [0,150) + [400,500) + [600,700); comm [120,200)
    assert full["computation_ns"] == 150 + 100 + 100
    assert full["exposed_comm_ns"] == 50 and full["total_comm_ns"] == 80
    assert full["exposed_memcpy_ns"] == 10 and full["busy_ns"] == 410 and full["total_ns"] == 700
    linked = tl["linked_only"]  # B unlinked; of the graph's two kernels only g1 (the last-ending)
    assert (
        linked["computation_ns"] == 150 + 50
        and linked["total_ns"] == 700
        and linked["busy_ns"] == 200 + 10 + 50
    )
    assert linked["idle_ns"] == 700 - 260
    # tracekit's own: busy = the kernels only ([0,100) + [120,200) + B + the graph); the memset's
    # [100, 120) outside them is exposed memcpy with the memcpy's 10
    from tracekit.analyse.timeline.trace_totals import rank_trace_totals

    own = to_builtins(rank_trace_totals(ev))
    assert own is not None and own["busy_ns"] == 100 + 80 + 100 + 100 and own["exposed_memcpy_ns"] == 20 + 10


# ------------------------------------------------------------------ 8. --allow-partial


def test_partial_group_refusal_names_the_cli_option(tmp_path: Path) -> None:
    """Rank 0 of the TP=2 run alone: its all-reduces name a group of ranks [0, 1]; the refusal
    tells a CLI user the option that matches anyway, and the option does."""
    _tp1, tp2 = _write_compiled_runs(tmp_path)
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(tp2 / "rank-0.pt.trace.json", half)
    rc, _o, err = _cli(["diff", str(tp2), str(half)])
    assert rc == 2 and "--allow-partial" in err and "allow_partial=True" in err and err.count("\n") == 1
    rc, _o, err = _cli(["diff", str(tp2), str(half), "--allow-partial"])
    assert rc == 0, err
