"""`tracekit dilation`: profiled vs unprofiled per-token times of captured runs (METHOD.md 9)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import click

from tracekit.errors import NoTracesError


def _load_manifest(path: str) -> dict[str, Any]:
    from tracekit.read import load_manifest

    p = Path(path)
    m = p / "manifest.json" if p.is_dir() else p
    if not m.is_file():
        raise NoTracesError(f"{path}: no manifest.json (dilation needs a run captured by `tracekit capture`)")
    return load_manifest(m)  # TraceFormatError naming the file (and byte offset) when malformed


@click.command("dilation")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=str))
@click.option("--skip-first", type=int, default=1, show_default=True, help="Warm-up tokens left out.")
@click.option(
    "--threshold", type=float, default=0.10, show_default=True, help="Dilation above 1 + this is flagged."
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def command(run_dirs: tuple[str, ...], skip_first: int, threshold: float, fmt: str) -> None:
    """Print each run's per-token time unprofiled and profiled (the slowest rank per token, median,
    p10, p90) and the dilation = profiled / unprofiled median, flagged above the threshold.

    \b
    Examples:
      tracekit dilation traces/cpu-tp1 traces/cpu-tp2
      tracekit dilation traces/cpu-tp2 --format json
    """
    from rich.console import Console
    from rich.table import Table

    from tracekit.analyse.dilation import dilation_of

    rows = []
    for d in run_dirs:
        m = _load_manifest(d)
        dil = dilation_of(m, skip_first=skip_first, threshold=threshold)
        rows.append((d, m, dil))
    if fmt == "json":
        click.echo(json.dumps([{"run": d, **dil.to_json()} for d, _, dil in rows], indent=1))
        return
    console = Console(record=True, width=120, force_terminal=sys.stdout.isatty(), file=io.StringIO())
    t = Table(title="Per-token time, ms (each token: the slowest rank)", title_justify="left")
    t.add_column("run", overflow="fold")
    for col in (
        "mode",
        "tokens",
        "unprofiled median",
        "p10-p90",
        "profiled median",
        "p10-p90",
        "dilation",
        "",
    ):
        t.add_column(col, justify="right")
    for d, m, dil in rows:
        u, p = dil.unprofiled, dil.profiled

        def q(x: Any) -> tuple[str, str]:
            if x is None:
                return "-", "-"
            return (
                f"{x.median_ns / 1e6:.3f}",
                f"{x.quantile_ns(0.1) / 1e6:.3f}-{x.quantile_ns(0.9) / 1e6:.3f}",
            )

        wl = m.get("workload")
        mode = str(wl.get("mode", "?")) if isinstance(wl, dict) else "?"
        t.add_row(
            d,
            mode,
            str(u.n if u else "-"),
            *q(u),
            *q(p),
            "-" if dil.dilation is None else f"{dil.dilation:.2f}x",
            "INFLATED"
            if dil.inflated
            else ("NOISY" if dil.dilation is not None and dil.dilation < 1 / (1 + threshold) else ""),
        )
    console.print(t)
    for d, _, dil in rows:
        for note in dil.notes:
            console.print(f"{d}: {note}")
    console.print(
        f"INFLATED: dilation above {threshold:.0%}: the traced coordination share is inflated by the profiler. "
        "NOISY: the profiled pass was faster than the unprofiled one (a profiler cannot speed a run up: the host "
        "was loaded); tracekit shortfall then does not correct."
    )
    click.echo(console.export_text(styles=sys.stdout.isatty()), nl=False)
