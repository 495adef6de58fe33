"""`tracekit export --perfetto`: a Chrome-trace JSON (Trace Event Format) with tracekit's view,
checked against the format's documented fields, against what the captures' manifests say ran, and
read back by tracekit's reader into the same events and classes."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.conftest import shared_trace
from tracekit.analyse.timeline.breakdown import breakdown
from tracekit.classify import classify
from tracekit.cli.main import main
from tracekit.model.events import COLUMNS
from tracekit.read import read_run

ROOT = Path(__file__).resolve().parents[1]
H200_TP2 = ROOT / "traces" / "h200-tp2"
CPU_TP2 = ROOT / "traces" / "cpu-tp2"
SGLANG = "external/tracelens/sglang_qwen3-8b_decode.json.gz"

#: Trace Event Format phases this export writes, and the metadata event names it documents
PHASES = {"X", "M", "s", "t", "f"}
METADATA_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def _export(tmp_path: Path, src: Path, name: str = "out.json") -> dict:
    out = tmp_path / name
    assert main(["export", "--perfetto", str(out), str(src), "--no-cache"]) == 0
    raw = out.read_bytes()
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)

    def no_nan(c: str) -> float:
        raise AssertionError(f"non-JSON number {c} in the export")

    return json.loads(raw, parse_constant=no_nan)


@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("h200")
    doc = _export(tmp, H200_TP2)
    return tmp / "out.json", doc


def _by_cat(doc: dict, cat: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == cat]


def check_trace_event_format(doc: dict) -> None:
    """The JSON Object Format of the Trace Event Format (Chrome's "Trace Event Format" document):
    `traceEvents` an array, `displayTimeUnit` "ms" or "ns"; every event an object with `ph`, `pid`,
    `tid`, `name`; complete events (X) with `ts`, `dur` (microseconds, >= 0), `cat`, `args`; metadata
    events (M) naming processes and threads through `args.name` / `args.sort_index`; flow events
    (s, t, f) with `id`, `cat`, `ts`, one start and one finish per id, the finish bound to its
    enclosing slice (`bp` "e"), and each flow event inside an X slice of its own thread (what it
    binds to)."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc["displayTimeUnit"] in ("ms", "ns")
    named_threads, named_procs = set(), set()
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[int, list[dict]] = defaultdict(list)
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert isinstance(e["cat"], str) and e["cat"]
            assert isinstance(e["ts"], int | float) and isinstance(e["dur"], int | float)
            assert math.isfinite(e["ts"]) and e["ts"] >= 0 and e["dur"] >= 0
            assert isinstance(e["args"], dict)
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "M":
            assert e["name"] in METADATA_NAMES
            key = "name" if e["name"].endswith("_name") else "sort_index"
            assert key in e["args"]
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            elif e["name"] == "process_name":
                named_procs.add(e["pid"])
        else:
            assert isinstance(e["id"], int) and isinstance(e["cat"], str)
            assert isinstance(e["ts"], int | float) and e["ts"] >= 0
            if e["ph"] == "f":
                assert e["bp"] == "e"
            flows[e["id"]].append(e)
    assert set(slices) <= named_threads
    assert {p for p, _ in slices} <= named_procs
    bounds = {k: (np.array([a for a, _ in v]), np.array([b for _, b in v])) for k, v in slices.items()}
    for fid, chain in flows.items():
        phases = [e["ph"] for e in chain]
        assert phases[0] == "s" and phases[-1] == "f" and set(phases[1:-1]) <= {"t"}, (fid, phases)
        assert len({e["cat"] for e in chain}) == 1
        for e in chain:
            st, en = bounds[(e["pid"], e["tid"])]
            assert ((st <= e["ts"]) & (e["ts"] <= en)).any(), f"flow {fid} binds to no slice"


def check_view_tracks_nest(doc: dict) -> None:
    """Slices on every track, the run's own host threads and GPU streams as the tracekit view's,
    are disjoint or nested (a track Perfetto can draw: its importer drops a slice that overlaps
    another without nesting; issue 24: 831 kernel slices on the raw "GPU n stream 7" tracks)."""
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            a = round(e["ts"] * 1000)
            tracks[(e["pid"], e["tid"])].append((a, a + round(e["dur"] * 1000)))
    assert tracks
    for iv in tracks.values():
        stack: list[int] = []
        for a, b in sorted(iv, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= a:
                stack.pop()
            assert not stack or b <= stack[-1], "overlapping slices on one track"
            stack.append(b)


def test_h200_tp2_export_is_a_chrome_trace(h200):
    _path, doc = h200
    check_trace_event_format(doc)
    check_view_tracks_nest(doc)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}


def test_h200_tp2_view_matches_what_ran(h200):
    _path, doc = h200
    wl = json.loads((H200_TP2 / "manifest.json").read_text())["workload"]
    tokens, per_token = wl["tokens"], sum(c["per_token"] for c in wl["collectives"])
    run = read_run([H200_TP2])
    ev = classify(run.events)
    # one step window per decode step on each rank
    assert len(_by_cat(doc, "tracekit.step")) == 2 * tokens
    # every collective the decoder issued, on both ranks, joined by one flow chain per instance
    coll = _by_cat(doc, "tracekit.collective")
    assert len(coll) == 2 * tokens * per_token
    want: Counter[str] = Counter()
    for c in wl["collectives"]:
        want[c["op"]] += 2 * tokens * c["per_token"]
    assert Counter(e["args"]["op"] for e in coll) == want
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s" and e["cat"] == "tracekit.flow.collective"]
    assert len(starts) == tokens * per_token
    # each collective is cut at the last arrival: wait + transfer = the collective, ns for ns
    pieces: dict[tuple[int, int], int] = defaultdict(int)
    for cat in ("tracekit.collective.wait", "tracekit.collective.transfer"):
        for e in _by_cat(doc, cat):
            pieces[(e["pid"], e["args"]["instance"])] += round(e["dur"] * 1000)
    for e in coll:
        assert pieces[(e["pid"], e["args"]["instance"])] == round(e["dur"] * 1000)
        assert e["args"]["wait_ns"] + e["args"]["transfer_ns"] == round(e["dur"] * 1000)
    # on each instance one rank waited for nothing (the last to arrive): no wait slice there
    waits = Counter(e["args"]["instance"] for e in _by_cat(doc, "tracekit.collective.wait"))
    assert max(waits.values()) == 1
    # the class of every GPU interval, named as the classifier has it
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    classed = [e for e in doc["traceEvents"] if e.get("cat", "").startswith("tracekit.class.")]
    assert len(classed) == len(gpu)
    assert Counter(e["name"] for e in classed) == Counter(gpu["cls"].astype(str))
    # NCCL kernels are the collective class; matmuls compute
    nccl = [e for e in classed if e["args"]["kernel"].startswith("ncclDevKernel")]
    assert nccl and all(e["name"] == "collective" for e in nccl)
    # the critical path: per step its pieces tile time without a gap or an overlap, back from the
    # latest window end of the step for the window of the rank that ends it (cut at the previous
    # step's latest window end), short of it only where the walk reached a rank's origin (the
    # first step), on the aligned clock (docs/METHOD.md section Clocks and step matching): each
    # rank is drawn on its own clock, aligned = raw - the rank's offset (a few ns on this one host)
    from tracekit.analyse.collectives.matching import match_collectives

    off = match_collectives(
        ev, ranks=run.ranks, rank_info=run.rank_info, manifest=run.manifest
    ).clock.offsets_ns
    assert all(abs(v) < 1_000 for v in off.values())
    path = [e for e in doc["traceEvents"] if e.get("cat", "").startswith("tracekit.critical_path.")]
    base = doc["tracekitExport"]["base_ns"]
    windows: dict[tuple[int, int], tuple[int, int]] = {}
    for e in _by_cat(doc, "tracekit.step"):
        a = base + round(e["ts"] * 1000) - off[e["pid"]]
        windows[(e["args"]["step"], e["pid"])] = (a, a + e["args"]["window_ns"])
    by_step: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for e in path:
        a = base + round(e["ts"] * 1000) - off[e["pid"]]
        by_step[e["args"]["step"]].append((a, a + round(e["dur"] * 1000), e["pid"]))
    assert sorted(by_step) == list(range(1, tokens + 1))
    for step, pieces in by_step.items():
        pieces.sort()
        for (_a0, b0, _r0), (a1, _b1, _r1) in zip(pieces, pieces[1:], strict=False):
            assert a1 == b0, (step, pieces)
        assert pieces[-1][1] == max(windows[(step, r)][1] for r in (0, 1))
        # the range: the window of the rank that ends the step last (ties: the lowest rank)
        end_r = min((0, 1), key=lambda r: (-windows[(step, r)][1], r))
        step_ns = windows[(step, end_r)][1] - windows[(step, end_r)][0]
        if step == 1:
            assert pieces[0][0] >= pieces[-1][1] - step_ns
        else:
            # cut at the previous step's latest window end where that window reaches back
            # past it (Graph.path_spans: that time is the previous token's and is booked there)
            prev_end = max(windows[(step - 1, r)][1] for r in (0, 1))
            assert pieces[0][0] == max(pieces[-1][1] - step_ns, prev_end), step
    assert {e["pid"] for e in path} == {0, 1}  # the path runs through both ranks


@pytest.fixture(scope="module")
def h200_back(h200: tuple[Path, dict]) -> Any:  # -> (Run of traces/h200-tp2, Run of its export)
    """traces/h200-tp2 and its export read back (uncached: the export's own reading), once for the
    module's round-trip and breakdown tests; read, never changed."""
    return read_run([H200_TP2]), read_run([h200[0]], cache=False)


def test_round_trip_gives_the_same_events_and_classes(h200, h200_back):
    _path, doc = h200
    orig, back = h200_back
    assert back.ranks == orig.ranks == [0, 1]
    a, b = orig.events, back.events
    assert list(b.columns) == list(COLUMNS) and len(a) == len(b)
    for c, dtype in COLUMNS.items():
        if dtype == "category":
            assert (a[c].astype(str).to_numpy() == b[c].astype(str).to_numpy()).all(), c
        else:
            assert np.array_equal(a[c].to_numpy(), b[c].to_numpy()), c
    ca, cb = classify(a), classify(b)
    for c in ("cls", "subclass"):
        assert (ca[c].astype(str).to_numpy() == cb[c].astype(str).to_numpy()).all()
    # the classes written in the file are the classifier's
    written = [e["args"]["class"] for e in doc["traceEvents"] if e["ph"] == "X" and "kind" in e["args"]]
    assert written == list(ca["cls"].astype(str))
    assert back.data_quality.counts["tracekit_view_events_skipped"] > 0


def test_breakdown_of_the_export_is_the_runs(h200_back):
    """`tracekit breakdown --format json` of the export (its JSON: `breakdown(run).to_json()`) is the
    run's, on the two runs read once (h200_back) rather than read again by the CLI."""
    outs = [json.loads(json.dumps(breakdown(run).to_json())) for run in h200_back]
    for key in ("steps", "per_token", "per_rank", "kernels_by_class", "trace_totals"):
        assert outs[0][key] == outs[1][key], key


def test_sglang_export_and_gzip(tmp_path: Path, shared_traces: Path):
    src = shared_trace(shared_traces, SGLANG)
    doc = _export(tmp_path, src, "sglang.json.gz")
    check_trace_event_format(doc)
    check_view_tracks_nest(doc)
    classed = [e for e in doc["traceEvents"] if e.get("cat", "").startswith("tracekit.class.")]
    # SOURCES.md: "reduce" in paged_attention_ll4mi_reduce_kernel does not make it a collective
    red = [e for e in classed if "paged_attention_ll4mi_reduce_kernel" in e["args"]["kernel"]]
    assert red and all(e["name"] != "collective" for e in red)
    assert not _by_cat(doc, "tracekit.collective")  # one GPU, no collectives
    back = read_run([tmp_path / "sglang.json.gz"], cache=False)
    orig = read_run([src], cache=False)
    assert len(back.events) == len(orig.events)
    pd.testing.assert_series_equal(
        back.events["end_ns"] - back.events["start_ns"], orig.events["end_ns"] - orig.events["start_ns"]
    )


def test_cpu_export_flows_join_the_gloo_collectives(tmp_path: Path):
    doc = _export(tmp_path, CPU_TP2)
    check_trace_event_format(doc)
    wl = json.loads((CPU_TP2 / "manifest.json").read_text())["workload"]
    n = wl["tokens"] * sum(c["per_token"] for c in wl["collectives"])
    chains = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] in "stf" and e["cat"] == "tracekit.flow.collective":
            chains[e["id"]].add(e["pid"])
    assert len(chains) == n and all(p == {0, 1} for p in chains.values())


def test_cli_help_and_one_line_errors(tmp_path: Path, capsys):
    assert main(["export", "--help"]) == 0
    out = capsys.readouterr().out
    assert "tracekit export --perfetto" in out and "Examples" in out
    for args in (
        ["export", "--perfetto", str(tmp_path / "o.json"), str(tmp_path / "missing")],
        ["export", "--perfetto", str(tmp_path / "o.txt"), str(CPU_TP2)],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("tracekit: error:") and err.count("\n") == 1, err
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1,')
    assert main(["export", "--perfetto", str(tmp_path / "o.json"), str(bad), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit: error:") and "bad.json" in err and err.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_h200_tp2_export_keeps_kinetos_launch_to_kernel_flows(h200):
    """Kineto links every launch to its kernel with an `ac2g` flow (start on the runtime call, finish
    on the kernel, one id each); the export keeps one per kernel whose launch is in the trace. The
    count is the raw file's own: its `ac2g` finishes whose id has a start."""
    _path, doc = h200
    flows = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("cat") == "ac2g":
            flows[(e["pid"], e["id"])].append(e)
    for r in (0, 1):
        raw = json.loads(gzip.decompress((H200_TP2 / f"rank-{r}.pt.trace.json.gz").read_bytes()))
        kin = [e for e in raw["traceEvents"] if e.get("cat") == "ac2g"]
        starts = {e["id"] for e in kin if e["ph"] == "s"}
        complete = sum(1 for e in kin if e["ph"] == "f" and e["id"] in starts)
        mine = [v for (pid, _), v in flows.items() if pid == r]
        assert complete > 10_000 and len(mine) == complete, (r, len(mine), complete)
        assert all([x["ph"] for x in v] == ["s", "f"] for v in mine)
    # the arrows join a runtime call (a host thread) to a GPU stream track
    names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"
    }
    some = next(iter(flows.values()))
    assert names[(some[0]["pid"], some[0]["tid"])].startswith("host thread")
    assert names[(some[1]["pid"], some[1]["tid"])].startswith("GPU ")
    assert doc["tracekitExport"]["view"]["ac2g"] == len(flows)
