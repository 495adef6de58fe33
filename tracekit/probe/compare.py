"""NVLink vs PCIe on the same GPUs: the same sweep in each mode, the transport NCCL really used in
each, and the result judged against a decode trace by `tracekit.analyse.link_verdict`.

Modes (each a separate set of rank processes with its own environment; NCCL_NVLS_ENABLE=0 always):
- `nvlink`: NCCL's default (P2P allowed: NVLink where the pair has it);
- `pcie`: NCCL_P2P_DISABLE=1 (GPU peer-to-peer off: NCCL goes through host memory, `SHM`, i.e.
  over PCIe via the CPU), or NCCL_P2P_LEVEL=<level> when `pcie_p2p_level` is given (P2P only up to
  that PCIe distance; this never turns NVLink off);
- `default`: nothing set (label only).
What each run really used is read from NCCL's log and said plainly (`judge_transport`: a "pcie" run
that still used P2P over NVLink, a machine without NVLink).

This module runs the sweeps (`compare_links`); the verdict (docs/METHOD.md section Bandwidth and the link verdict: would a faster
link shrink the decode's per-token shortfall?), the trace's message sizes and `recompute` of a
saved result are pure analysis in `tracekit.analyse.links.verdict`, the text table is
`tracekit.render.links.table`. The result is the `Links` document (docs/JSON.md#probe,
`tracekit.compare_links`). No torch here except through `run_sweep_detailed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from msgspec import UNSET, structs

from tracekit.analyse.links.verdict import KIND, SCHEMA_VERSION, recompute
from tracekit.errors import ProbeError
from tracekit.model.documents.links import (
    Links,
    LinksConfig,
    LinksMeta,
    LinksMode,
    LinksProbe,
    LinksTransportsValue,
    NcclSummary,
    ProbeRow,
)
from tracekit.model.fields import copy_fields
from tracekit.probe.links import Topology, detect_topology
from tracekit.probe.sweep import SweepConfig, SweepResult, resolve_device, run_sweep_detailed

MODES = ("nvlink", "pcie", "default")


@dataclass(frozen=True)
class CompareConfig:
    ops: tuple[str, ...] = ("all_reduce", "all_gather")
    modes: tuple[str, ...] = ("nvlink", "pcie")
    gpus: tuple[int, ...] | None = None  # default: every visible GPU (2 on CPU ranks)
    min_bytes: int = 8
    max_bytes: int | None = None  # None: 1G on CUDA, 1M on CPU
    factor: int = 2
    iters: int = 20
    warmup: int = 5
    dtype: str = "float32"
    device: str = "auto"
    ranks: int | None = None  # CPU only (on CUDA: one rank per GPU)
    pcie_p2p_level: str | None = None  # use NCCL_P2P_LEVEL=<this> for "pcie" instead of NCCL_P2P_DISABLE=1
    trace_dir: str | None = None
    baseline_dir: str | None = None  # the trace's baseline run (TP=1): S and its transfer term
    nccl_debug: str = "init"  # timed sweeps log INIT,GRAPH only (TUNING costs host time per call)
    algo_pass: bool = True  # algo/proto per size from a separate un-timed TUNING pass
    log_dir: str | None = None  # per-mode subfolders
    progress: bool = False
    graph: bool = False  # CUDA/NCCL: time CUDA-graph replays (no host launch per call)


def mode_env(mode: str, pcie_p2p_level: str | None = None) -> dict[str, str]:
    if mode == "pcie":
        return {"NCCL_P2P_LEVEL": pcie_p2p_level} if pcie_p2p_level else {"NCCL_P2P_DISABLE": "1"}
    if mode in ("nvlink", "default"):
        return {}
    raise ProbeError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


# ---------------------------------------------------------------------------------------------
# transports


def judge_transport(
    mode: str, summary: NcclSummary | None, topo: Topology, devices: Sequence[int] | None, backend: str
) -> tuple[bool | None, list[str]]:
    """Did this mode's run use NVLink? Plus plain sentences about what it used."""
    notes: list[str] = []
    if backend != "nccl":
        notes.append(
            f"{mode}: gloo over host memory/TCP on CPU: no GPU link involved, NCCL variables have no effect"
        )
        return None, notes
    pairs = [topo.pair(a, b) for i, a in enumerate(devices or ()) for b in (devices or ())[i + 1 :]]
    pair_nvlink = [p.link == "nvlink" for p in pairs if p is not None]
    topo_nvlink = bool(pair_nvlink) and all(pair_nvlink)
    topo_known = bool(pair_nvlink)
    if summary is None or not summary.connections:
        if (summary is not None and summary.n_ranks == 1) or (devices is not None and len(devices) == 1):
            notes.append(f"{mode}: one rank: NCCL connected no peer, so no link was used")
        else:
            notes.append(
                f"{mode}: NCCL logged no connection lines (logging off or an old NCCL): transport unknown"
            )
        return None, notes
    p2p, wire = summary.p2p, summary.wire
    used = summary.transport
    uses_nvlink: bool | None
    if p2p and (wire == "nvlink" or (wire == "unknown" and topo_nvlink)):
        uses_nvlink = True
    elif p2p and (wire == "pcie" or (topo_known and not topo_nvlink)):
        uses_nvlink = False
    elif not p2p:
        uses_nvlink = False
    else:
        uses_nvlink = None
    if mode == "pcie":
        if uses_nvlink:
            notes.append(
                f"pcie: this run STILL used P2P over NVLink ({used}); NCCL_P2P_LEVEL does not turn NVLink off, "
                "use NCCL_P2P_DISABLE=1"
            )
        elif p2p:
            notes.append(f"pcie: GPU peer-to-peer over PCIe ({used})")
        elif summary.kinds.get("SHM"):
            notes.append(
                f"pcie: NCCL went through host memory ({used}): GPU -> PCIe -> CPU memory -> PCIe -> GPU, "
                "not direct PCIe peer-to-peer"
            )
        else:
            notes.append(f"pcie: transport {used}")
    elif mode == "nvlink":
        if uses_nvlink:
            notes.append(f"nvlink: P2P over NVLink ({used})")
        elif p2p:
            notes.append(f"nvlink: P2P over PCIe ({used}): these GPUs have no NVLink between them")
        else:
            notes.append(f"nvlink: NCCL did not use P2P ({used})")
    else:
        notes.append(f"{mode}: transport {used}")
    if summary.nvls_used:
        notes.append(f"{mode}: NVLS (NVLink multicast) was used although NCCL_NVLS_ENABLE=0 was set")
    return uses_nvlink, notes


# ---------------------------------------------------------------------------------------------
# the whole comparison


def compare_links(config: CompareConfig, *, topology: Topology | None = None) -> Links:
    """Run the sweep once per mode and put the results side by side (see module doc)."""
    if config.baseline_dir and not config.trace_dir:
        raise ProbeError("--baseline needs --trace (the sharded decode run it is the baseline of)")
    where = resolve_device(config.device, None)
    cpu_only = where == "cpu"
    if config.graph and cpu_only:
        raise ProbeError("--graph needs CUDA/NCCL (this run would use gloo on the CPU)")
    topo = topology if topology is not None else detect_topology()
    max_bytes = config.max_bytes if config.max_bytes is not None else (1024**3 if not cpu_only else 1024**2)
    notes: list[str] = []
    if cpu_only:
        notes.append(
            "CPU only: each mode runs the same gloo sweep (no GPU links to compare; NCCL variables have no effect)"
        )
    elif not topo.has_nvlink():
        notes.append(
            "this machine reports no NVLink between its GPUs: the 'nvlink' mode is whatever NCCL picks by default"
        )
    # the sweep's settings are the comparison's of the same names; the mode's env and log folder per mode
    base = copy_fields(
        SweepConfig,
        config,
        max_bytes=max_bytes,
        device=where,
        ranks=config.ranks if cpu_only else (len(config.gpus) if config.gpus else None),
        devices=None if cpu_only else config.gpus,
    )
    rows: list[ProbeRow] = []
    modes_out = []
    transports: dict[str, LinksTransportsValue] = {}
    results: dict[str, SweepResult] = {}
    for mode in config.modes:
        env = mode_env(mode, config.pcie_p2p_level)
        log_dir = str(Path(config.log_dir) / mode) if config.log_dir else None
        cfg = replace(base, mode=mode, env=env, log_dir=log_dir)
        res = run_sweep_detailed(cfg)
        results[mode] = res
        rows.extend(res.rows)
        devices = list(res.config.devices) if res.config.devices else None
        uses_nvlink, tnotes = judge_transport(mode, res.transport, topo, devices, res.config.backend or "")
        summary = structs.asdict(res.transport) if res.transport is not None else {}
        transports[mode] = LinksTransportsValue(
            **summary, uses_nvlink=uses_nvlink, notes=tnotes, log_dir=res.log_dir
        )
        modes_out.append(
            LinksMode(
                mode=mode,
                env={**env, "NCCL_NVLS_ENABLE": "0"},
                backend=res.config.backend,
                device=res.config.device,
                devices=devices,
                ranks=res.config.ranks,
                notes=tnotes,
            )
        )
        notes.extend(tnotes)
        notes.extend(n for n in res.notes if n not in notes)  # the graph note once, not per mode
    first = next(iter(results.values()), None)
    probed = LinksProbe(
        schema_version=SCHEMA_VERSION,
        kind=KIND,
        config=copy_fields(
            LinksConfig, config, ops=list(config.ops), modes=list(config.modes), max_bytes=max_bytes
        ),
        modes=modes_out,
        rows=rows,
        transports=transports,
        links=topo.document(),
        probe_notes=notes,
        meta=(first.meta if first else None) or LinksMeta(torch=None, python=None, cuda=None),
        trace=UNSET,
    )
    return recompute(probed, trace_dir=config.trace_dir, baseline_dir=config.baseline_dir)
