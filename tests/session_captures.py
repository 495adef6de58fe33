"""CPU captures taken once per test session and shared by the files that check the same run.

A capture costs seconds of CPU whatever its length (two rank processes, forked from the worker's
fork server once it has imported torch (tracekit.capture.starter), join a gloo group, calibrate and
start the profiler: the calibration alone ~8 of a warm TP=2 capture's ~10 s wall on the loaded
2-core VM), so files that check different things of one run share it: `SessionCaptures.get(name, cfg)` (through the `session_captures` fixture) captures `cfg` with
`tracekit.capture.runner.capture` the first time any worker asks for `name`, recording the progress
reports, and hands every later caller the same folder; `SessionCaptures.cli(name, argv)` does the
same for `python -m tracekit capture ARGV -o FOLDER` run as a user runs it, keeping its exit status,
stdout and stderr. Under pytest-xdist the folder is one every worker of the session sees, and each
name has its own lock: the first worker to ask captures while the others wait for that name only.
A folder whose record is missing or whose manifest is incomplete (a worker that died mid-capture) is
captured again. The same name must always be asked for with the same configuration (checked).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: tp=2 on gloo, 3 alternating rounds of 5 tokens after a 1-token warm-up: the run of the rounds
#: checks (tests/test_capture_rounds.py: passes, manifest, trace), of the dilation's pooling
#: (tests/test_dilation_rounds.py) and the footprint the full-disk test sizes its tmpfs from
#: (tests/test_reliability_faults.py)
ROUNDS_TP2 = {"tp": 2, "tokens": 5, "warmup": 1, "device": "cpu", "rounds": 3}

#: tp=2 on gloo, rank 1 sleeping 20 ms before each all-reduce, 4 tokens, one round, no profiler
#: calibration (8 of the ~10 s on the loaded 2-core VM; CLI_TP2 calibrates): the capture's
#: --inject-delay checked as captured now (tests/test_capture.py); the analyses' ground truth
#: reads the committed injected runs instead (tests/gloo_truth.py)
INJ_TP2: dict[str, Any] = {
    "tp": 2,
    "preset": "tiny",
    "tokens": 4,
    "warmup": 1,
    "backend": "gloo",
    "device": "cpu",
    "rounds": 1,
    "inject_delay": [1, 20.0],
    "calibrate": False,
}

#: TP=1, 3 tokens, one round, mode ranges, --inject-sync, as a user runs it: ranges mode's trace
#: (tests/test_capture.py) and --rounds 1's structure (tests/test_capture_rounds.py), one capture
CLI_TP1_RANGES_R1 = [
    "capture",
    "--tp",
    "1",
    "--tokens",
    "3",
    "--warmup",
    "1",
    "--device",
    "cpu",
    "--rounds",
    "1",
    "--mode",
    "ranges",
    "--inject-sync",
    "--quiet",
]

#: the CLI's TP=2 capture of tests/test_capture.py (8 tokens, the default 7 rounds), as a user runs
#: it: its files, manifest and collectives are checked there, and its stderr for the profiler's lines
CLI_TP2 = ["capture", "--tp", "2", "--preset", "tiny", "--tokens", "8", "--warmup", "2", "--device", "cpu"]


@dataclass(frozen=True)
class Captured:
    path: Path  # the capture's folder (shared: do not edit, copy it first)
    progress: list[tuple[str, int, int]]  # the progress reports, in order (get only)
    returncode: int = 0  # cli only
    stdout: str = ""  # cli only
    stderr: str = ""  # cli only


def _complete(path: Path) -> bool:
    try:
        return bool(json.loads((path / "manifest.json").read_text()).get("complete"))
    except (OSError, ValueError, AttributeError):
        return False


class SessionCaptures:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _once(self, name: str, what: dict[str, Any], take: Any) -> Captured:
        record = self.root / f"{name}.json"
        with open(self.root / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            doc = json.loads(record.read_text()) if record.exists() else None
            if doc is not None:
                assert doc["what"] == what, f"session capture {name!r} asked for with two configurations"
                if doc.get("returncode", 0) == 0 and not _complete(Path(doc["path"])):
                    doc = None
            if doc is None:
                record.unlink(missing_ok=True)
                out = self.root / name
                shutil.rmtree(out, ignore_errors=True)
                doc = {"what": what, "path": str(out), **take(out)}
                tmp = self.root / f"{name}.json.tmp"
                tmp.write_text(json.dumps(doc))
                os.replace(tmp, record)
        return Captured(
            Path(doc["path"]),
            [tuple(p) for p in doc.get("progress", [])],  # type: ignore[misc]
            doc.get("returncode", 0),
            doc.get("stdout", ""),
            doc.get("stderr", ""),
        )

    def get(self, name: str, cfg: dict[str, Any]) -> Captured:
        """`capture(CaptureConfig(**cfg), folder)`, once per session."""

        def take(out: Path) -> dict[str, Any]:
            from tracekit.capture.runner import CaptureConfig, capture

            seen: list[tuple[str, int, int]] = []
            capture(
                CaptureConfig(**cfg),
                out,
                progress=lambda phase, done, total: seen.append((phase, done, total)),
            )
            return {"progress": seen}

        return self._once(name, {"cfg": cfg}, take)

    def cli(self, name: str, argv: list[str]) -> Captured:
        """`python -m tracekit ARGV -o FOLDER` in a fresh interpreter, once per session."""

        def take(out: Path) -> dict[str, Any]:
            proc = subprocess.run(
                [sys.executable, "-m", "tracekit", *argv, "-o", str(out)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}

        return self._once(name, {"argv": argv}, take)


# -- added by the capture tests' time pass (issue 24) ----------------------------------------------
#: the CLI's TP=2 capture of tests/test_capture.py as a user types it, shorter than CLI_TP2: 4 tokens,
#: the default 7 rounds, no profiler calibration (--no-calibrate: ~4 of its ~9 CPU-s). Its files,
#: manifest, collectives and stderr are checked there; the calibration on ROUNDS_TP2 (calibrated,
#: and taken for the rounds files anyway)
CLI_TP2_SHORT = [
    "capture",
    "--tp",
    "2",
    "--preset",
    "tiny",
    "--tokens",
    "4",
    "--warmup",
    "1",
    "--device",
    "cpu",
    "--no-calibrate",
]


def cli_here(captures: SessionCaptures, name: str, argv: list[str]) -> Captured:
    """`tracekit ARGV -o FOLDER` once per session as `SessionCaptures.cli` runs it, but in this
    process (tracekit.cli.main.main) rather than a fresh interpreter: the ranks fork from this
    process' fork server, which has imported torch already (a fresh interpreter's server imports it
    again, ~3 CPU-s). Its stdout and stderr are those of the fds 1 and 2 the ranks are started with
    (tracekit.capture.starter), so what the ranks print is kept too, as a terminal would show it."""
    import contextlib
    import io
    import tempfile

    def take(out: Path) -> dict[str, Any]:
        from tracekit.cli.main import main

        got: dict[str, Any] = {}
        with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
            saved = os.dup(1), os.dup(2)
            py_out = io.TextIOWrapper(open(os.dup(fo.fileno()), "wb"), write_through=True)
            py_err = io.TextIOWrapper(open(os.dup(fe.fileno()), "wb"), write_through=True)
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(fo.fileno(), 1)
                os.dup2(fe.fileno(), 2)
                with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                    got["returncode"] = main([*argv, "-o", str(out)])
            finally:
                py_out.close()
                py_err.close()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            for key, f in (("stdout", fo), ("stderr", fe)):
                f.seek(0)
                got[key] = f.read().decode("utf-8", "replace")
        return got

    return captures._once(name, {"argv_here": argv}, take)
