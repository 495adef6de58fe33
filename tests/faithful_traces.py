"""Faithful traces of formats the project has no committed sample of (issue 25), built in code.

- `compiled_decode_rank`: a torch 2.x Kineto trace of a vLLM-style decode loop run through
  torch.compile: the only repeated host ranges are Inductor's `## Call CompiledFxGraph <hash> ##`
  (and, around the input fetch, the DataLoader's `enumerate(DataLoader)#..._DataLoaderIter.__next__`),
  no `ProfilerStep#N`, no serving-engine range. Field layout as torch 2.x writes it (user_annotation /
  cpu_op / cuda_runtime / kernel / gpu_memcpy / ac2g flows, `distributedInfo`, float-µs ts).
- `legacy_kineto_trace`: the PyTorch 1.8/1.9-era layout of pytorch/kineto's tb_plugin samples
  (2021): capitalised categories (`Operator`, `Runtime`, `Kernel`, `Memcpy`), `ProfilerStep#N` as an
  `Operator` event, string tids ("24572", "stream 7"), integer-µs ts, the GPU's pid its device,
  `async` flow events named `launch`, a `Trace` span with pid "Traces".

Times are in µs as the files hold them; every figure a test asserts follows from the layout here.
"""

from __future__ import annotations

from typing import Any

GRAPH_HASH = "cxmpmxq2fkzm4ab7dl3p6q5xj2rtmq6xnq3hdxw4bqd7z4c5kq8m"
#: baseTimeNanoseconds of `compiled_decode_rank` (torch adds it to every ts)
BASE_NS = 1790857026000000000
DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def compiled_range(h: str = GRAPH_HASH) -> str:
    return f"## Call CompiledFxGraph {h} ##"


def compiled_decode_rank(
    rank: int, world: int, steps: int = 6, kernel_us: float = 40.0, gap_us: float = 30.0
) -> dict[str, Any]:
    """One rank's trace: per step a DataLoader fetch (a host range and an H2D copy), then one call
    of the compiled graph launching 3 kernels (and, with world > 1, an NCCL all-reduce kernel), then
    `gap_us` of host time. Step i's graph call starts at 1000 + i * period µs."""
    pid = 4100 + rank
    ev: list[dict[str, Any]] = []
    corr = 100
    ext = 1
    period = 400.0
    nccl = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for i in range(steps):
        t0 = 1000.0 + i * period
        # the input fetch: a DataLoader range and its copy
        ev.append(_x("user_annotation", DATALOADER, pid, pid, t0, 40.0, {"External id": ext}))
        ev.append(
            _x("cuda_runtime", "cudaMemcpyAsync", pid, pid, t0 + 10, 8.0, {"cbid": 41, "correlation": corr})
        )
        ev.append(
            _x(
                "gpu_memcpy",
                "Memcpy HtoD (Pageable -> Device)",
                0,
                7,
                t0 + 20,
                4.0,
                {"device": rank, "stream": 7, "correlation": corr, "bytes": 640, "External id": ext},
            )
        )
        corr, ext = corr + 1, ext + 1
        g0 = t0 + 50
        names = ["triton_poi_fused_embedding_0", "triton_red_fused_rms_norm_1", "extern_kernels.mm_2"]
        if world > 1:
            names.append(nccl)
        ev.append(
            _x("user_annotation", compiled_range(), pid, pid, g0, 20.0 * len(names), {"External id": ext})
        )
        k0 = g0 + 10
        for j, kname in enumerate(names):
            launch = g0 + 2 + 18 * j
            ev.append(
                _x(
                    "cuda_runtime",
                    "cudaLaunchKernel",
                    pid,
                    pid,
                    launch,
                    6.0,
                    {"cbid": 211, "correlation": corr, "External id": ext},
                )
            )
            ev.append(
                {"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": launch, "cat": "ac2g", "name": "ac2g"}
            )
            args: dict[str, Any] = {"device": rank, "stream": 7, "correlation": corr, "External id": ext}
            if kname == nccl:
                args.update(
                    {
                        "Collective name": "allreduce",
                        "In msg nelems": 4096,
                        "Out msg nelems": 4096,
                        "Group size": world,
                        "dtype": "BFloat16",
                        "Process Group Name": "0",
                        "Process Group Ranks": list(range(world)),
                    }
                )
            ev.append(_x("kernel", kname, 0, 7, k0, kernel_us, args))
            ev.append(
                {
                    "ph": "f",
                    "id": corr,
                    "pid": 0,
                    "tid": 7,
                    "ts": k0,
                    "cat": "ac2g",
                    "name": "ac2g",
                    "bp": "e",
                }
            )
            k0 += kernel_us + 2
            corr += 1
        ext += 1
    ev.append(
        {"name": "process_name", "ph": "M", "ts": 900.0, "pid": pid, "tid": 0, "args": {"name": "python3"}}
    )
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": ev,
    }


def _x(
    cat: str, name: str, pid: Any, tid: Any, ts: float, dur: float, args: dict[str, Any]
) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def legacy_kineto_trace(steps: int = 4, kernel_us: int = 30) -> dict[str, Any]:
    """A PyTorch 1.8-era trace: per step `ProfilerStep#N` (N from 1) as an `Operator` on the main
    thread, 500 µs long, an `aten::mm` inside launching one kernel (`kernel_us` long, 100 µs after
    the step starts) and an `aten::copy_` with an H2D Memcpy. Steps start every 1000 µs."""
    pid, tid = 24572, "24572"
    base = 1621401187223005
    ev: list[dict[str, Any]] = []
    corr, ext = 300, 1
    for i in range(steps):
        t0 = base + 100 + i * 1000
        ev.append(_legacy_op(f"ProfilerStep#{i + 1}", pid, tid, t0, 500, ext))
        ext += 1
        ev.append(_legacy_op("aten::mm", pid, tid, t0 + 50, 200, ext))
        ev.append(
            _x(
                "Runtime",
                "cudaLaunchKernel",
                pid,
                tid,
                t0 + 60,
                16,
                {"cbid": 211, "correlation": corr, "external id": ext, "external ts": t0 + 50},
            )
        )
        ev.append(
            {"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": t0 + 60, "cat": "async", "name": "launch"}
        )
        ev.append(
            _x(
                "Kernel",
                "volta_sgemm_128x32_nt",
                0,
                "stream 7",
                t0 + 100,
                kernel_us,
                {
                    "queued": 0,
                    "device": 0,
                    "context": 1,
                    "stream": 7,
                    "correlation": corr,
                    "external id": ext,
                    "registers per thread": 55,
                    "shared memory": 16384,
                    "blocks per SM": 0.0125,
                    "warps per SM": 0.1,
                    "grid": [1, 1, 1],
                    "block": [256, 1, 1],
                    "theoretical occupancy %": 0,
                },
            )
        )
        ev.append(
            {
                "ph": "f",
                "id": corr,
                "pid": 0,
                "tid": "stream 7",
                "ts": t0 + 100,
                "cat": "async",
                "name": "launch",
                "bp": "e",
            }
        )
        corr, ext = corr + 1, ext + 1
        ev.append(_legacy_op("aten::copy_", pid, tid, t0 + 300, 80, ext))
        ev.append(
            _x(
                "Runtime",
                "cudaMemcpyAsync",
                pid,
                tid,
                t0 + 310,
                20,
                {"cbid": 41, "correlation": corr, "external id": ext, "external ts": t0 + 300},
            )
        )
        ev.append(
            _x(
                "Memcpy",
                "Memcpy HtoD (Pageable -> Device)",
                0,
                "stream 7",
                t0 + 340,
                2,
                {
                    "device": 0,
                    "context": 1,
                    "stream": 7,
                    "correlation": corr,
                    "external id": ext,
                    "bytes": 640,
                },
            )
        )
        corr, ext = corr + 1, ext + 1
    ev += [
        {"name": "process_name", "ph": "M", "ts": base, "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"name": "process_labels", "ph": "M", "ts": base, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {
            "name": "thread_name",
            "ph": "M",
            "ts": base,
            "pid": pid,
            "tid": tid,
            "args": {"name": f"thread {tid} (python)"},
        },
        {
            "ph": "X",
            "cat": "Trace",
            "ts": base,
            "dur": steps * 1000 + 200,
            "pid": "Traces",
            "tid": "PyTorch Profiler",
            "name": "PyTorch Profiler (0)",
            "args": {"Op count": 0},
        },
        {
            "name": "Iteration Start: PyTorch Profiler",
            "ph": "i",
            "s": "g",
            "pid": "Traces",
            "tid": "Trace PyTorch Profiler",
            "ts": base,
        },
        {
            "name": "Record Window End",
            "ph": "i",
            "s": "g",
            "pid": "",
            "tid": "",
            "ts": base + steps * 1000 + 200,
        },
    ]
    return {"schemaVersion": 1, "traceEvents": ev}


def _legacy_op(name: str, pid: int, tid: str, ts: int, dur: int, ext: int) -> dict[str, Any]:
    return _x("Operator", name, pid, tid, ts, dur, {"Device": pid, "External id": ext})
