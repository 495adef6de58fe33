"""The Kineto reader on the real shared traces, checked against independent counts made here with
plain `json` / `gzip` (and the exact decimal text of timestamps), plus error cases built in tmp_path
from the real files."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import shared_params

from tracekit.errors import RankError, TraceFormatError
from tracekit.model.events import check_events
from tracekit.read.kineto import parse_us_to_ns, rank_from_filename, read_kineto

KINETO_TRACES = [
    "h200/kineto_decode_ws1.pt.trace.json.gz",
    "external/hta/cpu_only_rank-34.pt.trace.json.gz",
    "external/hta/cuda_event_sync_trace.json.gz",
    "external/hta/distributed_info_not_found.json.gz",
    "external/hta/mi250_minitoy_rocm.json.gz",
    "external/hta/nccl_data.json.gz",
    "external/hta/ns_resolution_rank-0.pt.trace.json.gz",
    "external/hta/sampled_rank-0.json.gz",
    "external/hta/sampled_rank-1.json.gz",
    "external/tracelens/sglang_qwen3-8b_decode.json.gz",
]

# Independent of the reader: Kineto `cat` -> our kind (the documented mapping).
_KIND = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
}


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _trace(shared_traces: Path, rel: str) -> Path:
    p = shared_traces / rel
    if not p.exists():
        pytest.skip(f"{rel} not in {shared_traces}")
    return p


@pytest.mark.parametrize("rel", shared_params(KINETO_TRACES))
def test_counts_match_plain_json(shared_traces: Path, rel: str) -> None:
    path = _trace(shared_traces, rel)
    doc = _load(path)
    events = doc["traceEvents"]
    want = Counter(_KIND.get(e.get("cat"), "other") for e in events if e.get("ph") == "X")
    run = read_kineto(path, rank=0 if "rank" not in path.name and "distributedInfo" not in doc else None)
    check_events(run.events)
    got = Counter(run.events["kind"].astype(str))
    assert {k: v for k, v in got.items() if v} == dict(want)
    # non-X events are counted, never silently dropped
    skipped = sum(v for k, v in run.data_quality.counts.items() if k.startswith("skipped_"))
    assert skipped == sum(1 for e in events if e.get("ph") != "X")
    assert (run.events["end_ns"] >= run.events["start_ns"]).all()


def _exact_ns(text: str, base_ns: int) -> int:
    return base_ns + int(Decimal(text) * 1000)


def test_ns_resolution_keeps_sub_microsecond_digits(shared_traces: Path) -> None:
    path = _trace(shared_traces, "external/hta/ns_resolution_rank-0.pt.trace.json.gz")
    text = gzip.open(path, "rt").read()
    # the exact decimal text of the first X events' ts / dur, straight from the file
    xs = re.findall(r'"ph": "X".*?"ts": ([0-9.]+), "dur": ([0-9.]+)', text[:200_000], flags=re.S)
    assert len(xs) > 20
    run = read_kineto(path)
    ev = run.events
    starts = set(ev["start_ns"].tolist())
    spans = set(zip(ev["start_ns"].tolist(), ev["end_ns"].tolist(), strict=True))
    fractional = 0
    for ts, dur in xs:
        s = _exact_ns(ts, 0)
        assert s in starts
        assert (s, s + int(Decimal(dur) * 1000)) in spans
        fractional += s % 1000 != 0
    assert fractional > 10  # the trace really has sub-us digits, and they survived
    # float64 would have lost them: 1712195495519695.812 us is not representable
    assert int(float("1712195495519695.812") * 1000) != 1712195495519695812


def test_base_time_convention(real_kineto_file: Path) -> None:
    path = real_kineto_file
    doc = _load(path)
    text = gzip.open(path, "rt").read()
    base = int(doc["baseTimeNanoseconds"])
    first_ts = re.search(
        r'"ph": "X", "cat": "[a-z_]+", "name": "[^"]*", "pid": \d+, "tid": \d+,\s*"ts": ([0-9.]+)', text
    )
    assert first_ts
    run = read_kineto(path)
    assert _exact_ns(first_ts.group(1), base) in set(run.events["start_ns"].tolist())
    assert run.rank_info[0]["baseTimeNanoseconds"] == base


def test_nccl_allreduce_kernel_bytes(shared_traces: Path) -> None:
    path = _trace(shared_traces, "external/hta/nccl_data.json.gz")
    doc = _load(path)
    want = [
        (e["ts"], e["args"]["In msg nelems"], e["args"]["dtype"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e["name"].startswith("ncclKernel_AllReduce_RING_LL_Sum_float")
    ]
    assert want and all(d == "Float" for _, _, d in want)
    run = read_kineto(path)
    ev = run.events
    k = ev[ev["name"].astype(str).str.startswith("ncclKernel_AllReduce_RING_LL_Sum_float")]
    assert len(k) == len(want)
    assert set(k["coll_op"].astype(str)) == {"all_reduce"}
    assert sorted(k["coll_in_bytes"].tolist()) == sorted(n * 4 for _, n, _ in want)
    assert set(k["coll_group_size"].tolist()) == {2}
    assert set(k["coll_pg_ranks"].astype(str)) == {"[0, 1]"}
    assert (k["device"] == 0).all()


def test_nccl_kernel_without_args_gets_op_from_name(shared_traces: Path) -> None:
    path = _trace(shared_traces, "external/hta/sampled_rank-0.json.gz")
    doc = _load(path)
    sendrecv = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "SendRecv" in e["name"]
    ]
    assert sendrecv and not any("Collective name" in e.get("args", {}) for e in sendrecv)
    ev = read_kineto(path).events
    k = ev[(ev["kind"] == "kernel") & ev["name"].astype(str).str.contains("SendRecv")]
    assert len(k) == len(sendrecv)
    assert set(k["coll_op"].astype(str)) == {"send_recv"}


def test_rank_sources(shared_traces: Path) -> None:
    di = read_kineto(_trace(shared_traces, "external/hta/cpu_only_rank-34.pt.trace.json.gz"))
    assert di.ranks == [34] and di.rank_info[34]["rank_source"] == "distributedInfo"
    missing = _trace(shared_traces, "external/hta/distributed_info_not_found.json.gz")
    with pytest.raises(RankError, match="--rank"):
        read_kineto(missing)
    assert read_kineto(missing, rank=5).ranks == [5]
    assert (read_kineto(missing, rank=5).events["rank"] == 5).all()


def test_rank_from_file_name(shared_traces: Path, tmp_path: Path) -> None:
    src = _trace(shared_traces, "external/hta/distributed_info_not_found.json.gz")
    dst = tmp_path / "job_rank-3.pt.trace.json.gz"
    dst.write_bytes(src.read_bytes())
    run = read_kineto(dst)
    assert run.ranks == [3] and run.rank_info[3]["rank_source"] == "file name"
    assert read_kineto(dst, rank=7).ranks == [7]  # an explicit rank overrides


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.pt.trace.json.gz", 3),
        ("rank3.json", 3),
        ("x_rank_12.json", 12),
        ("trace.json", None),
        ("frank9.json", None),
        # SGLang's per-TP-worker files (python/sglang/srt/managers: `<time>-TP-<tp_rank>...`)
        ("1733000000.123-TP-3.trace.json.gz", 3),
        ("1733000000.123-TP-1-DECODE.trace.json.gz", 1),
        ("STP-4.json", None),
        ("http-2.json", None),
    ],
)
def test_rank_from_filename_patterns(name: str, rank: int | None) -> None:
    assert rank_from_filename(name) == rank


def test_parse_us_to_ns_exact() -> None:
    texts = [b"1234.567", b"1712195495519695.8", b"1682725898236567", b"0.001", b"-2.5", b"", b"1.5e3"]
    ns, ok, sub = parse_us_to_ns(texts)
    assert ns[:5].tolist() == [1234567, 1712195495519695800, 1682725898236567000, 1, -2500]
    assert ok.tolist() == [True] * 5 + [False, True]
    assert ns[6] == 1_500_000 and sub == 0


def test_parse_us_to_ns_long_texts_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few texts far longer than a timestamp among many: each value is what it is alone (a
    100-decimal number read, truncated below 1 ns; a 5,000-digit one and a long string refused),
    and the many short texts are not parsed in a matrix as wide as the longest (5,000 events with
    one 5,000-digit ts took ~1 CPU-s and 200 MB temporaries)."""
    from tracekit.read import kineto_events

    widths: list[tuple[int, int]] = []
    real = kineto_events._text_matrix

    def recorded(texts: Any, n: int) -> Any:
        m, same = real(texts, n)
        widths.append(m.shape)
        return m, same

    monkeypatch.setattr(kineto_events, "_text_matrix", recorded)
    long_dec, huge, quoted = b"1." + b"5" * 100, b"1" * 5000, b'"' + b"7" * 300 + b'"'
    texts = [b"1234.567"] * 3000 + [long_dec, huge, b"-2.5", quoted] + [b"1682725898236567"] * 2000
    counts: dict[str, int] = {}
    ns, ok, sub = parse_us_to_ns(texts, counts)
    assert ok[3000:3004].tolist() == [True, False, True, False]
    assert (ns[3000], ns[3002]) == (1555, -2500)  # the value of a refused text is not defined
    assert set(ns[:3000].tolist()) == {1234567} and set(ns[3004:].tolist()) == {1682725898236567000}
    assert ok[:3000].all() and ok[3004:].all() and sub == 1
    assert counts == {"strings": 1}  # a number written as a string, counted as such, too long to read
    assert sum(r * w for r, w in widths) <= len(texts) * 25 + 5000 + 300 + 102, widths
    # each long text parsed alone gives the same
    for t, i in ((long_dec, 3000), (huge, 3001), (quoted, 3003)):
        one = parse_us_to_ns([t])
        assert one[1][0] == ok[i] and (not ok[i] or one[0][0] == ns[i])


def test_chunked_equals_whole(shared_traces: Path) -> None:
    """Tiny chunks (many cuts, including inside nested args) give the same table as one big chunk."""
    path = _trace(shared_traces, "external/hta/nccl_data.json.gz")
    a = read_kineto(path).events
    b = read_kineto(path, chunk_bytes=4096).events
    assert a.equals(b)


# ------------------------------------------------------------------------------------------------
# errors, built from the real files


def _raw(real_kineto_file: Path) -> bytes:
    """The real trace's JSON text (conftest.real_kineto_file: a step of traces/h200-tp2-full)."""
    return gzip.decompress(real_kineto_file.read_bytes())


def test_truncated_gzip(real_kineto_file: Path, tmp_path: Path) -> None:
    data = real_kineto_file.read_bytes()
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"rank-0.json.gz at byte \d+: truncated gzip") as exc:
        read_kineto(bad, rank=0)
    assert exc.value.offset is not None and exc.value.offset <= len(data) // 2


def test_truncated_json(real_kineto_file: Path, tmp_path: Path) -> None:
    raw = _raw(real_kineto_file)
    bad = tmp_path / "rank-0.json"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceFormatError, match=r"truncated JSON") as exc:
        read_kineto(bad, rank=0)
    assert exc.value.offset is not None and len(raw) // 4 < exc.value.offset <= len(raw) // 2


def test_invalid_json_offset(real_kineto_file: Path, tmp_path: Path) -> None:
    raw = _raw(real_kineto_file)
    i = raw.index(b'"ph": "X"', len(raw) // 2)
    bad = tmp_path / "rank-0.json"
    bad.write_bytes(raw[:i] + b"@@" + raw[i:])
    with pytest.raises(TraceFormatError, match="invalid JSON") as exc:
        read_kineto(bad, rank=0)
    assert exc.value.offset is not None and abs(exc.value.offset - i) <= 2


def test_no_trace_events(real_kineto_file: Path, tmp_path: Path) -> None:
    doc = json.loads(_raw(real_kineto_file))
    del doc["traceEvents"]
    bad = tmp_path / "rank-0.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="no traceEvents"):
        read_kineto(bad)


def test_empty_trace(real_kineto_file: Path, tmp_path: Path) -> None:
    doc = json.loads(_raw(real_kineto_file))
    doc["traceEvents"] = []
    bad = tmp_path / "rank-0.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="empty trace"):
        read_kineto(bad)
    empty = tmp_path / "rank-1.json"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty file"):
        read_kineto(empty)


def test_events_without_ts(real_kineto_file: Path, tmp_path: Path) -> None:
    doc = json.loads(_raw(real_kineto_file))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    for e in xs[:3]:
        del e["ts"]
    f = tmp_path / "rank-0.json"
    f.write_text(json.dumps(doc))
    run = read_kineto(f)
    assert len(run.events) == len(xs) - 3
    assert run.data_quality.counts["events_without_ts"] == 3
    for e in xs:
        e.pop("ts", None)
    f.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="no complete .X. event has a ts"):
        read_kineto(f)


def test_unexpected_types_fall_back(real_kineto_file: Path, tmp_path: Path) -> None:
    """A string dur or device still reads (slow path), with the same numbers."""
    doc = json.loads(_raw(real_kineto_file))
    good = tmp_path / "rank-0.json"
    good.write_text(json.dumps(doc))
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            e["dur"] = str(e["dur"])
            e["args"]["device"] = str(e["args"]["device"])
    odd = tmp_path / "rank-1.json"
    odd.write_text(json.dumps(doc))
    a, b = read_kineto(good).events, read_kineto(odd, rank=0).events
    assert np.array_equal(a["end_ns"], b["end_ns"]) and np.array_equal(a["device"], b["device"])


# PyTorch 1.8's Kineto category names (as torch-tb-profiler maps them to today's) and the runtimes
# of other Kineto device backends; the reader must give these files the same kinds
_LEGACY_CAT = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy"}
_LEGACY_CAT["gpu_memset"] = "Memset"


@pytest.mark.parametrize("spelling", ["legacy", "xpu"])
def test_other_category_spellings_read_as_the_same_kinds(
    real_kineto_file: Path, tmp_path: Path, spelling: str
) -> None:
    doc = _load(real_kineto_file)
    renamed = 0
    for ev in doc["traceEvents"]:
        cat = ev.get("cat")
        if spelling == "legacy" and cat in _LEGACY_CAT:
            ev["cat"], renamed = _LEGACY_CAT[cat], renamed + 1
        elif spelling == "xpu" and cat == "cuda_runtime":
            ev["cat"], renamed = "xpu_runtime", renamed + 1
    assert renamed > 100  # premise: the trace has these categories
    out = tmp_path / "rank-0.pt.trace.json"
    out.write_text(json.dumps(doc))
    ref = read_kineto(real_kineto_file).events
    got = read_kineto(out).events
    assert (
        got["kind"].astype(str).value_counts().to_dict() == ref["kind"].astype(str).value_counts().to_dict()
    )
    assert (got["kind"].astype(str) == "other").sum() == (ref["kind"].astype(str) == "other").sum()


def test_json_array_format_reads_like_the_object_form(real_kineto_file: Path, tmp_path: Path) -> None:
    """The Chrome trace format's other form: the file is the events array (legacy autograd profiler
    exports, merging tools); its closing `]` is optional, so a trace whose writer died reads too."""
    src = real_kineto_file
    events = _load(src)["traceEvents"]
    text = json.dumps(events)
    ref = read_kineto(src).events
    cols = ["kind", "name", "start_ns", "end_ns", "stream"]

    def rel(df):  # type: ignore[no-untyped-def]
        # the object form's baseTimeNanoseconds (metadata the array form lacks) shifts every time
        out = df[cols].copy()
        t0 = int(df["start_ns"].min())
        out["start_ns"] -= t0
        out["end_ns"] -= t0
        return out.astype(str).reset_index(drop=True)

    want = rel(ref)
    for label, body in [
        ("array", text),
        ("no closing bracket", text[:-1]),
        ("trailing comma", text[:-1] + ",\n"),
    ]:
        f = tmp_path / f"{label.replace(' ', '_')}.json"
        f.write_text(body)
        got = read_kineto(f, rank=0).events  # the array form has no distributedInfo
        assert rel(got).equals(want), label
    bad = tmp_path / "after.json"
    bad.write_text(text + ' {"x": 1}')
    with pytest.raises(TraceFormatError, match="after the events array") as exc:
        read_kineto(bad, rank=0)
    assert exc.value.offset == len(text) + 1


def test_an_execution_trace_is_named_as_such(tmp_path: Path) -> None:
    """PyTorch's execution trace (an operator graph, no timings) is often saved beside the Kineto
    trace; given by mistake, the error says what it is and what to pass instead."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ExecutionTraceObserver

    et_path = tmp_path / "et.json"
    et = ExecutionTraceObserver().register_callback(str(et_path))
    et.start()
    x = torch.randn(8, 8)
    (x @ x).relu()
    et.stop()
    et.unregister_callback()
    assert "nodes" in json.loads(et_path.read_text())  # premise: a real execution trace
    with pytest.raises(TraceFormatError, match="execution trace .* not a Kineto trace"):
        read_kineto(et_path, rank=0)


def test_duration_events_begin_end_read_as_the_complete_events(
    real_kineto_file: Path, tmp_path: Path
) -> None:
    """The Chrome trace format's duration events ("B" ... "E" on one thread, nested) are the same
    intervals as complete ("X") events: every X of a real trace rewritten as a B/E pair (times
    kept exact as decimal text) reads back as the same events; a stray E and an unclosed B are
    counted, not guessed."""
    src = real_kineto_file
    with gzip.open(src, "rt") as fh:
        doc = json.loads(fh.read(), parse_float=Decimal)

    # B/E nest by construction (an E ends the innermost open B), so only the host threads' events
    # become pairs (a GPU stream's annotations overlap its kernels without nesting: they stay X);
    # of two with one start the longer must begin first: laid out by (start, longest first)
    def host(e: dict) -> bool:
        return (
            e.get("ph") == "X"
            and "dur" in e
            and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime")
        )

    out = [e for e in doc["traceEvents"] if not host(e)]
    xs = sorted(filter(host, doc["traceEvents"]), key=lambda e: (e["ts"], -e["dur"]))
    for e in xs:
        b = {k: v for k, v in e.items() if k != "dur"}
        b["ph"] = "B"
        out += [b, {"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e["dur"]}]
    n_pairs = sum(1 for e in out if e.get("ph") == "E")
    assert n_pairs > 400  # premise: the host threads hold hundreds of ops, runtime calls and ranges
    out += [
        {"ph": "E", "pid": 99, "tid": 1, "ts": 1},
        {"ph": "B", "pid": 99, "tid": 2, "ts": 1, "name": "open"},
    ]
    doc["traceEvents"] = out
    text = json.dumps(doc, default=lambda d: f"D:{d}")
    text = re.sub(r'"D:([^"]+)"', r"\1", text)  # Decimals as bare numbers, digit for digit
    f = tmp_path / "rank-0.json"
    f.write_text(text)
    cols = ["kind", "name", "start_ns", "end_ns", "stream", "device", "correlation"]
    key = lambda df: df[cols].astype(str).sort_values(cols).reset_index(drop=True)  # noqa: E731
    ref = read_kineto(src)
    got = read_kineto(f)
    assert key(got.events).equals(key(ref.events))
    assert got.data_quality.counts["begin_end_unmatched"] == 2


def test_ranks_merged_into_one_file_are_named_not_mixed_silently(tmp_path: Path) -> None:
    """Trace-merging tools (e.g. for SGLang) put every rank's events in one file, each pid
    relabelled "[TP<rank>] <pid>"; read as one rank, its steps would mix the ranks: the reader
    says so in data_quality, naming the ranks. A plain trace (string pid "Spans" and the like) does not."""
    repo = Path(__file__).resolve().parents[1]
    merged: dict = {"traceEvents": []}
    for r in (0, 1):
        doc = _load(repo / "traces" / "cpu-tp2" / f"rank-{r}.pt.trace.json.gz")
        for e in doc["traceEvents"]:
            e["pid"] = f"[TP{r:02d}] {e.get('pid')}"
        merged["traceEvents"] += doc["traceEvents"]
        merged.setdefault("distributedInfo", doc.get("distributedInfo"))
    f = tmp_path / "merged.trace.json"
    f.write_text(json.dumps(merged))
    dq = read_kineto(f).data_quality
    assert dq.counts.get("merged_ranks_in_one_file") == 2
    assert any("ranks 0, 1" in n and "per-rank trace files" in n for n in dq.notes)
    plain = read_kineto(repo / "traces" / "cpu-tp2" / "rank-0.pt.trace.json.gz").data_quality
    assert "merged_ranks_in_one_file" not in plain.counts
