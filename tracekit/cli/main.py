"""The `tracekit` command. Each sub-command lives in its own module `tracekit/cli/<name>.py`
exposing a click command named `command`; modules are imported only when their command runs, so
`tracekit breakdown` never imports torch.

Errors: a `TracekitError` (bad input, impossible request) and a usage error (a bad option value,
an unknown option) become one line on stderr and exit 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import traceback
from typing import Any

import click

from tracekit import __version__
from tracekit.cli.options import common_params, verbose
from tracekit.errors import TracekitError

#: command name -> module under tracekit.cli. Order is the order in `tracekit --help`.
COMMANDS: dict[str, str] = {
    "study": "study",
    "capture": "capture",
    "breakdown": "breakdown",
    "shortfall": "shortfall",
    "diff": "diff",
    "report": "report",
    "probe": "probe",
    "compare-links": "compare_links",
    "dilation": "dilation",
    "decompose": "decompose",
    "advise": "advise",
    "rho": "rho",
    "whatif": "whatif",
    "export": "export",
    "roofline": "roofline",
    "predict": "predict",
}


def _module_exists(module: str) -> bool:
    return importlib.util.find_spec(f"tracekit.cli.{module}") is not None


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, module in COMMANDS.items() if _module_exists(module)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None or not _module_exists(module):
            return None
        cmd: click.Command = importlib.import_module(f"tracekit.cli.{module}").command
        have = {o for p in cmd.params for o in getattr(p, "opts", ())}
        # the vocabulary every command shares: -q/--quiet, -v/--verbose, --no-color (cli/options.py)
        cmd.params.extend(p for p in common_params() if not have & set(p.opts))
        _check_outputs_first(cmd)
        return cmd


def _check_outputs_first(cmd: click.Command) -> None:
    """Every command checks the files it would write against its inputs before its body runs
    (`tracekit.cli.options.check_command_outputs`: an --out naming an input is refused, the input
    untouched). Wrapped once per command object."""
    body = cmd.callback
    if body is None or getattr(body, "_outputs_checked", False):
        return

    def checked(*args: Any, **kwargs: Any) -> Any:
        from tracekit.cli.options import check_command_outputs

        check_command_outputs(click.get_current_context())
        return body(*args, **kwargs)

    checked._outputs_checked = True  # type: ignore[attr-defined]
    checked.__doc__ = body.__doc__
    cmd.callback = checked


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
def cli() -> None:
    """tracekit: where the per-token shortfall of a tensor-parallel decode loop goes.

    \b
    Typical use:
      tracekit study                      # capture TP=1 and TP=2, analyse, write the report
      tracekit breakdown traces/cpu-tp2   # per-step compute/memory/collective/sync/idle
      tracekit shortfall --baseline traces/cpu-tp1 --sharded traces/cpu-tp2
      tracekit diff runs/main runs/pr --fail-if-slower 5   # what moved per token; a CI gate

    \b
    Every command: --format table|json|md|csv (those it writes), -o/--output FILE, results on
    stdout and messages on stderr, -q/--quiet, -v/--verbose, --no-color (or NO_COLOR), -h/--help.
    `python -m tracekit` is the same command.
    """


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input / TracekitError, 1 usage error)."""
    t0 = time.perf_counter()
    try:
        rc = cli.main(args=argv, prog_name="tracekit", standalone_mode=False)
    except TracekitError as exc:
        # a file name that is not UTF-8 (surrogates) is shown escaped, not turned into a traceback
        line = f"tracekit: error: {exc}".encode("utf-8", "backslashreplace").decode("utf-8")
        click.echo(line, err=True)
        if verbose():  # -v: where it was raised, for a bug report (the one line stays first)
            click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("tracekit: aborted", err=True)
        return 130
    except click.UsageError as exc:
        # one line naming the option and the value (was click's usage block of 3-4 lines)
        click.echo(_usage_line(exc), err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    if verbose():
        click.echo(f"tracekit: done in {time.perf_counter() - t0:.2f} s", err=True)
    # without standalone mode click returns the code of an `Exit(n)` (diff --fail-if-slower: 1)
    return rc if isinstance(rc, int) else 0


def _usage_line(exc: click.UsageError) -> str:
    """`tracekit: error: Invalid value for '--out': File '.' is a directory.`, and where to look
    for the options when the mistake is not in a value (an unknown option, a missing argument)."""
    msg = " ".join(exc.format_message().split())
    value_error = isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter)
    if not value_error and exc.ctx is not None:
        msg += f" (see '{exc.ctx.command_path} -h')"
    return f"tracekit: error: {msg}".encode("utf-8", "backslashreplace").decode("utf-8")


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
