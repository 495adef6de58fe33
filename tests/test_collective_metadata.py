"""Collective metadata in the reader (issue 4/5 follow-up): bytes of gloo worker-thread ops.

- real committed CPU captures (gloo, mode `cpu`, record_shapes): every `gloo:*` op gets its bytes
  from its own shapes; the expected bytes are computed here from the raw JSON (Input Dims x 4 for
  float, all_gather out = world size x in), independently of the reader;
- the enqueue -> worker pairing assumption (k-th c10d enqueue on the main thread <-> k-th gloo op
  on the worker threads) is checked on the raw JSON of the real traces: every pair has the same op
  and the same shapes, and every worker op starts after its enqueue;
- a Kineto file written here with `record_param_comms` on the calling thread and bare `gloo:` ops
  on two worker threads: the worker ops take bytes / dtype / group / seq from their enqueue, and
  a disagreeing pair refuses the join (counted, nothing copied).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tracekit.read import read_run
from tracekit.read.kineto import out_bytes_for, pair_enqueued, shape_dtype, shape_tensors

REPO = Path(__file__).resolve().parents[1]
CPU_TP2 = REPO / "traces" / "cpu-tp2"


def _raw(path: Path) -> dict[str, Any]:
    return json.load(gzip.open(path))


def _need(p: Path) -> Path:
    if not p.exists():
        pytest.skip(f"committed trace {p} not found")
    return p


# ---------------------------------------------------------------------------------------------
# pure helpers


def test_shape_helpers():
    assert shape_dtype("float") == "Float" and shape_dtype("c10::BFloat16") == "BFloat16"
    assert shape_dtype("c10::Float8_e4m3fn") == "Float8_e4m3fn" and shape_dtype("TensorList") == ""
    # gloo:all_reduce of a [1, 1, 256] float tensor; c10d::allreduce_ with a TensorList (no dtype)
    assert shape_tensors([[1, 1, 256]], ["float"]) == [(256, "Float")]
    assert shape_tensors([[[1, 1, 256]], [], []], ["TensorList", "", ""]) == [(256, "")]
    assert shape_tensors([[8, 4096]], ["c10::BFloat16"]) == [(32768, "BFloat16")]
    assert shape_tensors("junk", None) == []
    assert out_bytes_for("all_reduce", 1024, 2) == 1024
    assert out_bytes_for("all_gather", 2048, 2) == 4096 and out_bytes_for("all_gather", 2048, -1) == -1
    assert out_bytes_for("reduce_scatter", 4096, 4) == 1024 and out_bytes_for("barrier", 0, 2) == -1


def test_pair_enqueued_rules():
    ops = ["all_reduce", "all_gather", "all_reduce"]
    ok, why = pair_enqueued(ops, [10, 20, 30], ops, [12, 25, 31])
    assert why == "" and ok == [(0, 0), (1, 1), (2, 2)]
    # a worker op that started before the first enqueue (enqueued before the trace began) and an
    # enqueue after the last worker op (not run before the trace ended) are left out
    pairs, why = pair_enqueued(ops + ["all_reduce"], [10, 20, 30, 40], ["all_reduce"] + ops, [5, 12, 25, 31])
    assert why == "" and pairs == [(0, 1), (1, 2), (2, 3)]
    assert "2 enqueued collectives but 3" in pair_enqueued(ops[:2], [10, 20], ops, [12, 25, 31])[1]
    assert (
        "enqueued all_gather but the worker ran all_reduce"
        in pair_enqueued(["all_reduce", "all_gather"], [10, 20], ["all_reduce", "all_reduce"], [11, 21])[1]
    )
    assert "starts before its enqueue" in pair_enqueued(ops, [10, 20, 30], ops, [12, 19, 31])[1]
    assert (
        "256 elements enqueued but 512"
        in pair_enqueued(ops, [10, 20, 30], ops, [12, 25, 31], [256, 512, 256], [256, 512, 512])[1]
    )
    # unknown element counts (-1) are not compared
    assert pair_enqueued(ops, [10, 20, 30], ops, [12, 25, 31], [-1, -1, -1], [256, 512, 256])[1] == ""


# ---------------------------------------------------------------------------------------------
# real committed CPU captures


def _gloo_ops(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(
        (e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:")),
        key=lambda e: e["ts"],
    )


def test_gloo_ops_get_bytes_from_their_shapes():
    ws = 2
    run = read_run(_need(CPU_TP2), cache=False)
    ev = run.events
    for r in (0, 1):
        doc = _raw(CPU_TP2 / f"rank-{r}.pt.trace.json.gz")
        raw = _gloo_ops(doc)
        assert raw and all(e["args"]["Input type"] == ["float"] for e in raw)
        expect = []
        for e in raw:
            nbytes = math.prod(e["args"]["Input Dims"][0]) * 4
            out = nbytes * ws if e["name"] == "gloo:all_gather" else nbytes
            expect.append((e["name"], nbytes, out))
        got = ev[(ev["rank"] == r) & ev["name"].astype(str).str.startswith("gloo:")].sort_values("start_ns")
        assert (
            list(zip(got["name"].astype(str), got["coll_in_bytes"], got["coll_out_bytes"], strict=True))
            == expect
        )
        assert set(got["coll_dtype"].astype(str)) == {"Float"}
        assert set(got["coll_group_size"]) == {ws}
        assert set(got["coll_op"].astype(str)) == {"all_reduce", "all_gather"}
    # the tiny preset: hidden 256 (all-reduce of [1, 1, 256] fp32), vocab 1024 / 2 ranks gathered
    sizes = set(zip(ev["coll_op"].astype(str), ev["coll_in_bytes"], ev["coll_out_bytes"], strict=True))
    assert {("all_reduce", 1024, 1024), ("all_gather", 2048, 4096)} <= sizes
    assert "collective_enqueue_join_refused" not in run.data_quality.counts


@pytest.mark.parametrize("folder", ["cpu-tp2", "cpu-tp2-straggler"])
def test_enqueue_to_worker_pairing_holds_on_real_traces(folder):
    """The k-th c10d enqueue on the calling thread is the k-th gloo op on the worker threads:
    checked on the raw JSON by op and by the tensor shapes both sides recorded."""
    d = _need(REPO / "traces" / folder)
    for r in (0, 1):
        doc = _raw(d / f"rank-{r}.pt.trace.json.gz")
        main_tid = next(e["tid"] for e in doc["traceEvents"] if e.get("name") == "c10d::allreduce_")
        enq = sorted(
            (
                e
                for e in doc["traceEvents"]
                if e.get("ph") == "X" and e.get("tid") == main_tid and str(e["name"]).startswith("c10d::")
            ),
            key=lambda e: e["ts"],
        )
        wk = _gloo_ops(doc)
        assert len({e["tid"] for e in wk}) >= 1 and main_tid not in {e["tid"] for e in wk}
        assert len(enq) == len(wk) == 80  # 16 steps x (4 all-reduces + 1 all-gather)

        def op(name: str) -> str:
            return "all_gather" if "gather" in name else "all_reduce"

        def enq_dims(e: dict[str, Any]) -> list[int]:
            # c10d::allreduce_(TensorList, ...) / c10d::allgather_(out lists, TensorList, ...)
            dims = e["args"]["Input Dims"]
            return dims[0][0] if e["name"] == "c10d::allreduce_" else dims[1][0]

        for a, b in zip(enq, wk, strict=True):
            assert op(a["name"]) == op(b["name"])
            assert enq_dims(a) == b["args"]["Input Dims"][0]
            assert b["ts"] >= a["ts"]
        pairs, why = pair_enqueued(
            [op(e["name"]) for e in enq],
            [round(e["ts"] * 1000) for e in enq],
            [op(e["name"]) for e in wk],
            [round(e["ts"] * 1000) for e in wk],
            [math.prod(enq_dims(e)) for e in enq],
            [math.prod(e["args"]["Input Dims"][0]) for e in wk],
        )
        assert why == "" and len(pairs) == 80


# ---------------------------------------------------------------------------------------------
# a trace written here: record_param_comms on the calling thread, bare gloo ops on workers


def _x(name: str, tid: int, ts: float, dur: float, args: dict[str, Any] | None = None, cat: str = "cpu_op"):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args or {},
    }


def _comms(coll: str, nelems: int, out_nelems: int, seq: int) -> dict[str, Any]:
    return {
        "Collective name": coll,
        "In msg nelems": nelems,
        "Out msg nelems": out_nelems,
        "dtype": "BFloat16",
        "Group size": 2,
        "Process Group Name": "tp",
        "Process Group Ranks": "[0, 1]",
        "Seq": seq,
    }


def _write_trace(path: Path, calls: list[tuple[str, str, int, int]], worker_ops: list[str]) -> None:
    """calls: (c10d name, collective name, in nelems, out nelems) enqueued 100 us apart on tid 1;
    worker_ops: the gloo op names run 10 us after each enqueue, alternating tids 7 and 8; one extra
    gloo op at ts 0 (enqueued before the trace began)."""
    ev = [_x("gloo:all_reduce", 7, 0.0, 5.0, cat="user_annotation")]
    for k, (c10d, coll, n_in, n_out) in enumerate(calls):
        t = 100.0 * (k + 1)
        ev.append(_x(c10d, 1, t, 8.0))
        ev.append(_x("record_param_comms", 1, t + 1, 6.0, _comms(coll, n_in, n_out, seq=k)))
        ev.append(_x(worker_ops[k], 7 + k % 2, t + 10, 50.0, cat="user_annotation"))
    doc = {"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2}, "traceEvents": ev}
    path.write_text(json.dumps(doc))


def test_worker_ops_take_metadata_from_their_enqueue(tmp_path):
    calls = [
        ("c10d::allreduce_", "allreduce", 4096, 4096),
        ("c10d::allreduce_", "allreduce", 4096, 4096),
        ("c10d::allgather_", "allgather", 16000, 32000),
    ]
    p = tmp_path / "rank-0.json"
    _write_trace(p, calls, ["gloo:all_reduce", "gloo:all_reduce", "gloo:all_gather"])
    run = read_run(p, cache=False)
    ev = run.events
    wk = ev[ev["name"].astype(str).str.startswith("gloo:")].sort_values("start_ns")
    # the op at ts 0 ran before any enqueue in the trace: left alone
    first = wk.iloc[0]
    assert first["coll_in_bytes"] == -1 and str(first["coll_pg_name"]) == ""
    rest = wk.iloc[1:]
    assert rest["coll_in_bytes"].tolist() == [8192, 8192, 32000]  # bf16: 2 bytes per element
    assert rest["coll_out_bytes"].tolist() == [8192, 8192, 64000]
    assert rest["coll_seq"].tolist() == [0, 1, 2]
    assert set(rest["coll_pg_name"].astype(str)) == {"tp"} and set(rest["coll_group_size"]) == {2}
    assert set(rest["coll_dtype"].astype(str)) == {"BFloat16"}
    assert rest["coll_name"].astype(str).tolist() == ["allreduce", "allreduce", "allgather"]
    assert run.data_quality.counts["collective_metadata_from_enqueue"] == 3
    assert "collective_enqueue_join_refused" not in run.data_quality.counts


def test_disagreeing_enqueues_are_not_joined(tmp_path):
    calls = [("c10d::allreduce_", "allreduce", 4096, 4096), ("c10d::allgather_", "allgather", 16000, 32000)]
    p = tmp_path / "rank-0.json"
    _write_trace(p, calls, ["gloo:all_reduce", "gloo:all_reduce"])  # the worker ran another op
    run = read_run(p, cache=False)
    ev = run.events
    wk = ev[ev["name"].astype(str).str.startswith("gloo:")]
    assert (wk["coll_in_bytes"] == -1).all() and (wk["coll_seq"] == -1).all()
    assert run.data_quality.counts["collective_enqueue_join_refused"] == 3
    assert any("enqueued all_gather but the worker ran all_reduce" in n for n in run.data_quality.notes)
