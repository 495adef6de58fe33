"""Options shared by the analysis commands, so that they read and behave the same everywhere."""

from __future__ import annotations

from pathlib import Path

import click

STEP_PATTERN_HELP = "Regex of the step annotations (default: decode_step, then ProfilerStep#N)."

step_pattern_option = click.option(
    "--step-pattern",
    default=None,
    metavar="REGEX",
    help=STEP_PATTERN_HELP,
)

out_file_option = click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="Write to FILE instead of stdout.",
)

no_cache_option = click.option(
    "--no-cache", is_flag=True, help="Do not use (or write) the Parquet cache of parsed traces."
)


def write_text(text: str, out: str | None) -> None:
    """Print `text` to stdout, or write it to `out` and say so on stderr."""
    if out is None:
        click.echo(text, nl=False)
    else:
        Path(out).write_text(text)
        click.echo(f"wrote {out}", err=True)
