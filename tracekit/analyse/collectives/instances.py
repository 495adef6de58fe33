"""The result of matching one run's collectives: `CollectiveInstances` (the per-rank rows, the
instances, the clock alignment `ClockAlignment`, the bytes source) and its column lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tracekit.model.documents import shortfall as sd
from tracekit.model.documents.base import Documented
from tracekit.model.events import DataQuality

#: Where an instance's message size came from (`CollectiveInstances.instances.bytes_source`).
BYTES_SOURCES = ("trace", "manifest", "unknown")

#: Columns of `CollectiveInstances.per_rank`.
PER_RANK_COLUMNS = (
    "instance",
    "group",
    "rank",
    "op",
    "start_ns",
    "end_ns",
    "raw_start_ns",
    "raw_end_ns",
    "wait_ns",
    "transfer_ns",
    "in_bytes",
    "out_bytes",
    "event_index",
    "seq",
    "arrival_ns",
    "arrival_raw_ns",
)

#: how a refused partial group is matched anyway, in the words of both ways in (MatchError's hint)
PARTIAL_HINT = "pass --allow-partial (allow_partial=True from Python) to match the ranks present"


@dataclass
class ClockAlignment(Documented):
    """How the ranks' clocks were put on one time line (docs/METHOD.md section Clocks and step
    matching).

    `aligned`: the ranks are on one time line: one rank, or offsets estimated from the matched
    collectives (`estimate_offsets`) and subtracted (`offsets_ns[r]`: raw = aligned + offset), or
    one clock as an API caller said (`clock="shared"`). False when they cannot be aligned:
    `refusal` says why in one line. `residual_ns`: per rank, the end differences' median and
    largest deviation from its offset; `raw_instances_over`: the collectives the unaligned clocks
    put over the end-spread threshold (None where not checked).
    """

    aligned: bool
    offsets_ns: dict[int, int]
    method: str
    hosts: dict[int, str] = field(default_factory=dict)
    #: the end-spread check of the matched instances on the aligned clock (`end_spread_check`)
    check: sd.ShortfallCheck | None = None
    estimated: bool = False
    refusal: str | None = None
    residual_ns: dict[int, dict[str, int]] = field(default_factory=dict)
    raw_instances_over: int | None = None

    def document(self) -> sd.ShortfallClock:
        return sd.ShortfallClock(
            aligned=self.aligned,
            estimated=self.estimated,
            offsets_applied=self.estimated and any(v != 0 for v in self.offsets_ns.values()),
            offsets_ns={str(r): int(v) for r, v in sorted(self.offsets_ns.items())},
            residual_ns={
                str(r): sd.ShortfallResidualNsValue(**v) for r, v in sorted(self.residual_ns.items())
            },
            raw_instances_over=self.raw_instances_over,
            method=self.method,
            refusal=self.refusal,
            hosts={str(r): h for r, h in sorted(self.hosts.items())},
            check=self.check,
        )


@dataclass
class CollectiveInstances:
    """Matched collective instances of one run.

    - `per_rank`: one row per (instance, rank), columns `PER_RANK_COLUMNS`; times aligned to one
      clock (`raw_*` as the trace had them); `event_index` is the row label in the event table.
    - `instances`: one row per instance: instance, group, seq (the sequence number or the order
      within the group), op, n_ranks, last_rank, arrival_ns (a), first_start_ns, skew_ns,
      end_ns (max e), size_bytes (nccl-tests size), bytes_source ("trace" | "manifest" |
      "unknown"), transfer_ns_mean, wait_ns_max, algbw_gbps, busbw_gbps, last_tie (more than one
      rank started at a), end_spread_ns (max e - min e on the aligned clock).
    - `stragglers`: per rank: rank, last_count, instances, share.
    - `clock_check` (= `clock.check`): the end-spread check (`end_spread_check`).
    """

    per_rank: pd.DataFrame
    instances: pd.DataFrame
    stragglers: pd.DataFrame
    clock: ClockAlignment
    level: str  # "gpu_kernel" | "gloo" | "host_op" | "none"
    match_by: dict[str, str]  # group -> "seq" | "step_order" | "order"
    data_quality: DataQuality = field(default_factory=DataQuality)

    @property
    def n_instances(self) -> int:
        return len(self.instances)

    @property
    def clock_check(self) -> sd.ShortfallCheck | None:
        """threshold_ns, instances, instances_over, median_ns, p99_ns, max_ns, worst (see
        `end_spread_check`); also under "check" in `clock.to_json()`."""
        return self.clock.check

    def stragglers_json(self) -> list[sd.ShortfallStraggler_]:
        return [
            sd.ShortfallStraggler_(
                rank=int(r.rank),
                last_count=int(r.last_count),
                instances=int(r.instances),
                share=float(r.share),
            )
            for r in self.stragglers.itertuples(index=False)
        ]
