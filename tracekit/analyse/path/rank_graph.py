"""One rank's share of the dependency graph (`tracekit.analyse.path`): `RankGraph`, the builder
its nodes and edges are appended to, the columns it is made of, and the lookups both timelines'
builders share (`gpu_rank`, `host_rank`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict

import numpy as np
import pandas as pd

from tracekit.model.strings import str_values


class RankSource(NamedTuple):
    """What a timeline's builder (`gpu_rank`, `host_rank`; `build.build_rank_graph` picks one) reads
    of one rank: its classified events, its step windows (sorted by start, own clock), its rows of
    the matched collectives, its clock offset (aligned = own - offset), the bytes per instance."""

    events: pd.DataFrame
    rank: int
    windows: pd.DataFrame
    matched: pd.DataFrame
    offset: int
    inst_bytes: Mapping[int, int]


@dataclass
class MatchedCollectives:
    """A rank's matched collectives, one entry per collective in its builder's order: the begin
    (arrival) node, the end node, the instance, the transfer, the op, the bytes (-1: unknown)."""

    begin: np.ndarray
    end: np.ndarray
    inst: np.ndarray
    x: np.ndarray
    op: list[str]
    nbytes: np.ndarray


class MatchedBuilder:
    """A rank's matched collectives, appended as its builder meets them (`gpu_rank`, `host_rank`)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, str, int]] = []

    def add(self, begin: int, end: int, inst: int, x: int, op: str, nbytes: int) -> None:
        self.rows.append((int(begin), int(end), int(inst), int(x), op, int(nbytes)))

    def done(self) -> MatchedCollectives:
        i64 = np.int64
        ints = np.asarray([(b, e, i, x, nb) for b, e, i, x, _, nb in self.rows], dtype=i64).reshape(-1, 5)
        return MatchedCollectives(
            begin=ints[:, 0].copy(),
            end=ints[:, 1].copy(),
            inst=ints[:, 2].copy(),
            x=ints[:, 3].copy(),
            op=[r[4] for r in self.rows],
            nbytes=ints[:, 4].copy(),
        )


@dataclass
class RankGraph:
    """One rank's share of the graph (local node numbers); `build_rank_graph`."""

    rank: int
    timeline: str
    t: np.ndarray  # node times, aligned clock
    src: np.ndarray
    dst: np.ndarray
    lat: np.ndarray
    role: np.ndarray
    kind: np.ndarray
    seg: np.ndarray  # straggler segment: step index * 100000 + collective launches before it; -1
    calls: np.ndarray  # runtime calls the edge's host time holds (profiler deduction)
    ops: np.ndarray  # host-timeline ops / annotated ranges the edge's host time holds
    cidx: np.ndarray  # compute operation: its index among the step's compute operations; -1
    # windows: per step (in `steps` order), the start marker node and the end nodes
    steps: list[int]
    ws_node: np.ndarray
    end_nodes: list[np.ndarray]
    matched: MatchedCollectives
    origin: int
    notes: list[str] = field(default_factory=list)
    rho_typ: int = 5000  # the rank's typical launch latency
    q_typ: int = 1000  # the rank's typical queued gap between operations
    #: its nodes' times re-timed where the piece is (`rank_forward`: the profiler correction's
    #: latencies, the rendezvous exchanged with the other ranks); None: not re-timed
    retimed: np.ndarray | None = None

    def __getstate__(self) -> dict[str, object]:
        # on the wire (a Dask worker's piece on its way to the graph's Reduces) each edge column in
        # the narrowest integer type that holds its values: 34 bytes an edge instead of 80 on
        # h200-tp2 (times and latencies stay int64), and read as sent, no copy on the Reduce's
        # worker: the piece's readers (`graph.assemble`, `rank_forward.rank_subgraph`) take any
        # integer columns and build the graph in int64
        state = dict(self.__dict__)
        for col in NARROW_COLUMNS:
            state[col] = narrowed(state[col])
        return state


#: the edge columns `RankGraph` narrows on the wire: node numbers, roles, kinds and counts
NARROW_COLUMNS = ("src", "dst", "role", "kind", "seg", "calls", "ops", "cidx")


def narrowed(a: np.ndarray) -> np.ndarray:
    """`a` (integers) in the narrowest of int8 / int16 / int32 / int64 that holds every value."""
    if not len(a):
        return a
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.int8, np.int16, np.int32):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a.astype(dt)
    return a


class RankBuilder:
    """A rank's nodes (their times) and edge rows, appended in build order (`host_rank`)."""

    def __init__(self) -> None:
        self.t: list[int] = []
        self.e: list[tuple[int, int, int, int, int, int, int, int, int]] = []

    def node(self, t: int) -> int:
        self.t.append(int(t))
        return len(self.t) - 1

    def edge(
        self,
        s: int,
        d: int,
        lat: int,
        role: int,
        kind: int,
        seg: int = -1,
        calls: int = 0,
        ops: int = 0,
        cidx: int = -1,
    ) -> None:
        self.e.append((s, d, int(lat), role, kind, seg, calls, ops, cidx))

    def arrays(self) -> BuiltColumns:
        return BuiltColumns(
            t=np.asarray(self.t, dtype=np.int64), **edge_columns(np.asarray(self.e, dtype=np.int64))
        )


#: the columns of an edge row (src, dst, lat, role, kind, seg, calls, ops, cidx), as RankGraph holds them
EDGE_COLUMNS = ("src", "dst", "lat", "role", "kind", "seg", "calls", "ops", "cidx")


def edge_columns(e: np.ndarray) -> EdgeColumns:
    """RankGraph's edge arrays from an [n, 9] table of edge rows."""
    e = e.reshape(-1, len(EDGE_COLUMNS))
    return EdgeColumns(**{c: e[:, i].copy() for i, c in enumerate(EDGE_COLUMNS)})  # type: ignore[typeddict-item]


def coll_lookup(matched: pd.DataFrame) -> dict[tuple[int, int], tuple[int, int, str]]:
    out: dict[tuple[int, int], tuple[int, int, str]] = {}
    if len(matched):
        for inst, s, e, a, op in zip(
            matched["instance"].to_numpy(np.int64),
            matched["raw_start_ns"].to_numpy(np.int64),
            matched["raw_end_ns"].to_numpy(np.int64),
            matched["arrival_raw_ns"].to_numpy(np.int64),
            str_values(matched["op"]),
            strict=True,
        ):
            out[(int(s), int(e))] = (int(inst), max(int(e) - max(int(a), int(s)), 0), str(op))
    return out


def seg_id(step_i: int, k: int) -> int:
    return step_i * 100_000 + k


class EdgeColumns(TypedDict):
    """RankGraph's edge arrays, one entry per edge (`EDGE_COLUMNS`)."""

    src: np.ndarray
    dst: np.ndarray
    lat: np.ndarray
    role: np.ndarray
    kind: np.ndarray
    seg: np.ndarray
    calls: np.ndarray
    ops: np.ndarray
    cidx: np.ndarray


class BuiltColumns(EdgeColumns):
    """A `RankBuilder`'s nodes (their times) and edges."""

    t: np.ndarray
