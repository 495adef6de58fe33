"""The view of `tracekit dilation`: per run its per-token time unprofiled and profiled, the
dilation with its interval and flag, the notes, and what the figures mean (docs/METHOD.md section
Dilation)."""

from __future__ import annotations

from collections.abc import Sequence

from tracekit.analyse.dilation import Dilation, TokenTimes
from tracekit.model.documents import given
from tracekit.model.documents.manifest import Manifest
from tracekit.model.units import ms
from tracekit.render.writers import console_text, text_console, titled_table

_COLUMNS = (
    "run",
    "mode",
    "rounds U/P",
    "tokens U/P",
    "unprofiled mean",
    "p10-p90",
    "profiled mean",
    "p10-p90",
    "dilation",
    "95% interval",
    "",
)


def _ms(x: TokenTimes | None) -> tuple[str, str]:
    if x is None:
        return "-", "-"
    return ms(float(x.mean_ns)), f"{ms(x.quantile_ns(0.1))}-{ms(x.quantile_ns(0.9))}"


def _mode(m: Manifest) -> str:
    wl = given(m.workload)
    mode = given(wl.mode) if wl is not None else None
    return "?" if not mode else mode if isinstance(mode, str) else ", ".join(mode)


def _flag(dil: Dilation, threshold: float) -> str:
    if dil.inflated:
        return "INFLATED"
    return "NOISY" if dil.dilation is not None and dil.dilation < 1 / (1 + threshold) else ""


def table(rows: Sequence[tuple[str, Manifest, Dilation]], threshold: float, color: bool = False) -> str:
    """The table of `rows` (run as given, its manifest, its dilation), then each run's notes, then
    what dilation, INFLATED and NOISY mean at `threshold`."""
    console = text_console(160, color)
    t = titled_table(
        "Per-token time, ms (each token: the slowest rank; rounds pooled)", _COLUMNS, left={"run"}
    )
    t.columns[0].overflow = "fold"
    for d, m, dil in rows:
        u, p, iv = dil.unprofiled, dil.profiled, dil.interval
        t.add_row(
            d,
            _mode(m),
            f"{dil.rounds['unprofiled']}/{dil.rounds['profiled']}",
            f"{u.n if u else '-'}/{p.n if p else '-'}",
            *_ms(u),
            *_ms(p),
            "-" if dil.dilation is None else f"{dil.dilation:.2f}x",
            "-" if iv is None else f"{iv[0]:.2f}-{iv[1]:.2f}",
            _flag(dil, threshold),
        )
    console.print(t)
    for d, _, dil in rows:
        for note in dil.notes:
            console.print(f"{d}: {note}")
        if dil.dilation is not None and dil.interval is None:
            console.print(
                f"{d}: no per-token times to resample: the capture's own dilation figure, no interval"
            )
    console.print(
        "dilation = median over rounds of profiled / unprofiled mean per-token time (one round: mean profiled / "
        "mean unprofiled); tracekit shortfall divides the traced per-token time by exactly this figure. "
        f"INFLATED: dilation above {threshold:.0%}: the traced coordination share is inflated by the profiler. "
        "NOISY: the profiled pass was faster than the unprofiled one (a profiler cannot speed a run up: the host "
        "was loaded); tracekit shortfall then does not correct. A wide interval: the host drifted between rounds "
        "(capture with more --rounds)."
    )
    return console_text(console, color)
