"""`tracekit study`: the main job in one command (capture TP=1 and TP=N, analyse, report)."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import (
    RunOn,
    cache_dir_option,
    engine_options,
    no_cache_env_option,
    output_option,
    quiet,
)


def _check_out_dir(out_dir: Path, force: bool) -> None:
    """An earlier study (or anything else) in `out_dir` is replaced only with --force, as `capture`
    does: before anything runs, nothing touched."""
    from tracekit.errors import OutputError

    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"{out_dir}: not a folder (the study writes its runs and report there)")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise OutputError(
            f"{out_dir}: holds an earlier study; give --force to replace it, or -o/--output another folder"
        )


def _parse_tp(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        tps = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 1,2, got {text!r}") from None
    if not tps or min(tps) < 1:
        raise click.BadParameter(f"TP degrees must be positive, got {text!r}")
    return tps


@click.command("study", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--tp", "tp_text", default=None, help="TP degrees, comma-separated (default 1,2).")
@click.option(
    "--preset", default=None, help="Decoder preset: tiny (default on CPU), small, 7b (default on GPUs)."
)
@click.option(
    "--tokens", default=16, show_default=True, type=click.IntRange(1), help="Decode steps per pass."
)
@click.option("--layers", default=None, type=click.IntRange(1), help="Override the preset's layer count.")
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "gloo", "nccl"]))
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]))
@click.option("--mode", default="auto", show_default=True, help="Profiler mode for the traced pass.")
@output_option(
    "out_dir", default="reports/study", show_default=True, type=click.Path(path_type=Path), metavar="DIR",
    help="Output folder: run folders, analyses and report.html/.md/.json (in .gitignore).",
)  # fmt: skip
@click.option(
    "--force", is_flag=True,
    help="Replace an earlier study in the output folder (without it: an error, nothing touched).",
)  # fmt: skip
@click.option(
    "--cdn", is_flag=True,
    help="Link plotly.js from its CDN in the HTML (needs internet to view) instead of inlining it (the default).",
)  # fmt: skip
@click.option(
    "--offline", is_flag=True, hidden=True, help="Accepted for old scripts: inlining is the default."
)
@click.option(
    "--links/--no-links", default=None,
    help="Run the NVLink/PCIe link comparison (default: only where there are two GPUs).",
)  # fmt: skip
@click.option(
    "--rounds", default=8, show_default=True, type=click.IntRange(1),
    help="Measured rounds (an unprofiled and a profiled pass each) per TP degree, over all blocks: "
    "the shortfall's intervals come from them (more rounds: tighter intervals on a noisy host).",
)  # fmt: skip
@click.option(
    "--blocks", default=2, show_default=True, type=click.IntRange(1),
    help="Captures per TP degree, alternating TP=1, TP=N, TP=1, TP=N ... so the host's drift falls on "
    "every degree alike (their rounds are then paired in the intervals); 1: one capture each.",
)  # fmt: skip
@no_cache_env_option
@cache_dir_option
@engine_options
def command(
    tp_text: str | None,
    preset: str | None,
    tokens: int,
    layers: int | None,
    backend: str,
    device: str,
    mode: str,
    out_dir: Path,
    cdn: bool,
    offline: bool,
    links: bool | None,
    force: bool,
    rounds: int,
    blocks: int,
    engine: str | None,
    scheduler: str | None,
    workers: int | None,
) -> None:
    """Capture each TP degree, run breakdown and shortfall (and the link comparison where there
    are GPUs), and write the report. With no arguments on a CPU machine: the tiny preset over
    gloo, TP=1 and TP=2 (well under 2 minutes on 2 cores); with GPUs: NCCL and the 7b preset.

    \b
    Examples:
      tracekit study                                  # -> reports/study/report.html
      tracekit study --tp 1,2 --tokens 32 -o reports/cpu-study
      tracekit study --tp 1,2,4 --preset 7b --device cuda -o reports/h200-study
      tracekit study --tp 1,8 --engine dask --workers 16  # the analyses on a local Dask cluster
    """
    if cdn and offline:
        raise click.UsageError("--cdn and --offline contradict each other: give one")
    # where the analyses run (the captures run here): the study's own progress display, not the engine's
    eng = RunOn(engine, scheduler, workers).engine(progress=False)
    _check_out_dir(out_dir, force)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from tracekit.pipeline.study import StudyConfig, run_study

    config = StudyConfig(
        tp=_parse_tp(tp_text), preset=preset, tokens=tokens, backend=backend, device=device, mode=mode,
        links=links, offline=not cdn, layers=layers, rounds=rounds, blocks=blocks,
    )  # fmt: skip
    console = Console(stderr=True)
    if quiet():
        result = run_study(config, out_dir, engine=eng)
    else:
        with Progress(
            TextColumn("[bold]{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console, transient=False,
        ) as bar:  # fmt: skip
            tasks: dict[str, TaskID] = {}

            def hook(stage: str, done: int, total: int, detail: str) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(stage, total=max(total, 1), detail=detail)
                bar.update(tasks[stage], completed=done, total=max(total, 1), detail=detail)

            result = run_study(config, out_dir, progress=hook, engine=eng)
    from tracekit.cli.report import plotly_bundle_note
    from tracekit.render.study import text

    refs: list[tuple[str, str]] = []
    if result.device != "cuda":
        # on a machine without GPUs the verdict is about gloo's exchange on a loaded host; the real
        # GPU finding, from the committed two-H200 runs, goes beside it
        from tracekit.pipeline.study import gpu_reference_verdicts

        refs = gpu_reference_verdicts()
    click.echo(text(result, plotly_bundle_note(list(result.reports), cdn), refs), nl=False)
