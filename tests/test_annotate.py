"""tracekit.annotate: names, NVTX push/pop pairing, record_function only under a profiler.

The cost per range (issue 9: < 2 us with no profiler) is shown by benchmarks/bench_annotate.py
against a raw record_function, not by a timed unit test (it failed CI at 3.09 us on a loaded runner).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tracekit import annotate
from tracekit.capture import annotate as impl


@pytest.fixture(scope="module", autouse=True)
def torch() -> Any:
    """torch, for every test here (skipped without it); imported when the first one runs, not at
    collection, where it cost every xdist worker about 2 CPU-s."""
    return pytest.importorskip("torch")


def _trace_names(prof: object, tmp_path: Path) -> list[str]:
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))  # type: ignore[attr-defined]
    return [e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def test_names_follow_the_default_step_pattern() -> None:
    assert annotate.step(7).name == "decode_step#7"
    assert annotate.region("attention").name == "attention"
    assert annotate is not impl and annotate.step is impl.step  # thin re-export


def test_nvtx_push_pop_pair_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    impl._resolve()
    log: list[str] = []
    monkeypatch.setattr(impl._Backend, "push", lambda name: log.append(f"push {name}"))
    monkeypatch.setattr(impl._Backend, "pop", lambda: log.append("pop"))
    with annotate.step(3):
        with annotate.region("mlp"):
            pass
    assert log == ["push decode_step#3", "push mlp", "pop", "pop"]


def test_no_record_function_without_profiler(monkeypatch: pytest.MonkeyPatch, torch: Any) -> None:
    impl._resolve()
    entered: list[str] = []

    class Spy:
        def __init__(self, name: str):
            entered.append(name)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *a: object) -> None:
            return None

    monkeypatch.setattr(impl._Backend, "record_function", Spy)
    with annotate.step(0):
        pass
    assert entered == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with annotate.step(1):
            pass
    assert entered == ["decode_step#1"]


def test_ranges_land_in_a_torch_profiler_trace(tmp_path: Path, torch: Any) -> None:
    @annotate.region("mlp")
    def mlp(x: object) -> object:
        return torch.relu(x)  # type: ignore[arg-type]

    x = torch.ones(4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(3):
            with annotate.step(i):
                mlp(x)
                mlp(x)
    names = _trace_names(prof, tmp_path)
    assert sorted(n for n in names if n.startswith("decode_step")) == [f"decode_step#{i}" for i in range(3)]
    assert names.count("mlp") == 6  # the decorator opens a fresh range per call


def test_profile_session_times_each_step(tmp_path: Path, torch: Any) -> None:
    import tracekit

    with tracekit.profile(tmp_path, profiled=False, rank=0) as s:
        for i in range(4):
            with annotate.step(i):
                time.sleep(0.002)
    assert len(s.step_ns) == 4 and all(2_000_000 <= ns < 200_000_000 for ns in s.step_ns)
    with tracekit.profile(tmp_path, mode="cpu", warmup=1, rank=0):
        for i in range(4):
            with annotate.step(i):
                torch.ones(8).sum()
    doc = json.loads((tmp_path / ".rank-0.result.json").read_text())
    assert len(doc["unprofiled_ns"]) == 4 and len(doc["profiled_ns"]) == 3  # one warm-up step
    with gzip.open(tmp_path / "rank-0.pt.trace.json.gz", "rt") as f:
        names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"]
    assert sorted(n for n in names if n.startswith("decode_step")) == [
        "decode_step#1",
        "decode_step#2",
        "decode_step#3",
    ]


def test_ranges_resolved_before_torch_find_its_profiler_once_it_is_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, torch: Any
) -> None:
    """Ranges first used where torch is not imported look up no torch (a loop without torch pays no
    import: test_import_annotate_does_not_import_torch); torch imported afterwards, a range under its
    profiler lands in the trace (record_function looked up then). Here torch is hidden from
    sys.modules while the ranges resolve, then put back."""
    for name in ("resolved", "push", "pop", "record_function", "profiler_enabled", "nvtx_source"):
        monkeypatch.setattr(impl._Backend, name, vars(impl._Backend)[name])  # restored after the test
    impl._Backend.resolved = False
    with monkeypatch.context() as m:
        m.delitem(sys.modules, "torch")
        with annotate.step(0), annotate.region("mlp"):
            pass
        assert impl._Backend.resolved and impl._Backend.record_function is impl._torch_later
    # torch is back (the script imported it): the next range asks its profiler
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with annotate.step(7):
            pass
    assert impl._Backend.record_function is torch.profiler.record_function
    assert "decode_step#7" in _trace_names(prof, tmp_path)


def test_import_annotate_does_not_import_torch() -> None:
    """Nor do its ranges and a timed tracekit.profile() block, in a loop that does not use torch."""
    code = (
        "import sys, tempfile; import tracekit; from tracekit import annotate; "
        "import tracekit.capture.runner, tracekit.cli.capture\n"
        "with tracekit.profile(tempfile.mkdtemp(), profiled=False, rank=0) as s:\n"
        "    for i in range(3):\n"
        "        with annotate.step(i), annotate.region('mlp'):\n"
        "            pass\n"
        "print(len(s.step_ns), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3 False"
