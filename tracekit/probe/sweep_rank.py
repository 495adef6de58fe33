"""One rank of a collective sweep (`tracekit.probe.sweep`, the method in
docs/METHOD.md section Bandwidth and the link verdict): torch and its process group, the buffers
rotated per iteration, the warm-up, the timed loop (CUDA events and the host clock, or one
CUDA-graph replay), the check iteration. torch is imported when a rank starts."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

from tracekit.errors import ProbeError
from tracekit.probe import spec

if TYPE_CHECKING:
    from tracekit.probe.sweep import SweepConfig


class Buffers(NamedTuple):
    """One op's send and receive allocations (torch tensors), sliced per iteration."""

    send: Any
    recv: Any


class Measured(NamedTuple):
    """One rank's record of one (op, size, form): per-iteration times (us) and wrong elements
    (None: not checked); rank 0 gathers every rank's into the row (`probe.results.make_row`)."""

    time_us: float
    host_time_us: float
    wrong: int | None


def _torch_dtype(torch: Any, name: str) -> Any:
    return getattr(torch, name)


class Rank:
    """One rank's state: torch modules, device, process group."""

    def __init__(self, cfg: SweepConfig, rank: int, world: int, init_method: str):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.cfg, self.rank, self.world = cfg, rank, world
        self.cuda = cfg.device == "cuda"
        if self.cuda:
            assert cfg.devices is not None
            self.dev = torch.device("cuda", cfg.devices[rank])
            torch.cuda.set_device(self.dev)
        else:
            self.dev = torch.device("cpu")
        if cfg.backend == "nccl":
            dist.init_process_group(
                cfg.backend, init_method=init_method, rank=rank, world_size=world, device_id=self.dev
            )
        else:
            dist.init_process_group(cfg.backend, init_method=init_method, rank=rank, world_size=world)
        self.dtype = _torch_dtype(torch, cfg.dtype)
        self.elem = spec.DTYPES[cfg.dtype][1]
        self._capture_stream: Any = None

    def barrier(self) -> None:
        if self.cuda:
            self.dist.barrier(device_ids=[self.dev.index])
            self.torch.cuda.synchronize(self.dev)
        else:
            self.dist.barrier()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.current_stream(self.dev).synchronize()

    def _call(self, op: str, send: Any, recv: Any, buf: Any, in_place: bool, lay: spec.Layout) -> None:
        dist, r, n = self.dist, self.rank, self.world
        c = lay.chunk
        if op == "all_reduce":
            dist.all_reduce(buf)
        elif op == "broadcast":
            dist.broadcast(buf, src=0)
        elif op == "reduce":
            dist.reduce(buf, dst=0)
        elif op == "all_gather":
            # all_gather_single is all_gather_into_tensor's newer name (torch >= 2.12)
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            if in_place:
                gather(buf, buf[r * c : (r + 1) * c])
            else:
                gather(recv, send)
        elif op == "reduce_scatter":
            if in_place:
                dist.reduce_scatter_tensor(buf[r * c : (r + 1) * c], buf)
            else:
                dist.reduce_scatter_tensor(recv, send)
        elif op == "alltoall":
            dist.all_to_all_single(recv, send)
        elif op == "sendrecv":
            ops = [dist.P2POp(dist.isend, send, (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        else:  # pragma: no cover - normalise_op guards
            raise ProbeError(f"unknown op {op}")

    def measure(self, op: str, lay: spec.Layout, in_place: bool, pool: Buffers) -> Measured:
        """Time one (op, size, form) and check it; returns this rank's record."""
        torch = self.torch
        cfg = self.cfg
        send_pool, recv_pool = pool
        # nccl-tests rotates buffers: iteration i uses offset (i % steps) * size
        n_iter = max(cfg.iters, cfg.warmup, 1)
        if in_place:
            span = lay.shared_count
            steps = max(1, recv_pool.numel() // max(span, 1))
            views = [(None, None, recv_pool[k * span : (k + 1) * span]) for k in range(min(steps, n_iter))]
        else:
            steps = max(
                1,
                min(send_pool.numel() // max(lay.send_count, 1), recv_pool.numel() // max(lay.recv_count, 1)),
            )
            views = [
                (
                    send_pool[k * lay.send_count : (k + 1) * lay.send_count],
                    recv_pool[k * lay.recv_count : (k + 1) * lay.recv_count],
                    None,
                )
                for k in range(min(steps, n_iter))
            ]
        nv = len(views)
        for i in range(cfg.warmup):
            s, r, b = views[i % nv]
            self._call(op, s, r, b, in_place, lay)
        self.sync()
        self.barrier()
        if cfg.graph:
            time_us, host_us = self._time_graph(op, lay, in_place, views)
        elif self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            stream = torch.cuda.current_stream(self.dev)
            start.record(stream)
            t0 = time.perf_counter_ns()
            for i in range(cfg.iters):
                s, r, b = views[i % nv]
                self._call(op, s, r, b, in_place, lay)
            end.record(stream)
            stream.synchronize()
            t1 = time.perf_counter_ns()
            time_us = start.elapsed_time(end) * 1e3 / cfg.iters
            host_us = (t1 - t0) / 1e3 / cfg.iters
        else:
            t0 = time.perf_counter_ns()
            for i in range(cfg.iters):
                s, r, b = views[i % nv]
                self._call(op, s, r, b, in_place, lay)
            t1 = time.perf_counter_ns()
            time_us = (t1 - t0) / 1e3 / cfg.iters
            host_us = time_us
        wrong = self.check(op, lay, in_place, views[0]) if cfg.check else None
        return Measured(time_us, host_us, wrong)

    def _time_graph(
        self, op: str, lay: spec.Layout, in_place: bool, views: list[tuple[Any, Any, Any]]
    ) -> tuple[float, float]:
        """(device us, host us) per iteration of one timed CUDA-graph replay of `iters` collectives
        (the module doc's step 2 with `graph`). Called after the eager warm-up, sync and barrier."""
        torch, cfg = self.torch, self.cfg
        nv = len(views)
        cur = torch.cuda.current_stream(self.dev)
        if self._capture_stream is None:
            self._capture_stream = torch.cuda.Stream(device=self.dev)
        cap = self._capture_stream
        # torch: warm up on the side stream the capture will use
        cap.wait_stream(cur)
        with torch.cuda.stream(cap):
            s, r, b = views[0]
            self._call(op, s, r, b, in_place, lay)
        cur.wait_stream(cap)
        cap.synchronize()
        self.barrier()  # every rank enters the capture together (NCCL may register buffers there)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads' CUDA calls (torch's NCCL watchdog, NCCL's proxy) do not
        # invalidate the capture
        with torch.cuda.graph(graph, stream=cap, capture_error_mode="thread_local"):
            for i in range(cfg.iters):
                s, r, b = views[i % nv]
                self._call(op, s, r, b, in_place, lay)
        try:
            graph.replay()  # un-timed: the first launch uploads the graph
            cur.synchronize()
            self.barrier()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(cur)
            t0 = time.perf_counter_ns()
            graph.replay()
            end.record(cur)
            cur.synchronize()
            t1 = time.perf_counter_ns()
        finally:
            graph.reset()
        return start.elapsed_time(end) * 1e3 / cfg.iters, (t1 - t0) / 1e3 / cfg.iters

    def check(self, op: str, lay: spec.Layout, in_place: bool, view: tuple[Any, Any, Any]) -> int:
        """nccl-tests' check iteration: fill, run once, count wrong elements on this rank."""
        torch = self.torch

        def arange(a: int, b: int) -> Any:
            # int32 indices while they fit: half the memory of int64 at 1 GiB buffers
            return torch.arange(a, b, device=self.dev, dtype=torch.int32 if b < 2**31 - 1 else torch.int64)

        inp = spec.input_values(op, self.rank, lay, arange).to(self.dtype)
        send, recv, buf = view
        if in_place:
            in_off, out_off = lay.in_place_offsets(self.rank)
            buf.zero_()
            buf[in_off : in_off + lay.send_count].copy_(inp)
            out = buf[out_off : out_off + lay.recv_count]
        else:
            send.copy_(inp)
            recv.zero_()
            out = recv
        self._call(op, send, recv, buf, in_place, lay)
        self.sync()
        expected = spec.expected_output(op, self.rank, lay, arange)
        if expected is None:
            return 0
        # the values are small integers, exact in every supported dtype: compare in the buffer's dtype
        return int((out != expected.to(out.dtype)).sum().item())

    def pool_for(self, op: str, sizes: list[int]) -> Buffers:
        torch = self.torch
        lays = [spec.layout(op, s, self.world, self.elem) for s in sizes]
        send_n = max(max(lay.send_count, lay.shared_count) for lay in lays)
        recv_n = max(max(lay.recv_count, lay.shared_count) for lay in lays)
        return Buffers(
            torch.empty(send_n, dtype=self.dtype, device=self.dev),
            torch.empty(recv_n, dtype=self.dtype, device=self.dev),
        )

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:
            pass
