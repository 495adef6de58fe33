"""Copy-engine bandwidth probes, in the manner of nvbandwidth's device-to-device tests.

- `local`: on one GPU, a device-to-device copy `dst.copy_(src, non_blocking=True)` (torch issues
  cudaMemcpyAsync): the memory ceiling. `gbps` counts each copied byte once (bytes / time, as
  nvbandwidth reports a copy); `rw_gbps` = 2 x bytes / time counts the read and the write, the DRAM
  traffic. Beside it, `baseline_gbps`: a plain `b.copy_(a)` loop timed with the host clock between
  two `torch.cuda.synchronize()` in the same run, and `ratio` = gbps / baseline_gbps (the probe's
  machinery must not distort a copy: the ratio should be within 5% of 1 at large sizes).
- `peer`: between two GPUs, `dst_on_b.copy_(src_on_a, non_blocking=True)`. torch runs a
  cross-device copy on the *source* device's current stream (aten/src/ATen/native/cuda/Copy.cu),
  so this is a copy-engine write from a to b (nvbandwidth's device_to_device_memcpy_write_ce);
  each direction (a->b, b->a) is a row.
- `peer_bidir`: both directions at once, each on its own pair of streams (so torch's cross-stream
  synchronisation does not serialise them), like nvbandwidth's bidirectional tests. `gbps` is the
  mean per-direction bandwidth (CUDA events on each source stream), `total_gbps` = 2 x bytes x
  iters / host wall time of the whole bidirectional loop (both directions counted).
Times come from CUDA events around the loop (`time_us`, per copy) and the host clock closed by a
synchronise (`host_time_us`). On CPU only the `local` probe runs (host memory copy, host clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tracekit.errors import ProbeError
from tracekit.model.documents.copy import Copy
from tracekit.probe.spec import sweep_sizes

COPY_FIELDS: tuple[str, ...] = (
    "probe",
    "kind",
    "src",
    "dst",
    "device",
    "bytes",
    "iters",
    "time_us",
    "host_time_us",
    "gbps",
    "total_gbps",
    "rw_gbps",
    "baseline_gbps",
    "ratio",
    "p2p",
    "correct",
)


@dataclass(frozen=True)
class CopyConfig:
    min_bytes: int = 1024 * 1024
    max_bytes: int = 1024 * 1024 * 1024
    factor: int = 2
    iters: int = 20
    warmup: int = 5
    device: str = "auto"  # auto, cuda, cpu
    devices: tuple[int, ...] | None = None  # GPUs to use (default all visible)
    local: bool = True
    peers: bool = True


def _row(
    kind: str,
    src: int,
    dst: int,
    device: str,
    size: int,
    iters: int,
    time_us: float,
    host_us: float,
    correct: bool,
    p2p: bool | None = None,
) -> Copy:
    gbps = size / (time_us * 1e3) if time_us > 0 else float("nan")
    return Copy(
        probe="copy",
        kind=kind,
        src=src,
        dst=dst,
        device=device,
        bytes=size,
        iters=iters,
        time_us=time_us,
        host_time_us=host_us,
        gbps=gbps,
        total_gbps=gbps,
        rw_gbps=None,
        baseline_gbps=None,
        ratio=None,
        p2p=p2p,
        correct=correct,
    )


def _pattern(torch: Any, size: int, dev: Any, seed: int) -> Any:
    """`size` random bytes on `dev` (no int64 temporary: 1 GiB stays 1 GiB)."""
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    return torch.randint(0, 256, (size,), dtype=torch.uint8, device=dev, generator=gen)


def _local(torch: Any, dev: Any, size: int, cfg: CopyConfig, cuda: bool) -> Copy:
    src = _pattern(torch, size, dev, 1)
    dst = torch.empty_like(src)
    ref = torch.empty_like(src)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    for _ in range(cfg.warmup):
        dst.copy_(src, non_blocking=True)
        ref.copy_(src)
    sync()
    # the probe: events around a loop of non-blocking copies, host clock closed by a stream sync
    if cuda:
        stream = torch.cuda.current_stream(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        t0 = time.perf_counter_ns()
        for _ in range(cfg.iters):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
        stream.synchronize()
        t1 = time.perf_counter_ns()
        time_us = start.elapsed_time(end) * 1e3 / cfg.iters
    else:
        t0 = time.perf_counter_ns()
        for _ in range(cfg.iters):
            dst.copy_(src)
        t1 = time.perf_counter_ns()
        time_us = (t1 - t0) / 1e3 / cfg.iters
    host_us = (t1 - t0) / 1e3 / cfg.iters
    correct = bool(torch.equal(dst, src))
    # the baseline: the plainest timing of the same copy
    sync()
    b0 = time.perf_counter()
    for _ in range(cfg.iters):
        ref.copy_(src)
    sync()
    base_s = (time.perf_counter() - b0) / cfg.iters
    row = _row(
        "local",
        dev.index if cuda else -1,
        dev.index if cuda else -1,
        "cuda" if cuda else "cpu",
        size,
        cfg.iters,
        time_us,
        host_us,
        correct and bool(torch.equal(ref, src)),
    )
    gbps = row.gbps if row.gbps is not None else float("nan")
    baseline = size / (base_s * 1e9) if base_s > 0 else float("nan")
    row.rw_gbps = 2 * gbps
    row.baseline_gbps = baseline
    row.ratio = gbps / baseline if baseline else float("nan")
    del src, dst, ref
    return row


def _peer(torch: Any, a: int, b: int, size: int, cfg: CopyConfig) -> list[Copy]:
    da, db = torch.device("cuda", a), torch.device("cuda", b)
    p2p = bool(torch.cuda.can_device_access_peer(a, b))
    src_a = _pattern(torch, size, da, 2)
    src_b = _pattern(torch, size, db, 3)
    dst_b = torch.empty(size, dtype=torch.uint8, device=db)
    dst_a = torch.empty(size, dtype=torch.uint8, device=da)
    # two stream pairs: a->b runs on s_ab (device a) with s_ab_dst as b's current stream, b->a on
    # s_ba (device b) with s_ba_dst as a's current stream
    s_ab, s_ab_dst = torch.cuda.Stream(device=da), torch.cuda.Stream(device=db)
    s_ba, s_ba_dst = torch.cuda.Stream(device=db), torch.cuda.Stream(device=da)

    def copy_ab() -> None:
        with torch.cuda.stream(s_ab), torch.cuda.stream(s_ab_dst):
            dst_b.copy_(src_a, non_blocking=True)

    def copy_ba() -> None:
        with torch.cuda.stream(s_ba), torch.cuda.stream(s_ba_dst):
            dst_a.copy_(src_b, non_blocking=True)

    def sync_all() -> None:
        torch.cuda.synchronize(da)
        torch.cuda.synchronize(db)

    def timed(fns: list[tuple[Any, Any]]) -> tuple[list[float], float]:
        """Run every (copy fn, its source stream) `iters` times, interleaved; per-fn event time
        per copy (µs) and the host wall time per iteration (µs)."""
        for _ in range(cfg.warmup):
            for fn, _s in fns:
                fn()
        sync_all()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
        for (start, _end), (_fn, s) in zip(events, fns, strict=True):
            start.record(s)
        t0 = time.perf_counter_ns()
        for _ in range(cfg.iters):
            for fn, _s in fns:
                fn()
        for (_start, end), (_fn, s) in zip(events, fns, strict=True):
            end.record(s)
        sync_all()
        t1 = time.perf_counter_ns()
        return [start.elapsed_time(end) * 1e3 / cfg.iters for start, end in events], (
            t1 - t0
        ) / 1e3 / cfg.iters

    rows = []
    (t_ab,), host_ab = timed([(copy_ab, s_ab)])
    rows.append(
        _row(
            "peer", a, b, "cuda", size, cfg.iters, t_ab, host_ab, bool(torch.equal(dst_b.to(da), src_a)), p2p
        )
    )
    (t_ba,), host_ba = timed([(copy_ba, s_ba)])
    rows.append(
        _row(
            "peer", b, a, "cuda", size, cfg.iters, t_ba, host_ba, bool(torch.equal(dst_a.to(db), src_b)), p2p
        )
    )
    dst_a.zero_()
    dst_b.zero_()
    (t1_, t2_), host_bi = timed([(copy_ab, s_ab), (copy_ba, s_ba)])
    ok = bool(torch.equal(dst_b.to(da), src_a)) and bool(torch.equal(dst_a.to(db), src_b))
    bi = _row("peer_bidir", a, b, "cuda", size, cfg.iters, (t1_ + t2_) / 2, host_bi, ok, p2p)
    bi.gbps = (size / (t1_ * 1e3) + size / (t2_ * 1e3)) / 2
    bi.total_gbps = 2 * size / (host_bi * 1e3) if host_bi > 0 else float("nan")
    rows.append(bi)
    return rows


def run_copy_probe(config: CopyConfig) -> list[Copy]:
    """Copy rows for every size: `local` per GPU, `peer` per ordered GPU pair, `peer_bidir` per
    pair (see module doc). On CPU: `local` only."""
    import torch

    sizes = sweep_sizes(config.min_bytes, config.max_bytes, config.factor)
    cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ProbeError("--device cuda but no CUDA device is visible")
    if config.iters < 1:
        raise ProbeError("--iters must be >= 1")
    rows: list[Copy] = []
    if not cuda:
        if config.local:
            for size in sizes:
                rows.append(_local(torch, torch.device("cpu"), size, config, False))
        return rows
    devices = list(config.devices) if config.devices else list(range(torch.cuda.device_count()))
    if config.local:
        for d in devices:
            for size in sizes:
                rows.append(_local(torch, torch.device("cuda", d), size, config, True))
    if config.peers:
        for i, a in enumerate(devices):
            for b in devices[i + 1 :]:
                for size in sizes:
                    rows.extend(_peer(torch, a, b, size, config))
    return rows


def format_copy_table(rows: list[Copy]) -> str:
    out = [
        "# copy probe: torch copy_ (cudaMemcpyAsync, copy engine). GB/s = bytes copied / time, each byte once;",
        "# rw GB/s (local) counts read + write; bidir total = both directions / host wall time;",
        "# baseline = plain copy_ loop between two synchronize() calls in the same run; ratio = GB/s / baseline.",
        f"# {'kind':<10} {'src':>4} {'dst':>4} {'size(B)':>12} {'time(us)':>10} {'GB/s':>9} {'total':>9} {'rw':>9} "
        f"{'baseline':>9} {'ratio':>6} {'ok':>3}",
    ]

    def f(v: float | None, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    for r in rows:
        out.append(
            f"  {r.kind:<10} {r.src:>4} {r.dst:>4} {r.bytes:>12} {f(r.time_us):>10} {f(r.gbps):>9} "
            f"{f(r.total_gbps):>9} {f(r.rw_gbps):>9} {f(r.baseline_gbps):>9} {f(r.ratio, '.3f'):>6} "
            f"{'yes' if r.correct else 'NO':>3}"
        )
    local = [r for r in rows if r.kind == "local"]
    if local:
        big = max(local, key=lambda r: (r.bytes or 0, -(r.src or 0)))
        ratio = big.ratio if big.ratio is not None else float("nan")
        within = abs(ratio - 1.0) <= 0.05
        out.append(
            f"# check: local D2D copy at {big.bytes} B on {'GPU ' + str(big.src) if big.device == 'cuda' else 'CPU'}: "
            f"probe {f(big.gbps, '.1f')} GB/s vs plain torch copy_ {f(big.baseline_gbps, '.1f')} GB/s, ratio {ratio:.3f} "
            f"({'within' if within else 'NOT within'} 5%)"
        )
    return "\n".join(out) + "\n"
