"""One re-timing of a run's graph (`tracekit.analyse.retime`): `Setting`, and what it needs of the
what-if's probe and latency knob (`whatif.knobs.ProbeTimes`, `whatif.knobs.Knob`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class TransferTimes(Protocol):
    """A probe's measured transfer times (`whatif.knobs.ProbeTimes`)."""

    def time_ns(self, op: str, size: int) -> float | None:
        """One collective's transfer (ns) for its op and size; None: the probe has no rows for it."""
        ...


class CollectiveLatency(Protocol):
    """A fixed latency + bytes at a bandwidth per collective (`whatif.knobs.Knob` collective_latency)."""

    def transfer_ns(self, op: str, size: int, n_ranks: int) -> float:
        """One collective's transfer (ns) for its op, nccl-tests size and ranks."""
        ...


class NamedKnob(Protocol):
    """A knob as `RunModel.applicable` reads it: its name (`whatif.knobs.KNOB_NAMES`)."""

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class Setting:
    """One re-timing of a run's graph (`RunModel.latencies`): what the knobs ask for
    (`whatif.knobs.setting_for`) and the profiler's correction (`calibrate`)."""

    transfer: str | TransferTimes | None = None  # None, "zero" or the probe
    launch0: bool = False
    sync0: bool = False
    straggler_off: bool = False
    compute_scale: float | None = None  # per kernel: (baseline compute / N) / the ranks' mean compute
    host_scale: float = 1.0
    host_deduct: float = 0.0  # ns per runtime call (host timeline: per op) taken from host time
    deduct_collective: float = 0.0  # ns per collective call taken from host time (manifest calibration)
    device_scale: float = 1.0  # factor on device op times and gaps (calibration of a device-bound run)
    coll_latency: CollectiveLatency | None = (
        None  # collective_latency=US[@GBPS]: every transfer latency + bytes / bw
    )
    fuse_norm: bool = False  # allreduce_norm=fused: the vector kernels after each all-reduce take 0
    #: a cost per runtime call for each rank, (rank, ns) pairs, in place of `host_deduct` (and of the
    #: model's `rank_deduct`): one split of a solved cost (`attribution.correction.identify`); None: not set
    rank_costs: tuple[tuple[int, float], ...] | None = None
