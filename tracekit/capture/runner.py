"""`tracekit capture`: run the reference decoder over N ranks and write traces + manifest.json.

    from pathlib import Path
    from tracekit.capture.runner import CaptureConfig, capture
    run_dir = capture(CaptureConfig(tp=2, preset="tiny", tokens=8), Path("traces/cpu-tp2"))

Per rank: build the shard (weights from the seed), a warm-up pass, then `rounds` (K, `--rounds`,
default 3) alternating pairs of measured passes, U P U P ...: an unprofiled pass (host wall ns per
token, a device sync per token on CUDA) and a profiled pass (torch.profiler in the chosen mode,
its schedule skipping one warm-up step, then `tokens` recorded steps, timed the same way). The
host's speed drifts (the same H200 command gave dilation 1.59x and 3.13x minutes apart), so one
unprofiled pass against one profiled pass measures the drift as much as the profiler; alternating
rounds put both kinds under the same drift, and the manifest keeps every round
(`unprofiled.rounds`, `profiled.rounds`) for the pooled dilation and its interval
(tracekit.analyse.dilation). Every profiled round runs under the profiler in the same mode and
opens the same ranges, so all are timed under the same conditions, but only the last one (the
traced round) exports its trace: the others' recordings are dropped (`Tracer(keep=False)`), so
the written trace holds exactly `tokens` decode_step ranges per rank.

Every measured pass runs `LEAD + tokens + TAIL` steps at the same positions and keep the middle
`tokens`: the lead step is the profiler schedule's warm-up, and the tail step is where the
profiler stops and exports (its `step()` runs between steps, outside every timed step and every
`decode_step` range). The warm-up pass covers at least every position the measured passes use:
on the H200 smoke run, a decode step at a KV length never seen before took ~65 ms instead of ~3
(cuDNN attention builds a plan per new shape, then lazy-loads its kernel), which made the last
profiled step (one position further than the warm-up had gone) a 20x outlier. Only the kept
steps of a pass open a `decode_step` range (warm-up, lead and tail steps open none).

`--nsys`: nsys records every pass of the processes it starts, so the unprofiled pass must not run
under it (the first H200 nsys reports held 2T steps per rank, and a "dilation" between two passes
that both ran under nsys). A plain run without nsys (same workload and ranks, `passes="unprofiled"`)
records the unprofiled times; then the run under nsys (`passes="traced"`) warms up and runs only
the traced pass, so its report holds exactly `tokens` decode_step ranges per rank; then a second
plain run, so two unprofiled rounds bracket the traced one (`workload.pass_order` "UPU"; `--rounds`
does not apply: a second profiled round under nsys would put its ranges in the report). The
manifest is the nsys run's, with the plain runs' `unprofiled` rounds, and says so in
`workload.nsys`. A user's script under `--nsys` runs the same way (plain, nsys, plain).
Ranks run as spawned processes on this host, or in-process when launched by torchrun (RANK and
WORLD_SIZE set). Each rank writes rank-<r>.pt.trace.json.gz and a small result file; the
manifest (docs/JSON.md#manifest) is assembled from those. A failing rank: the others' traces are
kept, the manifest says `complete: false` with the errors, and CaptureError names the rank.

Importing this module is cheap: torch is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tracekit.capture import environment as env
from tracekit.capture.profile import ENV_DIR, ENV_MODE, ENV_PASSES, ENV_WARMUP, MODES
from tracekit.errors import CaptureError

#: progress(phase, done, total): rank 0's steps of a pass; phase is "warmup", or "unprofiled k/K" /
#: "profiled k/K" for round k of K (`phase_kind` gives the kind), in the order the passes run.
Progress = Callable[[str, int, int], None]

ENV_CONFIG = "TRACEKIT_CAPTURE_CONFIG"
ENV_RESOLVED = "TRACEKIT_CAPTURE_RESOLVED"  # under nsys: the outer process' Resolved (no CUDA calls)
#: Untimed steps of each measured pass before and after the `tokens` kept ones.
LEAD_STEPS = 1
TAIL_STEPS = 1
CPU_THREADS_PER_RANK = 1
ENV_NSYS = "NSYS"
#: Kineto leaves CUPTI attached after a profiling session (no cuptiFinalize) unless TEARDOWN_CUPTI=1
#: (pytorch/pytorch#144455: training stayed 10-20% slower after the profiler stopped). With
#: alternating rounds that cost would land in the unprofiled passes after the first profiled one,
#: so CUDA ranks run with it set, unless the environment already sets it; the manifest records the
#: value (workload.profiler_env). The teardown and the re-init run between steps, outside every
#: timed one. A precaution: on the H200 (torch 2.11+cu130) unprofiled rounds after a profiled one
#: were sometimes 2x the first with and without it alike (reports/dilation-repeat/README.md), so
#: what moved them there was the host, not a CUPTI left attached.
ENV_TEARDOWN_CUPTI = "TEARDOWN_CUPTI"


@dataclass(frozen=True)
class CaptureConfig:
    """The options of `tracekit capture` (one field per option)."""

    tp: int = 1  # ranks (tensor-parallel degree)
    tokens: int = 16  # decode steps per pass (recorded steps in the profiled pass)
    prompt: int = 16  # prompt length P (prefill, not a step)
    batch: int = 1  # sequences decoded together
    preset: str = "tiny"  # model shape: tiny, small, 7b (tracekit.capture.decoder.PRESETS)
    layers: int | None = None  # override the preset's layer count
    backend: str = "auto"  # auto (nccl on cuda, gloo on cpu), nccl, gloo
    device: str = "auto"  # auto (cuda when available), cpu, cuda
    mode: str = "auto"  # profiler mode, see tracekit.capture.profile.MODES
    seed: int = 0  # weights and prompt
    warmup: int = 4  # decode steps of the warm-up pass
    inject_delay: tuple[int, float] | None = None  # (rank, ms): host sleep before each all-reduce
    inject_sync: bool = False  # an extra device synchronisation per layer
    cuda_graphs: bool = False  # decode steps as one CUDA-graph replay each (static shapes, NCCL inside)
    compile: bool = False  # decode steps through torch.compile (static shapes)
    nsys: bool = False  # run under Nsight Systems (NVTX ranges, no torch.profiler)
    timeout_s: float = 300.0  # collective timeout, and how long to wait for ranks after one fails
    fail_rank: int | None = None  # testing: this rank raises at the end of its profiled pass
    kill_rank: int | None = None  # testing: this rank is killed (SIGKILL) at the end of its profiled pass
    #: testing: this rank hangs (sleeps, never returns) at `hang_at`: "after_trace" (the end of its
    #: traced pass, when the other ranks have nothing left to wait for: the run's watchdog ends it)
    #: or "all_reduce" (before an all-reduce of its traced pass: the others' collective times out)
    #: or "teardown" (after its last result is written, as NCCL's destroy after CUDA graphs can)
    hang_rank: int | None = None
    hang_at: str = "after_trace"
    command: str | None = None  # the command line recorded in the manifest
    #: which measured passes the ranks run: "both"; "unprofiled" (the plain run of --nsys) or
    #: "traced" (the run under nsys: warm-up and the traced pass only). Set by --nsys, not a CLI option.
    passes: str = "both"
    #: alternating measured rounds U P U P ... (--rounds); the last profiled one keeps its trace.
    #: 1 under --nsys (the plain runs before and after the run under nsys are the unprofiled rounds)
    rounds: int = 7
    #: time the profiler's cost per kind of call after the warm-up (manifest `profiler_calibration`,
    #: tracekit.capture.calibrate); not under --nsys (no torch.profiler there)
    calibrate: bool = True
    #: one rank's shard of a TP=N decoder on this one device, its collectives replaced by no-ops (the
    #: per-rank compute of TP=N measured where only one GPU is; tp must be 1). None: off
    shard_of: int | None = None
    #: the reference decoder's implementation (tracekit.capture.decoder.IMPLS): "fused" (default) or
    #: "legacy" (the decoder as first written, for the A/B of the fix)
    decoder_impl: str = "fused"


@dataclass(frozen=True)
class Resolved:
    """What `auto` became on this host."""

    device: str  # "cpu" | "cuda"
    backend: str  # "gloo" | "nccl" | "none"
    dtype: str  # "float32" | "bfloat16"
    mode: str


def parse_inject_delay(text: str | None) -> tuple[int, float] | None:
    """ "RANK:MS" -> (rank, ms)."""
    if not text:
        return None
    try:
        rank_s, ms_s = text.split(":", 1)
        rank, ms = int(rank_s), float(ms_s)
    except ValueError:
        raise CaptureError(f"--inject-delay wants RANK:MS (e.g. 1:20), got {text!r}") from None
    if rank < 0 or ms < 0:
        raise CaptureError(f"--inject-delay wants a rank >= 0 and MS >= 0, got {text!r}")
    return rank, ms


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(config: CaptureConfig, world: int | None = None) -> Resolved:
    """Check the config and decide device, backend, dtype and profiler mode. Raises CaptureError."""
    from tracekit.capture.decoder import check_tp, preset
    from tracekit.capture.profile import resolve_mode

    given = os.environ.get(ENV_RESOLVED)
    if given:  # decided by the process that started nsys: no CUDA call in this (non-rank) process
        return Resolved(**json.loads(given))
    n = world or config.tp
    if n < 1:
        raise CaptureError(f"--tp must be at least 1, got {n}")
    if config.tokens < 1 or config.prompt < 1 or config.batch < 1:
        raise CaptureError("--tokens, --prompt and --batch must be at least 1")
    if config.rounds < 1:
        raise CaptureError(f"--rounds must be at least 1, got {config.rounds}")
    check_tp(preset(config.preset, config.layers), n)
    if config.shard_of is not None:
        if config.shard_of < 2:
            raise CaptureError(f"--shard-of wants a TP degree of at least 2, got {config.shard_of}")
        if n != 1:
            raise CaptureError(
                f"--shard-of runs one rank's shard in one process: use it with --tp 1, not --tp {n}"
            )
        if config.inject_delay is not None:
            raise CaptureError("--shard-of has no other ranks to delay: drop --inject-delay")
        check_tp(preset(config.preset, config.layers), config.shard_of)
    from tracekit.capture.decoder import IMPLS

    if config.decoder_impl not in IMPLS:
        raise CaptureError(f"--decoder-impl must be one of {', '.join(IMPLS)}, got {config.decoder_impl!r}")
    if config.device not in ("auto", "cpu", "cuda"):
        raise CaptureError(f"--device must be auto, cpu or cuda, got {config.device!r}")
    if config.backend not in ("auto", "gloo", "nccl"):
        raise CaptureError(f"--backend must be auto, gloo or nccl, got {config.backend!r}")
    if config.inject_delay is not None and config.inject_delay[0] >= n:
        raise CaptureError(f"--inject-delay names rank {config.inject_delay[0]} but there are {n} ranks")
    if config.passes not in ("both", "unprofiled", "traced"):
        raise CaptureError(f"passes must be both, unprofiled or traced, got {config.passes!r}")
    if config.fail_rank is not None and config.fail_rank >= n:
        raise CaptureError(f"fail_rank {config.fail_rank} but there are {n} ranks")
    if config.hang_at not in ("after_trace", "all_reduce", "teardown"):
        raise CaptureError(f"hang_at must be after_trace, all_reduce or teardown, got {config.hang_at!r}")
    if config.timeout_s <= 0:
        raise CaptureError(f"--timeout must be more than 0 s, got {config.timeout_s}")
    local_n = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    device = config.device
    if device == "auto":
        device = "cuda" if _cuda_count() > 0 else "cpu"
    if device == "cuda":
        count = _cuda_count()
        if count == 0:
            raise CaptureError(
                "--device cuda but no CUDA device is visible (torch.cuda.is_available() is False)"
            )
        if local_n > count:
            raise CaptureError(
                f"{local_n} ranks on this host need {local_n} GPUs but {count} are visible "
                "(one rank per GPU; lower --tp or use --device cpu)"
            )
    if config.cuda_graphs and device != "cuda":
        raise CaptureError("--cuda-graphs needs CUDA (--device cuda); on a CPU use --compile")
    if config.cuda_graphs and (config.inject_delay is not None or config.inject_sync):
        raise CaptureError(
            "--cuda-graphs cannot replay --inject-delay or --inject-sync (host code is not in a graph)"
        )
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise CaptureError("--backend nccl needs --device cuda (use gloo on CPU)")
    if n == 1:
        backend = "none"
    mode = config.mode
    if config.nsys:
        if mode not in ("auto", "nvtx"):
            raise CaptureError(
                "--nsys records NVTX ranges under Nsight Systems; torch.profiler and nsys cannot share "
                "CUPTI, so --mode must be auto or nvtx with --nsys"
            )
        mode = "nvtx"
    mode = resolve_mode(mode, device)
    return Resolved(
        device=device, backend=backend, dtype="bfloat16" if device == "cuda" else "float32", mode=mode
    )


def warmup_steps(config: CaptureConfig) -> int:
    """Steps of the warm-up pass: --warmup, and at least every position a measured pass reaches."""
    return max(config.warmup, LEAD_STEPS + config.tokens + TAIL_STEPS)


def workload(config: CaptureConfig, res: Resolved, world: int) -> dict[str, Any]:
    from tracekit.capture.decoder import cache_length, collectives, preset

    shape = preset(config.preset, config.layers)
    return {
        "preset": config.preset,
        "tp": world,
        "tokens": config.tokens,
        "prompt": config.prompt,
        "batch": config.batch,
        "backend": res.backend,
        "device": res.device,
        "dtype": res.dtype,
        "seed": config.seed,
        "layers": shape.layers,
        "shape": asdict(shape),
        "warmup_tokens": warmup_steps(config),
        "profiler_warmup_steps": LEAD_STEPS,
        "untimed_tail_steps": TAIL_STEPS,
        "collectives": collectives(shape, world, config.batch, res.dtype),
        "inject_delay": None
        if config.inject_delay is None
        else {"rank": config.inject_delay[0], "ms": config.inject_delay[1]},
        "inject_sync": config.inject_sync,
        "cuda_graphs": config.cuda_graphs,
        "compile": config.compile,
        "mode": res.mode,
        "step_pattern": "decode_step",
        "cpu_threads_per_rank": CPU_THREADS_PER_RANK if res.device == "cpu" else None,
        "rounds": rounds_of(config),
        "shard_of": config.shard_of,
        "decoder_impl": config.decoder_impl,
        "kv_cache_len": cache_length(decoder_max_len(config), config.decoder_impl),
    }


def decoder_max_len(config: CaptureConfig) -> int:
    """The decoder's positions: the prompt, every step of the warm-up pass, one more."""
    return config.prompt + warmup_steps(config) + 1


def rounds_of(config: CaptureConfig) -> int:
    """Measured rounds each rank runs: --rounds, or 1 for the plain and traced runs of --nsys."""
    return config.rounds if config.passes == "both" else 1


def phase_kind(phase: str) -> str:
    """ "unprofiled 2/3" -> "unprofiled" (a progress phase's kind of pass)."""
    return phase.split(" ", 1)[0]


# -- one rank --------------------------------------------------------------------------------------
def _rank_main(
    rank: int,
    world: int,
    local_rank: int,
    config: CaptureConfig,
    res: Resolved,
    out_dir: Path,
    init_method: str | None,
    progress_queue: Any = None,
    destroy: bool = True,
) -> dict[str, Any]:
    """Run one rank; returns its result fields (also written to its result file)."""
    import datetime

    import torch

    from tracekit.capture import annotate
    from tracekit.capture.decoder import SHARD_BACKEND, Comm, TPDecoder, make_prompt, preset
    from tracekit.capture.profile import Tracer, write_result

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
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=config.timeout_s)}
        if init_method is not None:
            kwargs.update(init_method=init_method, rank=rank, world_size=world)
        dist.init_process_group(res.backend, **kwargs)

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
    model.generate(prompt, n_warm, on_token=report("warmup"), annotate_step=_never)
    barrier()
    write_result(out_dir, rank, device=str(device), nvtx=annotate.nvtx_source(), pid=os.getpid())
    fields: dict[str, Any] = {
        "inject_sync_count": model.sync_count,
        "nccl_env": env.nccl_env(),
        "pid": os.getpid(),
    }
    if config.passes == "both" and config.calibrate:
        from tracekit.capture.calibrate import calibrate

        barrier()
        fields["profiler_calibration"] = calibrate(
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
                rank,
                unprofiled_ns=unprofiled[0],
                unprofiled_rounds_ns=unprofiled,
                pass_order="".join(order),
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
        fields.update(
            {
                "profiled_ns": profiled[-1],
                "profiled_rounds_ns": profiled,
                "traced_round": len(profiled) - 1,
                "mode": res.mode,
                "trace": path.name if path else None,
                "file": env.file_entry(path, rank) if path else None,
            }
        )
        if tracer.mode == "kernels":
            fields["marker_steps"] = tracer.injected_steps
    fields["inject_sync_count"] = model.sync_count
    fields["pass_order"] = "".join(order)
    if res.device == "cuda":
        fields["profiler_env"] = {ENV_TEARDOWN_CUPTI: os.environ.get(ENV_TEARDOWN_CUPTI)}
    if unprofiled:
        fields.update(unprofiled_ns=unprofiled[0], unprofiled_rounds_ns=unprofiled)
    if rank == 0:
        fields["tokens_generated"] = tokens[:, : config.tokens].tolist() if tokens is not None else None
        # the ranks read versions and devices, so the parent makes no CUDA call (see ENV_RESOLVED)
        fields["versions"] = env.versions()
        # the devices the run used: [] for a CPU run, also on a host that has GPUs
        fields["devices"] = env.devices() if device.type == "cuda" else []
    fields["finished"] = True  # all files written: the parent may end a rank stuck in teardown
    write_result(out_dir, rank, **fields)
    if config.hang_rank == rank and config.hang_at == "teardown":  # as NCCL's destroy after graphs
        _hang()
    if dist is not None and destroy:
        model.release()  # a live graph holding NCCL collectives blocks the destroy (pytorch#115388)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return fields


def _never(i: int) -> bool:
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


def _spawned_rank(
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
    from tracekit.capture.profile import error_fields, write_result

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world)
    )
    try:
        with _stderr_without_usdt():  # Kineto's profiler_start/stop markers kept out of the output
            _rank_main(rank, world, rank, config, res, Path(out_dir), init_method, queue)
    except BaseException as exc:
        fields = error_fields(exc)
        with contextlib.suppress(Exception):
            write_result(Path(out_dir), rank, **fields)
        if said is not None:  # also when the result file cannot be written (a full disk)
            with contextlib.suppress(Exception):
                said.put((rank, fields["error"]["message"]))
        sys.stderr.write(f"tracekit capture: rank {rank} failed: {fields['error']['message']}\n")
        sys.exit(1)


# -- the manifest ----------------------------------------------------------------------------------
def read_results(out_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in sorted(out_dir.glob(".rank-*.result.json")):
        try:
            doc = json.loads(p.read_text())
            out[int(doc["rank"])] = doc
        except (ValueError, KeyError, OSError):
            continue
    return out


def build_manifest(
    *,
    world: int,
    results: dict[int, dict[str, Any]],
    workload_doc: dict[str, Any],
    command: str | None,
    errors: Sequence[dict[str, Any]] = (),
    extra_files: dict[str, dict[str, Any]] | None = None,
    needs_traces: bool = True,
    nccl: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The manifest document (docs/JSON.md#manifest) from the per-rank results."""
    errs = [dict(e) for e in errors]
    seen = {e.get("rank") for e in errs}
    for r in range(world):
        res = results.get(r, {})
        if res.get("error") and r not in seen:
            errs.append({"rank": r, "message": res["error"]["message"], "how": "error"})
            seen.add(r)
    files: dict[str, dict[str, Any]] = {}
    for r in range(world):
        fe = results.get(r, {}).get("file")
        if fe:
            files[env.trace_name(r)] = fe
        elif needs_traces and r not in seen:
            errs.append({"rank": r, "message": "no trace written", "how": "no_trace"})
    files.update(extra_files or {})
    unprof = {str(r): results[r]["unprofiled_ns"] for r in sorted(results) if results[r].get("unprofiled_ns")}
    prof = {str(r): results[r]["profiled_ns"] for r in sorted(results) if results[r].get("profiled_ns")}
    u_rounds, p_rounds = _rounds(results, "unprofiled"), _rounds(results, "profiled")
    traced_round = next(
        (int(results[r]["traced_round"]) for r in sorted(results) if "traced_round" in results[r]),
        len(p_rounds) - 1,
    )
    order = results.get(0, {}).get("pass_order")
    if order and "rounds" in workload_doc:  # the order rank 0 really ran its passes in
        workload_doc = dict(workload_doc, pass_order=order)
    if results.get(0, {}).get("profiler_env"):
        workload_doc = dict(workload_doc, profiler_env=results[0]["profiler_env"])
    dil, interval = env.dilation(u_rounds, p_rounds)
    from tracekit.capture.calibrate import merge_ranks

    calibration = merge_ranks({r: results[r].get("profiler_calibration") or {} for r in results})
    return {
        "schema_version": env.SCHEMA_VERSION,
        "kind": "tracekit.capture",
        "complete": not errs,
        "errors": sorted(errs, key=lambda e: (e.get("rank") is None, e.get("rank") or 0)),
        "created": env.now_utc(),
        "versions": results.get(0, {}).get("versions") or env.versions(),
        "host": env.host_info(),
        "devices": results[0]["devices"] if "devices" in results.get(0, {}) else env.devices(),
        "topology": env.topology(),
        "nccl_env": nccl
        if nccl is not None
        else next(
            (results[r]["nccl_env"] for r in sorted(results) if "nccl_env" in results[r]), env.nccl_env()
        ),
        "workload": workload_doc,
        # per_token_ns: the first unprofiled round and the traced profiled round (pre-1.2 readers);
        # rounds: every round in run order (docs/JSON.md#manifest)
        "unprofiled": {"per_token_ns": unprof, "rounds": u_rounds},
        "profiled": {"per_token_ns": prof, "rounds": p_rounds, "traced_round": max(traced_round, 0)},
        "dilation": dil,
        "dilation_interval": interval,
        **({"profiler_calibration": calibration} if calibration else {}),
        "tokens_generated": results.get(0, {}).get("tokens_generated"),
        "nvtx": results.get(0, {}).get("nvtx"),
        "inject_sync_count": {
            str(r): results[r]["inject_sync_count"]
            for r in sorted(results)
            if "inject_sync_count" in results[r]
        },
        # OS process id per rank: names the ranks of a one-file multi-process nsys report
        "rank_pids": {str(r): results[r]["pid"] for r in sorted(results) if "pid" in results[r]},
        **(
            {
                "marker_steps": {
                    str(r): results[r]["marker_steps"]
                    for r in sorted(results)
                    if "marker_steps" in results[r]
                }
            }
            if any("marker_steps" in results[r] for r in results)
            else {}
        ),
        "files": files,
        "command": command,
    }


def _rounds(results: dict[int, dict[str, Any]], kind: str) -> list[dict[str, list[int]]]:
    """Every round of one kind ("unprofiled" | "profiled") as {rank: [ns, ...]}, in run order, from
    the ranks' `<kind>_rounds_ns` (or their one `<kind>_ns`: a user's script, one round)."""
    per_rank: dict[str, list[list[int]]] = {}
    for r in sorted(results):
        lists = results[r].get(f"{kind}_rounds_ns") or (
            [results[r][f"{kind}_ns"]] if results[r].get(f"{kind}_ns") else []
        )
        if lists:
            per_rank[str(r)] = lists
    k = max((len(v) for v in per_rank.values()), default=0)
    return [{rk: v[i] for rk, v in per_rank.items() if i < len(v) and v[i]} for i in range(k)]


def _set_unprofiled(manifest: dict[str, Any], rounds: list[dict[str, list[int]]]) -> None:
    """--nsys: the plain runs' unprofiled rounds into the manifest of the run under nsys (in place),
    with the dilation recomputed from them."""
    rounds = [r for r in rounds if r]
    manifest["unprofiled"] = {"per_token_ns": rounds[0] if rounds else {}, "rounds": rounds}
    manifest["dilation"], manifest["dilation_interval"] = env.dilation(
        rounds, manifest["profiled"].get("rounds") or [manifest["profiled"]["per_token_ns"]]
    )


def _finish(out_dir: Path, manifest: dict[str, Any]) -> Path:
    path = out_dir / env.MANIFEST_NAME
    try:
        env.atomic_write_json(path, manifest)
        written = None
    except OSError as exc:  # a full disk: no manifest at all (never half of one)
        written = f"no manifest written: cannot write {path} ({exc.strerror or exc})"
    if not manifest["complete"]:
        parts = "; ".join(
            f"rank {e['rank']}: {e['message']}" if e.get("rank") is not None else e["message"]
            for e in manifest["errors"]
        )
        parts = " ".join(parts.split())  # one line, whatever a rank's exception said
        n = len(manifest.get("files") or {})
        kept = written or f"kept {n} whole trace file(s) and the manifest in {out_dir}"
        raise CaptureError(f"capture incomplete ({parts}); {kept}")
    if written:
        raise CaptureError(f"capture finished but {written}; the traces in {out_dir} are whole")
    for p in out_dir.glob(".rank-*.result.json"):
        p.unlink()
    return out_dir


def _command(config: CaptureConfig) -> str:
    return config.command or "tracekit " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: what a capture writes in its folder (and clears there first): `--force` is needed to replace them
_OUTPUT_GLOBS = ("manifest.json", "rank-*.pt.trace.json.gz", "nsys.nsys-rep", "nsys.sqlite", "nsys.qdstrm")


def existing_outputs(out_dir: Path) -> list[str]:
    """Names in `out_dir` that a capture would replace (an earlier capture's manifest and traces)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted({p.name for g in _OUTPUT_GLOBS for p in out_dir.glob(g)})


def check_out_dir(out_dir: Path, force: bool) -> None:
    """CaptureError (one line) when `out_dir` is a file, or holds an earlier capture's files and
    `force` is false: nothing already there is replaced without `--force`."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CaptureError(f"-o/--output {out_dir}: exists and is not a folder")
    found = existing_outputs(out_dir)
    if found and not force:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise CaptureError(
            f"-o/--output {out_dir} already holds {shown} from an earlier capture: pass --force to replace "
            "them, or choose another folder"
        )


def _prepare_out_dir(out_dir: Path) -> None:
    """Create `out_dir` and make sure it can be written; CaptureError (one line) when not."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".tracekit-write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CaptureError(f"-o/--output {out_dir}: cannot write there ({exc.strerror or exc})") from None


def _clear_outputs(out_dir: Path) -> None:
    for p in list(out_dir.glob(".rank-*.result.json")) + list(out_dir.glob("rank-*.pt.trace.json.gz")):
        p.unlink()
    with contextlib.suppress(FileNotFoundError):
        (out_dir / env.MANIFEST_NAME).unlink()


# -- entry points ----------------------------------------------------------------------------------
def capture(config: CaptureConfig, out_dir: Path, progress: Progress | None = None) -> Path:
    """Run the capture described by `config` into `out_dir` (created); returns `out_dir`.

    Under torchrun (RANK and WORLD_SIZE in the environment) every process runs its own rank and
    rank 0 writes the manifest. Raises CaptureError on bad options or a failed rank (after writing
    the manifest with `complete: false`).
    """
    out_dir = Path(out_dir)
    if config.nsys and os.environ.get("TRACEKIT_UNDER_NSYS") != "1":
        return _capture_under_nsys(config, out_dir, progress)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and os.environ.get("TRACEKIT_SPAWNED") != "1":
        return _capture_torchrun(config, out_dir)
    res = resolve(config)
    world = config.tp
    _prepare_out_dir(out_dir)
    _clear_outputs(out_dir)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue() if progress is not None else None
    said = ctx.SimpleQueue()  # each failing rank's error, whether or not its result file was written
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = []
    old = os.environ.get("TRACEKIT_SPAWNED")
    os.environ["TRACEKIT_SPAWNED"] = "1"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    teardown_set = res.device == "cuda" and ENV_TEARDOWN_CUPTI not in os.environ
    if teardown_set:  # for the spawned ranks only (see ENV_TEARDOWN_CUPTI)
        os.environ[ENV_TEARDOWN_CUPTI] = "1"
    try:
        for r in range(world):
            p = ctx.Process(
                target=_spawned_rank,
                args=(r, world, config, res, str(out_dir), init, queue, said),
                daemon=False,
            )
            p.start()
            procs.append(p)
    finally:
        if teardown_set:
            os.environ.pop(ENV_TEARDOWN_CUPTI, None)
        if old is None:
            os.environ.pop("TRACEKIT_SPAWNED", None)
        else:
            os.environ["TRACEKIT_SPAWNED"] = old
    errors: list[dict[str, Any]] = []
    stuck: list[int] = []  # ranks that finished their work but did not exit (ended by us)
    try:
        _wait_for_ranks(procs, queue, progress, config, errors, out_dir=out_dir, stuck=stuck)
    except KeyboardInterrupt:  # Ctrl-C: stop the ranks, keep what they finished, say so in the manifest
        for r, p in enumerate(procs):
            if p.is_alive():
                p.terminate()
                errors.append(
                    {"rank": r, "message": "interrupted (Ctrl-C) before it finished", "how": "interrupted"}
                )
    for p in procs:
        p.join(timeout=10)
    if queue is not None:
        with contextlib.suppress(Exception):
            while True:
                progress(*queue.get_nowait())  # type: ignore[misc]
    for p in procs:
        if p.is_alive():  # did not end within the join: never leave a rank behind
            p.kill()
            p.join(timeout=5)
    messages: dict[int, str] = {}
    with contextlib.suppress(Exception):
        while not said.empty():
            r, msg = said.get()
            messages[int(r)] = str(msg)
    results = read_results(out_dir)
    for r, msg in messages.items():  # a rank whose result file could not say it (a full disk)
        if not results.get(r, {}).get("error"):
            results.setdefault(r, {"rank": r})["error"] = {"message": msg}
    _blame_timeouts(results, errors)
    for r, p in enumerate(procs):
        if (
            p.exitcode not in (0, None)
            and r not in stuck
            and not results.get(r, {}).get("error")
            and not any(e["rank"] == r for e in errors)
        ):
            errors.append(
                {
                    "rank": r,
                    "message": exit_words(p.exitcode),
                    "how": "killed" if p.exitcode < 0 else "exited",
                }
            )
    manifest = build_manifest(
        world=world,
        results=results,
        workload_doc=workload(config, res, world),
        command=_command(config),
        errors=errors,
        needs_traces=res.mode != "nvtx",
    )
    if stuck:
        manifest["notes"] = [
            f"rank {r} wrote all its files but did not exit within {TEARDOWN_GRACE_S:g} s (stuck in "
            "process-group teardown); ended by tracekit, its files are complete"
            for r in stuck
        ]
    return _finish(out_dir, manifest)


def exit_words(code: int) -> str:
    """A rank process's exit code in words: a negative code is the signal that ended it."""
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory? the kernel's OOM killer sends it)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"process exited with code {code}"


#: Seconds a rank may take to exit after writing its last result (`finished`): NCCL teardown after
#: CUDA graphs can block forever (pytorch/pytorch#115388; both ranks at TP=2 on two H200s).
TEARDOWN_GRACE_S = 20.0


def _finished_ranks(out_dir: Path | None) -> set[int]:
    if out_dir is None:
        return set()
    return {r for r, doc in read_results(out_dir).items() if doc.get("finished") and not doc.get("error")}


def _wait_for_ranks(
    procs: list[Any],
    queue: Any,
    progress: Progress | None,
    config: CaptureConfig,
    errors: list[dict[str, Any]],
    out_dir: Path | None = None,
    stuck: list[int] | None = None,
) -> None:
    """Until every rank ends. Once one rank has ended, the others get a grace period: min(timeout_s,
    60) s after a failure, timeout_s (the collective timeout, `--timeout`) after a rank finished
    normally. A rank still running then is hung (a rank that finished has no collective left to
    wait on, so only this ends it): terminated, killed if SIGTERM does not end it, and named."""
    ended: tuple[float, int, bool] | None = None  # (when, rank, failed)
    finished_at: dict[int, float] = {}  # rank -> when its result first said `finished`
    last_look = 0.0
    while any(p.is_alive() for p in procs):
        if queue is not None:
            with contextlib.suppress(Exception):
                while True:
                    phase, done, total = queue.get(timeout=0.05)
                    progress(phase, done, total)  # type: ignore[misc]
        else:
            time.sleep(0.05)
        now = time.monotonic()
        if stuck is not None and now - last_look >= 0.5:
            last_look = now
            for r in _finished_ranks(out_dir):
                finished_at.setdefault(r, now)
            for r, t in finished_at.items():
                p = procs[r]
                if p.is_alive() and now - t > TEARDOWN_GRACE_S:
                    p.terminate()
                    p.join(timeout=5)
                    if p.is_alive():
                        p.kill()
                        p.join(timeout=5)
                    stuck.append(r)
        for r, p in enumerate(procs):
            code = p.exitcode
            if code is None or r in (stuck or ()) or (ended is not None and (ended[2] or code == 0)):
                continue
            ended = (now, r, code != 0)  # the first rank to end; a later failure shortens the wait
            break
        if ended is None:
            continue
        since, who, failed = ended
        grace = min(config.timeout_s, 60.0) if failed else config.timeout_s
        if now - since <= grace:
            continue
        hung = [(r, p) for r, p in enumerate(procs) if p.is_alive()]
        for r, p in hung:
            p.terminate()
            errors.append(
                {
                    "rank": r,
                    "message": f"hung: still running {grace:g} s after rank {who} "
                    f"{'failed' if failed else 'finished'} (--timeout {config.timeout_s:g}); terminated",
                    "how": "hung",
                }
            )
        for _, p in hung:
            p.join(timeout=5)
            if p.is_alive():  # SIGTERM ignored or blocked in a driver call
                p.kill()
        break


def _blame_timeouts(results: dict[int, dict[str, Any]], errors: list[dict[str, Any]]) -> None:
    """A rank whose collective timed out was waiting for a rank that hung: say so (in place), so
    the manifest and the message name the rank that hung, not only the one that gave up."""
    hung = sorted(e["rank"] for e in errors if e.get("how") == "hung")
    if not hung:
        return
    named = {e.get("rank") for e in errors}
    for r, res in sorted(results.items()):
        msg = str((res.get("error") or {}).get("message", ""))
        if r in named or not msg or "timed out" not in msg.lower() and "timeout" not in msg.lower():
            continue
        who = ", ".join(map(str, hung))
        said = re.sub(r"\[[^\]]*\]\s*", "", msg)[:200]  # without gloo's [source/file.cc:78]
        errors.append(
            {
                "rank": r,
                "message": f"collective timed out waiting for rank {who}, which hung ({said})",
                "how": "collective_timeout",
            }
        )


def _capture_torchrun(config: CaptureConfig, out_dir: Path) -> Path:
    """One rank of a torchrun launch; rank 0 gathers the results and writes the manifest."""
    from tracekit.capture.profile import error_fields, write_result

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if config.tp not in (1, world):
        raise CaptureError(f"--tp {config.tp} but torchrun started WORLD_SIZE={world} ranks")
    res = resolve(config, world)
    _prepare_out_dir(out_dir)
    try:
        fields = _rank_main(
            rank, world, local_rank, config, res, out_dir, "env://" if world > 1 else None, destroy=False
        )
    except BaseException as exc:
        write_result(out_dir, rank, **error_fields(exc))
        raise CaptureError(f"rank {rank} failed: {error_fields(exc)['error']['message']}") from exc
    if world > 1:  # the result files may live on other hosts: gather them to rank 0
        import torch.distributed as dist

        gathered: list[Any] = [None] * world if rank == 0 else []
        mine = dict(fields, rank=rank)
        dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
        dist.destroy_process_group()
        if rank != 0:
            return out_dir
        results = {int(g["rank"]): g for g in gathered if g}
    else:
        results = read_results(out_dir)
    manifest = build_manifest(
        world=world,
        results=results,
        workload_doc=workload(config, res, world),
        command=_command(config),
        needs_traces=res.mode != "nvtx",
    )
    return _finish(out_dir, manifest)


def find_nsys() -> str:
    """The nsys executable: $NSYS, else `nsys` on PATH. CaptureError when neither exists."""
    cand = os.environ.get(ENV_NSYS)
    if cand:
        if Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
        raise CaptureError(f"NSYS={cand} is not an executable file")
    found = shutil.which("nsys")
    if found is None:
        raise CaptureError(
            "nsys (Nsight Systems) not found: put it on PATH or set NSYS=/path/to/nsys "
            "(docs/NSYS.md says what it needs)"
        )
    return found


def _run_nsys(argv: list[str], out_dir: Path, child_env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Run argv under `nsys profile -t cuda,nvtx`, export SQLite; returns their manifest file entries.
    CaptureError when the command under nsys failed (the nsys files are kept)."""
    files, rc = _nsys_profile(argv, out_dir, child_env)
    if rc != 0:
        raise CaptureError(f"the command under nsys exited with {rc}; nsys files kept in {out_dir}")
    return files


def _nsys_profile(
    argv: list[str], out_dir: Path, child_env: dict[str, str]
) -> tuple[dict[str, dict[str, Any]], int]:
    """`nsys profile -t cuda,nvtx` of argv into out_dir/nsys.nsys-rep, then its SQLite export.
    Returns (manifest file entries of both, the command's exit code). CaptureError when nsys wrote
    no report or the export failed."""
    nsys = find_nsys()
    rep = out_dir / "nsys"
    cmd = [
        nsys,
        "profile",
        "-t",
        "cuda,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "-o",
        str(rep),
        "-f",
        "true",
        *argv,
    ]
    try:
        r = subprocess.run(cmd, env=child_env)
    except OSError as exc:
        raise CaptureError(f"cannot run {nsys!r}: {exc}") from exc
    rep_file = out_dir / "nsys.nsys-rep"
    if not rep_file.exists():
        hint = ""
        if (out_dir / "nsys.qdstrm").exists():
            hint = " (only nsys.qdstrm was left: the nsys importer is missing a library, see docs/NSYS.md)"
        raise CaptureError(f"nsys profile exited with {r.returncode} and wrote no {rep_file}{hint}")
    sqlite = out_dir / "nsys.sqlite"
    e = subprocess.run(
        [nsys, "export", "--type", "sqlite", "-f", "true", "-o", str(sqlite), str(rep_file)],
        capture_output=True,
        text=True,
    )
    if e.returncode != 0 or not sqlite.exists():
        raise CaptureError(
            f"nsys export --type sqlite failed ({e.returncode}): {(e.stderr or e.stdout).strip()[-300:]}"
        )
    return {p.name: env.file_entry(p, None) for p in (rep_file, sqlite)}, r.returncode


#: manifest workload.nsys: how a --nsys capture was made (docs/JSON.md#manifest)
NSYS_UNPROFILED = "separate runs without nsys, one before and one after the run under nsys"
NSYS_TRACED = "run under nsys: warm-up and the traced pass only; only its kept steps open decode_step ranges"
#: the second plain run of --nsys goes here, then into the manifest, then is removed
_PLAIN_AFTER = ".plain-after"


def _capture_under_nsys(config: CaptureConfig, out_dir: Path, progress: Progress | None) -> Path:
    """--nsys: three runs of the same workload and process layout. A plain run (no nsys) records
    one unprofiled round; then the run under nsys, whose ranks warm up and run only the traced
    pass, so the report holds exactly `tokens` decode_step ranges per rank; then a second plain
    run, another unprofiled round, so the unprofiled rounds bracket the traced one (pass order
    U P U). The manifest is the nsys run's, with the plain runs' `unprofiled` rounds and the
    dilation from them. A failed second plain run leaves one unprofiled round and says why in
    `workload.nsys.unprofiled_after_error`.
    """
    res = resolve(config)  # check options before starting anything
    find_nsys()
    _prepare_out_dir(out_dir)
    cmd = _command(config)
    plain_cfg = replace(
        config, nsys=False, mode=res.mode, passes="unprofiled", fail_rank=None, command=cmd, rounds=1
    )
    capture(plain_cfg, out_dir, progress)  # raises CaptureError (its manifest kept) when a rank fails
    manifest_path = out_dir / env.MANIFEST_NAME
    plain = json.loads(manifest_path.read_text())
    _clear_outputs(out_dir)

    child_env = dict(
        os.environ, TRACEKIT_UNDER_NSYS="1", NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0")
    )
    cfg = replace(config, command=cmd, passes="traced", rounds=1)
    child_env[ENV_CONFIG] = json.dumps(asdict(cfg))
    # the process nsys starts is not a rank: it must make no CUDA call, or a multi-process report
    # holds one more CUDA process than there are ranks (the H200 smoke run: 3 processes for tp=2)
    child_env[ENV_RESOLVED] = json.dumps(asdict(res))
    argv = [sys.executable, "-m", "tracekit.capture.runner", str(out_dir)]
    try:
        files = _run_nsys(argv, out_dir, child_env)
    finally:  # also when the run under nsys failed: its manifest gets the plain run's times
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text())
            _merge_plain_runs(manifest, [plain])
            env.atomic_write_json(manifest_path, manifest)
    if not manifest_path.exists():
        raise CaptureError(f"the capture under nsys wrote no manifest in {out_dir}")
    manifest["files"].update(files)
    after_dir = out_dir / _PLAIN_AFTER
    try:
        capture(plain_cfg, after_dir, progress)
        _merge_plain_runs(manifest, [plain, json.loads((after_dir / env.MANIFEST_NAME).read_text())])
    except (CaptureError, OSError, ValueError) as exc:
        manifest["workload"]["nsys"]["unprofiled_after_error"] = str(exc)
    finally:
        shutil.rmtree(after_dir, ignore_errors=True)
    env.atomic_write_json(manifest_path, manifest)
    return out_dir


def _merge_plain_runs(manifest: dict[str, Any], plains: list[dict[str, Any]]) -> None:
    """Put the plain runs' unprofiled times into the nsys run's manifest (in place): one
    unprofiled round per plain run, in run order (before, after the run under nsys)."""
    _set_unprofiled(manifest, [p["unprofiled"]["per_token_ns"] for p in plains])
    traced_tokens = manifest.get("tokens_generated")
    manifest["workload"]["pass_order"] = "UPU" if len(plains) > 1 else "UP"
    manifest["workload"]["nsys"] = {
        "unprofiled": NSYS_UNPROFILED,
        "traced": NSYS_TRACED,
        "unprofiled_rank_pids": plains[0].get("rank_pids", {}),
        "unprofiled_rank_pids_rounds": [p.get("rank_pids", {}) for p in plains],
        # greedy tokens of the plain runs equal to the traced run's (same weights, prompt, layout)
        "tokens_match": None
        if traced_tokens is None
        else all(p.get("tokens_generated") == traced_tokens for p in plains),
    }


def capture_script(
    argv: Sequence[str],
    out_dir: Path,
    *,
    mode: str = "auto",
    warmup: int = 1,
    nsys: bool = False,
    command: str | None = None,
) -> Path:
    """Run a user's script (`python my_decode.py ...`, or `torchrun ... my_decode.py`) that uses
    `tracekit.profile()`; assemble manifest.json from what its ranks wrote. Returns `out_dir`.

    The script's own `tracekit.profile()` blocks are its passes: one unprofiled and one profiled
    round each (`--rounds` is the reference decoder's; a script alternates by itself if it wants).

    With `nsys`, as for the reference decoder: the script runs three times, plain with
    TRACEKIT_CAPTURE_PASSES=unprofiled (only its `tracekit.profile(profiled=False)` blocks record),
    then under nsys with TRACEKIT_CAPTURE_PASSES=traced (only its profiled blocks record or open
    ranges), then plain again, so the report holds no step of an unprofiled pass and two
    unprofiled rounds bracket the traced one. A script without an unprofiled pass runs only the
    first two and gets `dilation: null`.
    """
    if not argv:
        raise CaptureError(
            "no command given after `--` (e.g. tracekit capture -o DIR -- python my_decode.py)"
        )
    if mode not in MODES:
        raise CaptureError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if nsys and mode not in ("auto", "nvtx"):
        raise CaptureError("--nsys records NVTX ranges; use --mode auto or nvtx with it")
    if nsys:
        find_nsys()  # before running anything
    out_dir = Path(out_dir)
    _prepare_out_dir(out_dir)
    _clear_outputs(out_dir)
    command = command or "tracekit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    child_env = dict(os.environ)
    child_env.update(
        {ENV_DIR: str(out_dir.resolve()), ENV_MODE: "nvtx" if nsys else mode, ENV_WARMUP: str(warmup)}
    )
    child_env.setdefault("NCCL_NVLS_ENABLE", "0")
    if nsys:
        return _capture_script_under_nsys(list(argv), out_dir, child_env, command)
    child_env.pop(ENV_PASSES, None)
    rc = _run_script(list(argv), child_env)
    errors = [] if rc == 0 else [{"rank": None, "message": f"{' '.join(argv)} exited with code {rc}"}]
    results = read_results(out_dir)
    _check_script_results(results, rc)
    manifest = _script_manifest(argv, results, command, errors, needs_traces=True)
    return _finish(out_dir, manifest)


def _run_script(argv: list[str], child_env: dict[str, str]) -> int:
    try:
        return subprocess.run(argv, env=child_env).returncode
    except OSError as exc:
        raise CaptureError(f"cannot run {argv[0]!r}: {exc}") from exc


def _check_script_results(results: dict[int, dict[str, Any]], rc: int) -> None:
    if not results and rc == 0:
        raise CaptureError(
            "the script ran but wrote no results: wrap its loop in `with tracekit.profile():` and mark steps "
            "with `tracekit.annotate.step(i)`"
        )


def _script_manifest(
    argv: Sequence[str],
    results: dict[int, dict[str, Any]],
    command: str,
    errors: list[dict[str, Any]],
    *,
    needs_traces: bool,
    extra_files: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    world = max(results) + 1 if results else 0
    modes = sorted({str(r.get("mode")) for r in results.values() if r.get("mode")})
    doc: dict[str, Any] = {
        "script": list(argv),
        "tp": world,
        "mode": modes[0] if len(modes) == 1 else modes,
        "step_pattern": "decode_step",
    }
    return build_manifest(
        world=world,
        results=results,
        workload_doc=doc,
        command=command,
        errors=errors,
        extra_files=extra_files,
        needs_traces=needs_traces and any(r.get("mode") for r in results.values()),
    )


#: manifest workload.nsys of a user's script under --nsys (docs/JSON.md#manifest)
NSYS_SCRIPT_UNPROFILED = (
    "separate runs of the script without nsys, before and after the run under nsys "
    "(TRACEKIT_CAPTURE_PASSES=unprofiled: only its tracekit.profile(profiled=False) blocks recorded)"
)
NSYS_SCRIPT_NO_UNPROFILED = (
    "none: the script made no unprofiled pass (no tracekit.profile(profiled=False) block), so the "
    "dilation is unknown"
)
NSYS_SCRIPT_TRACED = (
    "run of the script under nsys (TRACEKIT_CAPTURE_PASSES=traced): only its profiled "
    "tracekit.profile() blocks opened ranges, warm-up steps none"
)


def _capture_script_under_nsys(
    argv: list[str], out_dir: Path, child_env: dict[str, str], command: str
) -> Path:
    """--nsys for a user's script: a plain run records the unprofiled pass, then the run under nsys
    records only the traced pass, then (when the first plain run made an unprofiled pass) a second
    plain run records another: the manifest is the nsys run's with the plain runs' unprofiled
    rounds (pass order U P U). A script's own `tracekit.profile()` blocks make one round each."""
    plain_env = dict(child_env, **{ENV_PASSES: "unprofiled"})
    rc = _run_script(argv, plain_env)
    plain = read_results(out_dir)
    if rc != 0:  # nothing runs under nsys: the manifest of the plain run says why
        errors = [
            {"rank": None, "message": f"{' '.join(argv)} exited with code {rc} (plain run, before nsys)"}
        ]
        manifest = _script_manifest(argv, plain, command, errors, needs_traces=False)
        manifest["workload"]["nsys"] = {"unprofiled": NSYS_SCRIPT_UNPROFILED, "traced": None}
        return _finish(out_dir, manifest)
    _clear_outputs(out_dir)

    traced_env = dict(child_env, **{ENV_PASSES: "traced"})
    files, rc = _nsys_profile(argv, out_dir, traced_env)
    errors = [] if rc == 0 else [{"rank": None, "message": f"the command under nsys exited with {rc}"}]
    results = read_results(out_dir)
    _check_script_results(results, rc)
    manifest = _script_manifest(argv, results, command, errors, needs_traces=False, extra_files=files)
    plains = [plain]
    after_error = None
    if _unprofiled_of(plain) and rc == 0:  # the second plain run, after the one under nsys
        for f in out_dir.glob(".rank-*.result.json"):
            f.unlink()
        rc2 = _run_script(argv, plain_env)
        if rc2 == 0:
            plains.append(read_results(out_dir))
        else:
            after_error = f"{' '.join(argv)} exited with code {rc2} (plain run, after nsys)"
        for f in out_dir.glob(".rank-*.result.json"):
            f.unlink()
    rounds = [u for u in (_unprofiled_of(p) for p in plains) if u]
    _set_unprofiled(manifest, rounds)
    if rounds:
        manifest["workload"]["pass_order"] = "UPU" if len(rounds) > 1 else "UP"
    manifest["workload"]["nsys"] = {
        "unprofiled": NSYS_SCRIPT_UNPROFILED if rounds else NSYS_SCRIPT_NO_UNPROFILED,
        "traced": NSYS_SCRIPT_TRACED,
        "unprofiled_rank_pids": {str(r): plain[r]["pid"] for r in sorted(plain) if "pid" in plain[r]},
        "unprofiled_rank_pids_rounds": [
            {str(r): p[r]["pid"] for r in sorted(p) if "pid" in p[r]} for p in plains
        ],
        **({"unprofiled_after_error": after_error} if after_error else {}),
    }
    return _finish(out_dir, manifest)


def _unprofiled_of(results: dict[int, dict[str, Any]]) -> dict[str, list[int]]:
    return {str(r): results[r]["unprofiled_ns"] for r in sorted(results) if results[r].get("unprofiled_ns")}


def _main_under_nsys(argv: list[str]) -> int:
    """`python -m tracekit.capture.runner OUT_DIR` with the config in $TRACEKIT_CAPTURE_CONFIG."""
    doc = json.loads(os.environ[ENV_CONFIG])
    if doc.get("inject_delay") is not None:
        doc["inject_delay"] = tuple(doc["inject_delay"])
    config = CaptureConfig(**doc)
    try:
        capture(config, Path(argv[0]))
    except CaptureError as exc:
        print(f"tracekit: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main_under_nsys(sys.argv[1:]))


__all__ = [
    "CaptureConfig",
    "Resolved",
    "capture",
    "capture_script",
    "find_nsys",
    "parse_inject_delay",
    "resolve",
]
