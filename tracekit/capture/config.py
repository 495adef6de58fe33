"""What one capture runs (`tracekit capture`'s options as `CaptureConfig`), resolved on this host
(`resolve`: device, backend, ranks, threads -> `Resolved`), and the workload the manifest records
(`workload`, `warmup_steps`, `decoder_max_len`, `rounds_of`, `phase_kind`). No torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tracekit.capture.decoder_shape import IMPLS, cache_length, check_tp, collectives, preset
from tracekit.errors import CaptureError
from tracekit.model.documents.base import convert
from tracekit.model.documents.manifest import (
    ManifestCollective,
    ManifestInjectDelay,
    ManifestShape,
    ManifestWorkload,
)

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


def workload(config: CaptureConfig, res: Resolved, world: int) -> ManifestWorkload:
    """The manifest's `workload` of a capture of the reference decoder."""
    shape = preset(config.preset, config.layers)
    return ManifestWorkload(
        preset=config.preset,
        tp=world,
        tokens=config.tokens,
        prompt=config.prompt,
        batch=config.batch,
        backend=res.backend,
        device=res.device,
        dtype=res.dtype,
        seed=config.seed,
        layers=shape.layers,
        shape=convert(asdict(shape), ManifestShape),
        warmup_tokens=warmup_steps(config),
        profiler_warmup_steps=LEAD_STEPS,
        untimed_tail_steps=TAIL_STEPS,
        collectives=convert(collectives(shape, world, config.batch, res.dtype), list[ManifestCollective]),
        inject_delay=None
        if config.inject_delay is None
        else ManifestInjectDelay(rank=config.inject_delay[0], ms=config.inject_delay[1]),
        inject_sync=config.inject_sync,
        cuda_graphs=config.cuda_graphs,
        compile=config.compile,
        mode=res.mode,
        step_pattern="decode_step",
        cpu_threads_per_rank=CPU_THREADS_PER_RANK if res.device == "cpu" else None,
        rounds=rounds_of(config),
        shard_of=config.shard_of,
        decoder_impl=config.decoder_impl,
        kv_cache_len=cache_length(decoder_max_len(config), config.decoder_impl),
    )


def decoder_max_len(config: CaptureConfig) -> int:
    """The decoder's positions: the prompt, every step of the warm-up pass, one more."""
    return config.prompt + warmup_steps(config) + 1


def rounds_of(config: CaptureConfig) -> int:
    """Measured rounds each rank runs: --rounds, or 1 for the plain and traced runs of --nsys."""
    return config.rounds if config.passes == "both" else 1


def phase_kind(phase: str) -> str:
    """ "unprofiled 2/3" -> "unprofiled" (a progress phase's kind of pass)."""
    return phase.split(" ", 1)[0]
