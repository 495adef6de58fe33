"""The A/B summary of alternating rounds (tracekit/analyse/ab.py) on simulated rounds whose truth is
known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.analyse.ab import ABError, ab_document


def _rounds(rng: np.random.Generator, speeds: list[float], base_ns: float, n: int) -> list[list[int]]:
    return [[int(base_ns * s + v) for v in rng.normal(0, 0.01 * base_ns, n)] for s in speeds]


def test_the_ratio_interval_holds_the_truth_and_pairing_cancels_drift() -> None:
    rng = np.random.default_rng(1)
    # the host drifts by up to 40% between rounds; B is 20% faster than A in every round
    speeds = [1.0, 1.4, 0.9, 1.2, 1.0, 1.3, 0.95]
    a = _rounds(rng, speeds, 2e6, 31)
    b = _rounds(rng, speeds, 1.6e6, 31)
    doc = ab_document({"A": a, "B": b}, baseline="A").to_json()
    arm = doc["arms"]["B"]
    lo, hi = arm["ratio_interval"]
    assert lo < 0.8 < hi and hi - lo < 0.01  # the pairing: the drift falls on both arms alike
    # each arm's own interval is wide (it carries the drift), far wider than the ratio's
    alo, ahi = doc["arms"]["A"]["interval_ns"]
    assert (ahi - alo) / doc["arms"]["A"]["mean_ns"] > 10 * (hi - lo)
    dlo, dhi = arm["diff_interval_ns"]
    assert dlo < -0.2 * 2e6 * np.mean(speeds) < dhi < 0


def test_no_difference_spans_one() -> None:
    rng = np.random.default_rng(2)
    speeds = [1.0, 1.1, 0.9, 1.05]
    doc = ab_document(
        {"A": _rounds(rng, speeds, 1e6, 20), "B": _rounds(rng, speeds, 1e6, 20)}, baseline="A"
    ).to_json()
    lo, hi = doc["arms"]["B"]["ratio_interval"]
    assert lo < 1.0 < hi


def test_unpaired_rounds_are_refused() -> None:
    with pytest.raises(ABError, match="same number"):
        ab_document({"A": [[1, 2]], "B": [[1], [2]]}, baseline="A")
    with pytest.raises(ABError, match="no arm"):
        ab_document({"A": [[1, 2]]}, baseline="B")
    with pytest.raises(ABError, match="without tokens"):
        ab_document({"A": [[1, 2]], "B": [[]]}, baseline="A")
