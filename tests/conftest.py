"""Shared test fixtures.

`shared_traces` is the path of the real traces in ../shared/traces (relative to the repo root);
tests using it are skipped with a reason when that folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """Path of ../shared/traces; skips the test when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (../shared/traces relative to the repo root)")
    return SHARED_TRACES


def shared_trace(shared_traces: Path, rel: str) -> Path:
    """One file under ../shared/traces; skips when it is absent."""
    p = shared_traces / rel
    if not p.exists():
        pytest.skip(f"real trace {rel} not found under {shared_traces}")
    return p


@pytest.fixture(scope="session")
def gloo_truth(tmp_path_factory: pytest.TempPathFactory):  # -> tests.gloo_truth.TruthRuns
    """Fresh CPU captures (tp1, a, b, inj) shared by the ground-truth, diff and what-if tests."""
    pytest.importorskip("torch")
    from gloo_truth import capture_truth_runs, shared_truth_runs

    if os.environ.get("PYTEST_XDIST_WORKER"):  # -n auto: one capture for all workers
        shared = tmp_path_factory.getbasetemp().parent / "gloo-truth-shared"
        return shared_truth_runs(shared, tmp_path_factory.mktemp("gloo-truth"))
    return capture_truth_runs(tmp_path_factory.mktemp("gloo-truth"))
