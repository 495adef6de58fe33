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
import math
from collections.abc import Iterable, Sequence

import msgspec

from tracekit.analyse.collectives.bandwidth import algbw_gbps
from tracekit.analyse.links.words import fmt_magnitude
from tracekit.model.documents import convert
from tracekit.model.documents.links import ROW_FLOATS, ProbeRow
from tracekit.probe.spec import DTYPES, ROOTED, Layout, probe_factor

#: Row fields in the order JSON objects and CSV columns use (`ProbeRow`'s).
ROW_FIELDS: tuple[str, ...] = ProbeRow.__struct_fields__


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


def _fmt_time(us: float) -> str:
    # nccl-tests: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f
    return fmt_magnitude(us, ((10000.0, ".0f"), (100.0, ".1f")), below=".2f", nan="nan")


def _fmt_bw(v: float) -> str:
    return "nan" if not math.isfinite(v) else f"{v:.2f}"


def _fmt_wrong(row: ProbeRow | None) -> str:
    if row is None:
        return "n/a"
    return "N/A" if row.wrong is None else str(row.wrong)


def format_table(rows: Iterable[ProbeRow], notes: Sequence[str] = ()) -> str:
    """nccl-tests' layout: one line per (op, size) with the out-of-place and in-place columns side
    by side (`n/a` where that form is not run). Times in µs (small sizes read as latency)."""
    rows = list(rows)
    out: list[str] = []
    for note in notes:
        out.append(f"# {note}")
    groups: dict[tuple[str, int], dict[bool, ProbeRow]] = {}
    order: list[tuple[str, int]] = []
    for r in rows:
        key = (r.op, r.bytes)
        if key not in groups:
            groups[key] = {}
            order.append(key)
        groups[key][r.in_place] = r
    w = (12, 12, 9, 6, 6, 8, 7, 7, 6)
    head_ops = None
    for key in order:
        op = key[0]
        if op != head_ops:
            head_ops = op
            out.append("#")
            out.append(f"# op: {op}")
            out.append(
                f"# {'':>{w[0] - 2}}  {'':>{w[1]}}  {'':>{w[2]}}  {'':>{w[3]}}  {'':>{w[4]}}"
                f"  {'out-of-place':^{w[5] + w[6] + w[7] + w[8] + 6}}  {'in-place':^{w[5] + w[6] + w[7] + w[8] + 6}}"
            )
            out.append(
                f"# {'size':>{w[0] - 2}}  {'count':>{w[1]}}  {'type':>{w[2]}}  {'redop':>{w[3]}}  {'root':>{w[4]}}"
                + ("  " + f"{'time':>{w[5]}}  {'algbw':>{w[6]}}  {'busbw':>{w[7]}}  {'#wrong':>{w[8]}}") * 2
            )
            out.append(
                f"# {'(B)':>{w[0] - 2}}  {'(elements)':>{w[1]}}  {'':>{w[2]}}  {'':>{w[3]}}  {'':>{w[4]}}"
                + ("  " + f"{'(us)':>{w[5]}}  {'(GB/s)':>{w[6]}}  {'(GB/s)':>{w[7]}}  {'':>{w[8]}}") * 2
            )
        pair = groups[key]
        any_row = pair.get(False) or pair[True]
        type_name = DTYPES.get(any_row.dtype, (any_row.dtype, 0))[0]
        redop = "sum" if op in ("all_reduce", "reduce", "reduce_scatter") else "none"
        line = (
            f"{any_row.bytes:>{w[0]}}  {any_row.count:>{w[1]}}  {type_name:>{w[2]}}  {redop:>{w[3]}}"
            f"  {any_row.root:>{w[4]}}"
        )
        for in_place in (False, True):
            cell = pair.get(in_place)
            if cell is None:
                line += "  " + f"{'n/a':>{w[5]}}  {'n/a':>{w[6]}}  {'n/a':>{w[7]}}  {'n/a':>{w[8]}}"
            else:
                line += (
                    "  " + f"{_fmt_time(cell.time_us):>{w[5]}}  {_fmt_bw(cell.algbw_gbps):>{w[6]}}"
                    f"  {_fmt_bw(cell.busbw_gbps):>{w[7]}}  {_fmt_wrong(cell):>{w[8]}}"
                )
        out.append(line)
    finite = [r.busbw_gbps for r in rows if math.isfinite(r.busbw_gbps)]
    wrong = sum(r.wrong or 0 for r in rows)
    out.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    if finite:
        out.append(f"# Avg bus bandwidth    : {sum(finite) / len(finite):.4g}")
    return "\n".join(out) + "\n"


def rows_to_csv(rows: Iterable[ProbeRow]) -> str:
    """CSV with ROW_FIELDS as columns (booleans as true/false, None as empty; a row without
    `graph`, written before it, has it empty)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(ROW_FIELDS)
    for r in rows:
        cells = []
        for f in ROW_FIELDS:
            v = getattr(r, f)
            if v is None or v is msgspec.UNSET:
                cells.append("")
            elif isinstance(v, bool):
                cells.append("true" if v else "false")
            elif isinstance(v, float):
                cells.append(repr(v))
            else:
                cells.append(str(v))
        writer.writerow(cells)
    return buf.getvalue()


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
