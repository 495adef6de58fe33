"""What one probe measures, without torch: ops, sizes, buffer layouts, fill values and expected
results (nccl-tests' definitions, docs/METHOD.md section Bandwidth and the link verdict).

Sizes follow nccl-tests (src/common.cu `setupArgs` and each test's `GetCollByteCount`): the swept
size S is turned into an element count `count = S // typesize`, and per op

| op             | send count        | recv count        | count column (NCCL call's count) |
| ---            | ---               | ---               | ---                              |
| all_reduce     | count             | count             | count                            |
| broadcast      | count             | count             | count                            |
| reduce         | count             | count             | count                            |
| sendrecv       | count             | count             | count                            |
| all_gather     | count//n          | (count//n)*n      | count//n                         |
| reduce_scatter | (count//n)*n      | count//n          | count//n                         |
| alltoall       | (count//n)*n      | (count//n)*n      | count//n                         |

The reported size (nccl-tests' "size" column, the `bytes` of a row) is
max(send, recv) x typesize; algbw = size / time and busbw = algbw x factor with the factors of
`tracekit.analyse.collectives.bandwidth`.

Correctness: rank r fills element k (a global element index, see `input_index`) with
`fill(r, k) = (r + 1) + (k % 3)`: small integers, so sums over up to 13 ranks are exact in every
supported dtype (int8 holds 13*14/2 + 2*13 = 117), and each rank's data differs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracekit.analyse.collectives.bandwidth import BANDWIDTH_OP, bus_factor
from tracekit.errors import ProbeError
from tracekit.model.documents.links import PROBE_DTYPES
from tracekit.model.ops import COLLECTIVE_OPS as EVENT_COLLECTIVE_OPS

#: Collective probe ops (command-line names, nccl-tests' test names without `_perf`): the event
#: table's first five (`tracekit.model.ops.COLLECTIVE_OPS`), then nccl-tests' spelling of two more.
COLLECTIVE_OPS: tuple[str, ...] = EVENT_COLLECTIVE_OPS[:5] + ("alltoall", "sendrecv")

#: dtype name (as given on the command line, torch spelling) -> (nccl-tests type name, bytes)
DTYPES: dict[str, tuple[str, int]] = PROBE_DTYPES
_DTYPE_ALIASES = {
    "float": "float32",
    "half": "float16",
    "bf16": "bfloat16",
    "double": "float64",
    "fp32": "float32",
    "fp16": "float16",
}

#: Ops whose torch.distributed call is in-place only (one buffer): the out-of-place row does not
#: exist for them (nccl-tests passes distinct send/recv buffers; torch cannot).
IN_PLACE_ONLY = frozenset({"all_reduce", "broadcast", "reduce"})
#: Ops with no in-place form here (nccl-tests runs them in place but does not check them).
OUT_OF_PLACE_ONLY = frozenset({"alltoall", "sendrecv"})
#: Ops with a root (rank 0 here, like nccl-tests' default `-r 0`).
ROOTED = frozenset({"broadcast", "reduce"})

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG])?[bB]?\s*$")
_UNITS = {None: 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str | int) -> int:
    """A size like nccl-tests' `-b/-e`: `8`, `1K`, `64M`, `1G` (binary units, K = 1024)."""
    if isinstance(text, int):
        if text < 0:
            raise ProbeError(f"size must be >= 0, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ProbeError(
            f"cannot read size {text!r}; use a number with an optional K, M or G suffix (8, 1K, 64M, 1G)"
        )
    unit = m.group(2).lower() if m.group(2) else None
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(n_bytes: int) -> str:
    """1024 -> '1K', 3 -> '3', 1536 -> '1536' (exact binary suffixes only)."""
    for suffix, unit in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n_bytes >= unit and n_bytes % unit == 0:
            return f"{n_bytes // unit}{suffix}"
    return str(n_bytes)


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """min, min*factor, ... up to max inclusive (nccl-tests' `-b -e -f`)."""
    if min_bytes <= 0:
        raise ProbeError(f"--min must be > 0, got {min_bytes}")
    if max_bytes < min_bytes:
        raise ProbeError(f"--max ({max_bytes}) is smaller than --min ({min_bytes})")
    if factor < 2:
        raise ProbeError(f"--factor must be >= 2, got {factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def normalise_dtype(name: str) -> str:
    key = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ProbeError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
    return key


def normalise_op(name: str) -> str:
    key = name.lower().replace("-", "_")
    key = {
        "all_to_all": "alltoall",
        "send_recv": "sendrecv",
        "allreduce": "all_reduce",
        "allgather": "all_gather",
        "reducescatter": "reduce_scatter",
    }.get(key, key)
    if key not in COLLECTIVE_OPS:
        raise ProbeError(f"unknown op {name!r}; known: {', '.join(COLLECTIVE_OPS)}")
    return key


def parse_ops(text: str) -> tuple[str, ...]:
    """The ops of a comma list (`--op all_reduce,all_gather`; `all`: every op), normalised."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if items == ["all"]:
        return COLLECTIVE_OPS
    return tuple(normalise_op(t) for t in items)


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """The GPU indices of a comma list (`--gpus 0,1`); None when none are given."""
    if not text:
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ProbeError(f"--gpus wants GPU indices like 0,1; got {text!r}") from None


@dataclass(frozen=True)
class Layout:
    """Buffers of one op at one swept size on one rank (element counts)."""

    op: str
    n_ranks: int
    elem_bytes: int
    send_count: int  # elements in the send (input) buffer
    recv_count: int  # elements in the recv (output) buffer
    param_count: int  # the count passed to the NCCL call; nccl-tests' "count" column

    @property
    def size_bytes(self) -> int:
        """nccl-tests' size column: max(send, recv) bytes."""
        return max(self.send_count, self.recv_count) * self.elem_bytes

    @property
    def chunk(self) -> int:
        """Per-peer chunk in elements for all_gather / reduce_scatter / alltoall (== param_count)."""
        return self.param_count

    def in_place_offsets(self, rank: int) -> tuple[int, int]:
        """(input offset, output offset) inside one shared buffer for the in-place form."""
        if self.op == "all_gather":
            return rank * self.chunk, 0
        if self.op == "reduce_scatter":
            return 0, rank * self.chunk
        return 0, 0

    @property
    def shared_count(self) -> int:
        """Elements of the one buffer the in-place form uses."""
        return max(self.send_count, self.recv_count)


def layout(op: str, size_bytes: int, n_ranks: int, elem_bytes: int) -> Layout:
    """nccl-tests' buffer sizes for `op` at swept size `size_bytes` over `n_ranks` ranks."""
    op = normalise_op(op)
    if n_ranks < 1:
        raise ProbeError(f"ranks must be >= 1, got {n_ranks}")
    count = size_bytes // elem_bytes
    if op in ("all_gather",):
        per = count // n_ranks
        return Layout(op, n_ranks, elem_bytes, per, per * n_ranks, per)
    if op in ("reduce_scatter",):
        per = count // n_ranks
        return Layout(op, n_ranks, elem_bytes, per * n_ranks, per, per)
    if op == "alltoall":
        per = count // n_ranks
        return Layout(op, n_ranks, elem_bytes, per * n_ranks, per * n_ranks, per)
    return Layout(op, n_ranks, elem_bytes, count, count, count)


def probe_factor(op: str, n_ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor for a probe op (see tracekit.analyse.collectives.bandwidth)."""
    return bus_factor(BANDWIDTH_OP[normalise_op(op)], n_ranks)


def variants(op: str) -> tuple[bool, ...]:
    """Which in_place values a sweep runs for `op` (False = out-of-place first, like nccl-tests)."""
    if op in IN_PLACE_ONLY:
        return (True,)
    if op in OUT_OF_PLACE_ONLY:
        return (False,)
    return (False, True)


# ---------------------------------------------------------------------------------------------
# Deterministic data. `arange(start, stop)` returns a 1-D integer array (numpy or torch); the
# functions below only use arithmetic that both support, so the torch runner and the tests share
# one definition.

ArangeFn = Callable[[int, int], Any]


def fill(rank: int, index: Any) -> Any:
    """Rank `rank`'s value at global element index `index` (array or int)."""
    return (rank + 1) + (index % 3)


def input_values(op: str, rank: int, lay: Layout, arange: ArangeFn) -> Any:
    """The input buffer of `rank` (send_count elements)."""
    if op == "all_gather":
        # rank r's input is its chunk r of the gathered result
        return fill(rank, arange(rank * lay.chunk, (rank + 1) * lay.chunk))
    return fill(rank, arange(0, lay.send_count))


def expected_output(op: str, rank: int, lay: Layout, arange: ArangeFn, root: int = 0) -> Any | None:
    """The output buffer `rank` must hold after the op (recv_count elements); None when nothing
    is defined on that rank (reduce's non-root ranks)."""
    n = lay.n_ranks
    tri = n * (n + 1) // 2  # sum over ranks of (r + 1)
    if op == "all_reduce":
        return tri + n * (arange(0, lay.recv_count) % 3)
    if op == "reduce":
        return tri + n * (arange(0, lay.recv_count) % 3) if rank == root else None
    if op == "broadcast":
        return fill(root, arange(0, lay.recv_count))
    if op == "all_gather":
        # chunk j comes from rank j, whose input was fill(j, j*c + i): that is fill(j, k) for the
        # global index k; (j + 1) varies per chunk, so build it as index-derived chunk number + 1
        k = arange(0, lay.recv_count)
        return (k // lay.chunk) + 1 + (k % 3) if lay.chunk else k
    if op == "reduce_scatter":
        return tri + n * (arange(rank * lay.chunk, (rank + 1) * lay.chunk) % 3)
    if op == "alltoall":
        # out[j*c + i] = fill(j, rank*c + i): chunk j comes from rank j's chunk `rank`
        k = arange(0, lay.recv_count)
        j = k // lay.chunk if lay.chunk else k
        return (j + 1) + ((rank * lay.chunk + (k - j * lay.chunk)) % 3)
    if op == "sendrecv":
        return fill((rank - 1) % n, arange(0, lay.recv_count))
    raise ProbeError(f"no expected output for op {op!r}")
