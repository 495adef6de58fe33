"""The critical path walked back on the dependency graph (`tracekit.analyse.path`; the package
`critical_path` module says what it means): `walk_path`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.analyse.path.forward import first_of_runs
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
    over the edges' arrays (what `walk_path` follows, reading it a block of nodes at a time)."""
    return _binding_of_nodes(g, t, np.asarray(lat, dtype=np.int64), 0, len(t))


def _binding_of_nodes(g: Graph, t: np.ndarray, lat: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """`binding_edges` of the nodes lo..hi-1 (their in-edges alone: `lat` int64)."""
    out = np.full(hi - lo, -1, dtype=np.int64)
    a, b = int(g.indptr[lo]), int(g.indptr[hi])
    if a == b:
        return out
    counts = np.diff(g.indptr[lo : hi + 1])
    dst = np.repeat(np.arange(lo, hi, dtype=np.int64), counts)  # node n's in-edges: indptr[n]:indptr[n + 1]
    ok = np.flatnonzero(t[g.src[a:b]] + lat[a:b] == t[dst])
    out[counts > 0] = -2
    if len(ok):
        d = dst[ok]
        first = first_of_runs(d)
        out[d[first] - lo] = ok[first] + a
    return out


#: `_Chain` reads the binding edges in aligned blocks of this many nodes, each once per walk
_BIND_BLOCK = 1024


class _Chain:
    """The binding in-edges of a walk's nodes, read a block of nodes at a time where the walk goes
    (a path is a small part of the graph: the whole graph's per walk would cost its size), and
    the walk's scan along them (`scan`)."""

    def __init__(self, g: Graph, t: np.ndarray, lat: np.ndarray) -> None:
        self.g, self.t, self.lat = g, t, np.asarray(lat, dtype=np.int64)
        n = len(t)
        self.bind = np.zeros(n, dtype=np.int64)  # valid in the blocks `done` marks
        self.done = np.zeros((n + _BIND_BLOCK - 1) // _BIND_BLOCK, dtype=bool)

    def binding(self, lo: int, hi: int) -> np.ndarray:
        """The binding edges of the nodes lo..hi-1 (`binding_edges`)."""
        for blk in range(lo // _BIND_BLOCK, (hi - 1) // _BIND_BLOCK + 1):
            if not self.done[blk]:
                a = blk * _BIND_BLOCK
                b = min(a + _BIND_BLOCK, len(self.t))
                self.bind[a:b] = _binding_of_nodes(self.g, self.t, self.lat, a, b)
                self.done[blk] = True
        return self.bind[lo:hi]

    def scan(
        self, n: int, hi: int, limit: int
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], int, int, bool]:
        """From node `n` reached at `hi`, the edges followed back while the time reached is past
        `limit`: each node's binding edge, until one has none (ended), or one's source is before
        `limit` (that edge is taken, cut at `limit`: hi becomes `limit`). Returns the edges taken,
        the time each was reached at and its source's time (lists of arrays, in walk order), the
        node and time the scan stopped at and whether it ended. Node by node, that is:

            while hi > limit:
                e = bind[n]  (-2: an AssertionError)
                if e < 0: ended; break
                ts = t[src[e]]; take (e, hi, ts)
                if ts < limit: hi = limit; break
                n, hi = src[e], ts

        here read along runs of consecutive node numbers (a rank's chain, numbered in order) a
        window at a time."""
        t, src = self.t, self.g.src
        edges: list[np.ndarray] = []
        his: list[np.ndarray] = []
        tss: list[np.ndarray] = []
        width = 64
        while True:
            if hi <= limit:
                return edges, his, tss, n, hi, False
            lo = max(n - width + 1, 0)
            width = min(width * 2, 1 << 16)
            e = self.binding(lo, n + 1)[::-1]  # nodes n, n - 1, ..., lo
            nodes = np.arange(n, lo - 1, -1, dtype=np.int64)
            has = e >= 0
            nxt = np.where(has, src[np.where(has, e, 0)], -1)
            brk = np.flatnonzero(nxt != nodes - 1)
            m = int(brk[0]) + 1 if len(brk) else len(nodes)  # positions 0..m-1 are on the chain
            e, nxt = e[:m], nxt[:m]
            h = t[nodes[:m]]
            h[0] = hi
            ts = t[np.maximum(nxt, 0)]
            stop = np.flatnonzero((h <= limit) | (e < 0) | (ts < limit))
            if not len(stop):
                edges.append(e)
                his.append(h)
                tss.append(ts)
                n, hi = int(nxt[-1]), int(ts[-1])
                continue
            j = int(stop[0])
            edges.append(e[:j])
            his.append(h[:j])
            tss.append(ts[:j])
            n = int(nodes[j])
            if h[j] <= limit:
                return edges, his, tss, n, int(h[j]), False
            if e[j] < 0:
                if e[j] == -2:
                    raise AssertionError("a node's time is reached by none of its in-edges")
                return edges, his, tss, n, int(h[j]), True
            edges.append(e[j : j + 1])
            his.append(h[j : j + 1])
            tss.append(ts[j : j + 1])
            return edges, his, tss, n, limit, False


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
    chain = _Chain(g, t, lat)
    n_parts = len(PARTS)
    rank_arr = np.asarray(ranks, dtype=np.int64)
    by_rank = np.argsort(rank_arr, kind="stable")
    off_of = np.asarray([g.offsets.get(int(r), 0) for r in ranks], dtype=np.int64)

    rows_rev: list[list[PathRow]] = []
    segs_rev: list[list[Segment]] = []
    cursor: tuple[int, int] | None = None  # (node, time reached on its binding in-edge, <= its time)
    for k in range(len(g.steps) - 1, -1, -1):
        st = int(g.steps[k])
        i_end = int(np.argmax(we[:, k]))
        t_end = int(we[i_end, k])
        limit = t_end - int(step_ns[k])
        n, hi = -1, t_end
        if cursor is not None and cursor[1] >= t_end:  # go on from the later step's chain
            _e, _h, _s, n, hi, ended = chain.scan(cursor[0], cursor[1], t_end)
            if ended:
                n = -1
        last_rank = ranks[i_end]
        if n < 0:
            nodes = g.end_nodes[i_end][k]
            n = int(nodes[np.argmax(t[nodes])])
            hi = int(t[n])
        elif g.node_rank[n] >= 0:
            last_rank = int(g.node_rank[n])
        e_l, h_l, s_l, n, hi, ended = chain.scan(n, hi, limit)
        e = np.concatenate(e_l) if e_l else np.zeros(0, dtype=np.int64)
        lo_ = np.maximum(np.concatenate(s_l), limit) if s_l else np.zeros(0, dtype=np.int64)
        hi_ = np.concatenate(h_l) if h_l else np.zeros(0, dtype=np.int64)
        keep = hi_ - lo_ > 0
        e, lo_, hi_ = e[keep], lo_[keep], hi_[keep]
        r = g.erank[e].astype(np.int64)
        ri = by_rank[np.searchsorted(rank_arr, r, sorter=by_rank)] if len(r) else r
        if len(r) and not np.array_equal(rank_arr[ri], r):
            raise KeyError("an edge's rank is not one of the graph's ranks")
        acc = np.zeros(len(ranks) * n_parts, dtype=np.int64)
        np.add.at(acc, ri * n_parts + g.kind[e].astype(np.int64), hi_ - lo_)
        hops = int(np.count_nonzero(r[1:] != r[:-1])) + int(len(r) > 0 and int(r[0]) != last_rank)
        cursor = None if ended else (n, hi)
        path_len = t_end - max(hi, limit)
        acc_l = acc.reshape(len(ranks), n_parts).tolist()
        rows_rev.append(
            [
                PathRow(st, int(rk), tuple(acc_l[i]), int(step_ns[k]), int(step_ns[k]) - path_len, hops)
                for i, rk in enumerate(ranks)
            ]
        )
        segs_rev.append(_merge_segments(st, r, lo_ + off_of[ri], hi_ + off_of[ri], g.role[e] == ROLE_XFER))
        assert int(step_ns[k]) - path_len >= 0, f"step {st}: negative path offset"
        total = int(acc.sum())
        assert total == path_len, f"step {st}: path pieces {total} != path length {path_len}"
    rows = [row for per in reversed(rows_rev) for row in per]
    segs_all = [sg for per in reversed(segs_rev) for sg in per]
    return PathWalk(rows, segs_all)


def _merge_segments(
    step: int, rank: np.ndarray, start: np.ndarray, end: np.ndarray, is_x: np.ndarray
) -> list[Segment]:
    """One step's pieces (in walk order, backward; start and end on the rank's own clock) as
    segments, consecutive work pieces of one rank that meet as one (a piece that starts where the
    next one ends)."""
    if not len(rank):
        return []
    join = np.zeros(len(rank), dtype=bool)
    join[1:] = (rank[1:] == rank[:-1]) & ~is_x[1:] & ~is_x[:-1] & (start[:-1] == end[1:])
    first = np.flatnonzero(~join)  # each segment's first piece (its end); its last: before the next first
    last = np.append(first[1:], len(rank)) - 1
    xs = is_x[first].tolist()
    return [
        (step, r, s, e_, "transfer" if x else "work", -1)
        for r, s, e_, x in zip(
            rank[first].tolist(), start[last].tolist(), end[first].tolist(), xs, strict=True
        )
    ]
