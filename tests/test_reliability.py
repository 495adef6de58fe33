"""Reliability (issue 16): hostile and broken inputs end in one error line naming the file (exit 2)
or in a result whose data_quality counts the problem; never a traceback, a hang or unbounded
memory. Every case here is a row of docs/RELIABILITY.md. Inputs are real traces (traces/,
../shared/traces) damaged in a temporary folder."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tracekit.cli.main import main
from tracekit.errors import TraceFormatError

REPO = Path(__file__).resolve().parents[1]
CPU_TP1 = REPO / "traces" / "cpu-tp1"
CPU_TP2 = REPO / "traces" / "cpu-tp2"

#: every case must answer within this many seconds
CASE_SECONDS = 10.0


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")


def cli_error(capsys: pytest.CaptureFixture[str], argv: list[str], *names: str) -> str:
    """Run the CLI in this process: exit 2, exactly one line on stderr naming each of `names`."""
    capsys.readouterr()
    t0 = time.perf_counter()
    rc = main(argv)
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), err
    for n in names:
        assert n in lines[0], lines[0]
    assert took < CASE_SECONDS
    return lines[0]


def cli_ok(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    """Run `tracekit <argv> --format json`: exit 0; the JSON document."""
    capsys.readouterr()
    t0 = time.perf_counter()
    rc = main([*argv, "--format", "json"])
    took = time.perf_counter() - t0
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert took < CASE_SECONDS
    doc: dict[str, Any] = json.loads(out.out)
    return doc


def dq_counts(doc: dict[str, Any]) -> dict[str, int]:
    dq = doc.get("data_quality") or doc.get("source", {}).get("data_quality") or {}
    return dict(dq.get("counts", dq)) if isinstance(dq, dict) else {}


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        shutil.copy(f, dst / f.name)
    return dst


# ----------------------------------------------------------------------------------------------
# 1. a bad file among several (read in the process pool) is one error line naming that file


def test_format_error_survives_pickling() -> None:
    e = TraceFormatError("/x/rank-1.json", "truncated JSON", offset=12, event_index=3)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is TraceFormatError and str(back) == str(e)
    assert (back.path, back.offset, back.event_index, back.message) == (
        "/x/rank-1.json",
        12,
        3,
        "truncated JSON",
    )


@pytest.mark.parametrize("damage", ["truncated_gz", "junk_json", "empty_json", "symlink_to_non_trace"])
def test_bad_file_in_multi_rank_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    d = copy_run(CPU_TP2, tmp_path / "run")
    if damage == "truncated_gz":
        bad = d / "rank-1.pt.trace.json.gz"
        bad.write_bytes((CPU_TP2 / bad.name).read_bytes()[:5000])
    elif damage == "junk_json":
        bad = d / "notes.json"
        bad.write_text("this is not json\n")
    elif damage == "empty_json":
        bad = d / "rank-2.json"
        bad.write_bytes(b"")
    else:
        target = tmp_path / "passwd.txt"
        target.write_text("root:x:0:0:root:/root:/bin/bash\n")
        bad = d / "rank-2.json"
        os.symlink(target, bad)
    cli_error(capsys, ["breakdown", str(d), "--no-cache"], bad.name)


def test_gzip_of_the_right_name_but_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy_run(CPU_TP2, tmp_path / "run")
    (d / "rank-1.pt.trace.json.gz").write_bytes(gzip.compress(b"\x00\xff" * 1000))
    cli_error(capsys, ["breakdown", str(d), "--no-cache"], "rank-1.pt.trace.json.gz")
