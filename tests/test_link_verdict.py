"""The link verdict (tracekit.analyse.links.verdict) is analysis: judged from a saved probe JSON and
the committed decode traces alone, with no sweep, no GPU, and neither torch nor a probe runner
imported (a fresh interpreter checks `sys.modules`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the committed H200 compare-links results: eager timing, and CUDA-graph timing (--graph)
SAVED = [REPO / "reports/h200/links.json", REPO / "reports/h200/links-graph.json"]
TP2, TP1 = REPO / "traces/h200-tp2", REPO / "traces/h200-tp1"

_SCRIPT = """
import functools, json, math, sys
import tracekit.analyse.links.verdict as lv
from tracekit.analyse.links.verdict import load_compare, recompute, verdict
# the traces' side (the decode's collectives, the pair's shortfall) is the same for every saved
# probe: computed once, and recompute() below gets the same figures from its own calls
lv.trace_collectives = trace_collectives = functools.cache(lv.trace_collectives)
lv.shortfall_context = shortfall_context = functools.cache(lv.shortfall_context)
tp2, tp1, *links_files = sys.argv[1:]
trace = trace_collectives(tp2)  # the decode traces' side: the same for every saved probe
sf = shortfall_context(tp1, tp2)
out = {}
from tracekit.model.documents import to_builtins
for links in links_files:
    saved = load_compare(links)
    modes = [m.mode for m in saved.modes]
    text, details = verdict(saved.rows, modes, trace, False, shortfall=sf, transports=saved.transports)
    again = recompute(saved, trace_dir=tp2, baseline_dir=tp1)
    out[links] = to_builtins({"text": text, "details": details, "again": again.verdict, "sf": sf, "trace": trace})
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "tracekit.probe",
    "tracekit.capture", "tracekit.cli", "tracekit.pipeline")))
for v in out.values():
    v["loaded"] = loaded
clean = lambda x: None if isinstance(x, float) and not math.isfinite(x) else x
print(json.dumps(out, default=clean))
"""


@pytest.fixture(scope="module")
def judged_all() -> dict:
    """Every saved probe judged in one fresh interpreter (the verdict's inputs from the traces are
    the same for each; one interpreter start and one read of the traces instead of one per file)."""
    if not all(p.is_file() for p in SAVED) or not (TP2.is_dir() and TP1.is_dir()):
        pytest.skip("the H200 results are not in this checkout")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(TP2), str(TP1), *map(str, SAVED)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.fixture(params=SAVED, ids=lambda p: p.name)
def judged(request: pytest.FixtureRequest, judged_all: dict) -> dict:
    return judged_all[str(request.param)]  # type: ignore[no-any-return]


def test_verdict_needs_neither_torch_nor_a_probe_runner(judged: dict) -> None:
    assert judged["loaded"] == []


def test_verdict_on_the_saved_h200_probe_and_the_committed_traces(judged: dict) -> None:
    """Oracles: the decoder's shapes (7b, 8 layers, bf16: two all_reduces of hidden x 2 bytes per
    layer, one all_gather of vocab x 4 bytes per token) and the bound's arithmetic: XN is the
    shortfall's transfer term, a link k times faster removes at most XN (1 - 1/k) per size, or each
    call the probe's per-call time difference, whichever is larger."""
    d, sf = judged["details"], judged["sf"]
    assert judged["text"] == judged["again"]  # verdict() and recompute() agree
    assert {(e["op"], e["bytes"]): e["per_token"] for e in d["per_size"]} == {
        ("all_reduce", 4096 * 2): 16,
        ("all_gather", 32000 * 4): 1,
    }
    assert judged["trace"]["steps"] and judged["trace"]["source"] == "transfer"
    xn, s = sf["transfer_ns"], sf["shortfall_ns"]
    assert d["transfer_ns_per_token"] == xn and d["shortfall_ns"] == s > 0
    assert 0 <= d["bound_ns_per_token"] and d["bound_inf_ns_per_token"] == max(0.0, xn)
    assert d["transfer_share_of_shortfall"] == pytest.approx(xn / s)
    assert sum(e["transfer_weight"] for e in d["per_size"]) == pytest.approx(1.0)
    for e in d["per_size"]:
        if e["k"] and e["k"] > 0:
            ratio = max(0.0, e["transfer_ns_per_token"] * (1 - 1 / e["k"]))
            t = e["probe_time_us"]
            per_call = max(0.0, t["pcie"] - t["nvlink"]) * 1000.0 * e["per_token"]
            assert e["bound_ns_per_token"] == pytest.approx(max(ratio, per_call))
    assert (
        d["answer"] == "no"
        and d["trace_mode"] == "nvlink"
        and d["modes"] == {"fast": "nvlink", "slow": "pcie"}
    )
    assert judged["text"].startswith("Link bandwidth does not explain this run's shortfall")
    timing = set(d["timing"].values())
    assert timing in ({"eager"}, {"graph"}) and (
        ("CUDA-graph replay" in judged["text"]) == (timing == {"graph"})
    )
