"""`tracekit report`: the HTML / Markdown / JSON report of one run (and its shortfall vs a baseline)."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import (
    OutputPath,
    cache_dir_option,
    engine_options,
    message,
    no_cache_env_option,
    output_option,
    show_progress,
    step_pattern_option,
)


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path(exists=True, path_type=str))
@click.option(
    "--baseline", type=click.Path(exists=True, path_type=str), help="TP=1 run folder: adds the shortfall."
)
@click.option(
    "--links",
    type=click.Path(exists=True, dir_okay=False, path_type=str),
    help="compare-links JSON result (or a probe JSON): probe curves under the trace's busbw.",
)
@click.option(
    "--extra",
    "extras",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=str),
    help="JSON of tracekit decompose / advise / rho / whatif / diff (by its `kind`): adds a section with "
    "its answer and numbers. May be given several times.",
)
@click.option(
    "--cdn",
    is_flag=True,
    help="Link plotly.js from its CDN (a small page that needs internet to draw its charts) instead of "
    "inlining it (plotly.js' basic bundle, ~1.2 MB, the default: the page opens anywhere).",
)
@click.option(
    "--offline", is_flag=True, hidden=True, help="Accepted for old scripts: inlining is the default."
)
@output_option(
    "outputs",
    multiple=True,
    required=True,
    type=OutputPath(),
    metavar="FILE",
    help="Output file; the suffix picks the format (.html, .md, .json). May be given several times.",
)
@step_pattern_option
@click.option("--title", default=None, help="Page title.")
@engine_options
@cache_dir_option
@no_cache_env_option
def command(
    run_dir: str,
    baseline: str | None,
    links: str | None,
    extras: tuple[str, ...],
    cdn: bool,
    offline: bool,
    outputs: tuple[str, ...],
    step_pattern: str | None,
    title: str | None,
    engine: str | None,
    scheduler: str | None,
    workers: int | None,
) -> None:
    """Write the report of RUN_DIR: the verdict on top with the profiler dilation (the factor the
    shortfall applied, with its interval), per-token times, the shortfall waterfall and each rank's
    own attribution beside it, the critical path of a token across ranks (per rank compute / host /
    sync / transfer on it, the cause, the offset), per-step parts per rank, collectives (wait vs
    transfer, the straggler test), realised busbw over probe curves, and the manifest. With only
    RUN_DIR it reports the breakdown; --baseline adds the shortfall. Each --extra FILE.json (the
    JSON of decompose, advise, rho, whatif or diff, told apart by its `kind`) adds a section with
    its one-sentence answer and its numbers. The HTML carries plotly.js inline (it opens without
    internet); --cdn links it instead.

    \b
    Example:
      tracekit report traces/cpu-tp2 --baseline traces/cpu-tp1 \\
          -o reports/cpu.html -o reports/cpu.md -o reports/cpu.json
      tracekit report runs/tp64 --baseline runs/tp1 --engine dask --workers 8 -o tp64.json
      tracekit report traces/h200-tp2 --baseline traces/h200-tp1 --extra reports/whatif/h200-tp2.json \\
          --extra reports/rho/h200.json --extra reports/advise/predicted-from-committed.json -o h200.md
    """

    from tracekit.engine import Engine, analyse_dirs
    from tracekit.report.build import (
        format_of,
        load_extras,
        load_links,
        report_from_analyses,
        write_report,
    )

    eng = Engine.parse(engine, scheduler, workers, progress=show_progress())

    if cdn and offline:
        raise click.UsageError("--cdn and --offline contradict each other: give one")
    for o in outputs:
        format_of(o)  # refuse a bad suffix before any analysis runs
    links_data = load_links(links) if links else None
    extra_sections = load_extras(extras)  # refuse a bad --extra before any analysis runs
    note = (
        None
        if links
        else "no link probes given: pass a `tracekit compare-links -o FILE.json` result with --links FILE."
    )
    analysed = analyse_dirs(run_dir, baseline, eng, step_pattern=step_pattern)
    data = report_from_analyses(
        analysed,
        run_path=str(run_dir),
        baseline_path=baseline,
        links=links_data,
        links_note=note,
        title=title,
        extras=extra_sections,
    )
    written = write_report(data, outputs, offline=not cdn)
    click.echo(data.verdict)
    click.echo(data.dilation.sentence)
    if data.dilation.cross_check:
        click.echo(data.dilation.cross_check)
    if data.dilation.warning:
        click.echo(data.dilation.warning)
    for p in written:
        message(f"wrote {p}")
    bundle_note = plotly_bundle_note(written, cdn)
    if bundle_note:
        message(f"note: {bundle_note}")


def plotly_bundle_note(written: list[Path], cdn: bool) -> str | None:
    """When an HTML page inlined plotly.py's full plotly.js (the basic bundle is not in the asset
    cache), the one step that makes the next pages ~1.3 MB instead of ~4.9 MB (issue 24: a fresh
    report was 4.9 MB without a word on why)."""
    if cdn or not any(Path(p).suffix.lower() in (".html", ".htm") for p in written):
        return None
    from tracekit.report.html import basic_bundle_path, plotly_js

    js, which = plotly_js()
    if "full bundle" not in which:
        return None
    return (
        f"the page inlines plotly.py's full plotly.js ({len(js) / 1e6:.1f} MB of it); "
        "`bash scripts/fetch_plotly_basic.sh` puts the basic bundle (bar and scatter: every chart here, "
        f"~1.2 MB) in {basic_bundle_path().parent} for the next pages"
    )
