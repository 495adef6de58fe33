"""Options shared by the analysis commands, so that they read and behave the same everywhere."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tracekit.model.fields import copy_fields

if TYPE_CHECKING:
    from tracekit.engine import Engine

C = TypeVar("C")

STEP_PATTERN_HELP = (
    "How to find the steps: auto (default: decode_step, then ProfilerStep#N, then a serving engine's "
    "per-iteration range such as vLLM execute_*, SGLang step[DECODE ...], TensorRT-LLM _forward_step, then one "
    "CUDA-graph launch period, then NVTX ranges that repeat, else the whole trace as one window), whole (one "
    "window per rank), or a REGEX of the step annotations. --step-pattern is the same option."
)


def steps_option(help: str = STEP_PATTERN_HELP) -> Any:
    """`--steps` (or `--step-pattern`): how the steps are found."""
    return click.option(
        "--steps", "--step-pattern", "step_pattern", default=None, metavar="auto|whole|REGEX", help=help
    )


step_pattern_option = steps_option()


def run_option(
    name: str,
    help: str,
    *,
    dest: str | None = None,
    required: bool = True,
    path_type: Any = str,
    metavar: str | None = None,
    **settings: Any,
) -> Any:
    """An option naming a run to read (`--baseline`, `--sharded`, `--trace` ...): an existing
    folder of rank files or one trace, passed as `path_type` under `dest` (the option's name)."""
    return click.option(
        f"--{name}",
        dest or name.replace("-", "_"),
        required=required,
        type=click.Path(exists=True, path_type=path_type),
        default=None,
        metavar=metavar,
        help=help,
        **settings,
    )


def file_option(name: str, dest: str, help: str, *, exists: bool = False, path_type: Any = str) -> Any:
    """An option naming one JSON file a command reads (`--copy`, `--rho`, `--load` ...)."""
    return click.option(
        f"--{name}",
        dest,
        type=click.Path(exists=exists, dir_okay=False, path_type=path_type),
        default=None,
        help=help,
    )


def skip_first_option(default: int = 1, help: str = "Warm-up steps left out.") -> Any:
    """`--skip-first N`: the warm-up steps left out of the per-token figures."""
    return click.option("--skip-first", type=int, default=default, show_default=True, help=help)


#: `analyse.dilation.DEFAULT_THRESHOLD`, not imported (--help loads no analysis; test_cli_vocabulary)
DILATION_THRESHOLD = 0.10


def dilation_threshold_option(help: str) -> Any:
    """`--dilation-threshold X`: the attribution's `dilation_threshold` (`AttributionOptions`)."""
    return click.option(
        "--dilation-threshold", type=float, default=DILATION_THRESHOLD, show_default=True, help=help
    )


allow_partial_option = click.option(
    "--allow-partial",
    is_flag=True,
    help="Match collectives even when their group names ranks that are not in the run.",
)


class OutputPath(click.Path):
    """The type of every option naming a file a command writes (--out, --perfetto, report's
    -o/--output, rho's --json ...): a file, not a folder. The type is the mark `check_outputs` finds
    them by: before a command runs, each output it names is checked against the command's inputs."""

    name = "output file"

    def __init__(self, path_type: Any = str) -> None:
        super().__init__(dir_okay=False, path_type=path_type)


class AliasOption(click.Option):
    """An option with deprecated names that still work but are not shown in --help (`--out`, kept
    so that old scripts run, beside `-o/--output`)."""

    def __init__(self, *args: Any, hidden_names: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hidden_names = hidden_names

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        shown = self.opts
        self.opts = [o for o in shown if o not in self.hidden_names]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


def output_option(dest: str = "out", **kwargs: Any) -> Any:
    """`-o/--output` (the one name of every command's output; `--out` still works, unlisted)."""
    return click.option("-o", "--output", "--out", dest, cls=AliasOption, hidden_names=("--out",), **kwargs)


out_file_option = output_option(
    "out",
    type=OutputPath(),
    default=None,
    metavar="FILE",
    help="Write the result to FILE instead of stdout.",
)

#: the one --format vocabulary; older names still accepted: text = table, markdown = md
FORMAT_ALIASES = {"text": "table", "markdown": "md"}


class FormatChoice(click.Choice):
    """click.Choice over table|json|md|csv (the ones a command writes) that also takes the older
    names of FORMAT_ALIASES, unlisted."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.lower() in FORMAT_ALIASES:
            value = FORMAT_ALIASES[value.lower()]
        return super().convert(value, param, ctx)


def format_option(*formats: str, default: str | None = "table", help: str = "") -> Any:
    """`--format` over `formats`, a subset of table|json|md|csv in that order."""
    order = ("table", "json", "md", "csv")
    assert set(formats) <= set(order), formats
    return click.option(
        "--format",
        "fmt",
        type=FormatChoice([f for f in order if f in formats]),
        default=default,
        show_default=default is not None,
        help=help or None,
    )


# -- -q/--quiet, -v/--verbose, --no-color: every command has them (main.LazyGroup adds them) ------


@dataclass
class _State:
    quiet: bool = False
    verbose: int = 0


_STATE = _State()


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    _STATE.quiet = bool(value)
    return value


def _set_verbose(ctx: click.Context, param: click.Parameter, value: int) -> int:
    _STATE.verbose = int(value or 0)
    return value


def _set_no_color(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        _env_for_command(ctx, "NO_COLOR", "1")  # rich and every table below read NO_COLOR
    return value


def common_params() -> list[click.Parameter]:
    """The options every command takes, fresh objects (click keeps state on them)."""
    return [
        click.Option(
            ["-q", "--quiet"],
            is_flag=True,
            expose_value=False,
            callback=_set_quiet,
            help="Only the result: no progress display, no 'wrote ...' or other messages on stderr "
            "(errors still print).",
        ),
        click.Option(
            ["-v", "--verbose"],
            count=True,
            expose_value=False,
            callback=_set_verbose,
            help="Say more on stderr: the command's time; with an error, its traceback too.",
        ),
        click.Option(
            ["--no-color"],
            is_flag=True,
            expose_value=False,
            callback=_set_no_color,
            help="No colour in tables and progress (also when NO_COLOR is set).",
        ),
    ]


def quiet() -> bool:
    """-q/--quiet was given to the running command."""
    return _STATE.quiet


def verbose() -> int:
    """How many -v the running command was given."""
    return _STATE.verbose


def color_enabled() -> bool:
    """Colour unless --no-color or NO_COLOR (no-color.org: set and not empty)."""
    return not os.environ.get("NO_COLOR")


def show_progress() -> bool:
    """A progress display on stderr: when it is a terminal and not -q/--quiet."""
    return sys.stderr.isatty() and not quiet()


def message(text: str) -> None:
    """A message for people (not the result): on stderr, unless -q/--quiet."""
    if not quiet():
        click.echo(text, err=True)


def _path_values(value: Any) -> list[Path]:
    if isinstance(value, (str, os.PathLike)) and str(value) not in ("", "-"):
        return [Path(value)]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in _path_values(v)]
    return []


def _input_files(p: Path) -> list[Path]:
    """The files tracekit reads for an input path: the file and the manifest beside it; a folder's
    trace files (and its rank subfolders') and manifest. Best effort: never raises."""
    from tracekit.read.files import is_trace_name as _is_trace_name

    try:
        if p.is_file():
            return [p, p.parent / "manifest.json"]
        if p.is_dir():
            out = [p / "manifest.json"]
            for c in p.iterdir():
                if c.is_file() and (_is_trace_name(c.name) or c.name == "manifest.json"):
                    out.append(c)
                elif c.is_dir():
                    out.extend(f for f in c.iterdir() if f.is_file() and _is_trace_name(f.name))
            return out
    except OSError:
        pass
    return []


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(outputs: Mapping[str, Any], inputs: Any) -> None:
    """Refuse, before anything is written, an output that is one of the command's inputs, a file
    an input folder holds (a trace, the manifest), or the cache entry of an input (OutputError, one
    line, nothing written; the input is untouched). `outputs`: option name -> the path(s) it names;
    `inputs`: the command's input paths (any nesting of lists of paths). Reads nothing and creates
    nothing (not even the cache folder)."""
    named = [(opt, out) for opt, value in outputs.items() for out in _path_values(value)]
    named = [(opt, out) for opt, out in named if out.exists()]  # a new file cannot be an input
    if not named:
        return
    from tracekit.errors import OutputError
    from tracekit.read.cache import cache_root, digest_path, entry_name

    files = [f for p in _path_values(inputs) for f in _input_files(p)]
    root = cache_root()
    for opt, out in named:
        hit = next((f for f in files if _same_file(out, f)), None)
        if hit is not None:
            what = "the manifest of an input" if hit.name == "manifest.json" else "an input"
            raise OutputError(
                f"{out}: {opt} names {what} of this command ({hit}): writing would overwrite it; "
                "choose another output file"
            )
        for f in files:
            if f.name == "manifest.json" or not f.is_file():
                continue
            entry = root / entry_name(f)
            if _same_file(out, entry) or _same_file(out, digest_path(entry)):
                raise OutputError(
                    f"{out}: {opt} names the cache entry of the input {f}: choose another output file"
                )


def check_command_outputs(ctx: click.Context) -> None:
    """`check_outputs` for a command about to run: its outputs are the values of its OutputPath
    options, its inputs the values of every other parameter that names a path (tracekit.cli.main
    calls this before each command's body)."""
    outputs: dict[str, object] = {}  # option name -> the path(s) it names
    inputs: list[object] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if value is None:
            continue
        if isinstance(param.type, OutputPath):
            outputs[max(param.opts, key=len) if param.opts else str(param.name)] = value
        else:
            inputs.append(value)
    if outputs:
        check_outputs(outputs, inputs)


_no_cache_flag = click.option(
    "--no-cache", is_flag=True, help="Do not use (or write) the Parquet cache of parsed traces."
)


def _env_for_command(ctx: click.Context, name: str, value: str) -> None:
    """Set environment variable `name` for this command (the environment reaches the reader
    processes); the previous setting comes back when the command ends."""
    before = os.environ.get(name)
    os.environ[name] = value

    def _restore() -> None:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before

    ctx.call_on_close(_restore)


def _set_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Put --max-bytes / --max-events in the environment for this command (it reaches the reader
    processes), checked first; the previous setting comes back when the command ends."""
    if value is None:
        return value
    from tracekit.read import limits

    env = limits.ENV_MAX_BYTES if param.name == "max_bytes" else limits.ENV_MAX_EVENTS
    try:
        limits.parse_size(value, f"--{str(param.name).replace('_', '-')}")
    except limits.LimitError as exc:
        raise click.BadParameter(str(exc)) from None
    _env_for_command(ctx, env, value)
    return value


def _limit_option(name: str, metavar: str, help: str) -> Any:
    """A reading limit (`_set_limit`): put in the environment before the other options are read."""
    return click.option(
        name, default=None, expose_value=False, is_eager=True, callback=_set_limit, metavar=metavar, help=help
    )


_max_bytes_option = _limit_option(
    "--max-bytes",
    "SIZE",
    "Refuse a trace file larger than SIZE once decompressed (default 16G; also TRACEKIT_MAX_BYTES).",
)
_max_events_option = _limit_option(
    "--max-events",
    "N",
    "Refuse a run of more than N events, all its trace files together (default 40M; also "
    "TRACEKIT_MAX_EVENTS).",
)


def no_cache_option(func: Any) -> Any:
    """--no-cache, with the reading limits --max-bytes / --max-events (docs/RELIABILITY.md)."""
    return _no_cache_flag(_max_bytes_option(_max_events_option(func)))


def _set_no_cache(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    """--no-cache for a command whose analysis reads runs deep inside (report): TRACEKIT_NO_CACHE
    for this command (the environment reaches reader processes), the previous setting back after."""
    if value:
        _env_for_command(ctx, "TRACEKIT_NO_CACHE", "1")
    return value


def no_cache_env_option(func: Any) -> Any:
    """--no-cache (through TRACEKIT_NO_CACHE, no value passed) with --max-bytes / --max-events."""
    flag = click.option(
        "--no-cache",
        is_flag=True,
        expose_value=False,
        callback=_set_no_cache,
        help="Do not use (or write) the Parquet cache of parsed traces.",
    )
    return flag(_max_bytes_option(_max_events_option(func)))


def _set_cache_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Point the cache at `value` for this command (the environment carries it to reader processes),
    and put the previous setting back when the command ends."""
    if value:
        _env_for_command(ctx, "TRACEKIT_CACHE_DIR", value)
    return value


cache_dir_option = click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    expose_value=False,
    is_eager=True,
    callback=_set_cache_dir,
    metavar="DIR",
    help="Folder of the Parquet cache of parsed traces (default $XDG_CACHE_HOME/tracekit, else "
    "~/.cache/tracekit; never beside the traces).",
)


def write_text(text: str, out: str | None) -> None:
    """Print `text` to stdout, or write it to `out` and say so on stderr."""
    if out is None:
        click.echo(text, nl=False)
    else:
        from tracekit.errors import OutputError

        ctx = click.get_current_context(silent=True)
        if ctx is not None:  # the command's body may be called without tracekit.cli.main's check
            check_command_outputs(ctx)
        target = Path(out)
        # a regular file is written whole or not at all (a temporary beside it, renamed): a full disk
        # leaves no half file under the name; a device or pipe (/dev/stdout) is written in place
        atomic = not target.exists() or target.is_file()
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}") if atomic else target
        try:
            tmp.write_text(text)
            if atomic:
                os.replace(tmp, target)
        except OSError as exc:
            if atomic:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            raise OutputError(f"{out}: cannot write ({exc.strerror or exc})") from None
        message(f"wrote {out}")


def emit_result(
    out: str | None,
    fmt: str,
    doc: Callable[[], Any],
    table: Callable[[int | None, bool], str],
    *,
    others: Mapping[str, Callable[[], str]] | None = None,
    file_width: int = 120,
) -> None:
    """Write a command's result as its --format asks, to -o/--output or stdout (`write_text`): `json` is
    `doc()` as indented JSON (docs/JSON.md), a format named in `others` its renderer's text (md,
    markdown, csv), any other the table, `table(width, color)`: the terminal's width and colour when
    it prints to a terminal, `file_width` columns and no colour otherwise."""
    if fmt == "json":
        from tracekit.render.writers import json_text  # rich, loaded only by a command that writes

        text = json_text(doc())
    elif others is not None and fmt in others:
        text = others[fmt]()
    else:
        to_terminal = out is None and sys.stdout.isatty()
        text = table(None if out is None else file_width, to_terminal and color_enabled())
    write_text(text, out)


def emit_document(
    out: str | None,
    fmt: str,
    doc: Any,
    document: type,
    view: Any,
    *,
    csv: Callable[[], str] | None = None,
    md: bool = False,
    file_width: int = 120,
) -> None:
    """`emit_result` for a result that is the JSON document `doc` of type `document`
    (tracekit.model.documents) shown by the render module `view`: its `table(typed, width, color)`,
    with `md` its `markdown(typed)`, with `csv` that text for --format csv."""
    from tracekit.model.documents import convert

    def typed() -> Any:
        return convert(doc, document)

    others: dict[str, Callable[[], str]] = {}
    if md:
        others["md"] = lambda: str(view.markdown(typed()))
    if csv is not None:
        others["csv"] = csv
    emit_result(
        out,
        fmt,
        lambda: doc,
        lambda width, color: str(view.table(typed(), width, color)),
        others=others,
        file_width=file_width,
    )


#: --engine, --scheduler, --workers, in the order --help lists them
_ENGINE_OPTIONS = (
    click.option(
        "--engine",
        type=click.Choice(["local", "dask"]),
        default=None,
        help="Where the analysis runs: local (default: this machine, a process pool reads the rank "
        "files of a run of 16 MiB or more) or dask (per-rank tasks on a Dask cluster; the same JSON). "
        "Needs tracekit[dask].",
    ),
    click.option(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="With --engine dask: use the running Dask cluster at ADDRESS (tcp://host:8786).",
    ),
    click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        metavar="N",
        help="With --engine dask: start a local Dask cluster of N worker processes (default: the CPU count).",
    ),
)


def config_of(cls: type[C], params: Mapping[str, Any], **computed: Any) -> C:
    """The dataclass of a command's settings (`CaptureConfig`, `SweepConfig`) from the command's
    parameters of the same names (`click.get_current_context().params`), through
    `model.fields.copy_fields`; `computed`: the fields parsed or renamed from the options. A
    parameter no field has (an output path, a format) is not passed."""
    return copy_fields(cls, SimpleNamespace(**params), **computed)


def engine_options(func: Any) -> Any:
    """--engine, --scheduler, --workers (tracekit.engine): where the analysis runs."""
    for option in reversed(_ENGINE_OPTIONS):  # as stacked decorators: the last applied lists first
        func = option(func)
    return func


@dataclass(frozen=True)
class RunOn:
    """Where an analysis command runs and how it reads its runs: `--engine`, `--scheduler`,
    `--workers` (the engine, built by `engine()`) and `--no-cache` (`cache` False)."""

    kind: str | None = None
    scheduler: str | None = None
    workers: int | None = None
    cache: bool = True

    def engine(self, progress: bool | None = None) -> Engine:
        """The engine the options ask for (EngineError for a contradiction); a progress display
        on stderr when it is a terminal and not -q/--quiet, unless `progress` says."""
        from tracekit.engine import Engine

        return Engine.parse(
            self.kind,
            self.scheduler,
            self.workers,
            progress=show_progress() if progress is None else progress,
        )


def analysis_options(func: Any) -> Any:
    """The options an analysis command ends with, declared once: -o/--output, --no-cache (with
    --max-bytes / --max-events), --cache-dir and --engine / --scheduler / --workers. The command
    receives `out` and `run_on` (a `RunOn`: the engine and the cache) in place of the last four."""

    @functools.wraps(func)
    def call(**kw: Any) -> Any:
        run_on = RunOn(kw.pop("engine"), kw.pop("scheduler"), kw.pop("workers"), cache=not kw.pop("no_cache"))
        return func(run_on=run_on, **kw)

    return out_file_option(no_cache_option(cache_dir_option(engine_options(call))))
