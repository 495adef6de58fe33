"""The dilation over rounds (issue 12, item 4): one definition (mean ratio), pooled rounds, an interval.

Real data: the committed traces' manifests (captured before rounds: one round of each kind) and a
fresh CPU capture with `--rounds 3`. The expected figures are computed here from the manifest's
lists with plain Python, independently of tracekit.analyse.dilation.
"""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tracekit.analyse.dilation import bootstrap_interval, dilation_of, token_times
from tracekit.cli.dilation import command as dilation_command
from tracekit.model.documents import Manifest
from tracekit.read.manifests import manifest_from_json

#: tokens per round of the fresh capture (tests/session_captures.py ROUNDS_TP2)
TOKENS = 5

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(
    d
    for d in (REPO / "traces").iterdir()
    if (d / "manifest.json").is_file()
    and "rounds" not in json.loads((d / "manifest.json").read_text())["unprofiled"]
)


def _typed(doc: dict[str, Any]) -> Manifest:
    """A manifest's JSON object read as the reader reads manifest.json (no field left out here)."""
    read = manifest_from_json(doc)
    assert read.notes == []
    return read.manifest


def _pooled(block: dict[str, Any], skip: int = 1) -> list[int]:
    """By hand: the rounds (or the one per_token_ns), per token the slowest rank, `skip` dropped."""
    rounds = block.get("rounds") or [block["per_token_ns"]]
    out: list[int] = []
    for rnd in rounds:
        n = min(len(v) for v in rnd.values())
        out += [max(v[i] for v in rnd.values()) for i in range(skip, n)]
    return out


def _width(iv: tuple[float, float] | None) -> float:
    assert iv is not None
    return iv[1] - iv[0]


def test_there_are_committed_old_manifests() -> None:
    assert len(COMMITTED) >= 5


@pytest.mark.parametrize("run", COMMITTED, ids=[d.name for d in COMMITTED])
def test_old_manifests_are_one_round_and_the_figure_is_the_mean_ratio(run: Path) -> None:
    m = json.loads((run / "manifest.json").read_text())
    d = dilation_of(_typed(m))
    tokens = min(len(v) for v in m["profiled"]["per_token_ns"].values())
    assert d.rounds == {"unprofiled": 1, "profiled": 1}
    assert d.unprofiled is not None and d.profiled is not None
    assert d.profiled.n == tokens - 1  # one round: pooled n = 1 x (tokens - 1)
    u, p = _pooled(m["unprofiled"]), _pooled(m["profiled"])
    assert d.dilation == pytest.approx(statistics.mean(p) / statistics.mean(u), rel=1e-12)
    assert d.interval is not None and d.interval[0] <= d.dilation <= d.interval[1]
    # the shortfall's reconciliation uses the same pooled unprofiled mean
    assert float(d.unprofiled.mean_ns) == pytest.approx(statistics.mean(u))
    doc = d.to_json()
    assert doc["interval"] == list(d.interval) and doc["rounds"] == {"unprofiled": 1, "profiled": 1}


def test_old_manifests_load_in_the_cli_with_one_round_each() -> None:
    res = CliRunner().invoke(dilation_command, [str(d) for d in COMMITTED] + ["--format", "json"])
    assert res.exit_code == 0, res.output
    docs = json.loads(res.output)
    assert len(docs) == len(COMMITTED)
    for doc in docs:
        assert doc["rounds"] == {"unprofiled": 1, "profiled": 1}
        lo, hi = doc["interval"]
        assert lo <= doc["dilation"] <= hi


@pytest.fixture(scope="module")
def rounds_manifest(session_captures: Any) -> tuple[Path, dict[str, Any]]:
    """A fresh tp=2 capture of 3 rounds of 5 tokens (the session's, shared with
    tests/test_capture_rounds.py) and its manifest."""
    from session_captures import ROUNDS_TP2

    assert (ROUNDS_TP2["tokens"], ROUNDS_TP2["rounds"]) == (TOKENS, 3)
    out = session_captures.get("rounds-tp2", ROUNDS_TP2).path
    return out, json.loads((out / "manifest.json").read_text())


@pytest.mark.slow
def _slowest_tokens(round_doc: dict) -> list[int]:
    """One round {rank: [ns, ...]}: per token the slowest rank, the first token (warm-up) dropped."""
    lists = list(round_doc.values())
    n = min(len(v) for v in lists)
    return [max(v[i] for v in lists) for i in range(n)][1:]


def test_fresh_rounds_are_pooled(rounds_manifest) -> None:
    _, m = rounds_manifest
    d = dilation_of(_typed(m))
    assert d.rounds == {"unprofiled": 3, "profiled": 3}
    assert d.unprofiled.n == d.profiled.n == 3 * (TOKENS - 1)  # rounds x (tokens - 1)
    assert len(d.unprofiled.rounds) == 3 and all(len(r) == TOKENS - 1 for r in d.unprofiled.rounds)
    u, p = _pooled(m["unprofiled"]), _pooled(m["profiled"])
    assert list(d.unprofiled.per_token_ns) == u and list(d.profiled.per_token_ns) == p
    # three pairs: the median of the per-pair ratios mean(P_k) / mean(U_k), by hand
    pairs = [
        statistics.mean(_slowest_tokens(pk)) / statistics.mean(_slowest_tokens(uk))
        for uk, pk in zip(m["unprofiled"]["rounds"], m["profiled"]["rounds"], strict=True)
    ]
    assert d.dilation == pytest.approx(statistics.median(pairs), rel=1e-12)
    assert u and p
    assert d.interval[0] <= d.dilation <= d.interval[1]
    # the capture stated what the analysis applies
    assert m["dilation"] == round(d.dilation, 4) and m["dilation_interval"] == list(d.interval)
    # deterministic: the same manifest gives the same interval
    assert dilation_of(_typed(copy.deepcopy(m))).interval == d.interval


@pytest.mark.slow
def test_the_cli_shows_the_interval_and_rounds(rounds_manifest) -> None:
    run, m = rounds_manifest
    res = CliRunner().invoke(dilation_command, [str(run)])
    assert res.exit_code == 0, res.output
    d = dilation_of(_typed(m))
    text = " ".join(res.output.split())
    assert f"{d.dilation:.2f}x" in text and f"{d.interval[0]:.2f}-{d.interval[1]:.2f}" in text
    assert "3/3" in text and f"{3 * (TOKENS - 1)}/{3 * (TOKENS - 1)}" in text and "median over rounds" in text
    res = CliRunner().invoke(dilation_command, [str(run), "--format", "json"])
    doc = json.loads(res.output)[0]
    assert doc["interval"] == list(d.interval) and doc["rounds"] == {"unprofiled": 3, "profiled": 3}
    assert doc["unprofiled"]["rounds"] == 3 and len(doc["unprofiled"]["round_mean_ns"]) == 3


def _three_rounds_of(run: str) -> dict[str, Any]:
    """A 3-round manifest made of a committed run's real lists (each round the same lists)."""
    m = json.loads((REPO / "traces" / run / "manifest.json").read_text())
    return {
        kind: {
            "per_token_ns": m[kind]["per_token_ns"],
            "rounds": [copy.deepcopy(m[kind]["per_token_ns"])] * 3,
        }
        for kind in ("unprofiled", "profiled")
    }


def test_a_drifting_round_widens_the_interval() -> None:
    """One unprofiled round 2x slower (the host drifted between passes) must show as a wider
    interval, not only as a moved point: the rounds are resampled, not only the tokens."""
    steady = _three_rounds_of("h200-tp1")
    drifted = copy.deepcopy(steady)
    drifted["unprofiled"]["rounds"][1] = {
        r: [2 * x for x in v] for r, v in drifted["unprofiled"]["rounds"][1].items()
    }
    a, b = dilation_of(_typed(steady)), dilation_of(_typed(drifted))
    assert a.unprofiled.n == 3 * 31 and b.unprofiled.n == 3 * 31
    # the median of the pair ratios does not follow the one drifted pair (the pooled mean would
    # have dropped by ~25%): the point holds still, the interval says a pair disagreed
    assert b.dilation == pytest.approx(a.dilation, rel=0.05)
    pooled = statistics.mean(_pooled(drifted["profiled"])) / statistics.mean(_pooled(drifted["unprofiled"]))
    assert pooled < 0.85 * a.dilation
    assert _width(b.interval) > 3 * _width(a.interval)
    # the drifted interval reaches from about the 2x round's ratio to the steady one
    assert b.interval[0] < a.dilation / 1.5 and b.interval[1] >= a.dilation * 0.97


def test_a_drift_that_slows_a_whole_pair_cancels_in_the_ratio() -> None:
    """U_k and P_k ran back to back: a host slow for both (pair 2 both 2x) leaves each pair's ratio,
    and so the interval, about where it was (pairs are resampled together)."""
    steady = _three_rounds_of("h200-tp1")
    slow_pair = copy.deepcopy(steady)
    for kind in ("unprofiled", "profiled"):
        slow_pair[kind]["rounds"][1] = {
            r: [2 * x for x in v] for r, v in slow_pair[kind]["rounds"][1].items()
        }
    a, b = dilation_of(_typed(steady)), dilation_of(_typed(slow_pair))
    assert b.dilation == pytest.approx(a.dilation, rel=1e-9)
    assert _width(b.interval) < 2 * _width(a.interval)


def test_token_times_per_round_skip_and_pool() -> None:
    block = {
        "per_token_ns": {"0": [9, 10, 30], "1": [8, 12, 10]},
        "rounds": [{"0": [9, 10, 30], "1": [8, 12, 10]}, {"0": [50, 7, 8, 9], "1": [40, 6, 9, 1]}],
    }
    tt = token_times(block, skip_first=1)
    assert tt.rounds == ((12, 30), (7, 9, 9)) and tt.per_token_ns == (12, 30, 7, 9, 9) and tt.skipped == 1
    # no rounds: per_token_ns is the one round
    old = token_times({"per_token_ns": block["per_token_ns"]}, skip_first=1)
    assert old.rounds == ((12, 30),)
    # rounds of another shape are a MalformedTimes naming the round
    from tracekit.analyse.dilation import MalformedTimes

    with pytest.raises(MalformedTimes, match=r"rounds\[1\]\['0'\]"):
        token_times({"rounds": [{"0": [1, 2]}, {"0": [1, "x"]}]})
    with pytest.raises(MalformedTimes, match="rounds is a JSON object"):
        token_times({"per_token_ns": {"0": [1, 2]}, "rounds": {"0": [1]}})


def test_unequal_round_counts_nsys_style() -> None:
    """--nsys: two plain rounds bracket one traced round (U P U): rounds drawn per kind."""
    m = json.loads((REPO / "traces" / "h200-tp1-nsys" / "manifest.json").read_text())
    u0 = m["unprofiled"]["per_token_ns"]
    doc = {
        "unprofiled": {
            "per_token_ns": u0,
            "rounds": [u0, {r: [x + 1_000_000 for x in v] for r, v in u0.items()}],
        },
        "profiled": m["profiled"],
    }
    d = dilation_of(_typed(doc))
    assert d.rounds == {"unprofiled": 2, "profiled": 1}
    assert d.unprofiled.n == 2 * d.profiled.n
    assert d.dilation == pytest.approx(
        statistics.mean(_pooled(doc["profiled"])) / statistics.mean(_pooled(doc["unprofiled"]))
    )
    assert d.interval[0] <= d.dilation <= d.interval[1]


def test_bootstrap_is_the_token_interval_for_one_round_and_none_without_times() -> None:
    u, p = [[100, 101, 99, 100, 102]], [[150, 151, 149, 150, 152]]
    lo, hi = bootstrap_interval(u, p)
    assert lo <= 1.5 <= hi and hi - lo < 0.05
    assert bootstrap_interval([], p) is None and bootstrap_interval(u, [[]]) is None
    assert bootstrap_interval(u, p) == bootstrap_interval(u, p)  # seeded
