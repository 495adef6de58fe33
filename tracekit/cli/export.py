"""`tracekit export --perfetto OUT.json RUN...`: the run with tracekit's view, for the Perfetto UI."""

from __future__ import annotations

import click

from tracekit.cli.options import OutputPath, cache_dir_option, message, no_cache_option, step_pattern_option


@click.command("export", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "-o",
    "--output",
    "--perfetto",
    "out",
    required=True,
    type=OutputPath(),
    metavar="OUT.json",
    help="Write a Chrome-trace JSON (OUT.json, or OUT.json.gz gzipped) for ui.perfetto.dev and chrome://tracing "
    "(--perfetto is the same option).",
)
@step_pattern_option
@no_cache_option
@cache_dir_option
def command(paths: tuple[str, ...], out: str, step_pattern: str | None, no_cache: bool) -> None:
    """Write PATHS (a run folder, trace files: anything `tracekit breakdown` reads) as one
    Chrome-trace JSON that opens in the Perfetto UI (ui.perfetto.dev: Open trace file) and
    chrome://tracing, every rank a process with its own threads and GPU streams, and tracekit's
    view beside them: the step windows (with their compute / memory / collective / sync / idle
    split), the class of every GPU interval, each collective cut into wait (until its last rank
    arrives) and transfer slices with flow arrows joining its instances across the ranks, and the
    critical path of each token. `tracekit breakdown OUT.json` reads the file back as the same
    events and classes.

    \b
    Examples:
      tracekit export --perfetto tp2.json traces/h200-tp2
      tracekit export --perfetto sglang.json.gz sglang_qwen3-8b_decode.json.gz
    """
    from tracekit.errors import OutputError
    from tracekit.export.perfetto import write_perfetto

    if not out.endswith((".json", ".json.gz")):
        raise OutputError(f"{out}: the Perfetto export is JSON: name it .json or .json.gz")
    s = write_perfetto(list(paths), out, step_pattern=step_pattern, cache=not no_cache)
    v = s.view
    message(
        f"wrote {s.path} ({s.bytes / 1e6:.1f} MB): ranks {s.ranks}, {s.events} events; tracekit view: "
        f"{v.get('steps', 0)} step windows, {v.get('class', 0)} classed GPU intervals, "
        f"{v.get('collectives', 0)} collectives ({v.get('wait', 0)} wait, {v.get('transfer', 0)} transfer slices), "
        f"{v.get('path', 0)} critical-path pieces, {v.get('flows', 0)} flow events"
    )
    for note in s.notes:
        message(f"note: {note}")
    message("open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)")
