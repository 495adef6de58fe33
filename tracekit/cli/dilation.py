"""`tracekit dilation`: profiled vs unprofiled per-token times of captured runs (docs/METHOD.md section Dilation)."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from msgspec import UNSET

from tracekit.cli.options import color_enabled, format_option, out_file_option, write_text
from tracekit.errors import NoTracesError, TraceFormatError
from tracekit.model.documents.base import given

if TYPE_CHECKING:
    from tracekit.read.manifests import ManifestRead


def _load_manifest(path: str) -> ManifestRead:
    from tracekit.read.manifests import read_manifest

    p = Path(path)
    m = p / "manifest.json" if p.is_dir() else p
    if p.is_file() and p.name != "manifest.json" and (p.parent / "manifest.json").is_file():
        m = p.parent / "manifest.json"  # a trace file of a run: the run's manifest beside it
    if not m.is_file():
        raise NoTracesError(f"{path}: no manifest.json (dilation needs a run captured by `tracekit capture`)")
    try:
        read = read_manifest(m)  # TraceFormatError naming the file (and byte offset) when malformed
    except TraceFormatError:
        if "manifest" in m.name:
            raise
        raise NoTracesError(  # a trace or any other file given alone: it is not read as a manifest
            f"{path}: not a manifest and no manifest.json beside it (dilation reads the manifest of a run "
            "captured by `tracekit capture`: give the run folder)"
        ) from None
    doc = read.manifest
    fields = ("unprofiled", "profiled", "workload")
    if doc.kind != "tracekit.capture" and not any(
        getattr(doc, k) is not UNSET or any(f"field '{k}" in n for _, n in read.notes) for k in fields
    ):
        # any JSON object loads as a manifest: one with none of a capture's fields is another file
        # (a trace of another tool given by mistake printed an empty row and exit 0: issue 24)
        raise TraceFormatError(
            m,
            f"not a capture manifest (kind {str(given(doc.kind))[:40]!r}, no unprofiled / profiled / workload): "
            "dilation reads the manifest.json of a run `tracekit capture` wrote; give its folder",
        )
    return read


def _field_notes(read: ManifestRead) -> tuple[str, ...]:
    """The reader's notes on the fields the dilation reads (left out: not of their JSON type)."""
    return tuple(
        n for _, n in read.notes if any(f"field '{k}" in n for k in ("unprofiled", "profiled", "dilation"))
    )


@click.command("dilation", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=str))
@click.option(
    "--skip-first", type=int, default=1, show_default=True, help="Warm-up tokens left out of each round."
)
@click.option(
    "--threshold", type=float, default=0.10, show_default=True, help="Dilation above 1 + this is flagged."
)
@format_option("table", "json", help="table for people; json for machines.")
@out_file_option
def command(run_dirs: tuple[str, ...], skip_first: int, threshold: float, fmt: str, out: str | None) -> None:
    """Print each run's per-token time unprofiled and profiled (each token: the slowest rank; mean,
    p10, p90 over every round's tokens, the first --skip-first of each round left out) and the
    dilation: with K >= 2 alternating rounds (`tracekit capture --rounds`), the median over rounds
    of mean(profiled round k) / mean(unprofiled round k) (each pair ran back to back, so host drift
    between rounds cancels and one pair caught across a host-speed change does not move it); with
    one round of each (runs captured before rounds), mean profiled / mean unprofiled. With its 95%
    bootstrap interval (rounds drawn with replacement, then tokens within each). Flagged INFLATED above the threshold, NOISY
    below its inverse.

    \b
    Examples:
      tracekit dilation traces/cpu-tp1 traces/cpu-tp2
      tracekit dilation runs/h200-tp1 --format json -o dilation.json
    """
    from rich.console import Console
    from rich.table import Table

    from tracekit.analyse.dilation import dilation_of

    rows = []
    for d in run_dirs:
        read = _load_manifest(d)
        m = read.manifest
        dil = dilation_of(m, skip_first=skip_first, threshold=threshold)
        dil = dataclasses.replace(dil, notes=_field_notes(read) + dil.notes)
        rows.append((d, m, dil))
    if fmt == "json":
        write_text(json.dumps([{"run": d, **dil.to_json()} for d, _, dil in rows], indent=1) + "\n", out)
        return
    color = out is None and sys.stdout.isatty() and color_enabled()
    console = Console(record=True, width=160, force_terminal=color, no_color=not color, file=io.StringIO())
    t = Table(title="Per-token time, ms (each token: the slowest rank; rounds pooled)", title_justify="left")
    t.add_column("run", overflow="fold")
    for col in (
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
    ):
        t.add_column(col, justify="right")
    for d, m, dil in rows:
        u, p = dil.unprofiled, dil.profiled

        def q(x: Any) -> tuple[str, str]:
            if x is None:
                return "-", "-"
            return (
                f"{float(x.mean_ns) / 1e6:.3f}",
                f"{x.quantile_ns(0.1) / 1e6:.3f}-{x.quantile_ns(0.9) / 1e6:.3f}",
            )

        wl = given(m.workload)
        wl_mode = given(wl.mode) if wl is not None else None
        mode = "?" if not wl_mode else wl_mode if isinstance(wl_mode, str) else ", ".join(wl_mode)
        iv = dil.interval
        t.add_row(
            d,
            mode,
            f"{dil.rounds['unprofiled']}/{dil.rounds['profiled']}",
            f"{u.n if u else '-'}/{p.n if p else '-'}",
            *q(u),
            *q(p),
            "-" if dil.dilation is None else f"{dil.dilation:.2f}x",
            "-" if iv is None else f"{iv[0]:.2f}-{iv[1]:.2f}",
            "INFLATED"
            if dil.inflated
            else ("NOISY" if dil.dilation is not None and dil.dilation < 1 / (1 + threshold) else ""),
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
    write_text(console.export_text(styles=color), out)
