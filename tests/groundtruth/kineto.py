"""Write a simulated run as torch.profiler writes it: one Kineto trace per rank
(`rank-<k>.pt.trace.json.gz`) and the `manifest.json` of `tracekit capture`.

The structure follows the committed real traces (`traces/h200-tp2`, `traces/h200-tp2-full`):
`cpu_op` (full mode: aten ops around their launches, `c10d::allreduce_` / `record_param_comms`
with the NCCL metadata), `cuda_runtime` with `correlation` (and `External id` in full mode),
`kernel` / `gpu_memcpy` on `pid` = device, `tid` = stream, `user_annotation` ProfilerStep#N /
decode_step#N / nccl:<op>, `gpu_user_annotation` decode_step#N on the stream, `ac2g` flows,
`distributedInfo`, `baseTimeNanoseconds`, `deviceProperties`. Times are written as exact decimal
microseconds from the simulation's integer nanoseconds, shifted by each rank's clock offset.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.groundtruth.sim import Coll, Kernel, Memcpy, RunSpec, SimResult, simulate

CBID = {
    "cudaLaunchKernel": 211,
    "cudaMemcpyAsync": 41,
    "cudaDeviceSynchronize": 165,
    "cudaStreamSynchronize": 131,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
}
COLL_NAME = {
    "all_reduce": ("allreduce", "c10d::allreduce_", "nccl:all_reduce"),
    "all_gather": ("_allgather_base", "c10d::_allgather_base_", "nccl:_all_gather_base"),
}
DTYPE_BYTES = {"BFloat16": 2, "Float": 4}


def _us(ns: int) -> str:
    """Exact decimal microseconds of an integer ns count."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


class _Writer:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def x(
        self, cat: str, name: str, pid: int, tid: int, ts: int, dur: int, args: dict[str, Any] | None
    ) -> None:
        a = "" if args is None else f',"args":{json.dumps(args)}'
        self.parts.append(
            f'{{"ph":"X","cat":{json.dumps(cat)},"name":{json.dumps(name)},"pid":{pid},"tid":{tid},'
            f'"ts":{_us(ts)},"dur":{_us(dur)}{a}}}'
        )

    def flow(self, ph: str, ident: int, pid: int, tid: int, ts: int) -> None:
        bp = ',"bp":"e"' if ph == "f" else ""
        self.parts.append(
            f'{{"ph":"{ph}","id":{ident},"pid":{pid},"tid":{tid},"ts":{_us(ts)},"cat":"ac2g","name":"ac2g"{bp}}}'
        )

    def meta(self, name: str, pid: int, tid: int, ts: int, args: dict[str, Any]) -> None:
        self.parts.append(
            f'{{"name":{json.dumps(name)},"ph":"M","ts":{_us(ts)},"pid":{pid},"tid":{tid},"args":{json.dumps(args)}}}'
        )


def host_pid(r: int) -> int:
    return 4000 + r


def write_rank(res: SimResult, r: int, path: Path) -> None:
    spec = res.spec
    rs = spec.ranks[r]
    shift = spec.epoch_ns + rs.clock_offset_ns - spec.base_time_ns  # true time -> written ts (ns)
    pid, tid = host_pid(r), host_pid(r)
    full = spec.mode == "full"
    w = _Writer()
    rec = res.ranks[r]
    t_first = res.node_begin(rec.host_nodes[0])
    w.meta("process_name", pid, 0, t_first + shift, {"name": "python3"})
    w.meta("process_labels", pid, 0, t_first + shift, {"labels": "CPU"})
    streams = sorted({d.stream for d in res.device_ops if d.rank == r})
    w.meta("process_name", r, 0, t_first + shift, {"name": f"GPU {r}"})
    w.meta("process_labels", r, 0, t_first + shift, {"labels": f"GPU {r}"})
    for s in streams:
        w.meta("thread_name", r, s, t_first + shift, {"name": f"stream {s} "})
    ext = 0
    # step ranges
    steps = rec.steps
    for j, st in enumerate(steps):
        num = st.token + rs.step_number_offset
        a = res.node_begin(st.begin_node)
        b = res.node_end(st.end_node)
        if j + 1 < len(steps):
            pb = res.node_begin(steps[j + 1].begin_node)
        else:
            pb = res.node_end(st.between_node) if st.between_node >= 0 else b
        ext += 1
        w.x("user_annotation", f"ProfilerStep#{num}", pid, tid, a + shift, pb - a, {"External id": ext})
        ext += 1
        w.x("user_annotation", f"decode_step#{num}", pid, tid, a + shift, b - a, {"External id": ext})
        gpu = [d for d in res.device_ops if d.rank == r and d.step == st.token]
        if gpu:
            ga = min(res.node_begin(d.node) for d in gpu)
            gb = max(res.node_end(d.node) for d in gpu)
            w.x(
                "gpu_user_annotation",
                f"decode_step#{num}",
                r,
                gpu[0].stream,
                ga + shift,
                gb - ga,
                {"External id": ext},
            )
    group = list(range(spec.tp))
    seq = 0
    for c in rec.calls:
        a = res.node_begin(c.node_first)
        b = res.node_end(c.node_last)
        ext += 1
        rt_args: dict[str, Any] = {"cbid": CBID[c.name], "correlation": c.corr}
        if full:
            rt_args = {"External id": ext, **rt_args}
        d = res.device_ops[c.device_op] if c.device_op >= 0 else None
        coll_args: dict[str, Any] = {}
        if isinstance(c.op, Coll):
            cname, c10d, ann = COLL_NAME[c.op.op]
            nel = c.op.nbytes // DTYPE_BYTES[c.op.dtype]
            out_nel = nel * spec.tp if c.op.op == "all_gather" else nel
            seq += 1
            coll_args = {
                "Collective name": cname,
                "In msg nelems": nel,
                "Out msg nelems": out_nel,
                "Group size": spec.tp,
                "dtype": c.op.dtype,
                "In split size": "[]",
                "Out split size": "[]",
                "Process Group Name": "0",
                "Process Group Description": "default_pg",
                "Process Group Ranks": json.dumps(group).replace(",", ", ").replace(",  ", ", "),
            }
            w.x("user_annotation", ann, pid, tid, a + shift, b - a, {"External id": ext})
            if full:
                w.x("cpu_op", c10d, pid, tid, a + shift, b - a, {"External id": ext, "Record function id": 0})
                w.x(
                    "cpu_op",
                    "record_param_comms",
                    pid,
                    tid,
                    a + shift,
                    b - a,
                    {"External id": ext, "Record function id": 0, "Rank": r, "Seq": seq, **coll_args},
                )
        elif full and isinstance(c.op, Kernel):
            pa = res.node_begin(c.pre_node) if c.pre_node >= 0 else a
            w.x(
                "cpu_op",
                f"aten::{c.op.name}",
                pid,
                tid,
                pa + shift,
                b - pa,
                {"External id": ext, "Record function id": 0},
            )
        elif full and isinstance(c.op, Memcpy):
            w.x(
                "cpu_op",
                "aten::copy_",
                pid,
                tid,
                a + shift,
                b - a,
                {"External id": ext, "Record function id": 0},
            )
        w.x(c.cat, c.name, pid, tid, a + shift, b - a, rt_args)
        if d is not None:
            n = res.nodes[d.node]
            assert n.begin is not None and n.end is not None
            dargs: dict[str, Any] = {"device": r, "context": 1, "stream": d.stream, "correlation": c.corr}
            if full:
                dargs["External id"] = ext
            if d.kind == "memory" and not isinstance(c.op, Kernel):
                cat = "gpu_memcpy"
                dargs["bytes"] = getattr(c.op, "nbytes", 4)
                dargs["memory bandwidth (GB/s)"] = 1.0
            else:
                cat = "kernel"
                dargs.update(
                    {
                        "queued": 0,
                        "registers per thread": 32,
                        "shared memory": 0,
                        "grid": [8, 1, 1],
                        "block": [128, 1, 1],
                    }
                )
                if full and coll_args:
                    dargs.update(coll_args)
            w.x(cat, d.name, r, d.stream, n.begin + shift, n.end - n.begin, dargs)
            w.flow("s", c.corr, pid, tid, a + shift)
            w.flow("f", c.corr, r, d.stream, n.begin + shift)
    last = max(res.node_end(i) for i in rec.host_nodes)
    w.x("Trace", "PyTorch Profiler (0)", 0, 0, t_first + shift, last - t_first, {"Op count": 0})
    doc_head = {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": i,
                "name": spec.device,
                "totalGlobalMem": 150109880320,
                "computeMajor": 9,
                "computeMinor": 0,
                "maxThreadsPerBlock": 1024,
                "warpSize": 32,
                "numSms": 132,
            }
            for i in range(spec.tp)
        ],
        "distributedInfo": {
            "backend": "nccl",
            "rank": r,
            "world_size": spec.tp,
            "pg_count": 1,
            "pg_config": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "backend_config": "cuda:nccl",
                    "pg_size": spec.tp,
                    "ranks": group,
                }
            ],
            "nccl_version": "2.28.9",
        },
        "cuda_runtime_version": 13000,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": spec.base_time_ns,
        "traceName": f"/tmp/sim/{spec.name}/rank-{r}.pt.trace.json",
    }
    head = json.dumps(doc_head)[:-1]
    text = head + ',"traceEvents":[\n' + ",\n".join(w.parts) + "\n]}"
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as fh:
        fh.write(text)


def _dilation(u_rounds: list[dict[str, list[int]]], p_rounds: list[dict[str, list[int]]]) -> float:
    ratios = []
    for u, p in zip(u_rounds, p_rounds, strict=True):
        uu = [max(v) for v in zip(*u.values(), strict=True)][1:]
        pp = [max(v) for v in zip(*p.values(), strict=True)][1:]
        ratios.append((sum(pp) / len(pp)) / (sum(uu) / len(uu)))
    return float(statistics.median(ratios))


def with_host_scale(spec: RunSpec, scale: float) -> RunSpec:
    """The run on a host `scale` times slower (every host duration scaled)."""
    return replace(spec, ranks=tuple(replace(r, host_scale=r.host_scale * scale) for r in spec.ranks))


def write_run(
    spec: RunSpec, out: Path, rounds: int = 3, drift: Sequence[float] | None = None
) -> tuple[SimResult, SimResult]:
    """Simulate `spec` profiled and unprofiled, write the traces (profiled) and the manifest;
    returns (profiled, unprofiled) results. `drift`: the host's speed per round (U P pairs; the
    last profiled round is the traced one), as a loaded host drifts between rounds."""
    out.mkdir(parents=True, exist_ok=True)
    prof = simulate(spec, profiled=True)
    unprof = simulate(spec, profiled=False)
    files = {}
    for r in range(spec.tp):
        p = out / f"rank-{r}.pt.trace.json.gz"
        write_rank(prof, r, p)
        files[p.name] = {
            "rank": r,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            "bytes": p.stat().st_size,
        }
    u = {str(r): unprof.rank_token_times(r) for r in range(spec.tp)}
    pr = {str(r): prof.rank_token_times(r) for r in range(spec.tp)}
    colls: dict[tuple[str, int], int] = {}
    for op in spec.ranks[0].program(1):
        if isinstance(op, Coll):
            colls[(op.op, op.nbytes)] = colls.get((op.op, op.nbytes), 0) + 1
    workload = {
        "preset": "sim",
        "tp": spec.tp,
        "tokens": spec.tokens,
        "prompt": 16,
        "batch": 1,
        "backend": "nccl",
        "device": "cuda",
        "dtype": "bfloat16",
        "seed": 0,
        "layers": 2,
        "shape": {"hidden": 4096, "layers": 2},
        "warmup_tokens": 2,
        "profiler_warmup_steps": 1,
        "untimed_tail_steps": 0,
        "collectives": [
            {
                "op": op,
                "name": f"{op}_{i}",
                "in_bytes": nb,
                "out_bytes": nb * spec.tp if op == "all_gather" else nb,
                "dtype": "bfloat16",
                "per_token": cnt,
                "group_size": spec.tp,
            }
            for i, ((op, nb), cnt) in enumerate(sorted(colls.items()))
        ],
        "inject_delay": None,
        "inject_sync": False,
        "mode": "full" if spec.mode == "full" else "cuda",
        "step_pattern": "decode_step",
        "rounds": rounds,
    }
    u_rounds = [u] * rounds
    p_rounds = [pr] * rounds
    if drift is not None:
        rounds = len(drift)
        workload["rounds"] = rounds
        u_rounds, p_rounds = [], []
        for sc in drift:
            su, sp = simulate(with_host_scale(spec, sc)), simulate(with_host_scale(spec, sc), profiled=True)
            u_rounds.append({str(r): su.rank_token_times(r) for r in range(spec.tp)})
            p_rounds.append({str(r): sp.rank_token_times(r) for r in range(spec.tp)})
        u, pr = u_rounds[0], p_rounds[-1]
    manifest = {
        "schema_version": "1.2",
        "kind": "tracekit.capture",
        "complete": True,
        "errors": [],
        "created": "2026-12-01T19:00:00Z",
        "versions": {
            "tracekit": "0.1.0",
            "python": "3.12.3",
            "torch": "2.11.0+cu130",
            "cuda": "13.0",
            "nccl": "2.28.9",
        },
        "host": {"hostname": spec.hostname, "cpu": "simulated", "cpu_count": 16, "platform": "Linux"},
        "devices": [
            {
                "index": i,
                "name": spec.device,
                "memory_bytes": 150109880320,
                "capability": "9.0",
                "multiprocessors": 132,
            }
            for i in range(spec.tp)
        ],
        "topology": {"nvidia_smi_topo": None, "nvml_links": None},
        "nccl_env": {"NCCL_NVLS_ENABLE": "0"},
        "workload": workload,
        "unprofiled": {"per_token_ns": u, "rounds": u_rounds},
        "profiled": {"per_token_ns": pr, "rounds": p_rounds, "traced_round": rounds - 1},
        "dilation": round(_dilation(u_rounds, p_rounds), 6),
        "tokens_generated": [[1] * spec.tokens],
        "nvtx": "nvtx",
        "inject_sync_count": {str(r): 0 for r in range(spec.tp)},
        "rank_pids": {str(r): host_pid(r) for r in range(spec.tp)},
        "files": files,
        "command": f"simulated: tests/groundtruth case {spec.name}",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return prof, unprof
