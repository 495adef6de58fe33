"""The critical path walked back on the dependency graph (`tracekit.analyse.path`; the package
`critical_path` module says what it means): `walk_path`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.analyse.path.graph import Graph
from tracekit.analyse.path.roles import PARTS, ROLE_XFER

#: A piece of the path: step, rank, start and end (that rank's own clock), piece ("work" or
#: "transfer"), instance (`critical_path.SEGMENT_COLUMNS`).
Segment = tuple[int, int, int, int, str, int]
#: The columns of a `PathRow` as a table row (`PathRow.values`), PARTS in their order.
PATH_ROW_COLUMNS: tuple[str, ...] = (
    "step",
    "rank",
    *(f"{p}_ns" for p in PARTS),
    "step_ns",
    "offset_ns",
    "hops",
)


@dataclass(frozen=True)
class PathRow:
    """One (step, rank) of the walk: the rank's share of the step's path per part (`parts_ns`, in
    PARTS order), and the step's own figures: its path span (`step_ns`), the offset (path length
    short of it: the walk reached the origin) and how many times the path changed rank (`hops`)."""

    step: int
    rank: int
    parts_ns: tuple[int, ...]
    step_ns: int
    offset_ns: int
    hops: int

    def values(self) -> tuple[int, ...]:
        """The row in `PATH_ROW_COLUMNS` order."""
        return (self.step, self.rank, *self.parts_ns, self.step_ns, self.offset_ns, self.hops)


@dataclass
class PathWalk:
    """Per step: one row per rank (`PathRow`) and the segments (step, rank, start, end own clock,
    piece, instance)."""

    rows: list[PathRow]
    segments: list[Segment]


def binding_edges(g: Graph, t: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Per node, its binding in-edge at node times `t` and edge latencies `lat`: the first of its
    in-edges (CSR order) whose source time + latency is the node's time; -1 for a node without
    in-edges, -2 for one none of whose in-edges reaches its time (an inconsistent `t`). One pass
    over the edges' arrays (what `walk_path` follows node by node)."""
    n = len(t)
    out = np.full(n, -1, dtype=np.int64)
    if not len(g.src):
        return out
    counts = np.diff(g.indptr)
    dst = np.repeat(np.arange(n, dtype=np.int64), counts)  # node n's in-edges: indptr[n]:indptr[n + 1]
    ok = np.flatnonzero(t[g.src[: len(dst)]] + np.asarray(lat, dtype=np.int64)[: len(dst)] == t[dst])
    has_in = counts > 0
    out[has_in] = -2
    if len(ok):
        d = dst[ok]
        first = np.ones(len(ok), dtype=bool)
        first[1:] = d[1:] != d[:-1]
        out[d[first]] = ok[first]
    return out


def walk_path(g: Graph, t: np.ndarray | None = None, lat: np.ndarray | None = None) -> PathWalk:
    """Walk the path back from the last step's latest window end (ties: the lowest rank) through
    each node's binding in-edge (the first in-edge reaching its time), for one range per step
    (`path_spans`): each edge's latency goes to its rank and part, split at the steps' ranges
    [latest end - span, latest end]. The walk is one chain across steps: where it reaches a
    step's latest end it goes on into that step from where it is (so of ranks that end a step
    together, the one the later step's chain runs through); where it cannot (it reached a node with
    no in-edge, or a step's range starts before the previous one's end) that step's walk starts at
    its own latest end. A walk that reaches a node with no in-edge stops: the rest of the step is its
    offset."""
    lat = g.lat if lat is None else lat
    if t is None:
        t = g.times(lat)
    ws, we = g.windows(t)
    step_ns = g.path_spans(t)
    ranks = g.ranks
    bind = binding_edges(g, t, lat)
    # the walk visits one node at a time, a path's worth of the graph: scalar reads of the arrays
    # (whole-graph lists would cost the graph's size per walk)
    t_a, src_a = t, g.src
    erank_a, kind_a, role_a, node_rank_a = g.erank, g.kind, g.role, g.node_rank

    def binding(n: int) -> int:
        e = int(bind[n])
        if e == -2:
            raise AssertionError("a node's time is reached by none of its in-edges")
        return e

    rows_rev: list[list[PathRow]] = []
    segs_rev: list[list[Segment]] = []
    cursor: tuple[int, int] | None = None  # (node, time reached on its binding in-edge, <= its time)
    for k in range(len(g.steps) - 1, -1, -1):
        st = g.steps[k]
        i_end = int(np.argmax(we[:, k]))
        t_end = int(we[i_end, k])
        limit = t_end - int(step_ns[k])
        n, hi = -1, t_end
        if cursor is not None and cursor[1] >= t_end:  # go on from the later step's chain
            n, hi = cursor
            while hi > t_end:
                e = binding(n)
                if e < 0:
                    n = -1
                    break
                ts = int(t_a[src_a[e]])
                if ts < t_end:
                    hi = t_end
                    break
                n, hi = int(src_a[e]), ts
        last_rank = ranks[i_end]
        if n < 0:
            nodes = g.end_nodes[i_end][k]
            n = int(nodes[np.argmax(t[nodes])])
            hi = int(t[n])
        elif node_rank_a[n] >= 0:
            last_rank = int(node_rank_a[n])
        acc = {r: [0] * len(PARTS) for r in ranks}
        hops = 0
        segs: list[Segment] = []
        ended = False
        while hi > limit:
            e = binding(n)
            if e < 0:
                ended = True
                break
            ts = int(t_a[src_a[e]])
            piece = hi - max(ts, limit)
            r = int(erank_a[e])
            if piece > 0:
                acc[r][int(kind_a[e])] += piece
                if r != last_rank:
                    hops += 1
                    last_rank = r
                off = g.offsets.get(r, 0)
                is_x = int(role_a[e]) == ROLE_XFER
                segs.append((int(st), r, max(ts, limit) + off, hi + off, "transfer" if is_x else "work", -1))
            if ts < limit:
                hi = limit
                break
            n, hi = int(src_a[e]), ts
        cursor = None if ended else (n, hi)
        path_len = t_end - max(hi, limit)
        rows_rev.append(
            [
                PathRow(int(st), r, tuple(acc[r]), int(step_ns[k]), int(step_ns[k]) - path_len, hops)
                for r in ranks
            ]
        )
        segs_rev.append(segs)
        assert int(step_ns[k]) - path_len >= 0, f"step {st}: negative path offset"
        total = sum(sum(v) for v in acc.values())
        assert total == path_len, f"step {st}: path pieces {total} != path length {path_len}"
    rows = [row for per in reversed(rows_rev) for row in per]
    segs_all = [sg for per in reversed(segs_rev) for sg in per]
    return PathWalk(rows, _merge_segments(segs_all))


def _merge_segments(segs: list[Segment]) -> list[Segment]:
    """Consecutive work pieces of one rank and step that meet, as one."""
    out: list[Segment] = []
    for s in segs:
        if (
            out
            and out[-1][0] == s[0]
            and out[-1][1] == s[1]
            and out[-1][4] == s[4] == "work"
            and out[-1][2] == s[3]
        ):
            p = out[-1]
            out[-1] = (p[0], p[1], s[2], p[3], p[4], p[5])
        else:
            out.append(s)
    return out
