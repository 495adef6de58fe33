"""Probe rows: building them from per-rank timings, and writing them as an nccl-tests-style table,
JSON and CSV. No torch here.

Time across ranks: every rank times the same loop; a row's `time_us` is the **average over ranks**
of the per-iteration time, which is what nccl-tests reports by default (`-a 1`, src/common.cu
`Allreduce(args, &deltaSec, average)`); `time_us_min` / `time_us_max` are the fastest and slowest
rank. algbw / busbw are computed from `time_us` (and `host_algbw_gbps` / `host_busbw_gbps` from
`host_time_us`, the host-clock loop closed by a stream synchronise that nccl-tests itself times).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from tracekit.analyse.collectives.bandwidth import algbw_gbps
from tracekit.model.documents import convert
from tracekit.model.documents.links import ROW_FLOATS, ProbeRow
from tracekit.probe.spec import ROOTED, Layout, probe_factor


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    vals = [float(v) for v in values]
    return min(vals), sum(vals) / len(vals), max(vals)


def make_row(
    *,
    op: str,
    lay: Layout,
    backend: str,
    device: str,
    dtype: str,
    in_place: bool,
    time_us_per_rank: Sequence[float],
    host_time_us_per_rank: Sequence[float],
    timer: str,
    wrong: int | None,
    iters: int,
    warmup: int,
    mode: str = "default",
    transport: str = "",
    graph: bool = False,
) -> ProbeRow:
    """One row from every rank's per-iteration times (µs). `wrong` is the number of wrong
    elements summed over ranks, or None when the result was not checked. `graph`: the times are a
    CUDA-graph replay of the iterations (no host launch per call)."""
    t_min, t_avg, t_max = _stats(time_us_per_rank)
    h_min, h_avg, h_max = _stats(host_time_us_per_rank)
    factor = probe_factor(op, lay.n_ranks)
    size = lay.size_bytes
    alg = algbw_gbps(size, t_avg * 1e3)
    host_alg = algbw_gbps(size, h_avg * 1e3)
    return ProbeRow(
        op=op,
        ranks=lay.n_ranks,
        backend=backend,
        device=device,
        dtype=dtype,
        bytes=size,
        count=lay.param_count,
        in_place=bool(in_place),
        root=0 if op in ROOTED else -1,
        iters=iters,
        warmup=warmup,
        timer=timer,
        graph=bool(graph),
        time_us=t_avg,
        time_us_min=t_min,
        time_us_max=t_max,
        host_time_us=h_avg,
        host_time_us_min=h_min,
        host_time_us_max=h_max,
        algbw_gbps=alg,
        busbw_gbps=alg * factor,
        host_algbw_gbps=host_alg,
        host_busbw_gbps=host_alg * factor,
        bus_factor=factor,
        correct=None if wrong is None else wrong == 0,
        wrong=wrong,
        mode=mode,
        transport=transport,
        algo="",
        proto="",
    )


def rows_from_csv(text: str) -> list[ProbeRow]:
    """Read rows_to_csv's output back into rows (types restored; an empty number is NaN); a CSV
    that is not of their shape: DocumentError naming the row and field (`$[3].bytes`)."""
    ints = {"ranks", "bytes", "count", "root", "iters", "warmup", "wrong"}
    rows: list[dict[str, object]] = []
    for rec in csv.DictReader(io.StringIO(text)):
        row: dict[str, object] = {}
        for k, v in rec.items():
            if k in ("in_place", "correct", "graph"):
                if v != "" or k != "graph":
                    row[k] = None if v == "" else v == "true"
            elif k in ints:
                row[k] = None if v == "" else _int(v)
            elif k in ROW_FLOATS:
                row[k] = float(v) if v != "" else float("nan")
            else:
                row[k] = v
        rows.append(row)
    return convert(rows, list[ProbeRow])


def _int(v: str) -> int | str:
    try:
        return int(v)
    except ValueError:
        return v  # refused by the decode, which says where
