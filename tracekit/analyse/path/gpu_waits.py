"""What a GPU rank's graph reads beside its calls and operations (`gpu_rank`): the operation each
operation waits for through an event, and a window's end nodes."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tracekit.model.strings import str_flags

_RECORD = re.compile(r"^cu(da)?EventRecord")
_WAIT_EVENT = re.compile(r"^cu(da)?StreamWaitEvent")


def event_waits(
    rt: np.ndarray,
    launching: set[int],
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
    the pairing of eager NCCL's record / wait around each collective."""
    out = np.full(len(d_call), -1, dtype=np.int64)
    if not len(rt):
        return out
    ops_of: dict[int, list[int]] = {}
    for j, c in enumerate(d_call.tolist()):
        if c >= 0:
            ops_of.setdefault(int(c), []).append(j)
    rt_names = pd.Series(names[rt])  # one regex call per distinct name (str_flags), not per call
    is_rec = set(rt[str_flags(rt_names, _RECORD)].tolist())
    is_wait = set(rt[str_flags(rt_names, _WAIT_EVENT)].tolist())
    if not is_wait:
        return out
    per_thread: dict[int, list[int]] = {}
    for i in rt.tolist():
        if i in launching or i in is_rec or i in is_wait:
            per_thread.setdefault(int(thread[i]), []).append(int(i))
    for calls in per_thread.values():
        history: list[int] = []  # launched operations in program order
        rec_at: int | None = None  # len(history) at the last record
        waits: list[int] = []  # the records the waits since the last launch refer to
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
