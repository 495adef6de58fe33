"""The session's CPU ground-truth captures (tests/gloo_truth.py) shared by pytest-xdist workers:
every worker gets paths that exist and are complete, the captures are taken once, and an index
whose folders are gone is not trusted. The capture itself is replaced by a stand-in that writes a
manifest (no torch, no processes): what is checked is the sharing, not the capture."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import gloo_truth
import pytest
import session_captures
from session_captures import HostLock


@pytest.fixture
def fake_capture(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replaces the capture by one that writes a complete manifest, slowly enough that two
    workers overlap; returns the folders it was asked to write, in order."""
    import tracekit.capture.runner as runner

    calls: list[Path] = []

    def capture(cfg: object, out_dir: Path) -> Path:
        calls.append(Path(out_dir))
        time.sleep(0.02)
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "manifest.json").write_text(json.dumps({"complete": True}))
        return Path(out_dir)

    monkeypatch.setattr(runner, "capture", capture)
    monkeypatch.setattr(gloo_truth, "host_speed_s", lambda: 1.0)
    # the two "workers" here are threads of this one test: no host lock between them
    monkeypatch.setattr(session_captures, "HOST", None)
    return calls


def _two_workers(shared: Path, tmp: Path) -> list[gloo_truth.TruthRuns]:
    """Two workers asking for every capture at the same time, in opposite orders."""
    out: list[gloo_truth.TruthRuns] = []
    errors: list[BaseException] = []
    names = list(gloo_truth._configs())

    def worker(i: int) -> None:
        try:
            runs = gloo_truth.shared_truth_runs(shared, tmp / f"gw{i}")
            for name in names if i == 0 else names[::-1]:
                runs[name]
            out.append(runs)
        except BaseException as e:  # noqa: BLE001 - re-raised below in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def test_two_workers_see_one_set_of_existing_complete_captures(
    fake_capture: list[Path], tmp_path: Path
) -> None:
    shared = tmp_path / "gloo-truth-shared"
    runs = _two_workers(shared, tmp_path)
    names = set(gloo_truth._configs())
    assert sorted(p.name for p in fake_capture) == sorted(names)  # taken once, by one worker
    assert runs[0].paths == runs[1].paths
    for r in runs:
        assert set(r.paths) == names
        for name in names:
            # the folder a worker is handed, and the one under its `root`, are the shared capture
            assert r[name] == r.root / name == shared / name
            assert gloo_truth.is_complete_capture(r.root / name)
        assert not r.scratch or shared not in r.scratch.parents


def test_an_index_whose_captures_are_gone_is_taken_again(fake_capture: list[Path], tmp_path: Path) -> None:
    shared = tmp_path / "gloo-truth-shared"
    names = list(gloo_truth._configs())
    first = gloo_truth.shared_truth_runs(shared, tmp_path / "gw0")
    for name in names:
        first[name]
    import shutil

    shutil.rmtree(shared / "inj")
    runs = gloo_truth.shared_truth_runs(shared, tmp_path / "gw1")
    assert all(gloo_truth.is_complete_capture(runs[name]) for name in names)
    assert [p.name for p in fake_capture] == [*names, "inj"]  # the missing one only, taken again
    # an incomplete one (a rank failed) is not trusted either
    (shared / "a" / "manifest.json").write_text(json.dumps({"complete": False}))
    runs = gloo_truth.shared_truth_runs(shared, tmp_path / "gw0")
    assert all(gloo_truth.is_complete_capture(runs[name]) for name in names)
    assert [p.name for p in fake_capture] == [*names, "inj", "a"]


def test_a_capture_is_taken_when_first_asked_for(fake_capture: list[Path], tmp_path: Path) -> None:
    """A file that needs one capture does not wait for the others: asking for `inj` (its path or its
    host-speed probes) takes that capture only; the others follow when asked for."""
    shared = tmp_path / "gloo-truth-shared"
    runs = gloo_truth.shared_truth_runs(shared, tmp_path / "gw0")
    assert runs.speed["inj"] == [1.0, 1.0] and [p.name for p in fake_capture] == ["inj"]
    assert runs["inj"] == shared / "inj" and [p.name for p in fake_capture] == ["inj"]
    other = gloo_truth.shared_truth_runs(shared, tmp_path / "gw1")
    assert other["inj"] == shared / "inj" and other["tp1"] == shared / "tp1"
    assert [p.name for p in fake_capture] == ["inj", "tp1"]
    alone = gloo_truth.capture_truth_runs(tmp_path / "alone")
    assert alone["a"] == tmp_path / "alone" / "a" and [p.name for p in fake_capture] == ["inj", "tp1", "a"]


def test_capture_more_writes_under_the_workers_own_folder(fake_capture: list[Path], tmp_path: Path) -> None:
    shared = tmp_path / "gloo-truth-shared"
    runs = gloo_truth.shared_truth_runs(shared, tmp_path / "gw0")
    assert runs.capture_more("c") == tmp_path / "gw0" / "c"
    assert not (shared / "c").exists() and gloo_truth.is_complete_capture(runs["c"])
    # without xdist there is one folder: the captures and the extra ones go there
    alone = gloo_truth.capture_truth_runs(tmp_path / "alone")
    assert alone.capture_more("c") == tmp_path / "alone" / "c" and alone["tp1"] == tmp_path / "alone" / "tp1"


def test_an_exclusive_section_waits_for_running_tests_and_keeps_new_ones_out(tmp_path: Path) -> None:
    """HostLock (tests/session_captures.py), three workers on one folder: the exclusive section
    waits while another worker's test runs, a test that starts meanwhile waits behind it (the gate),
    and the worker that holds a share itself gives it up for the section and has it back after."""
    running, waiting, late = (HostLock(tmp_path) for _ in range(3))
    order: list[str] = []
    running.share()
    waiting.share()  # inside its own test: exclusive() gives that share up, no self-deadlock

    def section() -> None:
        with waiting.exclusive():
            order.append("exclusive")

    def new_test() -> None:
        late.share()
        order.append("late test")
        late.unshare()

    ex = threading.Thread(target=section)
    ex.start()
    ex.join(timeout=0.3)
    assert ex.is_alive() and order == []  # the running test holds the host
    nt = threading.Thread(target=new_test)
    nt.start()
    nt.join(timeout=0.3)
    assert nt.is_alive() and order == []  # queued behind the waiting section, not beside the test
    running.unshare()
    ex.join(timeout=30)
    nt.join(timeout=30)
    assert order == ["exclusive", "late test"]
    assert waiting._held is not None  # its test's share, taken back
    waiting.unshare()
