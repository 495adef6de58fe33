"""The profiler's cost per call, measured at capture time (docs/METHOD.md section "Noise and the
profiler correction").

The dilation (profiled / unprofiled per-token time) says how much the profiler added to a token,
not where: every round has the same mix of calls, so the cost of each kind of call cannot be
solved from the rounds (one equation per rank). So each rank times the same kinds of calls with
and without the profiler, in the capture's profiler mode, right after its warm-up:

- `op`: a small aten op on the host (`torch.add` into a preallocated output, CPU tensors): what
  the mode records per host op (nothing beyond the callback check in `cuda` / `ranges` modes);
- `range`: an empty `record_function` range (the decoder's step, layer and comm ranges);
- `collective`: an all-reduce of one element over the run's process group (gloo or NCCL), all
  ranks in lockstep (TP > 1 only);
- `runtime` (CUDA only): a small kernel launch (`torch.add` on device tensors), less the `op`
  cost of the aten op around it: the profiler's cost per CUDA runtime launch. This path runs only
  where CUDA is present and has not been run in this repository's tests (no GPU there).

After an untimed warm-up (WARMUP_CALLS calls of each kind without the profiler, then under a
first profiler session), `repeats` rounds, each BLOCKS blocks of `calls` calls per kind without the profiler, then the
same blocks under a fresh profiler session (started before them and stopped after them, outside
the timing); per kind (fastest profiled block - fastest plain block) / calls, clamped at 0: a
loaded host only adds time to a block, so the fastest one is the least disturbed. Host wall clock (`time.perf_counter_ns`); a CUDA block ends with a device
synchronise inside its timing, so the launches it queued are paid for. The manifest keeps, per
kind, the median over ranks (`profiler_calibration`: `per_call_ns`, `method`, `calls`, and per
rank `per_rank_ns`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit.model.documents.manifest import ManifestCalibration

#: calls per timed block, and rounds of (plain block, profiled block)
CALLS = 200
REPEATS = 3
#: timed blocks of each kind per plain stretch and per profiler session
BLOCKS = 4
#: calls of each kind in the untimed warm-up (one block plain, one under the first profiler
#: session): enough for the first calls' lazy set-up (gloo's pairs, Kineto's start), which the
#: timed blocks must not pay. It was BLOCKS blocks of CALLS, timed and thrown away: a quarter of
#: the calibration's calls, on a TP=2 CPU capture most of them all-reduces (~1 ms of CPU each on
#: the loaded 2-core host)
WARMUP_CALLS = 20


def _timed(fn: Callable[[], None], calls: int, sync: Callable[[], None] | None) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    if sync is not None:
        sync()
    return time.perf_counter_ns() - t0


def calibrate(
    mode: str,
    device: str,
    out_dir: Path,
    rank: int,
    *,
    dist: Any = None,
    barrier: Callable[[], None] | None = None,
    calls: int = CALLS,
    repeats: int = REPEATS,
) -> ManifestCalibration | None:
    """This rank's per-call profiler cost per kind of call (module doc): `per_call_ns` {kind: ns},
    `calls` per kind per block x repeats, `method` in one line; None in mode nvtx (no profiler).
    `dist`: torch.distributed when the run has more than one rank (then every rank must call this
    together)."""
    import torch

    from tracekit.capture.profile import Tracer, resolve_mode

    mode = resolve_mode(mode, device)
    if mode == "nvtx":
        return None
    a = torch.ones(8)
    b = torch.ones(8)
    c = torch.empty(8)

    def op() -> None:
        torch.add(a, b, out=c)

    def rng() -> None:
        with torch.autograd.profiler.record_function("tracekit_calibration"):
            pass

    kinds: dict[str, tuple[Callable[[], None], Callable[[], None] | None]] = {
        "op": (op, None),
        "range": (rng, None),
    }
    if device == "cuda":
        ga, gb = a.cuda(), b.cuda()
        gc = torch.empty_like(ga)

        def launch() -> None:
            torch.add(ga, gb, out=gc)

        kinds["launch"] = (launch, torch.cuda.synchronize)
    if dist is not None:
        t = torch.ones(1, device="cuda" if device == "cuda" else "cpu")

        def coll() -> None:
            dist.all_reduce(t)

        kinds["collective"] = (coll, torch.cuda.synchronize if device == "cuda" else None)
    plain: dict[str, list[int]] = {k: [] for k in kinds}
    prof: dict[str, list[int]] = {k: [] for k in kinds}

    def blocks(into: dict[str, list[int]] | None) -> None:
        n, per_block = (BLOCKS, calls) if into is not None else (1, min(calls, WARMUP_CALLS))
        for _ in range(n):
            for k, (fn, sync) in kinds.items():
                if barrier is not None and k == "collective":
                    barrier()
                ns = _timed(fn, per_block, sync)
                if into is not None:
                    into[k].append(ns)

    def profiled(into: dict[str, list[int]] | None) -> None:
        tracer = Tracer(mode, device, out_dir, rank, warmup=0, active=0, keep=False)
        tracer.start()
        try:
            blocks(into)
        finally:
            tracer.stop()

    blocks(None)  # untimed: first calls, lazy init (one short block of each kind)
    profiled(None)  # untimed: the profiler's first session (the same)
    for _ in range(repeats):
        blocks(plain)
        profiled(prof)
    # the fastest block of each kind: a loaded host only ever adds time to a block, so the
    # minimum is the block that ran undisturbed (the median moved by 3.6 us between two runs on
    # the loaded 2-core host; the minimum is what the host noise cannot inflate)
    per_call = {k: max(0, int(round((min(prof[k]) - min(plain[k])) / calls))) for k in kinds}
    if "launch" in per_call:  # the aten op around the launch is counted by `op`
        per_call["runtime"] = max(0, per_call.pop("launch") - per_call["op"])
    return ManifestCalibration(
        per_call_ns=per_call,
        calls=calls * repeats * BLOCKS,
        method=(
            f"(fastest profiled - fastest plain block of {calls} calls) / {calls}, {repeats} x {BLOCKS} blocks "
            f"of each, mode {mode}: "
            "op = torch.add on CPU tensors, range = an empty record_function"
            + (
                ", runtime = torch.add on CUDA tensors less op (device synchronised in the timing)"
                if device == "cuda"
                else ""
            )
            + (", collective = all_reduce of one element" if dist is not None else "")
            + "; clamped at 0"
        ),
    )
