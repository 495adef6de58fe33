"""Realised bandwidth of a collective, as nccl-tests defines it (docs/METHOD.md section Bandwidth and the link verdict;
nccl-tests doc/PERFORMANCE.md).

`size_bytes` is nccl-tests' "size" column: for all_reduce, broadcast, reduce and send/recv the
per-rank buffer; for all_gather, reduce_scatter and all_to_all the *total* buffer
(count x typesize x n), i.e. the larger of the per-rank input and output buffers.

    algbw = size_bytes / time
    busbw = algbw * factor(op, n)

factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
broadcast, reduce, send/recv 1. Bandwidths are decimal GB/s (1e9 bytes per second).
"""

from __future__ import annotations

#: probe op (nccl-tests' test name without `_perf`) -> the op name used here (and the event table's coll_op).
BANDWIDTH_OP: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
}

#: event-table coll_op -> probe op (inverse of BANDWIDTH_OP).
PROBE_OP: dict[str, str] = {v: k for k, v in BANDWIDTH_OP.items()}

_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}


def bus_factor(op: str, n_ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor for `op` over `n_ranks` ranks."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    try:
        return _FACTORS[op](n_ranks)
    except KeyError:
        raise ValueError(
            f"no bus-bandwidth factor for collective {op!r}; known: {sorted(_FACTORS)}"
        ) from None


def nccl_tests_size(op: str, in_bytes: int, out_bytes: int) -> int:
    """nccl-tests' size for one collective given the per-rank input and output buffer sizes."""
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return max(in_bytes, out_bytes)
    return in_bytes if in_bytes > 0 else out_bytes


def algbw_gbps(size_bytes: float, time_ns: float) -> float:
    """Algorithm bandwidth in decimal GB/s; NaN when the time is not positive."""
    if time_ns <= 0:
        return float("nan")
    return size_bytes / time_ns  # bytes/ns == GB/s (1e9)


def busbw_gbps(op: str, n_ranks: int, size_bytes: float, time_ns: float) -> float:
    """Bus bandwidth in decimal GB/s."""
    return algbw_gbps(size_bytes, time_ns) * bus_factor(op, n_ranks)


def safe_bus_factor(op: str, n: int) -> float:
    """`bus_factor`, NaN for an op or size nccl-tests has no factor for."""
    try:
        return bus_factor(op, n)
    except ValueError:
        return float("nan")
