"""Rank processes of a CPU capture forked from a server that imported torch once (a fork server).

A spawned rank is a fresh interpreter that imports torch before it does anything: ~2.5 CPU-s per
rank of every capture on the 2-core CI VM (more on a loaded host), most of what a short CPU capture
costs. Here one server process imports torch (`PRELOAD`) and forks every rank from itself, so a
TP=2 capture pays one import instead of two, and the next capture of the same process none.

The server and its children are CPython's own forkserver machinery (`multiprocessing.forkserver`:
the same Process API as a spawned rank, exit codes and signals; the server ignores Ctrl-C, which
ends the ranks as it ends spawned ones), on a server of tracekit's own rather than the process-wide
one (whatever a user set up for it is left alone). What a spawned rank gets and a forked one would
not, it is given:

- the environment of this process as it is when the rank starts (the server's is that of its own
  start): `RankProcess.run` puts it in place before the rank's code runs;
- this process' stdout and stderr as they are when the rank starts (the server holds those of its
  start, under pytest a finished test's capture): passed with the rank and put on its fd 1 and 2;
- this process' sys.path, working folder and main module, as for spawn (multiprocessing.spawn's
  preparation data).

What the server imported may depend on the environment (PYTHONPATH and its sitecustomize, torch's
import-time variables), so a server is used only while this process' environment (but for the
variables a capture sets for its own ranks, `_OWN_VARS`, and tracekit's own `TRACEKIT_*`, which
nothing the server imports reads) is the one it started with: another environment gets another
server (the two most recent are kept). Only torch is preloaded: tracekit
itself is imported by the rank after the fork, from this process' sys.path, as a spawned rank does.

CUDA captures spawn their ranks as before (tracekit.capture.runner): a CUDA rank's start is a small
part of its run, and the spawn path is the one the GPU runs were taken with. TRACEKIT_CAPTURE_START=
spawn spawns a CPU capture's ranks too (benchmarks/bench_capture_start.py compares the two).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import signal
import sys
import threading
import time
import weakref
from collections import OrderedDict
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.context import ForkServerProcess, set_spawning_popen
from typing import Any

from tracekit.capture.config import ENV_TEARDOWN_CUPTI

#: what the server imports once for all its ranks (each rank imports the rest itself)
PRELOAD = ["torch", "torch.distributed", "torch.profiler"]

#: variables a capture sets for its own ranks while it starts them, pytest's name of the test
#: running now, and inductor's cache folder (torch sets it in this process the first time inductor
#: asks for its cache, e.g. a compiled step in a test: the next capture started a second server,
#: ~3 CPU-s, though the server imports no inductor, tests/test_profiler_start.py): none of them
#: decides what the server imports
_OWN_VARS = frozenset(
    {
        "TRACEKIT_SPAWNED",
        ENV_TEARDOWN_CUPTI,
        "NCCL_NVLS_ENABLE",
        "PYTEST_CURRENT_TEST",
        "TORCHINDUCTOR_CACHE_DIR",
    }
)

#: servers kept, the most recently used last
_KEEP = 2
_servers: OrderedDict[tuple[Any, ...], forkserver.ForkServer] = OrderedDict()
_ending: list[int] = []  # pids of servers asked to end, reaped once they have
_started: weakref.WeakSet[RankProcess] = weakref.WeakSet()  # the ranks started here
_lock = threading.Lock()


#: tracekit's own variables (TRACEKIT_NO_CACHE, TRACEKIT_CACHE_DIR, ...): read by tracekit, which the
#: server does not import (each rank imports it after the fork, with the environment of its start)
_OWN_PREFIX = "TRACEKIT_"


def _key() -> tuple[Any, ...]:
    env = tuple(
        sorted((k, v) for k, v in os.environ.items() if k not in _OWN_VARS and not k.startswith(_OWN_PREFIX))
    )
    return (spawn.get_executable(), os.getcwd(), env)


def server() -> forkserver.ForkServer:
    """The running server for this process' environment, started (its imports begin) if needed."""
    key = _key()
    with _lock:
        srv = _servers.pop(key, None)
        if srv is None:
            srv = forkserver.ForkServer()
            srv.set_forkserver_preload(PRELOAD)
        _servers[key] = srv
        while len(_servers) > _KEEP:
            _stop(_servers.popitem(last=False)[1])
        _reap()
    # the server starts ignoring Ctrl-C (SIG_IGN survives exec; only the main thread may set it, for
    # the few ms the start takes): pressed while it imports torch, it would print the import's
    # KeyboardInterrupt. Each rank then takes Ctrl-C as a spawned one does (RankProcess.run)
    main = threading.current_thread() is threading.main_thread()
    before: Any = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        srv.ensure_running()
    finally:
        if main:
            signal.signal(signal.SIGINT, before)
    return srv


def wait_ready(srv: forkserver.ForkServer) -> None:
    """Until `srv` has imported PRELOAD: it forks a child that exits at once (no preparation, a process
    with nothing to run), whose pid comes back only once the imports are done. A rank is asked for only
    then, so Ctrl-C while torch is being imported cannot leave a rank that the server forks after this
    process gave up on it (its pid not yet known here, nothing would end it)."""
    status_r, w = srv.connect_to_new_process([])
    try:
        buf = io.BytesIO()
        set_spawning_popen(srv)  # type: ignore[arg-type]  # the authkey is pickled only while spawning
        try:
            reduction.dump({}, buf)
            reduction.dump(ForkServerProcess(), buf)
        finally:
            set_spawning_popen(None)
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        forkserver.read_signed(status_r)  # the pid: the imports are done
        forkserver.read_signed(status_r)  # its exit code
    finally:
        os.close(status_r)


def _stop(srv: forkserver.ForkServer) -> None:
    """End a server. One with no rank of ours still running is terminated (it has nothing left to
    do, and the interpreter's teardown of torch takes it seconds); another is asked to end, which
    it does once its ranks (they hold a copy of its alive pipe) have: not waited for here."""
    fd, pid = getattr(srv, "_forkserver_alive_fd", None), getattr(srv, "_forkserver_pid", None)
    if fd is None or pid is None:
        return
    busy = any(p._server is srv and p.is_alive() for p in list(_started))
    srv._forkserver_alive_fd = srv._forkserver_pid = None  # type: ignore[attr-defined]
    with contextlib.suppress(OSError):
        os.close(fd)
        if not busy:
            os.kill(pid, signal.SIGTERM)
    _ending.append(pid)


def _reap(wait_s: float = 0.0) -> None:
    """Collect the servers that have ended, waiting up to `wait_s` for the others."""
    deadline = time.monotonic() + wait_s
    while _ending:
        for pid in list(_ending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                _ending.remove(pid)
        if not _ending or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


@atexit.register
def _end_all() -> None:
    """At exit, end the servers and collect them: their CPU time, and that of the ranks they
    collected, then counts as this process' children's, as a spawned rank's does. A server whose
    rank still runs is left after a few seconds rather than hang the exit."""
    with _lock:
        while _servers:
            _stop(_servers.popitem()[1])
        _reap(wait_s=5.0)


class _Popen(popen_forkserver.Popen):
    """popen_forkserver.Popen through `srv`, with this process' fd 1 and 2 as the first fds passed."""

    def __init__(self, process_obj: Any, srv: forkserver.ForkServer) -> None:
        self._server = srv
        super().__init__(process_obj)

    def _launch(self, process_obj: Any) -> None:  # popen_forkserver.Popen._launch, on self._server
        fds: list[int] = self._fds  # type: ignore[attr-defined]  # (set by popen_forkserver.Popen)
        opened = []
        for fd in (1, 2):
            try:
                os.fstat(fd)
            except OSError:  # closed here: the rank's is /dev/null
                fd = os.open(os.devnull, os.O_WRONLY)
                opened.append(fd)
            fds.append(fd)
        try:
            prep_data = spawn.get_preparation_data(process_obj._name)
            buf = io.BytesIO()
            set_spawning_popen(self)
            try:
                reduction.dump(prep_data, buf)
                reduction.dump(process_obj, buf)
            finally:
                set_spawning_popen(None)
            self.sentinel, w = self._server.connect_to_new_process(fds)
        finally:
            for fd in opened:
                os.close(fd)
        # a duplicate of the data pipe's write end: the child's sentinel of this (its parent) process
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, _close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        try:
            self.pid = forkserver.read_signed(self.sentinel)
        except KeyboardInterrupt:  # forked all the same, and nobody's: start() raises, no pid kept
            with contextlib.suppress(Exception):
                os.kill(forkserver.read_signed(self.sentinel), signal.SIGKILL)
            raise


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class RankProcess(ForkServerProcess):
    """A multiprocessing Process forked from `srv`, with the environment, stdout and stderr this
    process has when it starts."""

    def __init__(self, srv: forkserver.ForkServer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._server = srv
        self._environ: dict[str, str] = {}
        self._sigint_ignored = False

    def start(self) -> None:
        self._environ = dict(os.environ)
        # a spawned rank ignores Ctrl-C only where this process does (SIG_IGN survives exec)
        self._sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        super().start()
        _started.add(self)

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _Popen(process_obj, process_obj._server)

    def __getstate__(self) -> dict[str, object]:  # the server (a lock, a socket address) stays here
        state = dict(self.__dict__)
        state.pop("_server", None)
        return state

    def run(self) -> None:
        out, err = (forkserver.get_inherited_fds() or [])[:2]
        for f in (sys.stdout, sys.stderr):
            if f is not None:
                f.flush()
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.environ.clear()
        os.environ.update(self._environ)
        signal.signal(signal.SIGINT, signal.SIG_IGN if self._sigint_ignored else signal.default_int_handler)
        super().run()


class Starter:
    """What tracekit.capture.runner asks of a multiprocessing context: Process, Queue, SimpleQueue
    (the queues are forkserver ones, passed to the ranks as spawn passes them)."""

    def __init__(self) -> None:
        import multiprocessing

        self._srv = server()
        wait_ready(self._srv)
        self._ctx = multiprocessing.get_context("forkserver")

    def Process(self, **kwargs: Any) -> RankProcess:  # noqa: N802 (multiprocessing's name)
        return RankProcess(self._srv, **kwargs)

    def Queue(self) -> Any:  # noqa: N802
        return self._ctx.Queue()

    def SimpleQueue(self) -> Any:  # noqa: N802
        return self._ctx.SimpleQueue()
