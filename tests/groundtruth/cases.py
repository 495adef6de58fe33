"""The named ground-truth cases (README.md in this folder says how to add one).

A `Case` is a TP=1 baseline run, an optional sharded run and an optional `after` run (for diff);
`decoder()` builds the usual program: per layer an attention block of kernels, an all-reduce, an
MLP block, an all-reduce; then the LM head, an all-gather and `.item()` on the next token.
Kernel durations are given at TP=1 and divided by N on the sharded ranks (times `imbalance`), so
`compute=/N` (each kernel at its TP=1 time / N) is known per kernel.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tests.groundtruth.sim import (
    Coll,
    DeviceSync,
    Host,
    Item,
    Kernel,
    Op,
    RankSpec,
    Record,
    RunSpec,
    Wait,
)


@dataclass(frozen=True)
class Case:
    name: str
    baseline: RunSpec
    sharded: RunSpec | None = None
    after: RunSpec | None = None  # a second run of the same workload, compared by diff with `sharded`
    item: int | None = None  # issue 23's numbered defect this case reproduces
    about: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)
    drift: tuple[float, ...] | None = None  # the host's speed per capture round (both runs), last = traced


def decoder(
    tp: int,
    *,
    name: str = "run",
    layers: int = 2,
    block: Sequence[int] = (40_000, 20_000, 30_000),  # TP=1 kernel durations of one block (ns)
    host_gap: int = 3_000,  # host work before each launch (ns)
    transfer: int = 6_000,
    ar_bytes: int = 8192,
    ag_bytes: int = 64000,
    lm_head: int = 50_000,
    sleep_before_ar: dict[int, int] | None = None,  # rank -> host sleep before each all-reduce
    imbalance: Callable[[int, int, int], float] | None = None,  # (rank, token, collective index) -> factor
    noise: dict[int, int] | None = None,  # rank -> max extra host ns per gap, seeded per (rank, token, op)
    item: bool = True,
    tail_host: int = 0,  # host work after the token's .item() (sampling on the host)
    sync_per_layer: bool = False,  # a device synchronisation after each layer (capture --inject-sync)
    nccl_stream: int | None = None,  # a separate NCCL stream joined by event waits (eager NCCL)
    rank_kw: dict[int, dict[str, object]] | None = None,
    tokens: int = 4,
    mode: str = "full",
    **run_kw: object,
) -> RunSpec:
    """A TP=`tp` decode run of `layers` layers (module doc)."""

    def program_for(r: int) -> Callable[[int], list[Op]]:
        def program(k: int) -> list[Op]:
            rng = random.Random(f"{name}:{r}:{k}")
            ops: list[Op] = []
            coll_i = 0

            def gap() -> None:
                g = host_gap
                if noise and r in noise:
                    g += rng.randrange(noise[r] + 1)
                if g:
                    ops.append(Host(g))

            def blk(tag: str, durs: Sequence[int]) -> None:
                f = imbalance(r, k, coll_i) if imbalance else 1.0
                for j, d in enumerate(durs):
                    gap()
                    ideal = d // tp
                    ops.append(Kernel(f"{tag}_{j}", int(round(ideal * f)) if tp > 1 else d, ideal=ideal))

            def coll(op: str, nbytes: int) -> None:
                nonlocal coll_i
                if tp == 1:
                    return
                if op == "all_reduce" and sleep_before_ar and r in sleep_before_ar:
                    ops.append(Host(sleep_before_ar[r]))
                gap()
                if nccl_stream is not None:
                    ops.append(Record(1, 7))
                    ops.append(Wait(1, nccl_stream))
                    ops.append(Coll(op, nbytes, transfer, stream=nccl_stream))
                    ops.append(Record(2, nccl_stream))
                    ops.append(Wait(2, 7))
                else:
                    ops.append(Coll(op, nbytes, transfer))
                coll_i += 1

            for layer in range(layers):
                blk(f"attn{layer}", block)
                coll("all_reduce", ar_bytes)
                blk(f"mlp{layer}", block)
                coll("all_reduce", ar_bytes)
                if sync_per_layer:
                    gap()
                    ops.append(DeviceSync())
            blk("lm_head", (lm_head,))
            coll("all_gather", ag_bytes)
            gap()
            if item:
                ops.append(Item())
            else:
                ops.append(DeviceSync())
            if tail_host:
                ops.append(Host(tail_host))
            return ops

        return program

    ranks = tuple(RankSpec(program_for(r), **((rank_kw or {}).get(r, {}))) for r in range(tp))  # type: ignore[arg-type]
    return RunSpec(name=name, ranks=ranks, tokens=tokens, mode=mode, **run_kw)  # type: ignore[arg-type]


def _pair(name: str, **kw: object) -> tuple[RunSpec, RunSpec]:
    tp = int(kw.pop("tp", 2))  # type: ignore[call-overload]
    kw.pop("rank_kw", None)
    rk = kw.pop("rank_kw_sharded", None)
    base_kw = {k: v for k, v in kw.items() if k not in ("sleep_before_ar", "imbalance")}
    base = decoder(1, name=f"{name}-tp1", **base_kw)  # type: ignore[arg-type]
    shard = decoder(tp, name=f"{name}-tp{tp}", rank_kw=rk, **kw)  # type: ignore[arg-type]
    return base, shard


def _all_ranks(tp: int, **kw: object) -> dict[int, dict[str, object]]:
    return {r: dict(kw) for r in range(tp)}


# GPU-bound: kernels much longer than the host's launch gaps. Launch-bound: the reverse.
GPU_BLOCK = (60_000, 30_000, 45_000)
LAUNCH_BLOCK = (3_000, 2_000, 2_500)


def build_cases() -> list[Case]:
    cases: list[Case] = []

    b, s = _pair("gpu-bound", block=GPU_BLOCK)
    cases.append(
        Case("gpu_bound_tp2", b, s, about="clean, symmetric, GPU-bound TP=2", tags=frozenset({"clean"}))
    )

    b, s = _pair("sleep100", block=GPU_BLOCK, sleep_before_ar={1: 100_000})
    cases.append(
        Case(
            "host_sleep_rank1",
            b,
            s,
            item=1,
            about="rank 1's host sleeps 100 us before each of 4 all-reduces; GPU work otherwise the bottleneck",
        )
    )

    b, s = _pair("launch-bound", block=LAUNCH_BLOCK, host_gap=12_000)
    cases.append(
        Case("launch_bound_tp2", b, s, item=1, about="symmetric launch-bound TP=2 (host gaps >> kernels)")
    )

    b, s = _pair("skew", block=GPU_BLOCK, rank_kw_sharded={1: {"clock_offset_ns": 5_000_000}})
    clean = decoder(2, name="skew-clean", block=GPU_BLOCK)
    cases.append(
        Case(
            "clock_skew_5ms",
            b,
            s,
            after=clean,
            item=3,
            about="rank 1's clock 5 ms ahead, no real delay; diff against the same run unskewed",
        )
    )

    b, s = _pair("stepoff", block=GPU_BLOCK, rank_kw_sharded={1: {"step_number_offset": 1}})
    clean = decoder(2, name="stepoff-clean", block=GPU_BLOCK)
    cases.append(
        Case(
            "step_numbers_off_by_one",
            b,
            s,
            after=clean,
            item=4,
            about="rank 1's step numbers start at 2; diff against the same run numbered alike",
        )
    )

    b, s = _pair("between", block=GPU_BLOCK, rank_kw_sharded={1: {"between_ns": 300_000}})
    cases.append(
        Case(
            "between_steps_300us",
            b,
            s,
            item=5,
            about="rank 1 spends 300 us between steps, outside its decode_step range",
        )
    )

    for cost in (15_000, 4_000):
        b, s = _pair(f"prof{cost // 1000}", block=LAUNCH_BLOCK, host_gap=8_000, rank_kw=None)
        b = replace(b, ranks=tuple(replace(x, profiler_cost=cost) for x in b.ranks))
        s = replace(s, ranks=tuple(replace(x, profiler_cost=cost) for x in s.ranks))
        cases.append(
            Case(
                f"profiler_cost_{cost // 1000}us",
                b,
                s,
                item=6,
                about=f"every runtime call costs {cost // 1000} us more under the profiler",
            )
        )

    # the profiler's cost makes rank 0 arrive last although rank 1 is last without it
    b, s = _pair("proflast", block=LAUNCH_BLOCK, host_gap=8_000, sleep_before_ar={1: 20_000})
    s = replace(s, ranks=(replace(s.ranks[0], profiler_cost=12_000), replace(s.ranks[1], profiler_cost=0)))
    b = replace(b, ranks=tuple(replace(x, profiler_cost=6_000) for x in b.ranks))
    cases.append(
        Case(
            "profiler_changes_last_rank",
            b,
            s,
            item=7,
            about="rank 1 is last without the profiler (20 us sleeps); rank 0's profiler cost makes it last",
        )
    )

    def imb(r: int, k: int, c: int) -> float:
        return 1.3 if (r + c) % 2 == 0 else 0.7

    b, s = _pair("imbalance", block=GPU_BLOCK, imbalance=imb)
    cases.append(
        Case(
            "compute_imbalance_per_collective",
            b,
            s,
            item=8,
            about="per-collective compute imbalance (1.3x / 0.7x alternating), balanced per token",
        )
    )

    # symmetric ranks that arrive together at every collective, host-side sampling after each token
    # on both: coordination (idle) dominates, no rank ever waits; the TP=1 GPU is ~75% busy
    b, s = _pair("zerowait", block=GPU_BLOCK, host_gap=1_000, tail_host=200_000)
    s = replace(s, ranks=tuple(replace(x, launch_latency=0) for x in s.ranks))
    cases.append(
        Case(
            "zero_wait",
            b,
            s,
            item=9,
            about="symmetric TP=2, ranks arrive together (wait exactly 0), 200 us host sampling per token",
        )
    )

    b, s = _pair("offset", block=GPU_BLOCK)
    after = decoder(2, name="offset-after", block=GPU_BLOCK, rank_kw={1: {"between_ns": 300_000}})
    cases.append(
        Case(
            "diff_in_path_offset",
            b,
            s,
            after=after,
            item=10,
            about="after: rank 1 spends 300 us between steps; the change sits in the path offset",
        )
    )

    epoch = 1_790_857_026_000_000_000
    tiny = {
        "block": (1_700, 1_300, 2_100),
        "host_gap": 700,
        "lm_head": 3_300,
        "transfer": 2_300,
        "rank_kw_sharded": _all_ranks(2, launch_cost=1_900, launch_latency=2_300, sync_cost=900),
    }
    b, s = _pair("epoch", base_time_ns=epoch, epoch_ns=epoch + 5_113_171_319_641_765, **tiny)
    b = replace(
        b, ranks=tuple(replace(x, launch_cost=1_900, launch_latency=2_300, sync_cost=900) for x in b.ranks)
    )
    cases.append(
        Case("epoch_times", b, s, item=11, about="absolute times at today's epoch (baseTimeNanoseconds)")
    )
    b, s = _pair("tiny", **tiny)  # type: ignore[arg-type]
    b = replace(
        b, ranks=tuple(replace(x, launch_cost=1_900, launch_latency=2_300, sync_cost=900) for x in b.ranks)
    )
    cases.append(
        Case("tiny_launch_bound", b, s, about="epoch_times' workload at small absolute times (its control)")
    )

    b, s = _pair("noise", block=LAUNCH_BLOCK, host_gap=6_000, noise={0: 8_000, 1: 8_000}, tokens=6)
    cases.append(
        Case("loaded_host_noise", b, s, item=2, about="seeded random host gaps on both ranks (a loaded host)")
    )

    # a loaded host drifting between rounds: at its fast speed the link dominates S, at its slow
    # speed the hosts' coordination does; the traced round runs at speed 1
    b, s = _pair("drift", block=(40_000, 20_000, 30_000), host_gap=9_000, transfer=14_000)
    cases.append(
        Case(
            "host_drift_between_rounds",
            b,
            s,
            item=2,
            drift=(0.5, 2.0, 1.0),
            about="the host's speed drifts 0.5x / 2x / 1x between capture rounds (the last traced)",
        )
    )

    b, s = _pair("straggler", block=GPU_BLOCK, sleep_before_ar={1: 2_000_000})
    cases.append(
        Case("straggler_2ms", b, s, about="rank 1 sleeps 2 ms before each all-reduce (8 ms per token)")
    )

    b, s = _pair("tp4", tp=4, block=GPU_BLOCK)
    cases.append(Case("gpu_bound_tp4", b, s, about="clean GPU-bound TP=4"))

    b = decoder(1, name="tp1-launch", block=LAUNCH_BLOCK, host_gap=12_000)
    cases.append(Case("tp1_launch_bound", b, about="TP=1 launch-bound baseline alone"))
    b = decoder(1, name="tp1-gpu", block=GPU_BLOCK)
    cases.append(Case("tp1_gpu_bound", b, about="TP=1 GPU-bound baseline alone"))

    graph = {"launch_cost": 0, "launch_latency": 1_000, "device_gap": 500}
    b, s = _pair(
        "graph", block=LAUNCH_BLOCK, host_gap=0, rank_kw=None, rank_kw_sharded=_all_ranks(2, **graph)
    )
    b = replace(
        b, ranks=tuple(replace(x, launch_cost=0, launch_latency=1_000, device_gap=500) for x in b.ranks)
    )
    cases.append(Case("graph_like", b, s, about="CUDA-graph-like: launches free, kernels back to back"))

    b, s = _pair("streams", block=GPU_BLOCK, nccl_stream=22)
    cases.append(
        Case(
            "nccl_stream_event_waits", b, s, about="NCCL on its own stream joined by cross-stream event waits"
        )
    )

    b, s = _pair(
        "queue",
        block=GPU_BLOCK,
        host_gap=500,
        item=False,
        rank_kw_sharded=_all_ranks(2, queue_depth=4),
        rank_kw=None,
    )
    cases.append(
        Case("launch_queue_backpressure", b, s, about="a 4-deep launch queue: the host blocks on launches")
    )

    b, s = _pair("cudamode", block=GPU_BLOCK, mode="cuda")
    cases.append(
        Case(
            "gpu_bound_cuda_mode",
            b,
            s,
            about="clean GPU-bound TP=2 written in capture mode `cuda` (no cpu_op)",
        )
    )

    b, s = _pair("syncs", block=GPU_BLOCK, sync_per_layer=True, sleep_before_ar={0: 30_000})
    cases.append(
        Case(
            "sync_per_layer",
            b,
            s,
            about="a device synchronize after each layer; rank 0 sleeps 30 us per all-reduce",
        )
    )

    return cases


CASES: dict[str, Case] = {c.name: c for c in build_cases()}


def random_run(seed: int, tp: int = 2, tokens: int = 4, noise: bool = False) -> RunSpec:
    """A generated TP=`tp` run for property tests: per rank its own host gaps, sleeps before
    all-reduces, costs and time between steps (seeded; odd nanoseconds, so ties are rare); every
    collective's transfer is the same. `noise`: seeded jitter per host gap, so tokens differ."""
    rng = random.Random(seed)
    block = tuple(rng.randrange(1, 30) * 3_000 for _ in range(3))  # / 2, 3, 4: whole 250 ns
    sleeps = {r: rng.choice((0, 0, rng.randrange(1, 150_000))) for r in range(tp)}
    rank_kw: dict[int, dict[str, object]] = {
        r: {
            "launch_cost": rng.randrange(2_000, 9_000),
            "launch_latency": rng.randrange(3_000, 9_000),
            "sync_cost": rng.randrange(500, 4_000),
            "device_gap": rng.randrange(0, 1_500),
            "between_ns": rng.choice((0, 0, rng.randrange(1, 200_000))),
        }
        for r in range(tp)
    }
    return decoder(
        tp,
        name=f"random{seed}",
        block=block,
        lm_head=rng.randrange(1, 30) * 3_000,
        host_gap=rng.randrange(500, 20_000),
        transfer=rng.randrange(1_000, 30_000),
        sleep_before_ar={r: v for r, v in sleeps.items() if v},
        noise={r: rng.randrange(0, 10_000) for r in range(tp)} if noise else None,
        rank_kw=rank_kw,
        tokens=tokens,
    )
