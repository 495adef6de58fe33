"""`tracekit dilation`: profiled vs unprofiled per-token times of captured runs (docs/METHOD.md section Dilation)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

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
    from tracekit.render.dilation import table

    color = out is None and sys.stdout.isatty() and color_enabled()
    write_text(table(rows, threshold, color), out)
