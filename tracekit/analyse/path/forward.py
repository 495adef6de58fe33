"""The forward pass of the dependency graph (`tracekit.analyse.path`): every node the latest of
its in-edges (source time + latency), for many latency vectors at once, exact in integer ns
(`Forward`; `times_reference` is the definition, node by node)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.analyse.path.roles import (
    ROLE_ARRIVE,
    ROLE_CALL,
    ROLE_GAP,
    ROLE_GAP_OUT,
    ROLE_GRAPH,
    ROLE_LEAD,
    ROLE_OP,
    ROLE_QUEUE,
    ROLE_SYNC,
    ROLE_WORK,
    ROLE_XFER,
)

if TYPE_CHECKING:
    from tracekit.analyse.path.graph import Graph

#: Lower bound of every replayed time (a node not reached yet in the fixpoint iteration).
_FLOOR = -(1 << 62)
#: Nodes per block of the forward pass: per block the pass is a few array operations per
#: iteration, so larger blocks cost less for one column and more for many (the h200-tp2 graph,
#: 117k nodes: one column 0.040 s at 512, 0.021 s at 2048; 32 columns 0.32 s at 512, 0.42 s at 2048).
#: The narrow pass's 8192 (CPU s on the 2-core VM, one column, build + pass): h200-tp2 0.044 +
#: 0.039 at 2048, 0.039 + 0.023 at 8192; 16 synthetic h200-tp2 ranks (930k nodes, the profiler
#: correction's one re-timing, a serial task on Dask) 0.61 + 0.21 at 2048, 0.38 + 0.17 at 8192
FORWARD_BLOCK = 512
FORWARD_BLOCK_NARROW = 8192
#: at most this many columns take the narrow pass's larger blocks
FORWARD_NARROW_COLS = 4
#: in the wide pass, a block whose chain pieces are at most this long takes one slice per index
#: along them instead of the doubling steps (h200-tp2 at 32 columns: 0.47 s sliced, 0.53 s doubled)
FORWARD_SLICES_UP_TO = 128
#: rounds of the chain parents' choice (`Forward`): each gives the nodes whose edge lost
#: their next one; what is left after them is not chained (exact either way, only slower)
CHAIN_ROUNDS = 8
# which edges may chain two nodes (host program order first, then stream order, then through a
# rendezvous); the edges that can be disabled (NEVER) never chain
_CHAIN_PRIORITY = np.full(32, 99, dtype=np.int64)
_CHAIN_PRIORITY[[ROLE_GAP, ROLE_GAP_OUT, ROLE_CALL, ROLE_SYNC, ROLE_WORK, ROLE_LEAD]] = 0
_CHAIN_PRIORITY[[ROLE_QUEUE, ROLE_OP]] = 1
_CHAIN_PRIORITY[[ROLE_XFER, ROLE_ARRIVE]] = 2
_CHAIN_PRIORITY[ROLE_GRAPH] = 3


def lexsort_packed(keys: Sequence[np.ndarray], unique: bool = False) -> np.ndarray:
    """`np.lexsort(keys)`'s order (the last key primary) by one argsort of the keys packed into
    one int64, where the product of their ranges stays under 2**62 (else `np.lexsort` itself);
    `unique`: no two rows have equal keys (one of them is a permutation), so an unstable sort
    gives the same order. One sort of one array instead of one stable sort per key."""
    n = len(keys[0]) if len(keys) else 0
    if not n:
        return np.lexsort(keys)
    cols = [np.asarray(k).astype(np.int64, copy=False) for k in reversed(keys)]  # primary first
    lows = [int(c.min()) for c in cols]
    spans = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True)]
    total = 1
    for sp in spans:
        total *= sp
    if total >= 1 << 62:
        return np.lexsort(keys)
    packed = cols[0] - lows[0]
    for c, lo, sp in zip(cols[1:], lows[1:], spans[1:], strict=True):
        packed = packed * sp + (c - lo)
    return np.argsort(packed, kind=None if unique else "stable")


def first_of_runs(keys: np.ndarray) -> np.ndarray:
    """True at the first element of each run of equal keys."""
    out = np.ones(len(keys), dtype=bool)
    out[1:] = keys[1:] != keys[:-1]
    return out


def index_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indices of the ranges [starts[i], ends[i]), one after the other."""
    lens = ends - starts
    offs = np.cumsum(lens) - lens
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - offs, lens)


def last_of_runs(keys: np.ndarray) -> np.ndarray:
    """True at the last element of each run of equal keys."""
    out = np.ones(len(keys), dtype=bool)
    out[:-1] = keys[1:] != keys[:-1]
    return out


def key_lookup(
    keys: np.ndarray, values: np.ndarray, query: np.ndarray, last: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Per `query` element, the value paired with its key in (`keys`, `values`): of several pairs
    with one key the first in their order (`last`: the last). Returns the mask of the queries
    whose key is there and, for those, the values (int64)."""
    o = np.argsort(keys, kind="stable")
    k, v = keys[o], values[o]
    one = last_of_runs(k) if last else first_of_runs(k)
    k, v = k[one], v[one]
    if not len(k):
        return np.zeros(len(query), dtype=bool), v.astype(np.int64)
    pos = np.minimum(np.searchsorted(k, query), len(k) - 1)
    ok = k[pos] == query
    return ok, v[pos[ok]].astype(np.int64)


#: the chain priorities' range (`_CHAIN_PRIORITY` below 99)
_PRIO_SPAN = int(_CHAIN_PRIORITY[_CHAIN_PRIORITY < 99].max()) + 1


def _chain_parents(src: np.ndarray, dst: np.ndarray, prio: np.ndarray, tpos: np.ndarray) -> np.ndarray:
    """Per node its chain parent's edge (-1: none), `Forward`'s rounds: per node its first in-edge
    of the best priority, then per source node one chain child (the earliest in topological
    order); a node whose edge lost to another child of that source tries its next edge whose
    source has no child yet, round by round."""
    n, n_e = len(tpos), len(src)
    left = np.flatnonzero(prio < 99)
    pedge = np.full(n, -1, dtype=np.int64)
    has_child = np.zeros(n, dtype=bool)
    sh = max(n_e, 1).bit_length()
    for _ in range(CHAIN_ROUNDS):
        if not len(left):
            break
        d = dst[left]
        if (d[1:] >= d[:-1]).all():  # in-edges grouped by destination (a Graph's): no sort
            first = np.flatnonzero(first_of_runs(d))
            c = np.minimum.reduceat((prio[left] << sh) | left, first) & ((1 << sh) - 1)
        else:
            c = left[lexsort_packed((left, prio[left], d), unique=True)]
            c = c[first_of_runs(dst[c])]
        n_dst = len(c)
        s = src[c]
        dup = np.bincount(s, minlength=n)[s] > 1  # a source with other candidates: sorted
        if dup.any():
            cd, sd = c[dup], s[dup]
            if n < 1 << 29:  # (source, priority, topological position) packed: unique
                o = np.argsort((sd * _PRIO_SPAN + prio[cd]) * n + tpos[dst[cd]], kind="stable")
            else:
                o = lexsort_packed((tpos[dst[cd]], prio[cd], sd), unique=True)
            win = first_of_runs(sd[o])
            c = np.concatenate((c[~dup], cd[o][win]))
            s = np.concatenate((s[~dup], sd[o][win]))
        pedge[dst[c]] = c
        has_child[s] = True
        if len(c) == n_dst:  # every destination chained
            break
        left = left[(pedge[d] < 0) & ~has_child[src[left]]]
    return pedge


def _chain_heads(par: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chains' runs (`par`: each node's chain parent, -1 for none; each node at most one
    child), a run being consecutive node numbers each the chain child of the one before (a
    rank's program and stream order: most nodes): which nodes begin one, their first nodes and
    each run's chain head (node `v`'s: `head[searchsorted(first, v, "right") - 1]`). Pointer
    jumping over the runs, each run's first node to its parent's run, instead of over the nodes."""
    n = len(par)
    run = par != np.arange(n) - 1
    if n:
        run[0] = True
    r_first = np.flatnonzero(run)
    rp = par[r_first]
    up = np.where(rp >= 0, np.searchsorted(r_first, rp, side="right") - 1, np.arange(len(r_first)))
    while True:
        nu = up[up]
        if np.array_equal(nu, up):
            break
        up = nu
    return run, r_first, r_first[up]


#: a block's running maximum (`Forward.blocks`): its pieces' groups, slices, doubling steps
_GROUPS, _SLICES, _DOUBLING = 0, 1, 2
#: groups of pieces by length (`_piece_groups`): this many per doubling of the length
_GROUPS_PER_OCTAVE = 4


def _piece_groups(
    p_len: np.ndarray, p_blk: np.ndarray, piece: np.ndarray, j: np.ndarray, n_blk: int
) -> tuple[np.ndarray, int, np.ndarray, list[list[tuple[int, int, int]]]]:
    """The rows of the pieces padded into groups: per block its pieces longest first, in groups
    of about equal length (`_GROUPS_PER_OCTAVE` per doubling), each piece padded to its group's
    longest, so that a group's rows are a (pieces, length) array whose running maximum along
    each piece is one `np.maximum.accumulate` (padding rows after each piece's last). Returns
    each node's row (in piece order), the rows, each block's first row (and the last's end),
    per block its groups longer than one (first row in the block, pieces, padded length)."""
    n_p = len(p_len)
    cls = np.full(n_p, -1, dtype=np.int64)
    big = p_len > 1
    cls[big] = (np.log2(p_len[big]) * _GROUPS_PER_OCTAVE).astype(np.int64)
    po = lexsort_packed((np.arange(n_p), -p_len, -cls, p_blk), unique=True)
    po_blk = p_blk[po]
    g_first = np.flatnonzero(first_of_runs(po_blk * (int(cls.max(initial=0)) + 2) + cls[po]))
    g_cnt = np.diff(np.append(g_first, n_p))
    g_w = p_len[po[g_first]]
    pw = np.repeat(g_w, g_cnt)
    prow_po = np.cumsum(pw) - pw
    n_rows = int(pw.sum())
    prow = np.empty(n_p, dtype=np.int64)
    prow[po] = prow_po
    row = prow[piece] + j
    first = np.searchsorted(po_blk, np.arange(n_blk))
    row_bounds = np.append(prow_po[first], n_rows) if n_p else np.zeros(n_blk + 1, dtype=np.int64)
    groups: list[list[tuple[int, int, int]]] = [[] for _ in range(n_blk)]
    g_blk = po_blk[g_first].tolist()
    for gb, r0, c, w in zip(g_blk, prow_po[g_first].tolist(), g_cnt.tolist(), g_w.tolist(), strict=True):
        if gb >= 0 and w > 1:
            groups[gb].append((r0 - int(row_bounds[gb]), c, w))
    return row, n_rows, row_bounds, groups


class Forward:
    """The forward pass of a graph, precomputed once (docs/METHOD.md section "The dependency graph").

    The graph's nodes are split into chains (each node keeps at most one in-edge as its chain
    parent, each node at most one chain child: host program order, stream order), and its
    topological order into blocks of `FORWARD_BLOCK` nodes. Along a chain the recurrence
    t_i = max(t_{i-1} + d_{i-1}, r_i) (r_i the latest of the node's other in-edges) is
    t_i = D_i + max_{j <= i}(r_j - D_j) with D the chain's prefix sum of latencies: a cumulative
    maximum. A block's r comes from edges out of earlier blocks (final) and from edges inside the
    block (not yet known): the block is iterated from below (unknown = `_FLOOR`) until the sources
    of its inside edges stop changing, the least fixpoint, which on a DAG is the longest-path time
    of every node; a few iterations (the chain changes along a binding path inside the block).
    Inside a block each chain piece is one contiguous run of rows, and the cumulative maximum of
    every piece and every latency column at once is log2(longest piece) doubling steps of whole
    arrays (`_piece_cummax`). Integer ns; the same numbers as the node-by-node pass
    (`times_reference`)."""

    def __init__(self, g: Graph, block: int = FORWARD_BLOCK, slices_up_to: int = 0) -> None:
        n = g.n_nodes
        src, dst = g.src, g.dst
        n_e = len(src)
        has_in = np.zeros(n, dtype=bool)
        has_in[dst] = True
        sources = np.flatnonzero(~has_in)
        topo = np.concatenate([sources, g.order]).astype(np.int64)
        tpos = np.empty(n, dtype=np.int64)
        tpos[topo] = np.arange(n)
        n_src = len(sources)
        # chain parents: per node its first in-edge of the best priority, then per source node
        # one chain child (the earliest in topological order); a node whose edge lost to another
        # child of that source tries its next edge whose source has no child yet, round by round
        # (a CUDA-graph replay's operations all queue after the operation before the replay: one
        # of them chains there, each other one to its in-graph predecessor; unchained, every
        # operation would cost the block one more iteration)
        prio = _CHAIN_PRIORITY[g.role] if n_e else np.zeros(0, dtype=np.int64)
        pedge = _chain_parents(src, dst, prio, tpos)
        c = np.flatnonzero(pedge >= 0)
        par = np.full(n, -1, dtype=np.int64)
        par[c] = src[pedge[c]]
        run, r_first, r_head = _chain_heads(par)
        bounds = np.asarray([*range(n_src, n, block), n], dtype=np.int64)
        n_blk = len(bounds) - 1
        blk = np.maximum((tpos - n_src) // block, -1)  # sources: -1 (final from the start)
        # a chain piece: one chain's nodes in one block (contiguous along the chain); the nodes
        # by piece (block, chain head, topological position) are its segments sorted, each
        # segment a run of consecutive node numbers along one chain inside one block (in
        # topological order already): one sort of the segments instead of one of the nodes
        seg = run.copy()
        seg[1:] |= blk[1:] != blk[:-1]
        sf = np.flatnonzero(seg)
        s_len = np.diff(np.append(sf, n))
        s_root = r_head[np.searchsorted(r_first, sf, side="right") - 1]
        s_blk = blk[sf]
        so = lexsort_packed((tpos[sf], s_root, s_blk), unique=True)
        sf, s_len, s_root, s_blk = sf[so], s_len[so], s_root[so], s_blk[so]
        s_row = np.cumsum(s_len) - s_len  # each segment's first row
        by_piece = np.repeat(sf - s_row, s_len) + np.arange(n)
        s_new = first_of_runs(s_blk * (n + 1) + s_root)  # a segment that begins a piece
        p_start = s_row[s_new]
        p_len = np.diff(np.append(p_start, n))
        p_blk = s_blk[s_new]
        piece = np.repeat(np.arange(len(p_start)), p_len)
        j = np.arange(n) - p_start[piece]  # index along its piece
        # the layout, block by block: a block whose longest piece has at most `slices_up_to`
        # nodes by index along the piece, longest pieces first (each step of the running maximum
        # one contiguous slice: fewer operations than the doubling steps' when the pieces are
        # short and the columns many); any other block its pieces one after the other (each
        # piece one contiguous run of rows: `_piece_cummax`), as they are in `by_piece`
        width = np.zeros(n_blk + 1, dtype=np.int64)  # per block (+1: the sources' -1)
        np.maximum.at(width, p_blk + 1, p_len)
        p_sliced = width[p_blk + 1] <= slices_up_to
        n_p = len(p_start)
        grouped = not p_sliced.any()
        if grouped:  # the pieces padded into groups: `_piece_groups`
            row, n_rows, row_bounds, groups = _piece_groups(p_len, p_blk, piece, j, n_blk)
            self.nodes = np.full(n_rows, -1, dtype=np.int64)  # -1: a padding row
            self.nodes[row] = by_piece
            pos = np.empty(n, dtype=np.int64)
            pos[by_piece] = row
            self.pc_pos = row
        else:
            pb = np.repeat(p_blk, p_len)
            sliced = p_sliced[piece]
            so = np.lexsort((np.arange(n_p), -p_len, p_blk))
            rank = np.empty(len(so), dtype=np.int64)
            sb = p_blk[so]
            rank[so] = np.arange(len(so)) - np.searchsorted(sb, sb, side="left")
            local = piece - piece[np.searchsorted(pb, pb, side="left")]  # piece number in its block
            final = lexsort_packed(
                (np.where(sliced, rank[piece], j), np.where(sliced, j, local), pb), unique=True
            )
            n_rows, row_bounds = n, bounds
            self.nodes = by_piece[final]
            pos = np.empty(n, dtype=np.int64)
            pos[self.nodes] = np.arange(n)
            self.pc_pos = pos[by_piece]
            j_at = j[final]
        self.n, self.n_rows, self.n_src, self.pos = n, n_rows, n_src, pos
        # the prefix sums D along each piece, in piece order
        pe_bp = pedge[by_piece]
        in_piece = j > 0  # its chain parent's edge inside its piece
        self.pc_edge = np.where(in_piece, pe_bp, -1)
        self.pc_start = p_start[piece]
        # the other edges, grouped per block: from earlier blocks, then inside the block (by
        # destination row, then edge: one stable sort, the edges in order)
        chained = np.zeros(n_e, dtype=bool)
        chained[pe_bp[in_piece]] = True
        ek = np.flatnonzero(~chained)
        d_k, s_k = dst[ek], src[ek]
        b_d = blk[d_k]
        grp = b_d * 2 + (blk[s_k] >= b_d)  # per block: 0 from earlier blocks, 1 inside
        e_d = pos[d_k]
        o = np.argsort(grp * max(n_rows, 1) + e_d, kind="stable")
        ek, grp, e_d, e_s = ek[o], grp[o], e_d[o], pos[s_k[o]]
        self.eperm = ek
        cuts = np.searchsorted(grp, np.arange(2 * n_blk + 1))
        self.blocks: list[tuple[Any, ...]] = []
        for bi in range(n_blk):
            a, b = int(row_bounds[bi]), int(row_bounds[bi + 1])
            e0, e1, e2 = int(cuts[2 * bi]), int(cuts[2 * bi + 1]), int(cuts[2 * bi + 2])
            w = int(width[bi + 1])
            steps: list[tuple[Any, ...]] = []
            if grouped:  # per group of pieces: (first row, pieces, padded length)
                kind = _GROUPS
                steps = groups[bi]
            elif w <= slices_up_to:  # per index along the pieces: (rows, rows of the index before)
                kind = _SLICES
                offs = np.searchsorted(j_at[a:b], np.arange(w + 1)).tolist()
                steps = [(offs[q], offs[q + 1], offs[q - 1]) for q in range(1, w)]
            else:  # the doubling steps: (k, which rows have a row of their piece k above)
                kind = _DOUBLING
                jb = j_at[a:b]  # each row's index along its piece
                k = 1
                while k < w:
                    steps.append((k, (jb[k:] >= k)[:, None]))
                    k *= 2
            self.blocks.append(
                (
                    a,
                    b,
                    e0,
                    e1,
                    e2,
                    e_s[e0:e1],
                    self._groups(e_d[e0:e1] - a),
                    e_s[e1:e2] - a,
                    self._groups(e_d[e1:e2] - a),
                    kind,
                    steps,
                )
            )

    @staticmethod
    def _groups(d: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        if not len(d):
            return None
        first = first_of_runs(d)
        return np.flatnonzero(first), d[first]

    def run(self, lats: Sequence[np.ndarray], t0: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
        """The node times (nodes, C) for the C latency vectors `lats` (each (edges,) int64); only
        the nodes `at` (rows in that order) when given."""
        n, n_c = self.n, len(lats)
        mx, red = np.maximum, np.maximum.reduceat
        pe = self.pc_edge
        has_pe = pe >= 0
        pe0 = np.where(has_pe, pe, 0)
        cs = np.empty((n_c, n), dtype=np.int64)
        lp = np.empty((len(self.eperm), n_c), dtype=np.int64)
        for i, lat in enumerate(lats):
            np.multiply((lat if len(lat) else np.zeros(1, dtype=np.int64))[pe0], has_pe, out=cs[i])
            lp[:, i] = lat[self.eperm]
        np.cumsum(cs, axis=1, out=cs)
        cs -= cs[:, self.pc_start]
        d_all = np.zeros((self.n_rows, n_c), dtype=np.int64)  # (padding rows: 0)
        d_all[self.pc_pos] = cs.T
        del cs
        t = np.empty((self.n_rows, n_c), dtype=np.int64)
        t[: self.n_src] = t0[self.nodes[: self.n_src], None]
        acc = np.maximum.accumulate
        for a, b, e0, e1, e2, x_src, x_grp, i_src, i_grp, kind, steps in self.blocks:
            r_out = np.full((b - a, n_c), _FLOOR, dtype=np.int64)
            if x_grp is not None:
                r_out[x_grp[1]] = red(t[x_src] + lp[e0:e1], x_grp[0], axis=0)
            d = d_all[a:b]
            r, l_in, seen = r_out, lp[e1:e2], None
            while True:
                x = r - d
                if kind == _GROUPS:
                    for o, c, w in steps:
                        v = x[o : o + c * w].reshape(c, w, n_c)
                        acc(v, axis=1, out=v)
                elif kind == _SLICES:
                    for q0, q1, p0 in steps:
                        mx(x[q0:q1], x[p0 : p0 + q1 - q0], out=x[q0:q1])
                else:
                    _piece_cummax(x, steps)
                x += d
                mx(x, _FLOOR, out=x)
                if i_grp is None:
                    break
                s_new = x[i_src]
                if seen is not None and np.array_equal(s_new, seen):
                    break
                seen = s_new
                r = r_out.copy()
                r[i_grp[1]] = mx(r[i_grp[1]], red(s_new + l_in, i_grp[0], axis=0))
            t[a:b] = x
        return t[self.pos if at is None else self.pos[at]]


_I64_MIN = np.iinfo(np.int64).min


def _piece_cummax(x: np.ndarray, steps: list[tuple[Any, ...]]) -> np.ndarray:
    """The running maximum of `x` (rows, C) down each chain piece (a piece's rows contiguous),
    column by column, in place: log2(longest piece) doubling steps, each row taking the larger
    of itself and the row `k` above when that row is of its piece (`steps`: (k, that mask
    (rows - k, 1))). Exact on any int64 values."""
    for k, same in steps:
        np.maximum(x[k:], np.where(same, x[:-k], _I64_MIN), out=x[k:])
    return x


def times_reference(g: Graph, lat: np.ndarray | None = None) -> np.ndarray:
    """`Graph.times` node by node in topological order (the definition; tests compare the fast
    pass with it)."""
    lat_l = (g.lat if lat is None else lat).tolist()
    t = g.t.tolist()
    src = g.src.tolist()
    ptr = g.indptr.tolist()
    for n in g.order.tolist():
        a, b = ptr[n], ptr[n + 1]
        best = t[src[a]] + lat_l[a]
        for k in range(a + 1, b):
            v = t[src[k]] + lat_l[k]
            if v > best:
                best = v
        t[n] = best
    return np.asarray(t, dtype=np.int64)
