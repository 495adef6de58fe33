"""The notebook API (tracekit.api, docs/API.md): `tk.load`, `run.events`, `run.steps()`,
`run.breakdown()`, `tk.shortfall()` give frozen results whose `to_json()` is the CLI's JSON, byte for
byte once parsed, on the committed traces, and whose `to_frame()` holds the same figures."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import tracekit as tk
from tracekit.cli.main import main
from tracekit.errors import NoTracesError
from tracekit.model.events import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
CPU_TP1 = ROOT / "traces" / "cpu-tp1"
CPU_TP2 = ROOT / "traces" / "cpu-tp2"
PARTS = ("compute", "memory", "collective", "unknown", "sync", "idle")


def _cli_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "cli.json"
    assert main([*args, "--format", "json", "--out", str(out), "--no-cache"]) == 0
    return json.loads(out.read_text())


def _roundtrip(doc: dict) -> dict:
    """What the CLI does with a document: json.dumps then (here) parse it back."""
    return json.loads(json.dumps(doc, indent=1))


@pytest.fixture(scope="module")
def tp1() -> tk.TraceRun:
    return tk.load(CPU_TP1, cache=False)


@pytest.fixture(scope="module")
def tp2() -> tk.TraceRun:
    return tk.load(CPU_TP2, cache=False)


@pytest.fixture(scope="module")
def sf(tp1: tk.TraceRun, tp2: tk.TraceRun) -> tk.Shortfall:
    """`tk.shortfall(tp1, tp2)`, made once for the tests that read it (a frozen result)."""
    return tk.shortfall(tp1, tp2)


def test_load_gives_the_event_table_of_every_rank(tp2: tk.TraceRun):
    assert list(tp2.events.columns) == list(COLUMNS)
    assert tp2.ranks == [0, 1]
    assert sorted(tp2.events["rank"].unique()) == [0, 1]
    # the capture's manifest comes with the run folder: a gloo TP=2 run of the tiny preset
    assert tp2.manifest is not None and tp2.manifest.workload and tp2.manifest.workload.tp == 2
    assert {"cls", "subclass"} <= set(tp2.classified.columns)
    assert tp2.classified is tp2.classified  # classified once


def test_breakdown_json_is_the_cli_json(tmp_path: Path, tp2: tk.TraceRun):
    api = tp2.breakdown()
    assert _roundtrip(api.to_json()) == _cli_json(tmp_path, "breakdown", str(CPU_TP2))
    api_skip = tp2.breakdown(skip_first=1, rank=1)
    cli_skip = _cli_json(tmp_path, "breakdown", str(CPU_TP2), "--skip-first", "1", "--rank", "1")
    assert _roundtrip(api_skip.to_json()) == cli_skip
    assert {s["rank"] for s in cli_skip["steps"]} == {1}


def test_breakdown_frame_holds_the_json_steps(tp2: tk.TraceRun):
    b = tp2.breakdown()
    frame, doc = b.to_frame(), b.to_json()
    assert len(frame) == len(doc["steps"]) > 0
    for row, s in zip(frame.itertuples(index=False), doc["steps"], strict=True):
        assert (row.rank, row.step, row.window_ns) == (s["rank"], s["step"], s["window_ns"])
        assert {p: getattr(row, f"{p}_ns") for p in PARTS} == s["parts_ns"]
        assert sum(getattr(row, f"{p}_ns") for p in PARTS) == row.window_ns  # the partition is exact
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.step_pattern = "x"  # type: ignore[misc]


def test_steps_are_the_breakdown_windows(tp2: tk.TraceRun):
    steps = tp2.steps()
    assert steps.step_rule == "decode_step"  # the capture marks each token with decode_step
    frame = steps.to_frame()
    windows = tp2.breakdown().to_frame()
    assert frame[["rank", "step", "window_ns"]].values.tolist() == (
        windows[["rank", "step", "window_ns"]].values.tolist()
    )
    doc = steps.to_json()
    assert doc["kind"] == "tracekit.steps" and len(doc["steps"]) == len(frame)
    # the manifest says how many decode steps each rank ran
    assert tp2.manifest is not None and tp2.manifest.workload
    tokens = tp2.manifest.workload.tokens
    assert frame.groupby("rank").size().tolist() == [tokens, tokens] == [16, 16]


def test_shortfall_json_is_the_cli_json(tmp_path: Path, sf: tk.Shortfall):
    api = sf
    cli = _cli_json(tmp_path, "shortfall", "--baseline", str(CPU_TP1), "--sharded", str(CPU_TP2))
    assert _roundtrip(api.to_json()) == cli
    # paths work as well as loaded runs
    assert _roundtrip(tk.shortfall(CPU_TP1, str(CPU_TP2)).to_json()) == cli


def test_shortfall_options_reach_the_attribution_as_the_cli_flags_do(tmp_path: Path):
    """`tk.shortfall`'s keywords (one `AttributionOptions`, built at the entry) and the CLI's flags
    (another, through the engine): the same document, and both attributions took the options: the
    steady steps are the manifest's decode steps less the 3 skipped, the threshold is the one given."""
    flags = ("--skip-first", "3", "--dilation-threshold", "0.5", "--steps", "decode_step")
    cli = _cli_json(tmp_path, "shortfall", "--baseline", str(CPU_TP1), "--sharded", str(CPU_TP2), *flags)
    api = tk.shortfall(CPU_TP1, CPU_TP2, step_pattern="decode_step", skip_first=3, dilation_threshold=0.5)
    assert _roundtrip(api.to_json()) == cli
    tokens = json.loads((CPU_TP2 / "manifest.json").read_text())["workload"]["tokens"]
    for side in ("baseline", "sharded"):
        assert cli["steps"][side]["pattern"] == "decode_step"
        assert (cli["steps"][side]["total"], cli["steps"][side]["steady"]) == (tokens, tokens - 3)
    assert cli["dilation"]["threshold"] == 0.5


def test_shortfall_frame_sums_to_s(sf: tk.Shortfall):
    doc, frame = sf.to_json(), sf.to_frame()
    terms = frame[frame["parent"] == ""]
    assert terms.set_index("term")["ns"].to_dict() == doc["terms_ns"]
    assert int(terms["ns"].sum()) == doc["shortfall_ns"]  # the terms sum to S exactly
    coord = frame[frame["parent"] == "coordination"]
    assert int(coord["ns"].sum()) == doc["terms_ns"]["coordination"]
    assert doc["per_token_ns"]["sharded"] - doc["per_token_ns"]["ideal"] == doc["shortfall_ns"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        sf.n_ranks = 3  # type: ignore[misc]


def test_load_takes_one_kineto_file_and_nsys_sqlite():
    """One rank file and one (gzipped) nsys export of the project's own captures: one step per
    decoded token, as each capture's manifest says (workload.tokens, step pattern decode_step)."""
    traces = Path(__file__).resolve().parents[1] / "traces"
    for folder, name in (
        ("h200-tp1-graphs-compile", "rank-0.pt.trace.json.gz"),
        ("h200-tp1-nsys", "nsys.sqlite.gz"),
    ):
        wl = json.loads((traces / folder / "manifest.json").read_text())["workload"]
        run = tk.load(traces / folder / name, cache=False)
        assert len(run.steps().table) == wl["tokens"] and run.steps().step_rule == wl["step_pattern"]
        b = run.breakdown()
        assert len(b.to_frame()) == wl["tokens"]
        assert b.to_json()["kernels_by_class"]["compute"]["count"] >= wl["tokens"]


def test_load_errors_are_the_readers(tmp_path: Path):
    with pytest.raises(NoTracesError):
        tk.load(tmp_path / "nothing-here")
    with pytest.raises(NoTracesError):
        tk.load()


def test_results_show_short_in_a_notebook(sf: tk.Shortfall, tp2: tk.TraceRun):
    """Issue 24: repr() of a Shortfall was 33,642 characters and there was no _repr_html_."""
    import html as _html

    doc = sf.to_json()
    text = repr(sf)
    assert len(text) < 300 and "\n" not in text
    assert f"S = {doc['shortfall_ns'] / 1e6:.3f} ms" in text
    page = sf._repr_html_()
    assert _html.escape(doc["verdict"], quote=True) in page  # the verdict, escaped, then the terms
    for term, ns in {**doc["terms_ns"], **doc["coordination_ns"]}.items():
        assert f"<td>{term}</td><td class=num>{ns / 1e6:.3f} ms</td>" in page.replace(
            "<td class=sub>", "<td>"
        )
    b = tp2.breakdown()
    assert len(repr(b)) < 300 and "32 step windows" in repr(b)  # 16 tokens x 2 ranks
    assert "<table>" in b._repr_html_() and "idle" in b._repr_html_()
    assert repr(tp2.steps()) == "Steps(32 windows on ranks [0, 1], rule decode_step, pattern 'decode_step')"


def test_tab_completion_offers_the_api():
    names = dir(tk)
    assert {"load", "shortfall", "TraceRun", "Steps", "Breakdown", "Shortfall", "profile"} <= set(names)
    assert "Any" not in names  # a typing import is not the API


def test_frames_carry_relative_milliseconds(tp2: tk.TraceRun):
    for frame in (tp2.steps().to_frame(), tp2.breakdown().to_frame()):
        t0 = frame["start_ns"].min()
        assert frame["start_ms"].min() == 0.0
        assert ((frame["start_ns"] - t0) / 1e6 - frame["start_ms"]).abs().max() == 0.0
        assert (frame["window_ms"] * 1e6 - frame["window_ns"]).abs().max() < 1e-3
        assert frame["start_ms"].max() < 60_000  # ms into the run, not an epoch
