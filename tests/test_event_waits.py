"""The operation each GPU operation waits for through an event (tracekit/analyse/path/gpu_waits.py):
`event_waits` on arrays is the pairing's definition, call by call in program order
(`_reference` below), on the committed GPU runs' ranks and on random call sequences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracekit.analyse.path.gpu_rank as gpu_rank
from tracekit.analyse.path.gpu_waits import event_waits

TRACES = Path(__file__).resolve().parents[1] / "traces"


def _reference(
    rt: np.ndarray,
    launching: set[int],
    names: np.ndarray,
    thread: np.ndarray,
    d_call: np.ndarray,
    d_stream: np.ndarray,
) -> np.ndarray:
    """The pairing call by call: per thread in program order, the launched operations' history;
    a record notes the history's length; a wait takes the last record's; the next launch's every
    operation waits for the last of the 64 operations before that length on another stream."""
    out = np.full(len(d_call), -1, dtype=np.int64)
    ops_of: dict[int, list[int]] = {}
    for j, c in enumerate(d_call.tolist()):
        if c >= 0:
            ops_of.setdefault(int(c), []).append(j)
    is_rec = {int(i) for i in rt if str(names[i]).startswith(("cudaEventRecord", "cuEventRecord"))}
    is_wait = {int(i) for i in rt if str(names[i]).startswith(("cudaStreamWaitEvent", "cuStreamWaitEvent"))}
    per_thread: dict[int, list[int]] = {}
    for i in rt.tolist():
        if i in launching or i in is_rec or i in is_wait:
            per_thread.setdefault(int(thread[i]), []).append(int(i))
    for calls in per_thread.values():
        history: list[int] = []
        rec_at: int | None = None
        waits: list[int] = []
        for i in calls:
            if i in is_rec:
                rec_at = len(history)
            elif i in is_wait:
                if rec_at is not None:
                    waits.append(rec_at)
            else:
                for j in ops_of.get(i, []):
                    for at in waits:
                        for jj in reversed(history[max(at - 64, 0) : at]):
                            if int(d_stream[jj]) != int(d_stream[j]):
                                if out[j] < 0 or jj > out[j]:
                                    out[j] = jj
                                break
                history.extend(ops_of.get(i, []))
                waits = []
    return out


@pytest.mark.parametrize("run", ["h200-tp2", "h200x2-tp2-b1", "h200-tp2-straggler", "h200-tp2-nsys", "sim"])
def test_the_pairing_of_whole_runs_is_the_call_by_call_one(
    run: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every rank of four committed eager GPU runs (Kineto and Nsight; none of their operations
    pairs: their NCCL shares the compute stream) and of the simulated run whose NCCL has its own
    stream joined by a record / wait around each collective (tests/groundtruth, case
    nccl_stream_event_waits: operations pair on every rank): the same operation for every operation."""
    from groundtruth.cases import CASES
    from groundtruth.kineto import write_run

    from tracekit.analyse.attribution.plan import attribution_plan
    from tracekit.analyse.plans import run_in_process
    from tracekit.read import read_run

    path = TRACES / run
    if run == "sim":
        spec = CASES["nccl_stream_event_waits"].sharded
        assert spec is not None
        write_run(spec, tmp_path / "sim")
        path = tmp_path / "sim"
    seen: list[int] = []
    own = gpu_rank.event_waits

    def both(rt: Any, launching: Any, names: Any, thread: Any, start: Any, d_call: Any, d_stream: Any) -> Any:
        got = own(rt, launching, names, thread, start, d_call, d_stream)
        want = _reference(rt, set(np.flatnonzero(launching).tolist()), names, thread, d_call, d_stream)
        assert np.array_equal(got, want)
        seen.append(int((got >= 0).sum()))
        return got

    monkeypatch.setattr(gpu_rank, "event_waits", both)
    run_in_process(attribution_plan(), read_run([str(path)]))
    assert len(seen) >= 2
    assert (min(seen) > 0) if run == "sim" else (max(seen) == 0)


def _mask(launching: set[int], n: int) -> np.ndarray:
    """The launching calls as `event_waits` takes them: per event, True for one of them."""
    out = np.zeros(n, dtype=bool)
    out[list(launching)] = True
    return out


NAMES = np.asarray(
    ["cudaLaunchKernel", "cudaEventRecord", "cudaStreamWaitEvent", "cudaMemcpyAsync", "cuEventRecord"]
)


@pytest.mark.parametrize("seed", range(40))
def test_the_pairing_of_random_call_sequences_is_the_call_by_call_one(seed: int) -> None:
    """Random programs: 1-3 threads, launches of 0-3 operations on 1-3 streams, records and waits
    in any order (a wait before any record, several waits before a launch, a record with nothing
    launched yet, more than 64 operations between a record and its wait), calls out of the window."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    kind = rng.choice(5, size=n, p=[0.5, 0.15, 0.15, 0.1, 0.1])  # index into NAMES
    names = NAMES[kind]
    thread = rng.integers(0, int(rng.integers(1, 4)), size=n) * 7
    rt = np.flatnonzero(rng.random(n) < 0.95)  # some calls are not in the window
    launching = {int(i) for i in np.flatnonzero((kind == 0) | (kind == 3)) if rng.random() < 0.9}
    n_ops = np.where(np.isin(np.arange(n), list(launching)), rng.integers(0, 4, size=n), 0)
    d_call = np.repeat(np.arange(n), n_ops)
    if rng.random() < 0.3:  # some operations of a call out of the window, or of no call
        d_call = np.where(rng.random(len(d_call)) < 0.1, -1, d_call)
    d_call = d_call[rng.permutation(len(d_call))] if rng.random() < 0.2 else d_call
    d_stream = rng.integers(0, int(rng.integers(1, 4)), size=len(d_call))
    start = np.arange(n, dtype=np.int64)
    got = event_waits(rt, _mask(launching, n), names, thread, start, d_call, d_stream)
    assert np.array_equal(got, _reference(rt, launching, names, thread, d_call, d_stream))


@pytest.mark.parametrize(("back", "pairs"), [(1, True), (64, True), (65, False)])
def test_a_record_holds_the_last_of_the_64_operations_before_it_on_another_stream(
    back: int, pairs: bool
) -> None:
    """100 launches of one operation each, all on stream 0 but the one `back` places before the
    record (stream 1); then the record, a wait and a launch on stream 0: its operation waits for
    that one when it is among the 64 before the record, else for none."""
    n = 100
    names = np.asarray(
        ["cudaLaunchKernel"] * n + ["cudaEventRecord", "cudaStreamWaitEvent", "cudaLaunchKernel"]
    )
    rt = np.arange(n + 3)
    launching = set(range(n)) | {n + 2}
    d_call = np.r_[np.arange(n), n + 2]
    d_stream = np.zeros(n + 1, dtype=np.int64)
    d_stream[n - back] = 1
    thread = np.zeros(n + 3, dtype=np.int64)
    got = event_waits(rt, _mask(launching, n + 3), names, thread, rt, d_call, d_stream)
    assert got[n] == (n - back if pairs else -1)
    assert (got[:n] == -1).all()
    assert np.array_equal(got, _reference(rt, launching, names, thread, d_call, d_stream))
