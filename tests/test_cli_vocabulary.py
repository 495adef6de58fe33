"""One CLI vocabulary (issue 24): every command's --help shows an example, -o/--output (the old
--out still works, unlisted), --format from table|json|md|csv only, -q/--quiet, -v/--verbose and
--no-color; results go to stdout, messages to stderr; NO_COLOR is honoured; `python -m tracekit`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tracekit.cli.main import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]
CPU_TP1 = REPO / "traces" / "cpu-tp1"
CPU_TP2 = REPO / "traces" / "cpu-tp2"
#: the commands whose result is a file or a folder (all of them) and those with a --format
FORMATS = {"table", "json", "md", "csv"}
NO_FORMAT = {"study", "capture", "report", "export"}  # a folder, a folder, by suffix, Chrome-trace JSON


def _help(capsys: pytest.CaptureFixture[str], name: str) -> str:
    capsys.readouterr()
    assert main([name, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_lists_h_whether_or_not_the_command_ran_on_its_own_first(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """click builds a command's help option once, from the first context it sees: a command run on
    its own (as the tests' CliRunner does, or a script importing it) must not lose `-h` for the
    `tracekit NAME --help` that follows in the same process (it did for shortfall, depending on the
    order the suite ran in)."""
    import importlib

    from click.testing import CliRunner

    cmd = importlib.import_module(f"tracekit.cli.{COMMANDS[name]}").command
    res = CliRunner().invoke(cmd, ["-h"])
    assert res.exit_code == 0 and "-h, --help" in res.output, res.output
    assert "-h, --help" in _help(capsys, name)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_help_speaks_the_one_vocabulary(capsys: pytest.CaptureFixture[str], name: str) -> None:
    text = _help(capsys, name)
    assert re.search(r"^\s*Examples?:", text, re.M), f"{name}: no example in --help"
    assert re.search(rf"^\s+tracekit {re.escape(name)}\b", text, re.M), f"{name}: no example line"
    for opt in ("-o, --output", "-q, --quiet", "-v, --verbose", "--no-color", "-h, --help"):
        assert opt in text, f"{name} --help lacks {opt}"
    # the deprecated spelling is neither listed nor used by an example
    assert not re.search(r"--out\b(?!put)", text), f"{name} --help still shows --out"
    m = re.search(r"--format \[([a-z|]+)\]", text)
    if name in NO_FORMAT:
        assert m is None
    else:
        assert m is not None, f"{name}: no --format"
        assert set(m.group(1).split("|")) <= FORMATS, m.group(1)


def test_python_dash_m_tracekit() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tracekit", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Usage: python -m tracekit" in proc.stdout or "Usage: tracekit" in proc.stdout
    assert "breakdown" in proc.stdout and "--verbose" in proc.stdout


@pytest.mark.parametrize("spelling", ["-o", "--output", "--out"])
def test_output_spellings_write_the_file_and_say_so_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, spelling: str
) -> None:
    out = tmp_path / "d.json"
    capsys.readouterr()
    assert main(["dilation", str(CPU_TP1), "--format", "json", spelling, str(out)]) == 0
    got = capsys.readouterr()
    assert got.out == ""  # the result is in the file
    assert got.err.strip() == f"wrote {out}"
    assert json.loads(out.read_text())[0]["run"] == str(CPU_TP1)


def test_quiet_keeps_stderr_empty_and_verbose_adds_the_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "b.csv"
    capsys.readouterr()
    assert main(["breakdown", str(CPU_TP1), "--no-cache", "--format", "csv", "-o", str(out), "-q"]) == 0
    got = capsys.readouterr()
    assert got.out == "" and got.err == "" and out.read_text().startswith("rank,")
    assert main(["breakdown", str(CPU_TP1), "--no-cache", "--format", "csv", "-o", str(out), "-v"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"wrote {out}" and re.fullmatch(r"tracekit: done in \d+\.\d\d s", err[-1])


def test_verbose_error_keeps_the_one_line_first_then_the_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    capsys.readouterr()
    assert main(["dilation", "/nonexistent-run-folder"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["dilation", str(REPO / "tracekit"), "-v"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("tracekit: error: ") and "no manifest.json" in err[0]
    assert any(ln.startswith("Traceback") for ln in err[1:])


def test_old_format_names_still_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    """`--format text` (advise, decompose) and `markdown` (whatif) were the older names."""
    from tracekit.cli.options import FormatChoice

    choice = FormatChoice(["table", "json", "md"])
    assert choice.convert("text", None, None) == "table"
    assert choice.convert("markdown", None, None) == "md"
    with pytest.raises(Exception, match="csv"):
        choice.convert("csv", None, None)


@pytest.mark.parametrize("how", ["NO_COLOR", "--no-color"])
def test_no_color(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    capsys.readouterr()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # as if printing to a terminal
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["dilation", str(CPU_TP1)]) == 0
    assert "\x1b[" in capsys.readouterr().out  # colour on a terminal by default
    if how == "NO_COLOR":
        monkeypatch.setenv("NO_COLOR", "1")
        assert main(["dilation", str(CPU_TP1)]) == 0
    else:
        assert main(["dilation", str(CPU_TP1), "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out and "dilation" in out
    import os

    assert how == "NO_COLOR" or "NO_COLOR" not in os.environ  # --no-color lasts for its command only


def test_capture_summary_counts_one_file_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary `capture` prints (a message, on stderr) says '1 file', '2 files'."""
    from tracekit.cli.capture import _summary

    wl = {"tp": 1, "device": "cpu", "backend": "gloo", "mode": "cpu"}
    for files, words in ((["rank-0.pt.trace.json.gz"], "1 file,"), (["a", "b"], "2 files,")):
        (tmp_path / "manifest.json").write_text(
            json.dumps({"workload": wl, "files": dict.fromkeys(files, {})})
        )
        capsys.readouterr()
        _summary(tmp_path)
        got = capsys.readouterr()
        assert got.out == "" and f"wrote {tmp_path}: {words}" in got.err, got.err


def _commands() -> dict[str, click.Command]:
    import importlib

    return {name: importlib.import_module(f"tracekit.cli.{mod}").command for name, mod in COMMANDS.items()}


def _options(cmd: click.Command) -> dict[str, click.Option]:
    return {max(p.opts, key=len): p for p in cmd.params if isinstance(p, click.Option)}


#: what every command that runs an analysis on an engine takes (cli/options.analysis_options)
ANALYSIS = (
    "--engine",
    "--scheduler",
    "--workers",
    "--no-cache",
    "--cache-dir",
    "--max-bytes",
    "--max-events",
)


def test_analysis_options_are_one_declaration_on_every_engine_command() -> None:
    """Every command with --engine has the whole analysis set and -o/--output, each spelled, typed
    and explained the same (a command that declared its own copy would drift from the others)."""
    cmds = {n: c for n, c in _commands().items() if "--engine" in _options(c)}
    assert {"breakdown", "shortfall", "diff", "decompose", "whatif", "report", "study"} <= set(cmds)
    for opt in ANALYSIS:
        seen = {
            (tuple(o.opts), type(o.type).__name__, o.help, o.default)
            for o in (_options(c)[opt] for c in cmds.values())
        }
        assert len(seen) == 1, (opt, seen)
    # report writes several files, study a folder of runs and reports: their -o says so
    outputs = {n: _options(c)["--output"] for n, c in cmds.items() if n not in ("report", "study")}
    assert {(tuple(o.opts), o.help) for o in outputs.values()} == {
        (("-o", "--output", "--out"), outputs["shortfall"].help)
    }


def test_attributing_commands_default_to_the_attributions_defaults() -> None:
    """The options `AttributionOptions` holds (built once from a command's flags), as each
    attributing command declares them: a flag left out attributes as the API's keyword left out
    (`--dilation-threshold`'s default is not imported by the CLI: the two must stay equal)."""
    import dataclasses

    from tracekit.analyse.attribution.options import AttributionOptions

    fields = {f.name: f.default for f in dataclasses.fields(AttributionOptions)}
    cmds = _commands()
    taken = {}
    for name in ("shortfall", "diff", "decompose", "whatif"):
        ctx = click.Context(cmds[name])
        got = {p.name: p.get_default(ctx) for p in cmds[name].params if p.name in fields}
        assert got == {k: fields[k] for k in got}, name
        taken[name] = set(got)
    assert taken["shortfall"] == taken["diff"] == set(fields)  # every option, on the pair commands
    assert taken["decompose"] == taken["whatif"] == {"step_pattern", "skip_first"}


def test_probe_and_compare_links_share_their_sweep_options() -> None:
    """`probe` and `compare-links` take the same sweep options under the same parameter names and
    types (declared once: cli/sweep_options.sweep_options); each may change a default or a help text."""
    from tracekit.cli.sweep_options import SWEEP_OPTIONS

    cmds = _commands()
    probe, links = _options(cmds["probe"]), _options(cmds["compare-links"])
    for names, _settings in SWEEP_OPTIONS.values():
        opt = names[0].split("/")[0]  # --graph of --graph/--no-graph
        assert opt in probe and opt in links, opt
        assert probe[opt].name == links[opt].name and type(probe[opt].type) is type(links[opt].type), opt
    assert probe["--output"].opts == links["--output"].opts


@pytest.mark.parametrize(
    "args",
    [
        ["breakdown", str(CPU_TP1)],
        ["shortfall", "--baseline", str(CPU_TP1), "--sharded", str(CPU_TP2)],
        ["diff", str(CPU_TP1), str(CPU_TP1)],
        ["decompose", "--baseline", str(CPU_TP1), "--intermediate", str(CPU_TP1), "--full", str(CPU_TP1)],
        ["whatif", "--baseline", str(CPU_TP1)],
    ],
    ids=lambda a: a[0],
)
def test_engine_options_reach_the_engine(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    """The analysis options are handed to the engine as given: --workers with --engine local is
    refused in one line before any run is read (they would be dropped if the option set lost them)."""
    capsys.readouterr()
    assert main([*args, "--engine", "local", "--workers", "2", "--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--scheduler and --workers apply to --engine dask" in err[0], err


def test_capture_and_probe_options_reach_their_config_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """`capture` and `probe` build their config from the options of the same names
    (`cli.options.config_of`): every option given a value other than its default arrives in the
    config's field, and the parsed ones (sizes, GPUs, --no-calibrate) as parsed. A field dropped on
    the way, or one the helper passed that the command did not mean, fails here."""
    import tracekit.capture.runner as runner
    import tracekit.probe.sweep as sweep

    seen: dict[str, object] = {}

    def fake_capture(config: object, out_dir: Path, progress: object = None) -> Path:
        seen["capture"] = config
        raise click.exceptions.Exit(0)

    def fake_sweep(config: object) -> object:
        seen["probe"] = config
        raise click.exceptions.Exit(0)

    monkeypatch.setattr(runner, "capture", fake_capture)
    monkeypatch.setattr(runner, "check_out_dir", lambda out_dir, force: None)
    monkeypatch.setattr(sweep, "run_sweep_detailed", fake_sweep)
    main(
        ["capture", "--tp", "3", "--tokens", "5", "--rounds", "2", "--seed", "7", "--warmup", "9"]
        + [
            "--inject-delay",
            "1:2.5",
            "--no-calibrate",
            "--decoder-impl",
            "legacy",
            "--compile",
            "-o",
            "/nonexistent",
        ]
    )
    c = seen["capture"]
    assert (c.tp, c.tokens, c.rounds, c.seed, c.warmup) == (3, 5, 2, 7, 9)  # type: ignore[attr-defined]
    assert (c.inject_delay, c.calibrate, c.decoder_impl, c.compile) == ((1, 2.5), False, "legacy", True)  # type: ignore[attr-defined]
    assert c.command.startswith("tracekit capture")  # type: ignore[attr-defined]
    main(["probe", "--op", "all_reduce", "--min", "1K", "--max", "4K", "--iters", "3", "--device", "cpu"])
    p = seen["probe"]
    assert (p.ops, p.min_bytes, p.max_bytes, p.iters, p.device) == (("all_reduce",), 1024, 4096, 3, "cpu")  # type: ignore[attr-defined]
    assert p.mode == "default" and p.env == {}  # type: ignore[attr-defined]  # no option of those names
