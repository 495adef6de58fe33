"""Run a function on N rank processes (gloo ranks on 127.0.0.1, a free port) and collect what each
puts on the queue: the decoder tests' TP=2 checks share it. The ranks are forked from the capture's
fork server (tracekit.capture.starter: torch imported once per test process), as a CPU capture's are."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any


def spawn_ranks(target: Callable[..., None], world: int, timeout_s: float) -> list[Any]:
    """`target(rank, world, port, queue)` on `world` processes; each puts one item on the queue.
    Returns the items in arrival order (waits up to `timeout_s` for each), then joins."""
    from tracekit.capture.starter import Starter

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = Starter()
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = [q.get(timeout=timeout_s) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return got
