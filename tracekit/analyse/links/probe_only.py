"""The link verdict without a trace (`tracekit compare-links` with no `--trace`): what the probe's
sweeps alone say, per link mode on a GPU and for the gloo sweep on a CPU (`tracekit.analyse.links.verdict`
calls it)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tracekit.analyse.links.curves import (
    busbw_at,
    curve,
    probe_timing,
    time_at,
    timing_sentence,
)
from tracekit.analyse.links.words import fmt_bytes, fmt_gbps
from tracekit.model.documents.links import LinksPerSizeItem, LinksVerdictDetails, ProbeRow


def probe_only_verdict(
    rows: Sequence[ProbeRow],
    modes: Sequence[str],
    prefix: str,
    details: LinksVerdictDetails,
    cpu_only: bool = False,
) -> tuple[str, LinksVerdictDetails]:
    """Without a decode trace: the ratio of the first two modes at the largest and smallest sizes.
    On the CPU every mode ran the same gloo sweep: the figures are given as two runs of it, with no
    link words and no ratio stated as a finding (issue 24). Either closes with how the rows were
    timed (`timing_sentence`), which the details keep."""
    if cpu_only:
        text = _cpu_runs(rows, modes, details) + (
            " (the runs differ only by the host's noise; this checks the sweep itself, it measures no link)."
        )
    else:
        text = _mode_ratios(rows, modes, details) + (
            ". Without a decode trace (--trace) the probe cannot say whether the link explains a decode's "
            "transfer time."
        )
    timing = probe_timing(rows, modes)
    details.timing = dict(timing)
    return prefix + text + timing_sentence(timing, iters_of(rows)), details


def _mode_ratios(rows: Sequence[ProbeRow], modes: Sequence[str], details: LinksVerdictDetails) -> str:
    """Per op, the first two modes' busbw at the largest size, their ratio and their times at the
    smallest (each also a `per_size` entry of the details)."""
    parts = []
    for op in sorted({r.op for r in rows}):
        if len(modes) < 2:
            break
        a, b = curve(rows, op, modes[0]), curve(rows, op, modes[1])
        if not a or not b:
            continue
        big, small = a[-1][0], a[0][0]
        va, vb = busbw_at(rows, op, modes[0], big)[0], busbw_at(rows, op, modes[1], big)[0]
        la, lb = time_at(rows, op, modes[0], small), time_at(rows, op, modes[1], small)
        ratio = va / vb if vb and math.isfinite(vb) and vb > 0 else float("nan")
        lat = (
            f"; latency at {fmt_bytes(small)}: {la:.1f} vs {lb:.1f} us"
            if math.isfinite(la) and math.isfinite(lb)
            else ""
        )
        parts.append(
            f"{op} busbw at {fmt_bytes(big)}: {modes[0]} {va:.2f} GB/s vs {modes[1]} {vb:.2f} GB/s "
            f"(x{ratio:.2f}){lat}"
        )
        details.per_size.append(
            LinksPerSizeItem(op=op, bytes=big, busbw_gbps={modes[0]: va, modes[1]: vb}, ratio=ratio)
        )
    return "; ".join(parts) if parts else "no two modes to compare"


def _cpu_runs(rows: Sequence[ProbeRow], modes: Sequence[str], details: LinksVerdictDetails) -> str:
    """The CPU sweep without a trace: each op's busbw at the largest size and time at the smallest,
    per run of the same gloo sweep ("run 1", "run 2": a mode's name is an NCCL setting gloo ignores)."""
    parts = []
    for op in sorted({r.op for r in rows}):
        curves = [(m, curve(rows, op, m)) for m in modes]
        curves = [(m, c) for m, c in curves if c]
        if not curves:
            continue
        big, small = curves[0][1][-1][0], curves[0][1][0][0]
        bws = [busbw_at(rows, op, m, big)[0] for m, _ in curves]
        lats = [time_at(rows, op, m, small) for m, _ in curves]
        bw_text = " / ".join(fmt_gbps(v) for v in bws)
        lat_text = " / ".join(f"{v:.1f}" for v in lats) if all(math.isfinite(v) for v in lats) else ""
        who = "run " + " / ".join(str(i + 1) for i in range(len(curves)))
        parts.append(
            f"{op} busbw at {fmt_bytes(big)} {bw_text} GB/s"
            + (f", time at {fmt_bytes(small)} {lat_text} us" if lat_text else "")
            + f" ({who})"
        )
        details.per_size.append(
            LinksPerSizeItem(
                op=op, bytes=big, busbw_gbps={m: v for (m, _), v in zip(curves, bws, strict=True)}
            )
        )
    return f"the same gloo sweep ran {len(modes)} times: " + "; ".join(parts) if parts else "no sweep rows"


def iters_of(rows: Sequence[ProbeRow]) -> int | None:
    """The iterations of the CUDA-graph rows, when they all have the same."""
    its = {r.iters for r in rows if r.graph is True}
    return its.pop() if len(its) == 1 else None
