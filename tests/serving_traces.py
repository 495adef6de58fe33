"""Faithful serving-engine tensor-parallel traces (issue 28), built in code with known truth.

The Kineto JSON each rank's torch.profiler writes for an SGLang TP decode server: the engine's
per-iteration ranges `step[DECODE bs=1]` / `step[EXTEND bs=1 toks=128]` (user_annotation on the
scheduler thread, as in the TraceLens SGLang trace in shared/), `aten::mm` launching a GEMM, and
SGLang's custom all-reduce op `sglang::outplace_all_reduce` (record_shapes: `Input Dims`
[[tokens, 4096], [], []], `Input type` ["c10::BFloat16", "", ""]) launching SGLang's own kernels
`void (anonymous namespace)::all_reduce_one_shot_push_kernel<__nv_bfloat16, 4u, true>(...)` (decode)
and `void (anonymous namespace)::all_reduce_two_shot_kernel<__nv_bfloat16, 4u, true>(...)` (extend),
the kernel names and argument types as SGLang builds them (seen in public profiles of SGLang
servers). No NCCL metadata on those kernels (no `Collective name`, no sequence number, no group):
they are matched by order.

Modes: "eager" (each kernel launched by `cudaLaunchKernel` inside its op, correlation ids as CUPTI
writes them), "graph" (one `cudaGraphLaunch` per step, every kernel of the replay carrying its
correlation id, as CUPTI records graph kernels; a captured side branch runs concurrently with
the GEMM on the captured stream), and `overlap=True` (the engine's overlap scheduler: the host's
step annotation runs ahead of the GPU, whose steps run back to back).

Truth by construction, returned in `Truth`: per all-reduce instance each rank's start, the last
arrival a = max start, every rank's end a + transfer; so wait_r = a - s_r and transfer = T.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

HIDDEN = 4096
ONE_SHOT = (
    "void (anonymous namespace)::all_reduce_one_shot_push_kernel<__nv_bfloat16, 4u, true>"
    "((anonymous namespace)::AllReducePushData, device::distributed::PushController)"
)
TWO_SHOT = (
    "void (anonymous namespace)::all_reduce_two_shot_kernel<__nv_bfloat16, 4u, true>"
    "(host::distributed::AllReduceData const*, device::distributed::PushController)"
)
GEMM = "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_NNT"
SIDE_BRANCH = "void moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int)"
AR_OP = "sglang::outplace_all_reduce"
TRANSFER_NS = {ONE_SHOT: 8_000, TWO_SHOT: 12_000}
_STEP = re.compile(r"step\[(\w+) bs=(\d+)(?: toks=(\d+))?\]")


@dataclass
class Truth:
    """What the trace holds, by construction (ns on every rank's clock, one host)."""

    ar_starts: list[list[int]] = field(default_factory=list)  # per instance: start per rank
    ar_ends: list[int] = field(default_factory=list)  # per instance: the common end
    ar_names: list[str] = field(default_factory=list)
    ar_bytes: list[int] = field(default_factory=list)
    step_names: list[str] = field(default_factory=list)
    # per step: the device's window [first kernel start, next step's first kernel start) and the
    # kernels' union time (compute + collective), on rank 0
    step_device_start: list[int] = field(default_factory=list)
    step_host_window: list[tuple[int, int]] = field(default_factory=list)
    step_kernel_ns: list[list[int]] = field(default_factory=list)  # per step, per rank: GEMM ns total

    def wait(self, i: int, r: int) -> int:
        return max(self.ar_starts[i]) - self.ar_starts[i][r]

    def transfer(self, i: int) -> int:
        return self.ar_ends[i] - max(self.ar_starts[i])


def _tokens(name: str) -> tuple[str, int, int]:
    m = _STEP.fullmatch(name)
    assert m, name
    kind, bs = m.group(1), int(m.group(2))
    return kind, bs, int(m.group(3)) if m.group(3) else bs


def _gemm_ns(name: str, rank: int) -> int:
    kind, bs, toks = _tokens(name)
    base = 150_000 if kind == "EXTEND" else 30_000 + 10_000 * bs
    return base + 4_000 * rank  # rank 3 is the slowest: the others wait for it at each all-reduce


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def build(
    out: Path,
    step_names: list[str],
    *,
    ranks: int = 4,
    layers: int = 2,
    mode: str = "eager",
    overlap: bool = False,
    drop: tuple[int, int, int] | None = None,
) -> Truth:
    """Write one `rank-<r>.pt.trace.json` per rank under `out`; return the truth. `drop`: (rank,
    step, layer) whose all-reduce kernel is left out of that rank's trace (a damaged capture)."""
    out.mkdir(parents=True, exist_ok=True)
    truth = Truth(step_names=list(step_names))
    events: list[list[dict]] = [[] for _ in range(ranks)]
    corr = 1000
    host_t = 1_000_000  # the host's step annotation start (same on every rank)
    lead = 100_000 if overlap else 40_000  # how far the device starts behind the step's annotation
    dev_t = host_t + lead  # where the device starts the step
    for k, name in enumerate(step_names):
        kind, bs, toks = _tokens(name)
        ar_kernel = TWO_SHOT if kind == "EXTEND" else ONE_SHOT
        nbytes = toks * HIDDEN * 2
        step_first = dev_t
        dev = [dev_t] * ranks  # per rank: where its stream is free
        graph_corr = corr
        if mode == "graph":
            corr += 1
        launch_t = host_t + 20_000
        gemm_total = [0] * ranks
        for layer in range(layers):
            # GEMM per rank, then the all-reduce: each rank arrives when its GEMM ends
            starts = []
            c_mm, c_ar = corr, corr + 1
            corr += 2
            for r in range(ranks):
                g = _gemm_ns(name, r)
                gemm_total[r] += g
                ev = events[r]
                kc = graph_corr if mode == "graph" else c_mm
                ev.append(_kernel(GEMM, r, dev[r], g, kc))
                if mode == "graph" and layer == 0:
                    # a captured side branch: the replay runs it beside the GEMM on the same stream
                    ev.append(_kernel(SIDE_BRANCH, r, dev[r] + 2_000, 20_000, graph_corr))
                if mode == "eager":
                    dims = [[toks, HIDDEN], [HIDDEN, HIDDEN]]
                    ev.append(_cpu("aten::mm", r, launch_t, 10_000, dims, ["c10::BFloat16"] * 2))
                    ev.append(_runtime("cudaLaunchKernel", r, launch_t + 3_000, 5_000, c_mm))
                dev[r] += g
                starts.append(dev[r])
            if ranks == 1:  # TP=1: no all-reduce
                launch_t += 30_000
                continue
            a = max(starts)
            end = a + TRANSFER_NS[ar_kernel]
            for r in range(ranks):
                if drop == (r, k, layer):
                    continue
                kc = graph_corr if mode == "graph" else c_ar
                events[r].append(_kernel(ar_kernel, r, starts[r], end - starts[r], kc))
                if mode == "eager":
                    t = launch_t + 12_000
                    events[r].append(
                        _cpu(AR_OP, r, t, 15_000, [[toks, HIDDEN], [], []], ["c10::BFloat16", "", ""])
                    )
                    events[r].append(
                        _cpu("aten::empty_like", r, t + 1_000, 2_000, [[toks, HIDDEN]], ["c10::BFloat16"])
                    )
                    events[r].append(_runtime("cudaLaunchKernel", r, t + 6_000, 5_000, c_ar))
                dev[r] = end
            truth.ar_starts.append(starts)
            truth.ar_ends.append(end)
            truth.ar_names.append(ar_kernel)
            truth.ar_bytes.append(nbytes)
            launch_t += 30_000
        dev_end = max(dev)
        if overlap:
            # the host launched step k a step ahead: its annotation is short and ends long before
            # the device has run the work; the device runs the steps back to back
            ann_start, ann_end = host_t, host_t + 20_000 + layers * 30_000
            next_dev = dev_end
            next_host = next_dev - lead
        else:
            ann_start, ann_end = host_t, dev_end + 10_000  # the step ends when its work is done
            next_host = ann_end + 30_000
            next_dev = next_host + lead
        for r in range(ranks):
            events[r].append(_annotation(name, r, ann_start, ann_end - ann_start))
            if mode == "graph":
                events[r].append(_runtime("cudaGraphLaunch", r, host_t + 10_000, 8_000, graph_corr))
        truth.step_device_start.append(step_first)
        truth.step_host_window.append((ann_start, ann_end))
        truth.step_kernel_ns.append(gemm_total)
        host_t, dev_t = next_host, next_dev
    for r in range(ranks):
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": r, "name": "NVIDIA H200"}],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
            "record_shapes": 1,
            "displayTimeUnit": "ms",
            "traceEvents": sorted(events[r], key=lambda e: (e["ts"], -e["dur"])),
        }
        (out / f"rank-{r}.pt.trace.json").write_text(json.dumps(doc))
    return truth


def _kernel(name: str, r: int, start: int, dur: int, corr: int) -> dict:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": r,
        "tid": 7,
        "ts": _us(start),
        "dur": _us(dur),
        "args": {"device": r, "context": 1, "stream": 7, "correlation": corr, "grid": [132, 1, 1]},
    }


def _runtime(name: str, r: int, start: int, dur: int, corr: int) -> dict:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 100 + r,
        "tid": 100 + r,
        "ts": _us(start),
        "dur": _us(dur),
        "args": {"cbid": 211, "correlation": corr},
    }


def _cpu(name: str, r: int, start: int, dur: int, dims: list, types: list) -> dict:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 100 + r,
        "tid": 100 + r,
        "ts": _us(start),
        "dur": _us(dur),
        "args": {"External id": start, "Input Dims": dims, "Input type": types},
    }


def _annotation(name: str, r: int, start: int, dur: int) -> dict:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": name,
        "pid": 100 + r,
        "tid": 100 + r,
        "ts": _us(start),
        "dur": _us(dur),
        "args": {"External id": start, "Record function id": 0},
    }
