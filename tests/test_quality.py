"""ruff (lint) and mypy (types) are part of the checks: the README's test command runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_finds_nothing() -> None:
    result = _run("ruff", "check", "tracekit", "tests", "benchmarks", "examples", "cli.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing() -> None:
    result = _run("mypy", "--no-error-summary")
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_ruff_formatted() -> None:
    result = _run("ruff", "format", "--check", "tracekit", "tests", "benchmarks", "examples", "cli.py")
    assert result.returncode == 0, result.stdout + result.stderr
