"""Which host operation launched a GPU operation, and which GPU operations ran inside a CUDA-graph
replay (docs/METHOD.md section "Serving engines: custom all-reduce and step kinds").

Both are facts of the event table alone (the `correlation` column joins a GPU operation to the
runtime call that launched it; the runtime call lies inside the host ops of its thread), so the
reader (the stream check), the classifier (launching-op classification) and the analyses share them.

- `collective_launch_ops(events)`: for each row, the position of the host op or range that is an
  all-reduce (or another collective) and is the innermost host op enclosing the launch call of
  that kernel; -1 elsewhere. A kernel launched by `sglang::outplace_all_reduce`,
  `vllm::all_reduce`, `_C_custom_ar::all_reduce`, `trtllm::allreduce`, a `symm_mem::` all-reduce,
  `c10d::allreduce_` or a ProcessGroup range (`nccl:all_reduce`) is a collective whatever its
  name. Innermost only: a copy kernel launched by `aten::copy_` inside `_c10d_functional::all_reduce`
  is not the collective. Kernels of a CUDA-graph replay share the graph launch's correlation id
  and have no launching op of their own: they are left to the name rules. Containment is
  half-open ([start, end) of the op holds the launch's start; its end no later than the op's) and
  a zero-length op contains nothing: equal timestamps say nothing about nesting.
- `graph_replay_mask(events)`: GPU operations whose correlation id is a `cudaGraphLaunch` call's
  on the same rank. Inside one replay the captured graph's branches run concurrently even when
  they were captured on one stream, so stream order does not hold among them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

#: Host ops / ranges that are collectives. torch.distributed's own (`c10d::allreduce_`,
#: `_c10d_functional::all_reduce`, `record_param_comms`, ProcessGroup ranges `nccl:all_reduce`),
#: and any namespaced dispatcher op whose name says all-reduce / all-gather / reduce-scatter /
#: all-to-all: SGLang `sglang::outplace_all_reduce`, `sglang::inplace_all_reduce`,
#: `sgl_kernel::all_reduce`, vLLM `vllm::all_reduce`, `_C_custom_ar::all_reduce`,
#: `_C_custom_ar::qr_all_reduce`, TensorRT-LLM `trtllm::allreduce`, FlashInfer
#: `flashinfer::trtllm_allreduce_fusion`, PyTorch symmetric memory `symm_mem::one_shot_all_reduce`,
#: `symm_mem::two_shot_all_reduce_`, `symm_mem::multimem_all_reduce_`.
COLLECTIVE_LAUNCH_OP = re.compile(
    r"^(?:c10d::|_?c10d_functional::(?!wait)|record_param_comms$|(?:nccl|rccl|mpi|ucc|xccl):)"
    r"|^(?!aten::)[A-Za-z_][\w.]*::\w*(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)\w*$",
    re.IGNORECASE,
)
#: torch.distributed's own host collectives (the launched kernel's subclass is `c10d`).
_TORCH_DISTRIBUTED = re.compile(
    r"^(?:c10d::|_?c10d_functional::|record_param_comms$|(?:nccl|rccl|mpi|ucc|xccl):)"
)

#: Runtime calls that launch a CUDA / HIP graph.
GRAPH_LAUNCH = re.compile(r"^(?:cuda|hip|cu)GraphLaunch(?:_v\d+|_ptsz)?$")

_OPS = (
    (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
    (re.compile(r"all_?gather", re.I), "all_gather"),
    (re.compile(r"all_?reduce", re.I), "all_reduce"),
    (re.compile(r"all_?to_?all", re.I), "all_to_all"),
)


def launch_op_collective(name: str) -> str:
    """The collective a launching op's name says ("all_reduce", ...), "" when it says none."""
    for rx, op in _OPS:
        if rx.search(name):
            return op
    return ""


def launch_op_subclass(name: str) -> str:
    """The subclass of a kernel its launching op made a collective: `c10d` (torch.distributed's
    own ops and ranges) or `custom_allreduce` / `custom_collective` (an engine's or library's op)."""
    if _TORCH_DISTRIBUTED.search(name):
        return "c10d"
    return "custom_allreduce" if launch_op_collective(name) == "all_reduce" else "custom_collective"


def _name_mask(names: pd.Series, rx: re.Pattern[str], rows: np.ndarray | None = None) -> np.ndarray:
    """Rows whose name `rx` finds, among `rows` (a mask; default all): each distinct name of those
    rows searched once."""
    col = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype(str).astype("category")
    cats = col.cat.categories
    codes = col.cat.codes.to_numpy()
    want = np.unique(codes if rows is None else codes[rows])
    hit = np.zeros(len(cats) + 1, dtype=bool)  # the last entry: code -1 (no name)
    for c in want[want >= 0].tolist():
        hit[c] = bool(rx.search(str(cats[c])))
    out = hit[codes]
    return out if rows is None else out & rows


def _ints(events: pd.DataFrame, col: str) -> np.ndarray:
    """Integer column `col` of `events`; a column the table lacks reads as its missing value -1
    everywhere, as `tracekit.model.events.make_events` fills it (a hand-built table of kernels
    has no `device` or `correlation`: none of its rows is a host op on a device or a launch)."""
    if col in events.columns:
        return events[col].to_numpy(np.int64)
    return np.full(len(events), -1, dtype=np.int64)


def _kind_mask(kind: pd.Series, values: tuple[str, ...]) -> np.ndarray:
    return np.asarray(kind.isin(values).to_numpy(), dtype=bool)


def graph_replay_mask(events: pd.DataFrame) -> np.ndarray:
    """GPU operations (kernel, memcpy, memset) launched by a CUDA / HIP graph launch on their rank."""
    n = len(events)
    if not n:
        return np.zeros(0, dtype=bool)
    corr = _ints(events, "correlation")
    runtime = _kind_mask(events["kind"], ("runtime",)) & (corr >= 0)
    if not runtime.any():
        return np.zeros(n, dtype=bool)
    launch = _name_mask(events["name"], GRAPH_LAUNCH, runtime)
    if not launch.any():
        return np.zeros(n, dtype=bool)
    gpu = _kind_mask(events["kind"], ("kernel", "memcpy", "memset")) & (corr >= 0)
    rank = _ints(events, "rank")
    key = rank * (1 << 40) + corr
    return gpu & np.isin(key, np.unique(key[launch]))


def collective_launch_ops(events: pd.DataFrame) -> np.ndarray:
    """Per row of `events`, the position (0-based row number) of the collective host op that is the
    innermost host op (cpu_op or annotation) enclosing the launch call of that kernel; -1 for every
    other row (module doc). Cost: one pass per thread with collective ops, a binary search per
    launch; loops run over the collective ops only."""
    n = len(events)
    out = np.full(n, -1, dtype=np.int64)
    if not n:
        return out
    kind = events["kind"]
    device = _ints(events, "device")
    host_op = _kind_mask(kind, ("cpu_op", "annotation")) & (device < 0)
    if not host_op.any():
        return out
    coll = _name_mask(events["name"], COLLECTIVE_LAUNCH_OP, host_op)
    if not coll.any():
        return out
    corr = _ints(events, "correlation")
    runtime = _kind_mask(kind, ("runtime",)) & (corr >= 0)
    launch = runtime & ~_name_mask(events["name"], GRAPH_LAUNCH, runtime)
    kernel = _kind_mask(kind, ("kernel",)) & (corr >= 0)
    if not launch.any() or not kernel.any():
        return out
    rank = _ints(events, "rank")
    thread = _ints(events, "stream")
    start = events["start_ns"].to_numpy(np.int64)
    end = events["end_ns"].to_numpy(np.int64)
    cand_pos: list[np.ndarray] = []
    cand_op: list[np.ndarray] = []
    pairs = np.unique(np.stack((rank[coll], thread[coll]), axis=1), axis=0)
    for r, t in pairs.tolist():
        on = (rank == r) & (thread == t)
        c_idx = np.flatnonzero(on & coll)
        l_idx = np.flatnonzero(on & launch)
        if not len(l_idx):
            continue
        c_idx = c_idx[np.lexsort((-end[c_idx], start[c_idx]))]
        l_idx = l_idx[np.argsort(start[l_idx], kind="stable")]
        l_start, l_end = start[l_idx], end[l_idx]
        best = np.full(len(l_idx), -1, dtype=np.int64)
        best_start = np.full(len(l_idx), np.iinfo(np.int64).min, dtype=np.int64)
        # ops sorted by start: a later-starting op that contains a launch is nested deeper (host
        # ops of one thread nest), so the last assignment is the innermost collective op
        for c in c_idx.tolist():
            if end[c] <= start[c]:
                continue  # a zero-length op contains nothing (ties of equal timestamps say no nesting)
            # half-open: a launch at the op's end belongs to what follows it
            lo = int(np.searchsorted(l_start, start[c], side="left"))
            hi = int(np.searchsorted(l_start, end[c], side="left"))
            if hi <= lo:
                continue
            inside = np.flatnonzero(l_end[lo:hi] <= end[c]) + lo
            best[inside] = c
            best_start[inside] = start[c]
        has = np.flatnonzero(best >= 0)
        if not len(has):
            continue
        # a non-collective host op nested inside that op and enclosing the launch is innermost
        h_idx = np.flatnonzero(on & host_op & ~coll)
        h_idx = h_idx[np.argsort(start[h_idx], kind="stable")]
        h_start, h_end = start[h_idx], end[h_idx]
        keep = np.ones(len(has), dtype=bool)
        if len(h_idx):
            h_lo = np.searchsorted(h_start, best_start[has], side="right")
            h_hi = np.searchsorted(h_start, l_start[has], side="right")
            for j in np.flatnonzero(h_hi > h_lo).tolist():
                if (h_end[h_lo[j] : h_hi[j]] >= l_end[has[j]]).any():
                    keep[j] = False
        has = has[keep]
        cand_pos.append(l_idx[has])
        cand_op.append(best[has])
    if not cand_pos:
        return out
    lp = np.concatenate(cand_pos)
    op = np.concatenate(cand_op)
    if not len(lp):
        return out
    key_l = rank[lp] * (1 << 40) + corr[lp]
    order = np.argsort(key_l, kind="stable")
    key_l, op = key_l[order], op[order]
    k_idx = np.flatnonzero(kernel)
    key_k = rank[k_idx] * (1 << 40) + corr[k_idx]
    pos = np.searchsorted(key_l, key_k)
    ok = pos < len(key_l)
    ok[ok] = key_l[pos[ok]] == key_k[ok]
    out[k_idx[ok]] = op[pos[ok]]
    return out
