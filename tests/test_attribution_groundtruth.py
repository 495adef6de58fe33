"""Ground truth from real CPU captures (issue 4): an injected straggler delay must come out as
coordination, on the injected rank, and not as compute.

Four captures of the tiny preset with gloo on the CPU (committed, tests/gloo_truth.py): TP=1,
two uninjected TP=2 runs, and TP=2 with `inject_delay=(1, 20 ms)`: rank 1 sleeps 20 ms on the
host before each all-reduce. The truth: the coordination term per token grows by
20 ms x (all-reduces per token) = 20 ms x 2 per layer x layers; so does rank 1's host time on the
critical path (the cause) and rank 0's own wait (the consequence).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gloo_truth import DELAY_MS

from tracekit.analyse.attribution.pair import shortfall_from_parts
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.run import RunParts
from tracekit.read import read_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(gloo_truth) -> dict[str, RunParts]:  # type: ignore[no-untyped-def]
    """The committed CPU ground-truth captures (tests/gloo_truth.py), each read and attributed."""
    out = {name: attribute_run(read_run([gloo_truth[name]]), label=name) for name in ("tp1", "a", "b", "inj")}
    out["_paths"] = dict(gloo_truth.paths)  # type: ignore[assignment]
    return out


def _all_reduces_per_token(run: RunParts) -> float:
    """All-reduce instances per steady step, counted in the trace."""
    coll = run.collectives
    pr = coll.per_rank[coll.per_rank["rank"] == 0]
    ar = pr[pr["op"] == "all_reduce"]
    steady = run.steady["step"]
    starts = run.steps[(run.steps["rank"] == 0) & run.steps["step"].isin(steady)]
    inside = np.zeros(len(ar), dtype=bool)
    for s, e in zip(starts["start_ns"], starts["end_ns"], strict=True):
        inside |= (ar["start_ns"].to_numpy() >= s) & (ar["start_ns"].to_numpy() < e)
    return inside.sum() / len(starts)


def test_injected_delay_is_coordination_on_the_injected_rank(runs):
    layers = 2  # the tiny preset (manifest workload.layers)
    per_token = _all_reduces_per_token(runs["inj"])
    assert per_token == 2 * layers  # one after attention, one after the MLP, per layer
    truth_ns = DELAY_MS * 1e6 * per_token

    results = {k: shortfall_from_parts(runs["tp1"], runs[k]) for k in ("a", "b", "inj")}
    for sf in results.values():
        doc = sf.to_json()
        assert sum(doc["terms_ns"].values()) == doc["shortfall_ns"]
        assert sum(doc["uncorrected"]["terms_ns"].values()) == doc["uncorrected"]["shortfall_ns"]
        assert set(doc["dilation"]) >= {"baseline", "sharded", "threshold", "inflated", "reconciliation"}
        assert doc["dilation"]["baseline"] is not None and doc["dilation"]["sharded"] is not None

    # the reported (corrected where the timings allow) coordination grows by D x all-reduces
    for block in ("corrected", "uncorrected"):

        def coord(k: str, block: str = block) -> float:
            return float(getattr(results[k], block).terms()["coordination"])

        growth = coord("inj") - (coord("a") + coord("b")) / 2
        assert growth == pytest.approx(truth_ns, rel=0.15), (block, growth, truth_ns)

    # rank 1 is named the straggler
    st = {s["rank"]: s for s in results["inj"].to_json()["stragglers"]}
    assert st[1]["share"] > 0.75 and st[1]["last_count"] > st[0]["last_count"]
    # the diagnosis sends the user to that rank; the uninjected runs have no straggler
    assert results["inj"].diagnosis().startswith("Rank 1 is a straggler"), results["inj"].diagnosis()
    for k in ("a", "b"):
        assert not results[k].straggler().is_straggler, results[k].straggler()

    # the cause on the critical path: rank 1's host time grows by the injected delay, and the
    # consequence: rank 0's own wait grows by it (per rank, not whichever window was longest)
    for block in ("corrected", "uncorrected"):
        corrected = block == "corrected"

        def path_host(k: str, r: int, corrected: bool = corrected) -> float:
            return float(results[k].path_ints(corrected).by_rank[str(r)].host_ns)

        def wait(k: str, r: int, block: str = block) -> float:
            doc = results[k].to_json()
            pr = doc["per_rank"] if block == "corrected" else doc["uncorrected"]["per_rank"]
            return float(next(d for d in pr if d["rank"] == r)["coordination_ns"]["wait"])

        host_growth = path_host("inj", 1) - (path_host("a", 1) + path_host("b", 1)) / 2
        assert host_growth == pytest.approx(truth_ns, rel=0.15), (block, host_growth, truth_ns)
        wait_growth = wait("inj", 0) - (wait("a", 0) + wait("b", 0)) / 2
        assert wait_growth == pytest.approx(truth_ns, rel=0.15), (block, wait_growth, truth_ns)
        # and rank 1, the one that sleeps, does not wait for rank 0
        assert wait("inj", 1) < 0.1 * truth_ns

    # the delay is not booked as compute: the compute term moves by less than the spread of the
    # per-step compute term over the two uninjected runs, or at most 5% of the injected delay
    def compute_steps(k: str) -> np.ndarray:
        return runs[k].steady["compute_ns"].to_numpy(np.float64)

    uninj = np.concatenate([compute_steps("a"), compute_steps("b")])
    spread = float(np.quantile(uninj, 0.9) - np.quantile(uninj, 0.1))
    moved = abs(float(compute_steps("inj").mean()) - float(uninj.mean()))
    assert moved <= max(spread, 0.05 * truth_ns), (moved, spread)


def test_cli_table_and_json_on_the_captures(runs):
    import json

    from click.testing import CliRunner

    from tracekit.cli.shortfall import command

    # the fixture's own paths (the committed folders)
    paths: dict[str, Path] = runs["_paths"]  # type: ignore[assignment]
    base, sharded = str(paths["tp1"]), str(paths["inj"])
    res = CliRunner().invoke(command, ["--baseline", base, "--sharded", sharded, "--no-cache"])
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("Coordination holds this run back"), first
    assert "Profiler dilation" in res.output and "Stragglers" in res.output
    res = CliRunner().invoke(
        command,
        ["--baseline", base, "--sharded", sharded, "--format", "json", "--no-cache"],
    )
    doc = json.loads(res.output)
    assert doc["kind"] == "tracekit.shortfall" and doc["n_ranks"] == 2
    assert sum(doc["terms_ns"].values()) == doc["shortfall_ns"]
