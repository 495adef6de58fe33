"""`tracekit study` for real on this CPU (gloo, tiny preset, few tokens): it captures TP=1 and TP=2,
analyses them and writes the report, whose verdict and numbers are the shortfall's."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tracekit.cli.main import main

pytestmark = pytest.mark.slow


class _Tree(HTMLParser):
    """The page's body as its children in order (tag, attrs, that element's own children (tag,
    attrs)); void elements hold none."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self) -> None:
        super().__init__()
        self.top: list[tuple[str, dict[str, str | None], list[tuple[str, dict[str, str | None]]]]] = []
        self.depth = -1  # -1 outside <body>; 0 directly inside it

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.depth = 0
            return
        if self.depth < 0:
            return
        if self.depth == 0:
            self.top.append((tag, dict(attrs), []))
        elif self.depth == 1:
            self.top[-1][2].append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "body":
            self.depth = -1
        elif self.depth > 0 and tag not in self.VOID:
            self.depth -= 1


def _body_children(
    page: str,
) -> list[tuple[str, dict[str, str | None], list[tuple[str, dict[str, str | None]]]]]:
    tree = _Tree()
    tree.feed(page)
    return tree.top


#: the configuration of each capture the study below asked for, in the order it asked (the real
#: captures, recorded on their way: `study` fixture)
ASKED: list = []


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("study")
    import contextlib
    import io

    import tracekit.capture.runner as runner
    import tracekit.pipeline.study as pipeline_study

    real = runner.capture

    def recorded(config, *args, **kwargs):  # the real capture, its configuration noted
        ASKED.append(config)
        return real(config, *args, **kwargs)

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "capture", recorded)
        mp.setattr(pipeline_study, "capture", recorded)  # the name the study imported at its top
        # 4 rounds per degree (2 per block): the default 8 (test_the_default_study_is_8_rounds_in_2_blocks)
        # cost 8 more measured rounds and prove the same interleaving
        rc = main(["study", "--tokens", "4", "--rounds", "4", "--device", "cpu", "--quiet", "-o", str(out)])
    assert rc == 0, buf.getvalue()
    return out, buf.getvalue()


def test_study_writes_runs_analyses_and_reports(study):
    out, stdout = study
    for tp in (1, 2):
        manifest = json.loads((out / f"tp{tp}" / "manifest.json").read_text())
        assert manifest["complete"] is True and manifest["workload"]["tp"] == tp
        assert manifest["workload"]["preset"] == "tiny" and manifest["workload"]["device"] == "cpu"
        assert len(list((out / f"tp{tp}").glob("rank-*.pt.trace.json.gz"))) == tp
        assert json.loads((out / f"breakdown-tp{tp}.json").read_text())["kind"] == "tracekit.breakdown"
    assert (out / "tp2" / "manifest.json").exists()
    for suffix in ("html", "md", "json"):
        assert (out / f"report.{suffix}").stat().st_size > 1000
        assert f"report: {out / f'report.{suffix}'}" in stdout
    assert "link comparison skipped" in stdout  # no GPUs here
    # the diagnosis (what to look at next) is printed under the verdict
    sf = json.loads((out / "shortfall-tp2.json").read_text())
    assert sf["diagnosis"] and f"Next: {sf['diagnosis']}" in stdout


def test_study_verdict_and_numbers_are_the_shortfalls(study):
    out, stdout = study
    sf = json.loads((out / "shortfall-tp2.json").read_text())
    rep = json.loads((out / "report.json").read_text())
    page = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    assert sf["verdict"] and rep["verdict"] == sf["verdict"]
    md_text = re.sub(r"\\(.)", r"\1", md)  # Markdown backslash escapes removed
    from tracekit.report.sections.fmt import prose

    # the pages print the verdict as prose (code spans lose their backticks), stdout as it is
    shown = prose(sf["verdict"])
    assert html.escape(shown) in page and shown in md_text and sf["verdict"] in stdout
    assert rep["headline"] and html.escape(prose(rep["headline"])) in page
    assert rep["per_token_ns"] == sf["per_token_ns"]
    assert rep["attribution"]["shortfall_ns"] == sf["shortfall_ns"]
    assert rep["attribution"]["terms_ns"] == sf["terms_ns"]

    # S = TN - T1/N and the waterfall sums to it exactly (docs/METHOD.md section Shortfall attribution)
    pt = sf["per_token_ns"]
    assert abs(pt["ideal"] - pt["baseline"] / 2) <= 1
    assert abs(sf["shortfall_ns"] - (pt["sharded"] - pt["ideal"])) <= 1
    assert sum(w["ns"] for w in rep["attribution"]["waterfall"]) == sf["shortfall_ns"]
    # the dilation of each run is carried and stated next to the verdict (issue 9)
    dil = {d["run"]: d["dilation"] for d in rep["dilation"]["runs"]}
    assert dil["baseline"] == pytest.approx(sf["dilation"]["baseline"])
    assert dil["sharded"] == pytest.approx(sf["dilation"]["sharded"])
    for run, d in dil.items():
        assert f"{run} {d:.2f}x" in rep["dilation"]["sentence"]
    assert rep["dilation"]["sentence"] in md
    assert rep["diagnosis"] == sf["diagnosis"] and (not sf["diagnosis"] or prose(sf["diagnosis"]) in md_text)
    # read by the page's structure: the verdict, the diagnosis, the caution paragraph (only when a
    # dilation is below 1 - threshold: a noisy host), then the dilation folded under one line
    top = _body_children(page)
    at = next(i for i, (_tag, attrs, _kids) in enumerate(top) if attrs.get("id") == "verdict")
    after = [(tag, attrs.get("id") or attrs.get("class")) for tag, attrs, _kids in top[at + 1 : at + 4]]
    if sf["diagnosis"]:
        assert after.pop(0) == ("p", "diagnosis")
    low = [d for d in rep["dilation"]["runs"] if d["dilation"] is not None and d["dilation"] < 1 - 0.10]
    if low:
        assert after.pop(0) == ("p", "dilation-caution")
        assert rep["dilation"]["caution"] and html.escape(prose(rep["dilation"]["caution"])) in page
    else:
        assert rep["dilation"]["caution"] is None and 'id="dilation-caution"' not in page
    assert after[0] == ("details", "dilation-details")
    kids = next(k for tag, attrs, k in top if attrs.get("id") == "dilation-details")
    assert [(t, a.get("class")) for t, a in kids[:2]] == [("summary", None), ("p", "dilation")]
    # both runs' per-step parts, rank by rank, each step's parts summing to its window
    assert [r["role"] for r in rep["runs"]] == ["baseline", "sharded"]
    assert {s["rank"] for s in rep["runs"][1]["steps"]} == {0, 1}
    assert all(sum(s["parts_ns"].values()) == s["window_ns"] for r in rep["runs"] for s in r["steps"])
    # the HTML and the Markdown print the same key figures
    h = {k: html.unescape(v) for k, v in re.findall(r'data-key="([^"]+)">([^<]*)</td>', page)}
    m = {k: v for v, k in re.findall(r"^\| [^|]+ \| ([^|]+) \| `([^`]+)` \|$", md, flags=re.M)}
    assert h == m and "shortfall" in h
    assert h["shortfall"] == f"{sf['shortfall_ns'] / 1e6:.3f} ms"


def test_report_cli_on_the_study_runs_agrees_with_the_study(study, tmp_path: Path):
    out, _ = study
    links = tmp_path / "links.json"
    # probe rows of the shape `tracekit probe --format json` writes (a real gloo row's fields)
    real_row = json.loads((Path(__file__).parent / "data" / "probe-cpu-gloo.json").read_text())[0]
    links.write_text(
        json.dumps(
            [
                real_row
                | {"op": "all_reduce", "ranks": 2, "bytes": b, "busbw_gbps": b / 1e4, "mode": "default"}
                for b in (8, 1024, 65536)
            ]
        )
    )
    outs = [tmp_path / "r.json", tmp_path / "r.md"]
    rc = main(
        ["report", str(out / "tp2"), "--baseline", str(out / "tp1"), "--links", str(links)]
        + sum((["-o", str(o)] for o in outs), [])
    )
    assert rc == 0
    mine = json.loads(outs[0].read_text())
    study_rep = json.loads((out / "report.json").read_text())
    # the analyses are deterministic given the traces: the same attribution and verdict
    assert mine["verdict"] == study_rep["verdict"]
    assert mine["attribution"]["terms_ns"] == study_rep["attribution"]["terms_ns"]
    assert [p["bytes"] for p in mine["busbw"]["probes"][0]["points"]] == [8, 1024, 65536]
    # breakdown-only: the verdict comes from the breakdown's step median
    rc = main(["report", str(out / "tp2"), "-o", str(tmp_path / "b.json")])
    assert rc == 0
    b = json.loads((tmp_path / "b.json").read_text())
    bd = json.loads((out / "breakdown-tp2.json").read_text())
    assert b["attribution"] is None
    assert b["per_token_ns"]["sharded"] == bd["per_token"]["step_ns"]["median"]
    assert b["verdict"].startswith(
        f"Per token {bd['per_token']['step_ns']['median'] / 1e6:.3f} ms on 2 rank(s)"
    )


def test_study_refuses_to_replace_an_earlier_study_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like `capture`: a non-empty output folder is replaced only with --force; refused before
    anything runs (nothing captured, the folder untouched)."""

    out = tmp_path / "study"
    out.mkdir()
    (out / "report.md").write_text("an earlier study")
    capsys.readouterr()
    assert main(["study", "-o", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "holds an earlier study" in lines[0] and "--force" in lines[0]
    assert [p.name for p in out.iterdir()] == ["report.md"] and (
        out / "report.md"
    ).read_text() == "an earlier study"


def test_the_default_study_folder_is_ignored_by_git() -> None:
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(
        ["git", "check-ignore", "-q", "reports/study/report.html"], cwd=root, capture_output=True
    )
    assert proc.returncode == 0  # `tracekit study` writes there by default


def test_the_default_study_is_8_rounds_in_2_blocks() -> None:
    """What `tracekit study` runs when not told: 8 measured rounds per degree in 2 alternating
    blocks (the CLI's defaults are the pipeline's)."""
    from tracekit.cli.study import command
    from tracekit.pipeline.study import StudyConfig

    defaults = {p.name: p.default for p in command.params}
    assert (defaults["rounds"], defaults["blocks"]) == (8, 2)
    assert (StudyConfig().rounds, StudyConfig().blocks) == (8, 2)


def test_study_interleaves_the_degrees_and_pairs_their_rounds(study):
    # 4 rounds per degree in the default 2 blocks, TP=1, TP=2, TP=1, TP=2; the merged manifests
    # hold every round in run order (the traced one last) and one interleaving group, and the
    # shortfall's intervals draw the two runs' rounds as pairs
    out, _ = study
    m1, m2 = (json.loads((out / f"tp{tp}" / "manifest.json").read_text()) for tp in (1, 2))
    for m in (m1, m2):
        il = m["workload"]["interleaved"]
        assert il["blocks"] == 2 and il["rounds_per_block"] == 2
        assert il["order"] == ["TP=1 block 1", "TP=2 block 1", "TP=1 block 2", "TP=2 block 2"]
        assert len(m["profiled"]["rounds"]) == len(m["unprofiled"]["rounds"]) == 4
        assert m["profiled"]["traced_round"] == 3 and m["workload"]["pass_order"] == "UP" * 4
        assert m["workload"]["rounds"] == 4
    assert m1["workload"]["interleaved"]["group"] == m2["workload"]["interleaved"]["group"]
    # four captures, in that order; only the last block of each degree calibrates the profiler
    # (the merged manifest is that block's: an earlier block's calibration would be dropped)
    assert [(c.tp, c.rounds, c.calibrate) for c in ASKED] == [
        (1, 2, False),
        (2, 2, False),
        (1, 2, True),
        (2, 2, True),
    ]
    for m in (m1, m2):
        assert set(m["profiler_calibration"]["per_call_ns"]) >= {"op", "range"}
    sf = json.loads((out / "shortfall-tp2.json").read_text())
    assert sf["intervals"]["paired"] is True and sf["intervals"]["rounds"] == {"baseline": 4, "sharded": 4}
    # the verdict names a cause only when its interval excludes zero, or says the run was too noisy
    rd = sf["noise"]
    if rd["status"] == "attributed":
        assert rd["terms"][rd["cause"]]["interval"][0] > 0
    elif rd["status"] == "unsettled":  # S and several terms clear of zero, none the largest in 95% of
        # the resamples (a noisy host's capture may read so; tracekit/analyse/noise.py): none named,
        # the candidates listed, each a finding
        assert rd["cause"] is None and rd["named"] is False and rd["candidates"]
        assert rd["shortfall"]["interval"][0] > 0
        assert all(rd["terms"][c["term"]]["interval"][0] > 0 for c in rd["candidates"])
    else:
        assert rd["status"] in ("too_noisy", "unattributed")


def test_a_cpu_study_shows_the_real_gpu_finding_beside_its_own(study):
    """Issue 24: on a machine without GPUs the first thing a newcomer reads is the committed two-H200
    finding: coordination dominates the eager decode, compute that does not shrink the CUDA-graph one.
    Read from the study's own output (tracekit.pipeline.study.gpu_reference_verdicts, printed after
    the CPU run's verdict), not computed a second time."""
    _, stdout = study
    intro = "The verdict above is this machine's CPU (gloo) run. On real GPUs (committed traces):\n"
    assert intro in stdout, stdout[-2000:]
    lines = stdout.split(intro, 1)[1].splitlines()
    labels = [ln[2:].split(":")[0] for ln in lines if ln.startswith("- ")]
    verdicts = [ln.strip() for ln in lines if ln.startswith("  ")]
    assert labels == [
        "2x H200, eager decode (7b shape, 8 layers, batch 1)",
        "2x H200, CUDA-graph decode (host out of the way)",
    ]
    assert len(verdicts) == 2
    assert verdicts[0].startswith("Coordination holds this run back")
    assert verdicts[1].startswith("Compute holds this run back")


def test_study_takes_the_engine_options_of_every_analysis_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`study --engine / --scheduler / --workers` (cli.options.engine_options, as breakdown and
    shortfall take them) reach `run_study` as the engine its analyses run on, without the
    engine's own progress display (the study shows one); a contradiction is a one-line error
    before anything is captured."""
    import click

    import tracekit.pipeline.study as pipeline
    from tracekit.engine import Engine

    got: list[Engine | None] = []

    def recorded(config, out_dir, progress=None, engine=None):  # noqa: ANN001, ANN202
        got.append(engine)
        raise click.exceptions.Exit(0)

    monkeypatch.setattr(pipeline, "run_study", recorded)
    out = tmp_path / "s"
    assert main(["study", "--quiet", "-o", str(out), "--scheduler", "tcp://127.0.0.1:8786"]) == 0
    assert main(["study", "--quiet", "-o", str(out), "--engine", "dask", "--workers", "3"]) == 0
    assert main(["study", "--quiet", "-o", str(out)]) == 0
    assert got == [
        Engine(kind="dask", scheduler="tcp://127.0.0.1:8786", progress=False),
        Engine(kind="dask", workers=3, progress=False),
        Engine(kind="local", progress=False),
    ]
    capsys.readouterr()
    assert main(["study", "-o", str(out), "--engine", "local", "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--engine dask" in err[0], err
    assert len(got) == 3 and not out.exists()


def test_the_study_view_says_verdict_next_dilation_notes_reports_then_the_gpu_finding(tmp_path: Path) -> None:
    """`render.study.text`, the lines `tracekit study` ends with, in the order a reader acts on
    them: the verdict, what to look at next (only when there is a diagnosis), the dilation and its
    warning (only when there is one), the notes, the reports, the plotly note; the committed GPU
    verdicts last, each under its label, only when given (a CPU machine)."""
    from tracekit.pipeline.study import StudyResult
    from tracekit.render.study import text

    res = StudyResult(
        out_dir=tmp_path, verdict="V.", dilation_sentence="D.", dilation_warning=None, run_dirs={},
        reports=[tmp_path / "report.html"], notes=["n1"], diagnosis="",
    )  # fmt: skip
    assert text(res).splitlines() == ["", "V.", "D.", "note: n1", f"report: {tmp_path / 'report.html'}"]
    warned = StudyResult(
        out_dir=tmp_path, verdict="V.", dilation_sentence="D.", dilation_warning="W!", run_dirs={},
        reports=[], diagnosis="look at X",
    )  # fmt: skip
    assert text(warned, "no bundle", [("eager, TP=2", "G1."), ("graphs", "G2.")]).splitlines() == [
        "", "V.", "Next: look at X", "D.", "W!", "note: no bundle", "",
        "The verdict above is this machine's CPU (gloo) run. On real GPUs (committed traces):",
        "- eager, TP=2", "  G1.", "- graphs", "  G2.",
    ]  # fmt: skip
