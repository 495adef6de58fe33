"""The fork server the CPU ranks start from (tracekit.capture.starter): torch imported once in the
server, and each rank given what a spawned one has and a fork would not (this process' environment,
stdout and stderr and Ctrl-C disposition as they are when it starts); a server per environment; and
Ctrl-C while the server imports torch leaves no rank behind.

The targets live here, in a module that imports no torch: a rank that finds torch imported got it
from the server."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tracekit.capture import starter  # noqa: E402


def _report(q: Any, var: str) -> None:
    """A rank's view: its parent, whether torch was there before it ran, a variable, Ctrl-C's handler;
    and a line on its fd 2."""
    os.write(2, f"rank stderr {os.environ.get(var)}\n".encode())
    handler = signal.getsignal(signal.SIGINT)
    q.put(
        {
            "ppid": os.getppid(),
            "torch_before": "torch" in sys.modules,
            "var": os.environ.get(var),
            "sigint": "ignored" if handler == signal.SIG_IGN else getattr(handler, "__name__", str(handler)),
        }
    )


def _run(ctx: starter.Starter, var: str) -> dict[str, Any]:
    q = ctx.Queue()
    p = ctx.Process(target=_report, args=(q, var))
    p.start()
    got: dict[str, Any] = q.get(timeout=120)
    p.join(timeout=30)
    assert p.exitcode == 0
    got["pid"] = p.pid
    return got


def _server_pid(ctx: starter.Starter) -> int:
    pid = ctx._srv._forkserver_pid  # type: ignore[attr-defined]
    assert isinstance(pid, int)
    return pid


def test_a_rank_is_forked_with_torch_and_gets_the_environment_and_stderr_of_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    var, own = "STARTER_PROBE", "TRACEKIT_STARTER_PROBE"
    monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(own, raising=False)
    ctx = starter.Starter()  # the server starts without the variable, its stderr the current one
    # a variable a capture sets for its ranks (not one that decides the server), set after its start
    monkeypatch.setenv("TRACEKIT_SPAWNED", "from-the-test")
    err = tmp_path / "stderr.txt"
    saved = os.dup(2)
    # Python's own Ctrl-C handler here (a suite started in the background ignores SIGINT: the
    # other test), so the rank must raise KeyboardInterrupt on Ctrl-C as a spawned one would
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with open(err, "wb") as f:
            os.dup2(f.fileno(), 2)
        got = _run(starter.Starter(), "TRACEKIT_SPAWNED")
        monkeypatch.setenv(own, "tracekit-own")
        mine = _run(starter.Starter(), own)
        # inductor's cache folder, which torch sets in this process once inductor asks for it
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
        cache = _run(starter.Starter(), "TORCHINDUCTOR_CACHE_DIR")
        monkeypatch.setenv(var, "set-after-the-server-started")
        also = _run(starter.Starter(), var)
    finally:
        signal.signal(signal.SIGINT, old_int)
        os.dup2(saved, 2)
        os.close(saved)
    # forked from the server (its parent), which had imported torch before the rank's code ran
    assert got["ppid"] == _server_pid(ctx) and got["torch_before"] is True
    assert got["var"] == "from-the-test"  # the environment at the rank's start, not the server's
    assert got["sigint"] == "default_int_handler"  # Ctrl-C raises KeyboardInterrupt, as in a spawned rank
    # one of tracekit's own variables (TRACEKIT_*: the server imports no tracekit) set after the
    # server's start: the same server, and the rank sees the variable
    assert mine["ppid"] == got["ppid"] and mine["var"] == "tracekit-own"
    assert cache["ppid"] == got["ppid"] and cache["var"] == str(
        tmp_path / "inductor"
    )  # the same: no torch import
    # a variable that is not tracekit's made another server, whose rank sees it too
    assert also["ppid"] != got["ppid"] and also["var"] == "set-after-the-server-started"
    # what the ranks wrote on fd 2 went to this process' fd 2 of the time, not to the server's
    assert err.read_text().splitlines() == [
        "rank stderr from-the-test",
        "rank stderr tracekit-own",
        f"rank stderr {tmp_path / 'inductor'}",
        "rank stderr set-after-the-server-started",
    ]


def test_one_server_per_environment_reused_and_sigint_ignored_where_this_process_ignores_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = starter.Starter()
    again = starter.Starter()
    assert _server_pid(first) == _server_pid(again)  # one server, torch imported once
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a suite started in the background
    try:
        got = _run(again, "PATH")
    finally:
        signal.signal(signal.SIGINT, old)
    assert got["ppid"] == _server_pid(first) and got["sigint"] == "ignored"


@pytest.mark.slow
def test_ctrl_c_while_the_server_imports_leaves_no_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C lands while the server still imports (a module that takes 3 s, here): the capture ends
    with KeyboardInterrupt (or the runner's "interrupted") and no rank is left running. Without
    `wait_ready` and the guard on the pid's read (each prevents it), the first rank's request was
    already with the server, which forked the rank once its imports were done: the
    rank waited at the rendezvous for a peer never started, left running (seen by hand: a Ctrl-C
    1.5 s into `tracekit capture --tp 2` left rank 0 and the server running after the CLI exited)."""
    from tracekit.capture.runner import CaptureConfig, capture
    from tracekit.errors import CaptureError

    slow = tmp_path / "mods"
    slow.mkdir()
    (slow / "tracekit_slow_preload.py").write_text("import time\ntime.sleep(3)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(slow), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(starter, "PRELOAD", [*starter.PRELOAD, "tracekit_slow_preload"])

    def ctrl_c(*_: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, ctrl_c)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    out = tmp_path / "run"
    try:
        # KeyboardInterrupt, or the runner's "interrupted" when it lands once the ranks are being started
        with pytest.raises((KeyboardInterrupt, CaptureError)) as exc:
            capture(CaptureConfig(tp=2, tokens=3, warmup=1, device="cpu", rounds=1, timeout_s=60), out)
        assert exc.type is KeyboardInterrupt or "interrupted (Ctrl-C)" in str(exc.value)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    srv = starter.server()  # the same environment: the same server, still importing
    starter.wait_ready(srv)  # it serves requests in order: every earlier one has been forked now
    pid = srv._forkserver_pid  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    kids = ["?"]
    while kids and time.monotonic() < deadline:  # the ready probes exit at once; a rank would stay
        kids = [k for t in Path(f"/proc/{pid}/task").iterdir() for k in (t / "children").read_text().split()]
        time.sleep(0.1)
    assert kids == [] and not list(out.glob(".rank-*.result.json"))


def test_a_rank_imports_no_pandas() -> None:
    """What a CPU rank of a capture or a probe imports of tracekit (tracekit.capture.rank and what
    rank_main imports, but the decoder, which needs torch; the probe's sweep and its rank) loads no
    pandas or pyarrow: the readers' table library, ~0.5-0.9 CPU-s per rank process. It came in
    through shared helpers: the events table in tracekit/model/__init__.py (reached from
    tracekit.model.shape), read.files' sha256_of (from tracekit.capture.environment; the digest is in
    model/digest.py now) and the events table's COLLECTIVE_OPS (from tracekit.probe.spec; now
    model/ops.py). Checked in a fresh interpreter (this one has imported pandas)."""
    import subprocess

    mods = [f"tracekit.capture.{m}" for m in ("rank", "config", "profile", "calibrate", "environment")]
    mods += ["tracekit.capture.annotate", "tracekit.capture.decoder_shape", "tracekit.cli.main"]
    mods += [f"tracekit.probe.{m}" for m in ("sweep", "sweep_rank", "spec", "results", "nccl_log")]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in mods)
        + "print(sorted(m for m in ('pandas', 'pyarrow', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
