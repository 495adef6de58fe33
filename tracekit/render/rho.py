"""The view of `tracekit rho`: each measured throughput beside its datasheet and anchor figures,
then rho per matrix dtype (matrix / fp32 FMA), from its document (docs/JSON.md#rho)."""

from __future__ import annotations

import math

from tracekit.model.documents.base import given
from tracekit.model.documents.rho import Rho


def _num(x: float | None, nd: int = 1) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:,.{nd}f}" if abs(x) >= 10 or nd > 1 else f"{x:.3g}"


def table(doc: Rho) -> str:
    """A plain-text table of the measurements (a skipped dtype: why) and of rho; the notes last."""
    d = doc.device
    lines = [f"device: {d.name} ({d.type}, torch {d.torch})", ""]
    head = f"{'kind':<7} {'dtype':<6} {'measured':>10} {'best':>10} {'datasheet':>10} {'anchor':>10}  method"
    lines += [head, "-" * len(head)]
    for m in [*doc.matrix, *doc.vector]:
        if m.skipped:
            lines.append(f"{m.kind:<7} {m.dtype:<6} {'skipped':>10}  {m.skipped}")
            continue
        sm, peak = given(m.sm_clock_mhz), given(m.peak_at_clock_tops)
        clock = f", SM clock {sm:.0f} MHz under load" if sm else ""
        lines.append(
            f"{m.kind:<7} {m.dtype:<6} {_num(m.tops):>10} {_num(m.tops_max):>10} {_num(m.datasheet_tops):>10} "
            f"{_num(m.anchor_tops):>10}  {m.method} [{m.shape}{clock}]"
        )
        if peak and m.tops:
            lines.append(f"{'':<15}{m.tops / peak:.1%} of the FMA peak at that clock ({peak:,.1f})")
    lines += ["", "(TFLOP/s; TOPS for int8 and int32)", ""]
    lines.append(f"{'rho':<14} {'measured':>9} {'datasheet':>10} {'anchor':>8}")
    for r in doc.rho:
        lines.append(
            f"{str(r.dtype) + ' / fp32 FMA':<14} {_num(r.rho, 1):>9} {_num(r.datasheet_rho, 1):>10} "
            f"{_num(r.anchor_rho, 1):>8}"
        )
    lines += [f"note: {n}" for n in doc.notes]
    return "\n".join(lines) + "\n"
