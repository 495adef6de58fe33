"""What a GPU rank's graph reads beside its calls and operations (`gpu_rank`): the operation each
operation waits for through an event, and a window's end nodes."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tracekit.analyse.path.forward import first_of_runs, index_ranges
from tracekit.model.strings import str_flags

_RECORD = re.compile(r"^cu(da)?EventRecord")
_WAIT_EVENT = re.compile(r"^cu(da)?StreamWaitEvent")


def event_waits(
    rt: np.ndarray,
    launching: np.ndarray,
    names: np.ndarray,
    thread: np.ndarray,
    start: np.ndarray,
    d_call: np.ndarray,
    d_stream: np.ndarray,
) -> np.ndarray:
    """Per device operation, the operation its stream waits for through an event (-1: none), from
    the host's calls in program order: an operation launched after a `cudaStreamWaitEvent` (since the
    thread's previous launch) waits for the event of the last `cudaEventRecord` before that wait,
    which holds the operation launched last before the record on another stream than its own (a
    record on its own stream adds nothing to stream order). The trace names no event, so this is
    the pairing of eager NCCL's record / wait around each collective. `launching`: per event,
    whether it is a call that launched device operations."""
    out = np.full(len(d_call), -1, dtype=np.int64)
    if not len(rt) or not (d_call >= 0).any():
        return out
    rt_names = pd.Series(names[rt])  # one regex call per distinct name (str_flags), not per call
    rec = str_flags(rt_names, _RECORD)
    wait = str_flags(rt_names, _WAIT_EVENT) & ~rec
    if not wait.any():
        return out
    launch = launching[rt] & ~rec & ~wait
    keep = rec | wait | launch
    calls, rec, wait = rt[keep], rec[keep], wait[keep]
    # each call's device operations (in operation order): the ops sorted by their call's place
    ops = np.flatnonzero(d_call >= 0)
    place = np.full(int(max(calls.max(), d_call.max())) + 1, -1, dtype=np.int64)
    place[calls[~rec & ~wait]] = np.flatnonzero(~rec & ~wait)
    op_place = place[d_call[ops]]
    ops, op_place = ops[op_place >= 0], op_place[op_place >= 0]
    by_call = np.argsort(op_place, kind="stable")
    ops, op_place = ops[by_call], op_place[by_call]
    th = thread[calls]
    for t in np.unique(th).tolist():
        _thread_waits(np.flatnonzero(th == t), rec, wait, ops, op_place, d_stream, out)
    return out


#: how far back before a record the pairing looks for the operation the record holds
_RECORD_LOOKBACK = 64


def _thread_waits(
    k: np.ndarray,
    rec: np.ndarray,
    wait: np.ndarray,
    ops: np.ndarray,
    op_place: np.ndarray,
    d_stream: np.ndarray,
    out: np.ndarray,
) -> None:
    """`event_waits` on one thread's calls (`k`: their places, in program order; `ops` the device
    operations by their call's place `op_place`), into `out`: the thread's launched operations in
    order (its history); at each record, how many were launched (`at`); each wait takes the last
    record's `at` and refers to the thread's next launch; that launch's every operation j waits for
    the last of history[at - 64 : at] on another stream than j's (the latest over its waits)."""
    lo_hi = np.searchsorted(op_place, np.stack((k, k + 1)))
    n_ops = lo_hi[1] - lo_hi[0]
    hist = ops[index_ranges(lo_hi[0], lo_hi[1])]
    before = np.cumsum(n_ops) - n_ops  # per call, the operations launched before it
    is_rec, is_wait = rec[k], wait[k]
    is_launch = ~is_rec & ~is_wait
    # per call, the history's length at the thread's last record so far (-1: none yet)
    rec_pos = np.where(is_rec, np.arange(len(k)), -1)
    last_rec = np.maximum.accumulate(rec_pos) if len(k) else rec_pos
    at = np.where(last_rec >= 0, before[np.maximum(last_rec, 0)], -1)
    # per call, the thread's next launch at or after it (len(k): none)
    launch_pos = np.where(is_launch, np.arange(len(k)), len(k))
    nxt = np.minimum.accumulate(launch_pos[::-1])[::-1] if len(k) else launch_pos
    w = np.flatnonzero(is_wait & (at > 0) & (nxt < len(k)))
    if not len(w) or not len(hist):
        return
    w_at, w_launch = at[w], nxt[w]
    # the (wait, operation of its launch) pairs
    cnt = n_ops[w_launch]
    w_at = np.repeat(w_at, cnt)
    j = ops[index_ranges(lo_hi[0][w_launch], lo_hi[1][w_launch])]
    # the last history entry before `at` on another stream: at - 1, else the one before its run
    h_stream = d_stream[hist]
    run_start = np.flatnonzero(first_of_runs(h_stream))
    p = w_at - 1
    same = h_stream[p] == d_stream[j]
    q = np.where(same, run_start[np.searchsorted(run_start, p, side="right") - 1] - 1, p)
    found = q >= np.maximum(w_at - _RECORD_LOOKBACK, 0)
    if found.any():
        np.maximum.at(out, j[found], hist[q[found]])


def window_end_nodes(
    t: np.ndarray, own: list[int], we: int, d_begin: np.ndarray, later_starts: np.ndarray
) -> np.ndarray:
    """A GPU window's end nodes: the step's own (its annotation's end, the ends of the operations
    it launched), so that the latest of them is the window's end `we` (aligned clock). A window
    clipped at the next step's start, or a device-paced one (steps.py: it ends where the next
    step's first operation begins), ends at a node that is not the step's own: then the own nodes
    after `we` are left out and the node at `we` is taken (an operation's begin first, else the
    next window's start marker)."""
    own_a = np.asarray(own, dtype=np.int64)
    if int(t[own_a].max()) == we:
        return own_a
    at = np.concatenate((d_begin[t[d_begin] == we], later_starts[t[later_starts] == we]))
    if not len(at):  # no node at the window's end: the step's own nodes, as measured
        return own_a
    return np.concatenate((own_a[t[own_a] <= we], at[:1])).astype(np.int64)
