"""`tracekit capture --rounds K`: alternating unprofiled and profiled passes (issue 12, item 4).

Real CPU/gloo captures of the tiny preset. The traces are read with plain gzip + json. What must
hold: the passes really alternate (U P U P ..., seen from the progress callback as they run, and
recorded in the manifest); every round is in the manifest with `tokens` times per rank; the trace
holds exactly `tokens` decode_step ranges per rank, those of the last (traced) profiled round;
`--rounds 1` is the old single-pass structure; the manifest's dilation is the pooled mean ratio.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tracekit.capture.profile import Tracer  # noqa: E402
from tracekit.capture.runner import phase_kind  # noqa: E402
from tracekit.cli.main import main  # noqa: E402

TOKENS = 5
ROUNDS = 3


def _steps(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("decode_step#")
    ]
    return sorted(steps, key=lambda e: float(e["ts"]))


@pytest.fixture(scope="module")
def rounds_run(session_captures: Any) -> tuple[Path, list[tuple[str, int, int]]]:
    """tp=2, 3 rounds of 5 tokens (the session's capture, shared with tests/test_dilation_rounds.py),
    the progress callback having recorded every report in order."""
    from session_captures import ROUNDS_TP2

    assert (ROUNDS_TP2["tokens"], ROUNDS_TP2["rounds"]) == (TOKENS, ROUNDS)
    got = session_captures.get("rounds-tp2", ROUNDS_TP2)
    return got.path, got.progress


@pytest.mark.slow
def test_passes_alternate_unprofiled_and_profiled_as_they_run(rounds_run) -> None:
    out, seen = rounds_run
    phases: list[str] = []
    for phase, _, _ in seen:
        if not phases or phases[-1] != phase:
            phases.append(phase)
    want = ["warmup"] + [
        f"{kind} {k}/{ROUNDS}" for k in range(1, ROUNDS + 1) for kind in ("unprofiled", "profiled")
    ]
    assert phases == want  # each phase once, in this order: U1 P1 U2 P2 U3 P3
    # every measured pass ran all its steps (1 lead + tokens + 1 tail) before the next began
    for phase in want[1:]:
        done = [d for p, d, _ in seen if p == phase]
        assert done == list(range(1, TOKENS + 3)), phase
    assert {phase_kind(p) for p in want} == {"warmup", "unprofiled", "profiled"}
    m = json.loads((out / "manifest.json").read_text())
    assert m["workload"]["pass_order"] == "UP" * ROUNDS and m["workload"]["rounds"] == ROUNDS


@pytest.mark.slow
def test_every_round_is_in_the_manifest_and_only_the_traced_one_in_the_trace(rounds_run) -> None:
    out, _ = rounds_run
    m = json.loads((out / "manifest.json").read_text())
    assert m["schema_version"] == "1.2" and m["complete"]
    for kind in ("unprofiled", "profiled"):
        rounds = m[kind]["rounds"]
        assert len(rounds) == ROUNDS
        for rnd in rounds:
            assert set(rnd) == {"0", "1"} and all(len(v) == TOKENS and min(v) > 0 for v in rnd.values())
    # old readers: per_token_ns is the first unprofiled and the traced profiled round
    traced = m["profiled"]["traced_round"]
    assert traced == ROUNDS - 1
    assert m["unprofiled"]["per_token_ns"] == m["unprofiled"]["rounds"][0]
    assert m["profiled"]["per_token_ns"] == m["profiled"]["rounds"][traced]
    # one trace per rank, no trace or temporary file of a dropped round left behind
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "rank-0.pt.trace.json.gz",
        "rank-1.pt.trace.json.gz",
    ]
    for r in ("0", "1"):
        steps = _steps(out / f"rank-{r}.pt.trace.json.gz")
        assert [e["name"] for e in steps] == [f"decode_step#{i}" for i in range(1, TOKENS + 1)]
        # the ranges are the traced round's steps: their durations match its host times (the
        # range opens just after the timer starts and closes just before it stops), better than
        # any other profiled round's
        durs = [float(e["dur"]) * 1000 for e in steps]

        def off(rnd: dict[str, list[int]], r: str = r, durs: list[float] = durs) -> float:
            return sum(abs(d - t) for d, t in zip(durs, rnd[r], strict=True))

        kept = m["profiled"]["rounds"][traced][r]
        assert all(abs(d - t) <= max(0.05 * t, 300_000) for d, t in zip(durs, kept, strict=True)), (
            durs,
            kept,
        )
        assert all(off(m["profiled"]["rounds"][traced]) <= off(rnd) for rnd in m["profiled"]["rounds"])


@pytest.mark.slow
def test_manifest_dilation_is_the_median_pair_ratio_with_an_interval(rounds_run) -> None:
    out, _ = rounds_run
    m = json.loads((out / "manifest.json").read_text())

    def pooled(kind: str) -> list[int]:  # per round: slowest rank per token, first token out
        return [max(rnd["0"][i], rnd["1"][i]) for rnd in m[kind]["rounds"] for i in range(1, TOKENS)]

    u, p = pooled("unprofiled"), pooled("profiled")
    assert len(u) == len(p) == ROUNDS * (TOKENS - 1)
    # per pair k (U_k then P_k, back to back): mean(P_k) / mean(U_k); the dilation is their median
    n = TOKENS - 1
    pairs = [
        statistics.mean(p[k * n : (k + 1) * n]) / statistics.mean(u[k * n : (k + 1) * n])
        for k in range(ROUNDS)
    ]
    assert m["dilation"] == pytest.approx(statistics.median(pairs), rel=1e-3)
    lo, hi = m["dilation_interval"]
    assert 0 < lo <= m["dilation"] <= hi
    # stated = applied: `tracekit dilation` reads the same figure and interval from the rounds
    from tracekit.analyse.dilation import dilation_of
    from tracekit.read import load_manifest

    d = dilation_of(load_manifest(out / "manifest.json"))
    assert round(d.dilation, 4) == m["dilation"] and list(d.interval) == [lo, hi]
    assert d.rounds == {"unprofiled": ROUNDS, "profiled": ROUNDS}


@pytest.mark.slow
def test_rounds_1_is_the_old_single_pass_structure(session_captures: Any) -> None:
    """--rounds 1: warm-up, one unprofiled pass, one profiled pass (the structure before rounds):
    --inject-sync counts one sync per layer per forward of exactly 3 passes. The session's
    `capture --tp 1 --tokens 3 --rounds 1 --mode ranges --inject-sync` by the CLI's main in this
    process (shared with tests/test_capture.py: tests/session_captures.py CLI_TP1_RANGES_R1, cli_here)."""
    from session_captures import CLI_TP1_RANGES_R1, cli_here

    got = cli_here(session_captures, "tp1-ranges-r1-here", CLI_TP1_RANGES_R1)
    assert got.returncode == 0, got.stderr[-2000:]
    out, tokens = got.path, 3
    m = json.loads((out / "manifest.json").read_text())
    w = m["workload"]
    assert w["rounds"] == 1 and w["pass_order"] == "UP" and w["tokens"] == tokens
    assert m["inject_sync_count"] == {
        "0": 2 * 3 * (1 + tokens + 2)
    }  # 2 layers x 3 passes x (prefill + lead + tail)
    assert m["unprofiled"]["rounds"] == [m["unprofiled"]["per_token_ns"]]
    assert m["profiled"]["rounds"] == [m["profiled"]["per_token_ns"]] and m["profiled"]["traced_round"] == 0
    assert len(_steps(out / "rank-0.pt.trace.json.gz")) == tokens
    assert "--rounds 1" in m["command"]


def test_rounds_below_1_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "--device", "cpu", "--rounds", "0", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tracekit: error: --rounds must be at least 1, got 0"]


def test_a_dropped_round_profiles_the_same_way_and_writes_nothing(tmp_path: Path) -> None:
    """Tracer(keep=False): the same profiler and schedule as a kept one, the recording is ended at
    the same schedule step, but nothing is exported; stop() returns None (no error)."""
    import torch

    from tracekit.capture import annotate

    def loop(tracer: Tracer) -> None:
        tracer.start()
        for i in range(4):  # 1 warm-up + 2 recorded + 1 after the recording ended
            if i:
                tracer.step()
            with annotate.step(i):
                torch.ones(8) @ torch.ones(8)

    dropped = Tracer("cpu", "cpu", tmp_path, 0, warmup=1, active=2, keep=False)
    loop(dropped)
    assert dropped.recorded and dropped.stop() is None
    assert list(tmp_path.iterdir()) == []
    kept = Tracer("cpu", "cpu", tmp_path, 0, warmup=1, active=2)
    loop(kept)
    path = kept.stop()
    assert kept.recorded and path is not None and path.name == "rank-0.pt.trace.json.gz"
    assert [e["name"] for e in _steps(path)] == ["decode_step#1", "decode_step#2"]
