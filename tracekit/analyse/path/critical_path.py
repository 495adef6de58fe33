"""The per-token critical path across ranks, walked back on the run's dependency graph
(`tracekit.analyse.path.graph`; docs/METHOD.md section "The dependency graph").

Waiting is a consequence, not a cause. Every node of the graph (an instant: a host call's begin or
end, a device operation's begin or end, a collective's rendezvous) is reached at the latest of its
in-edges; the edge that reaches it is the one that held it back. Per step, from the latest window
end over ranks (ties: the lowest rank), the path follows those binding edges backward, each edge's
latency going to its rank and part (compute, memory, transfer, host, sync, unknown), for exactly
one step time (the longest window): the last edge is cut there. A collective is reached from its
rendezvous, which is reached from the last rank to arrive: the other ranks' waiting is not on the
path. A host that kept launching past an asynchronous launch or collective is not held by it; a
host holds the path only through its own calls and gaps, and it waits for the device only at a
synchronising call (or a full launch queue). Time between steps is host work like any other: the
path of a step can run into the previous token's work on the rank that held it.

The path is continuous in time, so the parts sum to its length; `offset_ns` is what is left of the
step time when the walk reaches the run's start (the graph's origin) before a step time: 0 almost
always, never negative (asserted).

Clocks: node times are on the aligned clock (raw = aligned + offset); segments are on each rank's
own clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pandas as pd

from tracekit.analyse.path.build import build_graph
from tracekit.analyse.path.graph import Graph, assemble
from tracekit.analyse.path.rank_graph import RankGraph
from tracekit.analyse.path.walk import PATH_ROW_COLUMNS, PathRow, Segment, walk_path
from tracekit.classify.rules import GPU_KINDS
from tracekit.model.parts import PATH_PARTS
from tracekit.model.strings import str_isin

#: Columns of `CriticalPath.segments`.
SEGMENT_COLUMNS: tuple[str, ...] = ("step", "rank", "start_ns", "end_ns", "piece", "instance")


@dataclass
class CriticalPath:
    """The critical path of every step of one run.

    - `per_step`: one row per (step, rank) with the PATH_PARTS in `<part>_ns` (the rank's share of
      that step's path; 0 rows for ranks the path did not visit are present), plus the step's
      `step_ns` (the longest window), `offset_ns` and `hops` (how many times the path changed rank)
      repeated on every row of the step.
    - `ranks`: the run's ranks.
    - `segments`: the path itself, one row per piece: step, rank, start_ns, end_ns (that rank's own
      clock), piece ("work": the rank's own time before a collective or its window start;
      "transfer": a collective from its last arrival to its end on that rank), instance (-1 for
      work); consecutive rows walk backward in time (`tracekit export --perfetto` draws them).
    """

    per_step: pd.DataFrame
    ranks: list[int]
    timeline: str
    segments: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(SEGMENT_COLUMNS)))

    def per_token(self, steps: list[int]) -> dict[str, Any]:
        """Exact means over `steps`: {"by_rank": {rank: {part: Fraction}}, "offset": Fraction,
        "step": Fraction}; sum over ranks and parts + offset == step."""
        ps = self.per_step[self.per_step["step"].isin(steps)]
        n = len(set(int(s) for s in ps["step"]))
        if n == 0:
            raise ValueError("no steps on the critical path")
        by_rank: dict[int, dict[str, Fraction]] = {}
        for r in self.ranks:
            g = ps[ps["rank"] == r]
            by_rank[r] = {p: Fraction(int(g[f"{p}_ns"].sum()), n) for p in PATH_PARTS}
        first = ps.drop_duplicates("step")
        offset = Fraction(int(first["offset_ns"].sum()), n)
        step = Fraction(int(first["step_ns"].sum()), n)
        total = sum(sum(d.values()) for d in by_rank.values()) + offset
        assert total == step, "critical path does not sum to the step time"
        return {"by_rank": by_rank, "offset": offset, "step": step}


def critical_path(
    classified: pd.DataFrame,
    windows: pd.DataFrame,
    per_rank: pd.DataFrame,
    offsets: Mapping[int, int] | None = None,
    timeline: str | None = None,
) -> CriticalPath:
    """The per-step critical path (module doc) on the graph of `classified` over `windows` (rank,
    step, start_ns, end_ns and, for a GPU timeline, annotation_end_ns; each rank's own clock);
    `per_rank`: the matched collectives (`CollectiveInstances.per_rank`); `offsets`: rank -> clock
    offset (raw = aligned + offset); `timeline`: "gpu" or "host" (else read from the events)."""
    if timeline not in ("gpu", "host"):
        timeline = event_timeline(classified)
    return path_of_graph(build_graph(classified, windows, per_rank, offsets, timeline))


def event_timeline(events: pd.DataFrame) -> str:
    """ "gpu" when the events hold device operations, else "host"."""
    return "gpu" if str_isin(events["kind"], GPU_KINDS).any() else "host"


def path_of_ranks(
    rank_graphs: Sequence[RankGraph], offsets: Mapping[int, int], timeline: str | None = None
) -> CriticalPath:
    """The path from the ranks' graphs (`build.build_rank_graph`, e.g. built where each rank's
    events are): assembled, then walked; `timeline`: the path's (the graph's when None)."""
    return path_of_graph(assemble(rank_graphs, offsets), timeline)


def path_of_graph(g: Graph, timeline: str | None = None) -> CriticalPath:
    """The walk of every step of `g` at its measured times, as a CriticalPath."""
    walk = walk_path(g, g.t)
    return path_of(walk.rows, walk.segments, g.ranks, timeline or g.timeline)


def path_timeline(timelines: Iterable[str]) -> str:
    """The path's timeline from its ranks' ("gpu", "host" or "mixed")."""
    ts = set(timelines)
    return "gpu" if ts == {"gpu"} else ("host" if ts == {"host"} else "mixed")


def path_of(rows: list[PathRow], segs: list[Segment], ranks: list[int], timeline: str) -> CriticalPath:
    """The CriticalPath of the walk's rows and segments (every step's, in step order)."""
    cols_out = ["step", "rank", *(f"{p}_ns" for p in PATH_PARTS), "step_ns", "offset_ns", "hops"]
    table = pd.DataFrame([r.values() for r in rows], columns=list(PATH_ROW_COLUMNS))[cols_out]
    seg = pd.DataFrame(segs, columns=list(SEGMENT_COLUMNS))
    seg = seg[seg["end_ns"] > seg["start_ns"]].reset_index(drop=True)
    return CriticalPath(table, ranks, timeline, seg)
