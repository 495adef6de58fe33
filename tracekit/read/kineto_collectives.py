"""The Kineto reader's collective metadata (tracekit.read.kineto): collective names normalised to
the event table's ops (`normalise_coll_op`, NCCL kernel names), element sizes of dtypes, and the
post-passes over one rank file's columns that fill host collectives' bytes from record_shapes and
join gloo's enqueueing op to the worker-thread range that runs it (`pair_enqueued`)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pandas as pd

from tracekit.model.events import DataQuality
from tracekit.model.launch import COLLECTIVE_LAUNCH_OP, launch_op_collective
from tracekit.read.kineto_decode import ANY_DECODER
from tracekit.read.kineto_events import categorical
from tracekit.read.kineto_ints import to_int

if TYPE_CHECKING:
    from tracekit.read.kineto_events import Columns


#: torch dtype names (c10::toString(ScalarType)) -> bytes per element.
DTYPE_BYTES: dict[str, int] = {
    "Byte": 1,
    "Char": 1,
    "Bool": 1,
    "Short": 2,
    "Int": 4,
    "Long": 8,
    "Half": 2,
    "Float": 4,
    "Double": 8,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "BFloat16": 2,
    "QInt8": 1,
    "QUInt8": 1,
    "QInt32": 4,
    "QUInt4x2": 1,
    "QUInt2x4": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    "Bits8": 1,
    "Bits16": 2,
}

#: Raw collective names (lower-cased) -> normalised op (see tracekit.model.ops.COLLECTIVE_OPS).
_COLL_OP: dict[str, str] = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "_allreduce_base": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allreduce_sparse": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "allgather_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "broadcast_oop": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoallv": "all_to_all",
    "sendrecv": "send_recv",
    "send_recv": "send_recv",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}


@functools.lru_cache(maxsize=8192)  # pure; called per event row by the collective joins
def normalise_coll_op(name: str) -> str:
    """Normalise a raw collective name ("allreduce", "_allgather_base", "nccl:all_reduce"...) -> op or ""."""
    n = name.strip().lower()
    for prefix in ("nccl:", "gloo:", "c10d::", "rccl:", "c10d_functional::", "_c10d_functional::"):
        if n.startswith(prefix):
            n = n[len(prefix) :]
    n = n.rstrip("_")
    return _COLL_OP.get(n, "")


# NCCL/RCCL kernel names: ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL,
# ncclDevKernel_SendRecv, ncclDevKernel_ReduceScatter_Sum_f32_RING_LL, ncclKernel_Broadcast_...
_NCCL_KERNEL_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
#: the kernel name's op (lower-cased) -> normalised op: the raw names' table (`_COLL_OP`) for the
#: ops NCCL/RCCL have kernels of, and the all-to-all pivot kernel
_NCCL_KERNEL_OP: dict[str, str] = {
    k: _COLL_OP[k]
    for k in "allreduce allgather reducescatter broadcast reduce sendrecv send recv alltoall".split()
} | {"alltoallpivot": "all_to_all"}


def coll_op_from_kernel_name(name: str) -> str:
    """The collective an NCCL/RCCL kernel performs, from its name alone ("" when not one)."""
    m = _NCCL_KERNEL_RE.search(name)
    if not m:
        return ""
    return _NCCL_KERNEL_OP.get(m.group(1).lower(), "")


def _sparse_cat(n: int, rows: list[int], values: list[str]) -> pd.Categorical:
    codes = np.zeros(n, np.int32)
    cats: dict[str, int] = {"": 0}
    if rows:
        vc = np.array([cats.setdefault(v, len(cats)) for v in values], np.int32)
        codes[np.asarray(rows, np.int64)] = vc
    return categorical(codes, list(cats))


# ----------------------------------------------------------------------------------------------
# Collective metadata of host ops: bytes from record_shapes, and the gloo enqueue -> worker join
#
# On gloo, `c10d::allreduce_` (and `record_param_comms`, where torch emits it) runs on the calling
# thread and only enqueues the work; the exchange is the `gloo:all_reduce` range a gloo worker
# thread records when it runs the work, and that range is the collective interval the analysis
# uses. It carries no comm args, only (in `cpu`/`full` modes) its record_shapes. Two post-passes,
# per rank file, fill its columns where they are missing:
# 1. bytes from its own shapes (`Input Dims` x the element size of `Input type`);
# 2. the k-th enqueue on a calling thread <-> the k-th gloo op on the worker threads (one rank,
#    start order; by `Seq` when every enqueue has one in one process group): every field the
#    enqueue carries (bytes, dtype, group, seq, collective name) is copied where the worker op has
#    none. The pairing is refused (counted, nothing copied) unless ops agree pair by pair, every
#    worker op starts after its enqueue, and element counts agree where both sides have shapes.
# Both are per file facts of the trace (no other rank, no manifest), so they live in the reader:
# every consumer (breakdown, shortfall, compare-links, report) sees the same table.

_PARAM_COMMS = "record_param_comms"

#: record_shapes' `Input type` spellings (C++ type names) -> torch dtype names (DTYPE_BYTES keys).
_SHAPE_DTYPE: dict[str, str] = {
    "float": "Float",
    "double": "Double",
    "c10::Half": "Half",
    "c10::BFloat16": "BFloat16",
    "long int": "Long",
    "long": "Long",
    "int64_t": "Long",
    "int": "Int",
    "short int": "Short",
    "short": "Short",
    "signed char": "Char",
    "unsigned char": "Byte",
    "bool": "Bool",
    "unsigned short": "UInt16",
    "unsigned int": "UInt32",
    "unsigned long": "UInt64",
    "c10::complex<c10::Half>": "ComplexHalf",
    "c10::complex<float>": "ComplexFloat",
    "c10::complex<double>": "ComplexDouble",
    "c10::qint8": "QInt8",
    "c10::quint8": "QUInt8",
    "c10::qint32": "QInt32",
}


def shape_dtype(type_name: str) -> str:
    """The torch dtype name of a record_shapes `Input type` ("float" -> "Float"); "" when not a dtype."""
    if type_name in _SHAPE_DTYPE:
        return _SHAPE_DTYPE[type_name]
    bare = type_name[5:] if type_name.startswith("c10::") else type_name
    return bare if bare in DTYPE_BYTES else ""


def shape_tensors(dims: Any, types: Any) -> list[tuple[int, str]]:
    """(elements, dtype name or "") of each tensor argument in record_shapes `Input Dims` /
    `Input type`; a TensorList argument gives one entry per tensor, its dtype unknown ("")."""
    out: list[tuple[int, str]] = []
    if not isinstance(dims, list):
        return out
    types_l = types if isinstance(types, list) else []
    for i, d in enumerate(dims):
        t = types_l[i] if i < len(types_l) and isinstance(types_l[i], str) else ""
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append((math.prod(d), shape_dtype(t)))
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):  # TensorList
            for inner in d:
                if inner and all(isinstance(x, int) for x in inner):
                    out.append((math.prod(inner), ""))
        elif isinstance(d, list) and not d and shape_dtype(t):  # a 0-d tensor
            out.append((1, shape_dtype(t)))
    return out


def single_process_group(meta: dict[str, object]) -> tuple[int, str, str] | None:
    """(size, name, ranks text) of the only process group the trace's distributedInfo names, or
    None when it names several or none (then a gloo op's group cannot be known from this file)."""
    di = meta.get("distributedInfo")
    if not isinstance(di, dict):
        return None
    cfg = di.get("pg_config")
    if isinstance(cfg, list):
        if len(cfg) != 1 or not isinstance(cfg[0], dict):
            return None
        size = to_int(cfg[0].get("pg_size"))
        ranks = cfg[0].get("ranks")
        ranks_text = "[" + ", ".join(str(to_int(x)) for x in ranks) + "]" if isinstance(ranks, list) else ""
        return (size, str(cfg[0].get("pg_name", "")), ranks_text) if size > 0 else None
    if to_int(di.get("pg_count", 1)) == 1 and to_int(di.get("world_size")) > 0:
        return to_int(di.get("world_size")), "", ""
    return None


def out_bytes_for(op: str, in_bytes: int, group_size: int) -> int:
    """Per-rank output bytes of `op` given its per-rank input bytes (record_param_comms'
    convention: all_gather out = n x in, reduce_scatter out = in / n, the others out = in);
    -1 when it depends on an unknown group size or the op has no fixed relation."""
    if in_bytes < 0:
        return -1
    if op in ("all_reduce", "broadcast", "reduce", "all_to_all", "send", "recv", "send_recv"):
        return in_bytes
    if op == "all_gather":
        return in_bytes * group_size if group_size > 0 else -1
    if op == "reduce_scatter":
        return in_bytes // group_size if group_size > 0 else -1
    return -1


class CollMeta:
    """The collective columns while they are built: int arrays plus sparse row -> str dicts."""

    def __init__(self, n: int):
        self.n = n
        self.in_b = np.full(n, -1, np.int64)
        self.out_b = np.full(n, -1, np.int64)
        self.gsize = np.full(n, -1, np.int32)
        self.seq = np.full(n, -1, np.int64)
        self.strs: dict[str, dict[int, str]] = {k: {} for k in ("name", "op", "dtype", "pg_name", "pg_ranks")}
        self.nelems: dict[int, int] = {}  # from record_shapes, for the join's check

    def cat(self, key: str) -> pd.Categorical:
        d = self.strs[key]
        return _sparse_cat(self.n, list(d), list(d.values()))


def fill_from_shapes(
    cm: CollMeta,
    cols: Columns,
    names: list[str],
    name_codes: np.ndarray,
    device: np.ndarray,
    meta: dict[str, object],
) -> None:
    """Bytes / dtype / op of host `gloo:` and `nccl:` ranges from their own record_shapes, and of
    an engine's collective ops (`tracekit.model.launch.COLLECTIVE_LAUNCH_OP`, e.g.
    `sglang::outplace_all_reduce`) from their first tensor argument (the kernels they launch take
    these from them in the classifier)."""
    if not cols.shape_rows:
        return
    pg = single_process_group(meta)
    # a decode loop repeats the same few shapes every token: decode each distinct text once;
    # per text: (total elements, the one dtype of all its tensors or "") or None without tensors
    shape_of: dict[tuple[bytes, bytes], tuple[int, str] | None] = {}
    first_of: dict[tuple[bytes, bytes], tuple[int, str] | None] = {}  # the first tensor argument
    op_of: dict[int, str] = {}  # name code -> op of a gloo:/nccl: range, "" otherwise
    engine_op: dict[int, bool] = {}  # name code -> an engine's collective op (sglang::outplace_all_reduce)
    for r, key in zip(cols.shape_rows, cols.shape_vals, strict=True):
        if device[r] >= 0:
            continue
        if key in shape_of:
            shape = shape_of[key]
        else:
            dims_raw, types_raw = key
            try:
                dims = ANY_DECODER.decode(dims_raw)
                types = ANY_DECODER.decode(types_raw) if types_raw else []
            except (msgspec.DecodeError, RecursionError):
                dims, types = None, None
            tensors = shape_tensors(dims, types)
            dtypes = {dt for _, dt in tensors}
            one_dt = next(iter(dtypes)) if len(dtypes) == 1 else ""
            shape = shape_of[key] = (sum(k for k, _ in tensors), one_dt) if tensors else None
            first_of[key] = tensors[0] if tensors else None
        if shape is None:
            continue
        nelems, one_dt = shape
        cm.nelems[r] = nelems
        code = int(name_codes[r])
        op = op_of.get(code)
        if op is None:
            nm = names[code]
            # c10d:: ops: TensorList shapes carry no dtype (nelems kept for the join)
            engine_op[code] = not nm.startswith(
                ("gloo:", "nccl:", "c10d::", "_c10d_functional::", "c10d_functional::")
            )
            engine_op[code] = engine_op[code] and bool(COLLECTIVE_LAUNCH_OP.search(nm))
            if nm.startswith(("gloo:", "nccl:")):
                op = normalise_coll_op(nm)
            elif engine_op[code]:
                op = launch_op_collective(nm)
            else:
                op = ""
            op_of[code] = op
        if not op:
            continue
        if engine_op.get(code):
            # an engine's or library's collective op (sglang::outplace_all_reduce(tensor, ...),
            # _C_custom_ar::all_reduce(fa, inp, out, ...)): its message is its first tensor argument
            first = first_of.get(key)
            if first is None or not first[1]:
                continue
            nelems, one_dt = first
        cm.strs["op"].setdefault(r, op)
        if cm.in_b[r] < 0 and one_dt:
            dt = one_dt
            cm.in_b[r] = nelems * DTYPE_BYTES[dt]
            cm.strs["dtype"].setdefault(r, dt)
            gs = int(cm.gsize[r]) if cm.gsize[r] > 0 else (pg[0] if pg else -1)
            if cm.out_b[r] < 0:
                cm.out_b[r] = out_bytes_for(op, int(cm.in_b[r]), gs)
            if cm.gsize[r] < 0 and pg is not None:
                cm.gsize[r] = pg[0]


def pair_enqueued(
    enq_ops: Sequence[str],
    enq_start: Sequence[int],
    wk_ops: Sequence[str],
    wk_start: Sequence[int],
    enq_nelems: Sequence[int] | None = None,
    wk_nelems: Sequence[int] | None = None,
) -> tuple[list[tuple[int, int]], str]:
    """Pair the enqueues of one rank (calling threads, in call order) with the worker-thread ops
    (in start order): the k-th with the k-th. Returns (pairs of positions, "") or ([], why not).

    Trace edges: worker ops that start before the first enqueue (enqueued before the trace
    began) and enqueues after the last worker op's start (not run before it ended) are left out.
    Refused when the counts still differ, an op differs, a worker op starts before its enqueue, or
    element counts (-1 = unknown) differ."""
    wk = [i for i in range(len(wk_ops)) if not enq_start or wk_start[i] >= enq_start[0]]
    last_wk = max((wk_start[i] for i in wk), default=None)
    enq = [j for j in range(len(enq_ops)) if last_wk is not None and enq_start[j] <= last_wk]
    if len(enq) != len(wk):
        return [], f"{len(enq)} enqueued collectives but {len(wk)} ran on the gloo worker threads"
    pairs = list(zip(enq, wk, strict=True))
    for k, (j, i) in enumerate(pairs):
        if enq_ops[j] != wk_ops[i]:
            return [], f"call #{k}: enqueued {enq_ops[j]} but the worker ran {wk_ops[i]}"
        if wk_start[i] < enq_start[j]:
            return [], f"call #{k}: the worker op starts before its enqueue"
        if enq_nelems is not None and wk_nelems is not None:
            a, b = enq_nelems[j], wk_nelems[i]
            if a >= 0 and b >= 0 and a != b:
                return [], f"call #{k}: {a} elements enqueued but {b} on the worker"
    return pairs, ""


def _outermost_rows(rows: list[int], stream: np.ndarray, start: np.ndarray, end: np.ndarray) -> list[int]:
    """The rows not inside an earlier row of the same thread."""
    out: list[int] = []
    last_end: dict[int, int] = {}
    for r in sorted(rows, key=lambda x: (int(stream[x]), int(start[x]), -int(end[x]))):
        t = int(stream[r])
        if t in last_end and int(end[r]) <= last_end[t]:
            continue
        out.append(r)
        last_end[t] = max(last_end.get(t, int(end[r])), int(end[r]))
    return out


def join_enqueued(
    cm: CollMeta,
    cols: Columns,
    names: list[str],
    name_codes: np.ndarray,
    device: np.ndarray,
    stream: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    dq: DataQuality,
) -> None:
    """Copy the enqueue's collective metadata onto the gloo worker-thread op it ran as."""
    coll_codes = [c for c, nm in enumerate(names) if nm.startswith("gloo:")]
    if not coll_codes or not cm.n:
        return
    host = device < 0
    wk_rows = [
        int(r)
        for r in np.flatnonzero(host & np.isin(name_codes, coll_codes))
        if normalise_coll_op(names[int(name_codes[r])])
    ]
    if not wk_rows:
        return
    wk_threads = {int(stream[r]) for r in wk_rows}
    off_worker = host & ~np.isin(stream, list(wk_threads))
    pc_codes = [c for c, nm in enumerate(names) if nm == _PARAM_COMMS]
    enq_rows = [
        int(r)
        for r in np.flatnonzero(off_worker & np.isin(name_codes, pc_codes))
        if cm.strs["op"].get(int(r))
    ]
    if enq_rows:
        enq_op = {r: cm.strs["op"][r] for r in enq_rows}
    else:
        c10d_codes = [c for c, nm in enumerate(names) if nm.startswith("c10d::") and normalise_coll_op(nm)]
        cand = [int(r) for r in np.flatnonzero(off_worker & np.isin(name_codes, c10d_codes))]
        enq_rows = _outermost_rows(cand, stream, start, end)
        enq_op = {r: normalise_coll_op(names[int(name_codes[r])]) for r in enq_rows}
    if not enq_rows:
        return  # e.g. `ranges` mode: no op on the calling thread is traced
    pgs = {cm.strs["pg_name"].get(r, "") for r in enq_rows}
    if len(pgs) == 1 and all(cm.seq[r] >= 0 for r in enq_rows):
        enq_rows.sort(key=lambda r: (int(cm.seq[r]), int(start[r])))
    else:
        enq_rows.sort(key=lambda r: int(start[r]))
    wk_rows.sort(key=lambda r: int(start[r]))
    wk_op = {r: cm.strs["op"].get(r) or normalise_coll_op(names[int(name_codes[r])]) for r in wk_rows}
    pairs, why = pair_enqueued(
        [enq_op[r] for r in enq_rows],
        [int(start[r]) for r in enq_rows],
        [wk_op[r] for r in wk_rows],
        [int(start[r]) for r in wk_rows],
        [cm.nelems.get(r, -1) for r in enq_rows],
        [cm.nelems.get(r, -1) for r in wk_rows],
    )
    if why:
        dq.add(
            "collective_enqueue_join_refused",
            len(wk_rows),
            f"gloo worker-thread collectives not joined to their enqueues ({why}); their bytes come from "
            "their own shapes only",
        )
        return
    copied = 0
    for j, i in pairs:
        e, w = enq_rows[j], wk_rows[i]
        got = False
        for arr in (cm.in_b, cm.out_b, cm.gsize, cm.seq):
            if arr[w] < 0 <= arr[e]:
                arr[w] = arr[e]
                got = True
        for key in ("name", "dtype", "pg_name", "pg_ranks"):
            if key in cm.strs and e in cm.strs[key] and w not in cm.strs[key]:
                cm.strs[key][w] = cm.strs[key][e]
                got = True
        cm.strs["op"].setdefault(w, wk_op[w])
        copied += got
    if copied:
        dq.add(
            "collective_metadata_from_enqueue",
            copied,
            "gloo worker-thread collectives took their metadata (bytes, group, seq) from the enqueueing op",
        )
