"""The view of a collective probe's rows (`tracekit probe`): nccl-tests' table and the CSV, from
the rows' documents (`model.documents.links.ProbeRow`, docs/JSON.md#probe)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence

import msgspec

from tracekit.analyse.links.words import fmt_magnitude
from tracekit.model.documents.links import PROBE_DTYPES, ROW_FIELDS, ProbeRow


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
        type_name = PROBE_DTYPES.get(any_row.dtype, (any_row.dtype, 0))[0]
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
