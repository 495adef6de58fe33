"""One rank of a capture (`tracekit.capture.runner`): build the shard, warm up, then the measured
passes (`run_pass`: LEAD + tokens + TAIL steps, the middle kept), each profiled round under the
profiler, the traced one exported; as a spawned process (`spawned_rank`, its stderr without
USDT probe noise) or in-process under torchrun. torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit.capture import environment as env
from tracekit.capture.config import (
    CPU_THREADS_PER_RANK,
    ENV_TEARDOWN_CUPTI,
    LEAD_STEPS,
    TAIL_STEPS,
    CaptureConfig,
    Resolved,
    decoder_max_len,
    rounds_of,
    warmup_steps,
)
from tracekit.capture.rank_result import RankError, RankResult, write_result


# -- one rank --------------------------------------------------------------------------------------
def rank_main(
    rank: int,
    world: int,
    local_rank: int,
    config: CaptureConfig,
    res: Resolved,
    out_dir: Path,
    init_method: str | None,
    progress_queue: Any = None,
    destroy: bool = True,
) -> RankResult:
    """Run one rank; returns its result (also written to its result file)."""
    import datetime

    import torch

    from tracekit.capture import annotate
    from tracekit.capture.decoder import Comm, TPDecoder, make_prompt, preset
    from tracekit.capture.decoder_ops import SHARD_BACKEND
    from tracekit.capture.profile import Tracer

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast (see KINDS.md)
    if res.device == "cuda":  # spawned ranks inherit it; under torchrun, before any profiler runs
        os.environ.setdefault(ENV_TEARDOWN_CUPTI, "1")
    if res.device == "cpu":
        # one intra-op thread per rank: with more, OpenMP spinning on a shared or loaded host
        # turned a 0.7 ms tiny-preset step into 40 ms (measured on the 2-core CI-like VM)
        torch.set_num_threads(CPU_THREADS_PER_RANK)
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist: Any = None
    if world > 1:
        import torch.distributed

        dist = torch.distributed
        timeout = datetime.timedelta(seconds=config.timeout_s)
        if init_method is None:
            dist.init_process_group(res.backend, timeout=timeout)
        else:
            dist.init_process_group(
                res.backend, timeout=timeout, init_method=init_method, rank=rank, world_size=world
            )

    steps = LEAD_STEPS + config.tokens + TAIL_STEPS  # per measured pass
    n_warm = warmup_steps(config)

    def report(phase: str) -> Callable[[int, int], None] | None:
        if progress_queue is None or rank != 0:
            return None
        total = n_warm if phase == "warmup" else steps
        return lambda i, ns: progress_queue.put((phase, i + 1, total))

    def barrier() -> None:
        if dist is not None:
            if res.backend == "nccl":
                dist.barrier(device_ids=[local_rank])
            else:
                dist.barrier()

    before_ar = None
    if config.inject_delay is not None and config.inject_delay[0] == rank:
        delay_s = config.inject_delay[1] / 1000.0
        before_ar = lambda: time.sleep(delay_s)  # noqa: E731
    comm = (
        Comm(config.shard_of, 0, SHARD_BACKEND)
        if config.shard_of is not None
        else Comm(world, rank, res.backend, before_all_reduce=before_ar)
    )
    shape = preset(config.preset, config.layers)
    max_len = decoder_max_len(config)
    model = TPDecoder(
        shape,
        comm,
        seed=config.seed,
        device=device,
        dtype=torch.bfloat16 if res.dtype == "bfloat16" else torch.float32,
        max_len=max_len,
        sync_per_layer=config.inject_sync,
        cuda_graphs=config.cuda_graphs,
        compile=config.compile,
        impl=config.decoder_impl,
    )
    prompt = make_prompt(shape.vocab, config.batch, config.prompt, config.seed)

    barrier()
    model.generate(prompt, n_warm, on_token=report("warmup"), annotate_step=never_annotate)
    barrier()
    write_result(
        out_dir, RankResult(rank=rank, device=str(device), nvtx=annotate.nvtx_source(), pid=os.getpid())
    )
    fields = RankResult(
        rank=rank, inject_sync_count=model.sync_count, nccl_env=env.nccl_env(), pid=os.getpid()
    )
    if config.passes == "both" and config.calibrate:
        from tracekit.capture.calibrate import calibrate

        barrier()
        fields.profiler_calibration = calibrate(
            res.mode, res.device, out_dir, rank, dist=dist if world > 1 else None, barrier=barrier
        )
        barrier()
    # U P U P ...: under --nsys one kind only ("unprofiled": the plain runs, "traced": under nsys)
    k_rounds = rounds_of(config)
    kept = slice(LEAD_STEPS, LEAD_STEPS + config.tokens)
    unprofiled: list[list[int]] = []
    profiled: list[list[int]] = []
    order: list[str] = []
    tokens = None
    for k in range(k_rounds):
        tag = f" {k + 1}/{k_rounds}"
        if config.passes != "traced":
            ids, times = run_pass(model, prompt, config.tokens, on_token=report("unprofiled" + tag))
            tokens = ids if tokens is None else tokens
            unprofiled.append(times[kept])
            order.append("U")
            write_result(
                out_dir,
                RankResult(
                    rank=rank,
                    unprofiled_ns=unprofiled[0],
                    unprofiled_rounds_ns=unprofiled,
                    pass_order="".join(order),
                ),
            )
            barrier()
        if config.passes == "unprofiled":
            continue
        traced = k == k_rounds - 1  # only the last profiled round keeps (exports) its trace
        tracer = Tracer(
            res.mode, res.device, out_dir, rank, warmup=LEAD_STEPS, active=config.tokens, keep=traced
        )
        if traced and config.hang_rank == rank and config.hang_at == "all_reduce":
            comm.before_all_reduce = _hang  # the others block in this all-reduce until it times out
        ids, times = run_pass(model, prompt, config.tokens, tracer=tracer, on_token=report("profiled" + tag))
        tokens = ids if tokens is None else tokens
        profiled.append(times[kept])
        order.append("P")
        if not traced:
            tracer.stop()  # its recording dropped, nothing written
            barrier()
            continue
        if config.fail_rank == rank:  # after the pass (its trace is written but not listed)
            raise RuntimeError(f"injected failure on rank {rank} (CaptureConfig.fail_rank)")
        if config.kill_rank == rank:  # as the OOM killer would: no exception, no result file
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if config.hang_rank == rank and config.hang_at == "after_trace":  # only a timeout ends it
            _hang()
        path = tracer.stop()
        fields.profiled_ns = profiled[-1]
        fields.profiled_rounds_ns = profiled
        fields.traced_round = len(profiled) - 1
        fields.mode = res.mode
        fields.trace = path.name if path else None
        fields.file = env.file_entry(path, rank) if path else None
        if tracer.mode == "kernels":
            fields.marker_steps = tracer.injected_steps
    fields.inject_sync_count = model.sync_count
    fields.pass_order = "".join(order)
    if res.device == "cuda":
        fields.profiler_env = {ENV_TEARDOWN_CUPTI: os.environ.get(ENV_TEARDOWN_CUPTI) or ""}
    if unprofiled:
        fields.unprofiled_ns, fields.unprofiled_rounds_ns = unprofiled[0], unprofiled
    if rank == 0:
        fields.tokens_generated = tokens[:, : config.tokens].tolist() if tokens is not None else None
        # the ranks read versions and devices, so the parent makes no CUDA call (see ENV_RESOLVED)
        fields.versions = env.versions()
        # the devices the run used: [] for a CPU run, also on a host that has GPUs
        fields.devices = env.devices() if device.type == "cuda" else []
    fields.finished = True  # all files written: the parent may end a rank stuck in teardown
    write_result(out_dir, fields)
    if config.hang_rank == rank and config.hang_at == "teardown":  # as NCCL's destroy after graphs
        _hang()
    if dist is not None and destroy:
        model.release()  # a live graph holding NCCL collectives blocks the destroy (pytorch#115388)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return fields


def never_annotate(i: int) -> bool:
    return False


def _hang() -> None:
    """Testing (CaptureConfig.hang_rank): never return, as a rank stuck in a driver call would."""
    while True:
        time.sleep(3600)


def run_pass(
    model: Any,
    prompt: Any,
    tokens: int,
    *,
    tracer: Any = None,
    on_token: Callable[[int, int], None] | None = None,
) -> tuple[Any, list[int]]:
    """One measured pass: LEAD_STEPS + tokens + TAIL_STEPS steps; returns (ids, ns of every step).

    Keep `times[LEAD_STEPS : LEAD_STEPS + tokens]`. Only those steps open a `decode_step` range.
    With a `tracer` (a tracekit.capture.profile.Tracer built with warmup=LEAD_STEPS,
    active=tokens): it starts before the first step, and its schedule step runs before each later
    step, outside the timing; the one before the first tail step ends the recording and writes
    the trace, so no stop/flush/export lands in a kept step.
    """
    first, last = LEAD_STEPS, LEAD_STEPS + tokens  # kept: first <= i < last
    before = None
    if tracer is not None:
        tracer.start()

        def before(i: int) -> None:
            if 0 < i <= last:
                tracer.step()

    return model.generate(
        prompt,
        LEAD_STEPS + tokens + TAIL_STEPS,
        before_step=before,
        on_token=on_token,
        annotate_step=lambda i: first <= i < last,
    )


#: lines Kineto writes on stderr at every profiler start and stop ("USDT:<time> <pid>:<tid>
#: SyncActivityProfilerHandler.cpp:52] profiler_start"): its USDT probe markers, printed whatever
#: KINETO_LOG_LEVEL says short of the level that also silences Kineto's errors
USDT_PREFIX = b"USDT:"


@contextlib.contextmanager
def _stderr_without_usdt() -> Any:
    """This process' file descriptor 2 through a pipe for the duration: every line but Kineto's
    `USDT:` markers goes on to the real stderr, as it arrives (a thread); at the end fd 2 is put
    back and what is left in the pipe is written out."""
    import threading

    try:
        sys.stderr.flush()
        real = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
    except OSError:  # no stderr to filter (closed): nothing to do
        yield
        return

    def pump() -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(r, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            keep = b"".join(ln + b"\n" for ln in lines if not ln.startswith(USDT_PREFIX))
            if keep:
                with contextlib.suppress(OSError):
                    os.write(real, keep)
        if buf and not buf.startswith(USDT_PREFIX):
            with contextlib.suppress(OSError):
                os.write(real, buf)

    t = threading.Thread(target=pump, name="tracekit-stderr", daemon=True)
    t.start()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(real, 2)  # the pipe's last write end closes: the thread drains it and ends
        t.join(timeout=5)
        os.close(real)


def spawned_rank(
    rank: int,
    world: int,
    config: CaptureConfig,
    res: Resolved,
    out_dir: str,
    init_method: str,
    queue: Any,
    said: Any = None,
) -> None:
    """Entry of a spawned rank process: errors go to its result file and exit code 1."""
    from tracekit.capture.profile import error_result

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world)
    )
    try:
        with _stderr_without_usdt():  # Kineto's profiler_start/stop markers kept out of the output
            rank_main(rank, world, rank, config, res, Path(out_dir), init_method, queue)
    except BaseException as exc:
        failed = error_result(rank, exc)
        message = failed.error.message if isinstance(failed.error, RankError) else repr(exc)
        with contextlib.suppress(Exception):
            write_result(Path(out_dir), failed)
        if said is not None:  # also when the result file cannot be written (a full disk)
            with contextlib.suppress(Exception):
                said.put((rank, message))
        sys.stderr.write(f"tracekit capture: rank {rank} failed: {message}\n")
        sys.exit(1)
