"""The view of a roofline (`tracekit roofline`'s table): its typed document
(`tracekit.model.documents.Roofline`, docs/JSON.md#roofline) as text."""

from __future__ import annotations

from tracekit.analyse.compute.kernel_scaling import short_kernel_name
from tracekit.model import units
from tracekit.model.documents import Roofline
from tracekit.render.writers import console_text, text_console, titled_table


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def table(doc: Roofline, width: int | None = None, color: bool = True) -> str:
    """The roofline as text: the per-token floor against the achieved time, by role, the top losers."""
    console = text_console(width, color)
    pt, wl, pk = doc.per_token, doc.workload, doc.peaks
    eff = pt.efficiency
    head = (
        f"Per token: floor {units.ms(pt.floor_ns)} ms ({pt.bytes / 1e9:.2f} GB to move, {pt.flops / 1e9:.2f} GFLOP), "
        f"achieved {units.ms(pt.achieved_ns)} ms ({pt.achieved_source})"
        + (f": {eff:.0%} of the roofline" if eff is not None else "")
        + f"; kernels {units.ms(pt.kernel_ns)} ms, of which matrix work {units.ms(pt.matrix_kernel_ns)} ms "
        f"(TP={wl.tp}, batch {wl.batch}, {wl.dtype}, KV length {wl.kv_len}: {wl.kv_len_source})."
    )
    console.print(f"[bold]{doc.verdict}[/bold]")
    console.print(head)
    console.print(
        f"Peaks: memory {_num(pk.memory_gbps)} GB/s ({pk.memory_source}); matrix "
        f"{_num(pk.matrix_tflops)} TFLOP/s ({pk.matrix_source}). Shapes: {doc.shapes.source}."
    )
    if doc.by_role:
        t = titled_table(
            "By role (per token, one rank)",
            ("role", "units", "ms", "floor ms", "lost ms", "GB/s", "TFLOP/s", "of roofline"),
            left=("role",),
        )
        for r in doc.by_role:
            t.add_row(
                "other kernels (norms, rotary, casts, copies)" if r.role == "other" else r.role,
                str(r.units_per_token),
                units.ms(r.time_ns),
                units.ms(r.floor_ns),
                units.ms(r.lost_ns),
                "-" if r.achieved_gbps is None else f"{r.achieved_gbps:.0f}",
                "-" if r.achieved_tflops is None else f"{r.achieved_tflops:.1f}",
                "-" if r.efficiency is None else f"{r.efficiency:.0%}",
            )
        console.print(t)
    t = titled_table(
        "Kernels losing the most time against their own roofline",
        ("kernel", "role", "per token", "ms", "floor ms", "lost ms"),
        left=("kernel", "role"),
    )
    for lost in doc.top_lost:
        t.add_row(
            short_kernel_name(lost.name),
            lost.role,
            str(lost.per_token),
            units.ms(lost.time_ns),
            units.ms(lost.floor_ns),
            units.ms(lost.lost_ns),
        )
    console.print(t)
    return console_text(console, color)
