"""The pinned JSON documents (scripts/pin_outputs.py, tests/data/output_pins.json; issue 27): a refactor
keeps every committed run's JSON byte-identical. The full check regenerates ~70 documents (minutes);
here every document the script writes must have a pin, and a few of them, through the attribution,
the breakdown and the report, are regenerated and must match theirs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pin_module():
    spec = importlib.util.spec_from_file_location("pin_outputs", ROOT / "scripts" / "pin_outputs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pin_outputs"] = mod
    spec.loader.exec_module(mod)
    return mod


pins_mod = _pin_module()
PINS = json.loads(pins_mod.PINS.read_text())


def test_every_document_written_is_pinned_and_every_pin_written():
    """make_reports.sh's JSON outputs (recorded, not run), the README commands' and the runs'."""
    names = {name for _argv, name in pins_mod.all_commands()}
    assert names == set(PINS["pins"])
    # make_reports.sh's JSON outputs are among them (the recording found its commands)
    assert "reports/h200/report.json" in names and "reports/whatif/h200-tp2.json" in names
    assert PINS["volatile"] == pins_mod.VOLATILE


def test_only_the_reports_top_level_time_and_version_are_masked():
    doc = {
        "manifests": [{"created": "2026-11-29T16:36:17Z"}],
        "title": "t",
        "created": "A",
        "generator": "tracekit 9",
    }
    other = {**doc, "created": "B", "generator": "tracekit 10"}
    text = lambda d: (json.dumps(d, indent=2) + "\n").encode()  # noqa: E731
    assert pins_mod.masked_sha256(text(doc)) == pins_mod.masked_sha256(text(other))
    moved = {**doc, "manifests": [{"created": "2026-11-29T16:36:18Z"}]}  # a capture's time is data
    assert pins_mod.masked_sha256(text(doc)) != pins_mod.masked_sha256(text(moved))
    assert pins_mod.masked_sha256(text({**doc, "title": "u"})) != pins_mod.masked_sha256(text(doc))


@pytest.mark.slow
def test_cpu_and_h200_attribution_and_report_match_their_pins(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    only = ["runs/shortfall/traces_cpu-tp2", "runs/shortfall/traces_h200-tp2.json",
            "runs/breakdown/traces_h200-tp2.json", "reports/cpu-study/report.json"]  # fmt: skip
    shas, failed = pins_mod.regenerate(tmp_path, only)
    assert not failed
    assert len(shas) == 6  # cpu-tp2, -ranges, -straggler; h200-tp2 twice; the CPU report
    assert {n: PINS["pins"][n] for n in shas} == shas


def test_make_reports_writes_each_extra_before_the_report_that_includes_it():
    """A report's `--extra FILE` that make_reports.sh itself regenerates is written by an earlier
    command: else the committed report carries the previous run's figures (reports/h200/report.json
    held the what-if's Shapley terms from before its last regeneration)."""
    written: set[str] = set()
    later: set[str] = {
        argv[i + 1]
        for argv in pins_mod.recorded_commands()
        for i, a in enumerate(argv[:-1])
        if a in pins_mod.OUTPUT_OPTS
    }
    checked = 0
    for argv in pins_mod.recorded_commands():
        for i, a in enumerate(argv[:-1]):
            if a in ("--extra", "--links") and argv[i + 1] in later:
                assert argv[i + 1] in written, f"{argv[i + 1]} is read before make_reports.sh writes it"
                checked += 1
        written |= {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in pins_mod.OUTPUT_OPTS}
    assert checked >= 3  # the two what-if extras and the advice
