"""Collective bandwidth sweeps, the nccl-tests way (docs/METHOD.md section Bandwidth and the link verdict; nccl-tests src/common.cu).

For every op, every size (min, min*factor, ... max) and every form (out-of-place, in-place):
1. `warmup` iterations, then a stream synchronise and a barrier;
2. `iters` timed iterations in one loop: on CUDA a CUDA event is recorded before and after the loop
   on the current stream (torch's NCCL stream is ordered with it), and the host clock runs from
   before the first launch until a stream synchronise after the last (nccl-tests' own timer);
   on CPU (gloo) the host clock only. Buffers rotate through offsets of one large allocation per
   iteration, as nccl-tests shifts its pointers, so caches do not flatter mid sizes;
   With `graph` (CUDA/NCCL only; nccl-tests' `-G`): after the warm-up, one more call of the op on a
   side stream (torch's rule before a capture), then the `iters` collectives of the timed form are
   captured into one `torch.cuda.CUDAGraph` on that stream, replayed once un-timed (the upload),
   and one `replay()` is timed the same way (events, host clock closed by a stream synchronise);
   per-iteration time = replay time / iters. That removes the host's launch cost per call (one
   Python `dist.*` call costs ~35-45 us, more than a small collective on NVLink);
3. a separate check iteration on freshly filled buffers, compared on the device with the value every
   element must have (`tracekit.probe.spec`), counting wrong elements (nccl-tests' `#wrong`).
Per-rank per-iteration times are gathered and reduced to min / average / max over ranks; the row's
`time_us` is the average (nccl-tests' default) and algbw / busbw use nccl-tests' byte counts and
factors (`tracekit.probe.results`).

Ranks: N processes on one host through torch.multiprocessing (spawn), rank r on GPU
`devices[r]` (default r), or the processes torchrun started (RANK / WORLD_SIZE / LOCAL_RANK in the
environment: every rank calls `run_sweep`, rank 0 gets the rows, the others []).

NCCL's own account of the transport: each rank runs with NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS
(INIT,GRAPH by default: the connection lines, nothing per call) and
NCCL_DEBUG_FILE=<log_dir>/nccl-rank<r>.log; the logs are parsed (`tracekit.probe.nccl_log`) into
the rows' `transport`. NCCL's algorithm/protocol per size (`algo`, `proto`) come from the TUNING
subsystem, which writes one log line per collective call: on the host, inside the timed loop, that
costs as much as a small collective (an 8 KiB all_reduce on two H200s read ~36 us/iter with it).
So the timed sweep does not log it; a separate short pass (`algo_pass`: fresh ranks, one un-timed
call per size, no check, NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING, logs in <log_dir>/tuning) does.
`nccl_debug="tuning"` still logs TUNING in the timed run itself (small-size times then include
that cost). NCCL_NVLS_ENABLE=0 is always set: NVLink multicast (NVLS) stays off.

torch is imported only inside the functions that run ranks.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from tracekit.errors import ProbeError
from tracekit.model.documents.links import LinksGpu, LinksMeta, NcclSummary, ProbeRow
from tracekit.probe import nccl_log, spec
from tracekit.probe.results import make_row
from tracekit.probe.sweep_rank import Buffers, Measured, Rank

#: What starts a CPU sweep's ranks, when set: a callable returning a multiprocessing-like context
#: (`Process`); None spawns fresh interpreters. The commands above this stage set the capture's fork
#: server (tracekit.capture.starter.Starter, which this stage may not import: the layers contract):
#: torch imported once per process instead of once per rank (~2.5 CPU-s a rank on a 2-core VM), as
#: a CPU capture's ranks are. CUDA ranks are always spawned (each its own CUDA context and environment).
cpu_rank_starter: Callable[[], Any] | None = None

#: NCCL_DEBUG_SUBSYS per `nccl_debug` setting ("off" sets no NCCL_DEBUG at all).
NCCL_DEBUG_SUBSYS = {"tuning": "INIT,GRAPH,TUNING", "init": "INIT,GRAPH"}


@dataclass(frozen=True)
class SweepConfig:
    """One sweep. Sizes are nccl-tests' swept sizes in bytes."""

    ops: tuple[str, ...] = ("all_reduce",)
    min_bytes: int = 8
    max_bytes: int = 128 * 1024 * 1024
    factor: int = 2
    iters: int = 20  # timed iterations per size (nccl-tests -n, default 20)
    warmup: int = 5  # warm-up iterations per size (nccl-tests -w, default 5)
    dtype: str = "float32"
    ranks: int | None = None  # None: number of GPUs on CUDA, 2 on CPU
    backend: str | None = None  # "nccl" / "gloo"; None: nccl on CUDA, gloo on CPU
    device: str = "auto"  # "auto", "cuda", "cpu"
    devices: tuple[int, ...] | None = None  # GPU of each rank; None: rank r -> GPU r
    check: bool = True  # run the correctness check per size
    mode: str = "default"  # label for rows ("nvlink", "pcie", "default")
    env: dict[str, str] = field(default_factory=dict)  # extra environment for every rank
    nccl_debug: str = (
        "init"  # "init" (INIT,GRAPH), "tuning" (INIT,GRAPH,TUNING: a host log line per call), "off"
    )
    algo_pass: bool = True  # NCCL only: algo/proto per size from a separate un-timed TUNING pass
    log_dir: str | None = None  # where NCCL logs go; None: a temporary folder (kept in the result)
    progress: bool = False  # rich progress bar over sizes on rank 0's stderr
    timeout_s: float = 900.0  # whole sweep
    graph: bool = False  # CUDA/NCCL: time a CUDA-graph replay of the iters (nccl-tests -G)

    def resolved(self) -> SweepConfig:
        """Config with auto choices made (device, backend, ranks, names normalised)."""
        ops = tuple(spec.normalise_op(op) for op in self.ops)
        dtype = spec.normalise_dtype(self.dtype)
        device = self.device
        if device not in ("auto", "cuda", "cpu"):
            raise ProbeError(f"--device must be auto, cuda or cpu, got {device!r}")
        n_gpus = _cuda_device_count() if device in ("auto", "cuda") else 0
        if device == "auto":
            device = "cuda" if n_gpus > 0 and self.backend != "gloo" else "cpu"
        if device == "cuda" and n_gpus == 0:
            raise ProbeError("--device cuda but no CUDA device is visible (torch.cuda.device_count() == 0)")
        backend = self.backend or ("nccl" if device == "cuda" else "gloo")
        if backend not in ("nccl", "gloo"):
            raise ProbeError(f"--backend must be nccl or gloo, got {backend!r}")
        if backend == "nccl" and device != "cuda":
            raise ProbeError("the nccl backend needs --device cuda (use --backend gloo on CPU)")
        ranks = self.ranks
        if ranks is None:
            ranks = (len(self.devices) if self.devices else n_gpus) if device == "cuda" else 2
        if ranks < 1:
            raise ProbeError(f"--ranks must be >= 1, got {ranks}")
        devices = self.devices
        if device == "cuda":
            devices = tuple(devices) if devices else tuple(range(ranks))
            if len(devices) < ranks:
                raise ProbeError(f"{ranks} ranks but only GPUs {list(devices)} were given")
            devices = devices[:ranks]
            bad = [d for d in devices if d >= n_gpus]
            if bad:
                raise ProbeError(f"GPU(s) {bad} requested but only {n_gpus} visible")
            if backend == "nccl" and len(set(devices)) < len(devices):
                raise ProbeError(f"NCCL needs one GPU per rank; devices {list(devices)} repeat one")
        else:
            devices = None
        if self.graph and (device != "cuda" or backend != "nccl"):
            raise ProbeError(f"--graph needs CUDA/NCCL (this sweep would run {backend} on {device})")
        if self.nccl_debug not in ("tuning", "init", "off"):
            raise ProbeError(f"nccl_debug must be tuning, init or off, got {self.nccl_debug!r}")
        spec.sweep_sizes(self.min_bytes, self.max_bytes, self.factor)  # validates
        if self.iters < 1 or self.warmup < 0:
            raise ProbeError(f"--iters must be >= 1 and --warmup >= 0 (got {self.iters}, {self.warmup})")
        return replace(
            self, ops=ops, dtype=dtype, device=device, backend=backend, ranks=ranks, devices=devices
        )


@dataclass
class SweepResult:
    rows: list[ProbeRow]
    transport: NcclSummary | None  # nccl_log.summarize(...) of all ranks' logs (None: no NCCL log read)
    log_dir: str | None
    meta: LinksMeta | None  # None on a torchrun rank other than 0
    notes: list[str]
    config: SweepConfig  # as resolved: device, backend, ranks and devices filled in


class _RankZero(msgspec.Struct):
    """What rank 0 of spawned ranks hands the parent (msgpack: NaN stays NaN)."""

    rows: list[ProbeRow]
    meta: LinksMeta


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def resolve_device(device: str, backend: str | None) -> str:
    """ "cuda" or "cpu" for --device auto|cuda|cpu (auto: cuda when a GPU is visible and the backend
    is not gloo)."""
    if device in ("cuda", "cpu"):
        return device
    return "cuda" if backend != "gloo" and _cuda_device_count() > 0 else "cpu"


def _under_torchrun() -> bool:
    return (
        all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        and "TRACEKIT_PROBE_CHILD" not in os.environ
    )


def rank_env(cfg: SweepConfig, rank: int, log_dir: str | None) -> dict[str, str]:
    """The environment one rank runs with (NCCL logging, NVLS off, the mode's variables)."""
    env = {"NCCL_NVLS_ENABLE": "0"}
    if cfg.backend == "nccl" and cfg.nccl_debug != "off" and log_dir:
        env.update(
            NCCL_DEBUG="INFO",
            NCCL_DEBUG_SUBSYS=NCCL_DEBUG_SUBSYS[cfg.nccl_debug],
            NCCL_DEBUG_FILE=str(Path(log_dir) / f"nccl-rank{rank}.log"),
        )
    env.update(cfg.env)
    env["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast, whatever the mode says
    return env


def _plan(cfg: SweepConfig, world: int) -> list[tuple[str, spec.Layout, bool]]:
    elem = spec.DTYPES[cfg.dtype][1]
    plan = []
    for op in cfg.ops:
        for size in spec.sweep_sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor):
            lay = spec.layout(op, size, world, elem)
            if lay.param_count == 0:
                continue  # fewer elements than ranks: nothing to move
            if op == "sendrecv" and world == 1:
                continue  # torch.distributed does not send to itself
            for in_place in spec.variants(op):
                plan.append((op, lay, in_place))
    return plan


def _rank_main(
    rank: int, world: int, cfg: SweepConfig, init_method: str, log_dir: str | None
) -> list[ProbeRow]:
    """Run the whole sweep on one rank; returns the rows on rank 0, [] elsewhere."""
    os.environ.update(rank_env(cfg, rank, log_dir))
    state = Rank(cfg, rank, world, init_method)
    try:
        plan = _plan(cfg, world)
        records: list[Measured] = []
        progress = None
        task = None
        if cfg.progress and rank == 0:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                transient=True,
                console=Console(stderr=True),
            )
            progress.start()
            task = progress.add_task("probe", total=len(plan))
        current_op = None
        pool: Buffers | None = None
        sizes = spec.sweep_sizes(cfg.min_bytes, cfg.max_bytes, cfg.factor)
        for op, lay, in_place in plan:
            if op != current_op or pool is None:
                pool = state.pool_for(op, sizes)
                current_op = op
            if progress is not None and task is not None:
                progress.update(
                    task,
                    description=f"{op} {spec.format_size(lay.size_bytes)}B {'in' if in_place else 'out-of'}-place",
                )
            records.append(state.measure(op, lay, in_place, pool))
            if progress is not None and task is not None:
                progress.advance(task)
        if progress is not None:
            progress.stop()
        gathered: list[list[Measured] | None] = [None] * world
        state.dist.all_gather_object(gathered, records)
        if rank != 0:
            return []
        rows = []
        for i, (op, lay, in_place) in enumerate(plan):
            per_rank = [g[i] for g in gathered if g is not None]
            wrongs = [p.wrong for p in per_rank]
            rows.append(
                make_row(
                    op=op,
                    lay=lay,
                    backend=str(cfg.backend),
                    device=cfg.device,
                    dtype=cfg.dtype,
                    in_place=in_place,
                    time_us_per_rank=[p.time_us for p in per_rank],
                    host_time_us_per_rank=[p.host_time_us for p in per_rank],
                    timer="cuda_event" if cfg.device == "cuda" else "host",
                    wrong=None if any(w is None for w in wrongs) else sum(w or 0 for w in wrongs),
                    iters=cfg.iters,
                    warmup=cfg.warmup,
                    mode=cfg.mode,
                    graph=cfg.graph,
                )
            )
        return rows
    finally:
        state.close()


def _spawn_entry(
    rank: int, world: int, cfg: SweepConfig, init_method: str, log_dir: str | None, result_path: str
) -> None:
    os.environ["TRACEKIT_PROBE_CHILD"] = "1"
    try:
        rows = _rank_main(rank, world, cfg, init_method, log_dir)
        if rank == 0:
            Path(result_path).write_bytes(msgspec.msgpack.encode(_RankZero(rows, _meta(cfg))))
    except BaseException:
        Path(f"{result_path}.rank{rank}.err").write_text(traceback.format_exc())
        sys.exit(1)


def _meta(cfg: SweepConfig) -> LinksMeta:
    import torch

    meta = LinksMeta(torch=str(torch.__version__), python=sys.version.split()[0], cuda=torch.version.cuda)
    if cfg.device == "cuda":
        try:
            v = torch.cuda.nccl.version()
            meta.nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            meta.nccl = None
        meta.gpus = [
            LinksGpu(index=d, name=torch.cuda.get_device_name(d)) for d in (cfg.devices or ()) if d >= 0
        ]
    return meta


def _spawn(cfg: SweepConfig, log_dir: str | None) -> tuple[list[ProbeRow], LinksMeta]:
    """Start one process per rank (multiprocessing, spawn: fresh interpreters, so each rank's
    environment is its own; on CPU forked from `cpu_rank_starter` when set) and wait for them; the
    parent does not import torch here."""
    import multiprocessing as mp

    assert cfg.ranks is not None
    starter = cpu_rank_starter if cfg.device == "cpu" else None
    ctx = starter() if starter is not None else mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="tracekit-probe-") as tmp:
        init_method = f"file://{Path(tmp) / 'store'}"
        result_path = str(Path(tmp) / "result.msgpack")
        procs = [
            ctx.Process(
                target=_spawn_entry, args=(r, cfg.ranks, cfg, init_method, log_dir, result_path), daemon=True
            )
            for r in range(cfg.ranks)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + cfg.timeout_s
        failed = None
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(timeout=0.2)
            bad = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if time.monotonic() > deadline:
                failed = -1
                break
        if failed is not None:
            time.sleep(0.5)  # let the others write their error
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
            errs = sorted(Path(tmp).glob("result.msgpack.rank*.err"))
            if failed == -1:
                raise ProbeError(
                    f"probe timed out after {cfg.timeout_s:.0f} s ({cfg.ranks} ranks, {cfg.backend})"
                )
            detail = (
                errs[0].read_text().strip().splitlines()[-1]
                if errs
                else f"rank {failed} exited with code {procs[failed].exitcode}"
            )
            raise ProbeError(f"a probe rank failed: {detail}")
        if not Path(result_path).is_file():
            codes = [p.exitcode for p in procs]
            raise ProbeError(f"the probe's rank 0 wrote no result (exit codes {codes})")
        data = msgspec.msgpack.decode(Path(result_path).read_bytes(), type=_RankZero)
        return data.rows, data.meta


def algo_pass_config(cfg: SweepConfig) -> SweepConfig:
    """The un-timed pass that reads NCCL's algorithm/protocol per size: the same ops, sizes, ranks,
    GPUs and environment, one call per size, no warm-up, no check, TUNING logged."""
    return replace(
        cfg, iters=1, warmup=0, check=False, nccl_debug="tuning", progress=False, algo_pass=False, graph=False
    )


def run_sweep_detailed(config: SweepConfig) -> SweepResult:
    """Run the sweep (spawning ranks, or as this torchrun rank) and read NCCL's logs; on NCCL,
    then the un-timed TUNING pass for algo/proto (`algo_pass`, see the module doc)."""
    notes: list[str] = []
    torchrun = _under_torchrun()
    if torchrun:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_RANK"])
        # validate as one rank on this process's GPU, then widen: rank r only reads devices[r]
        mine = config.devices[local] if config.devices else local
        one = replace(config, ranks=1, devices=(mine,) if config.device != "cpu" else None).resolved()
        devices = tuple(mine if r == rank else -1 for r in range(world)) if one.device == "cuda" else None
        cfg = replace(one, ranks=world, devices=devices)
    else:
        cfg = config.resolved()
    log_dir = cfg.log_dir
    if cfg.backend == "nccl" and cfg.nccl_debug != "off":
        if log_dir is None:
            run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT") or "x"
            log_dir = (
                str(Path(tempfile.gettempdir()) / f"tracekit-nccl-log-{run_id}")
                if torchrun
                else tempfile.mkdtemp(prefix="tracekit-nccl-log-")
            )
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        if not torchrun:  # under torchrun the other ranks may already be writing theirs
            for old in Path(log_dir).glob("nccl-rank*.log"):
                old.unlink()
    if torchrun:
        rows = _rank_main(rank, world, cfg, "env://", log_dir)
        meta = _meta(cfg) if rank == 0 else None
        notes.append(f"ran as torchrun rank {rank} of {world}; NCCL logs read from this host only")
        if rank != 0:
            return SweepResult([], None, log_dir, meta, notes, cfg)
    else:
        rows, meta = _spawn(cfg, log_dir)
    if cfg.graph:
        notes.append(graph_note(cfg.iters))
    if "sendrecv" in cfg.ops and cfg.ranks == 1:
        notes.append("sendrecv skipped: it needs at least 2 ranks")
    transport: NcclSummary | None = None
    if cfg.backend == "nccl" and log_dir:
        log = nccl_log.parse_files(sorted(Path(log_dir).glob("nccl-rank*.log")))
        transport = nccl_log.summarize(log)
        tuning_log, algo_source = (log, "timed run") if cfg.nccl_debug == "tuning" else (None, None)
        if cfg.algo_pass and cfg.nccl_debug != "tuning":
            if torchrun:
                notes.append(
                    "algo/proto not read: the un-timed TUNING pass needs spawned ranks (not torchrun)"
                )
            else:
                tuning_dir = Path(log_dir) / "tuning"
                tuning_dir.mkdir(parents=True, exist_ok=True)
                for old in tuning_dir.glob("nccl-rank*.log"):
                    old.unlink()
                _spawn(algo_pass_config(cfg), str(tuning_dir))
                tuning_log = nccl_log.parse_files(sorted(tuning_dir.glob("nccl-rank*.log")))
                algo_source = "un-timed TUNING pass"
                transport.algos = nccl_log.summarize(tuning_log).algos
                if not tuning_log.tuning:
                    notes.append(f"the TUNING pass logged no algorithm choices ({tuning_dir})")
        transport.nccl_debug_subsys = NCCL_DEBUG_SUBSYS.get(cfg.nccl_debug, "")
        transport.algo_source = algo_source
        label = transport.transport or ("none (1 rank)" if cfg.ranks == 1 else "unknown")
        for row in rows:
            row.transport = label
            if tuning_log is None:
                continue
            lay_sizes = {row.bytes, row.count * spec.DTYPES[cfg.dtype][1]}
            choice = nccl_log.choice_for(tuning_log, row.op, lay_sizes)
            if choice is not None:
                row.algo, row.proto = choice.algo, choice.proto
        if not log.lines:
            notes.append(f"no NCCL log lines found in {log_dir} (NCCL_DEBUG_FILE not honoured?)")
    elif cfg.backend == "gloo":
        for row in rows:
            row.transport = "gloo/tcp"
    return SweepResult(rows, transport, log_dir, meta, notes, cfg)


def graph_note(iters: int) -> str:
    """The sweep's note on CUDA-graph timing."""
    return (
        f"timed by CUDA-graph replay: {iters} collectives captured per (size, form), one un-timed replay, "
        "then one timed replay (no host launch per call); the check and the algo pass run eagerly"
    )


def run_sweep(config: SweepConfig) -> list[ProbeRow]:
    """The rows of a sweep (see docs/JSON.md#probe); [] on torchrun ranks other than 0."""
    return run_sweep_detailed(config).rows
