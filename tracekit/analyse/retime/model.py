"""One run's replay model (`tracekit.analyse.retime`): `RunModel`, the dependency graph of its
steady steps and the edge sets a `Setting` acts on; `latencies` transforms the edges' latencies,
`replay` / `replay_many` re-time the graph."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tracekit.analyse.path import roles
from tracekit.analyse.path.forward import key_lookup
from tracekit.analyse.path.graph import Graph
from tracekit.analyse.retime.norm import norm_after_all_reduce
from tracekit.analyse.retime.setting import NamedKnob, Setting
from tracekit.model.fields import copy_fields

if TYPE_CHECKING:
    from tracekit.analyse.retime.calibrate import ProfilerCalibration


@dataclass(frozen=True)
class EdgeSets:
    """The edge subsets the settings act on (fixed per graph, `RunModel._masks`): edge indices, and
    per launch / queued edge its rank's typical latency."""

    host: np.ndarray  # host time a host-time correction scales
    dev: np.ndarray  # device op times and gaps (a device-bound run's correction)
    xfer: np.ndarray  # collective transfers
    sync: np.ndarray
    sync_wait: np.ndarray
    launch_zero: np.ndarray  # host gaps and launch calls launch=0 zeroes
    launch: np.ndarray
    launch_rho: np.ndarray  # per `launch` edge: its rank's typical launch latency
    queue: np.ndarray  # queued and cross-stream gaps
    queue_typ: np.ndarray  # per `queue` edge: its rank's typical queued gap
    backpressure: np.ndarray


@dataclass(frozen=True)
class StragglerGroups:
    """The host gaps `straggler=off` scales (`idx`), their (segment, rank) group codes, each group's
    segment code, how many segments, and per group whether every rank has its segment."""

    idx: np.ndarray
    codes: np.ndarray
    seg_code: np.ndarray
    n_seg: int
    full: np.ndarray


@dataclass(frozen=True)
class KernelGroups:
    """The compute edges `compute=/N` scales (`idx`), their group codes (the k-th compute operation
    of a step) and whether every rank has that operation."""

    idx: np.ndarray
    codes: np.ndarray
    full: np.ndarray


_HOST_GAPS = (roles.ROLE_GAP, roles.ROLE_GAP_OUT, roles.ROLE_LEAD)
#: the roles of the edges the profiler's cost may come out of (`RunModel._costed`)
_DEDUCT_ROLES = (*_HOST_GAPS, roles.ROLE_CALL, roles.ROLE_WORK, roles.ROLE_SYNC)


def _first_at(
    edges: np.ndarray, at: np.ndarray, others: np.ndarray, others_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The `edges` whose node `at` is some other edge's node `others_at`, each with the first such
    of `others` (edges without one left out)."""
    ok, first = key_lookup(others_at, others, at)
    return edges[ok], first


def roles_in(role: np.ndarray, wanted: Sequence[int]) -> np.ndarray:
    """`np.isin(role, wanted)` for the edges' roles (small non-negative codes) by a table of the
    codes: one gather instead of a sort of the edges."""
    hi = int(role.max(initial=0))
    if int(role.min(initial=0)) < 0 or hi > 1 << 16:
        return np.isin(role, wanted)
    table = np.zeros(max(hi, *wanted) + 1, dtype=bool)
    table[list(wanted)] = True
    return table[role]


@dataclass
class RunModel:
    """The replay model of one run: the dependency graph of its steady steps, re-timed per knob."""

    label: str
    n_ranks: int
    ranks: list[int]
    timeline: str  # "gpu" | "host"
    steps: list[int]
    graph: Graph
    measured_ns: np.ndarray  # per steady step, the measured step time (longest window)
    compute_per_token: dict[int, float]  # rank -> mean compute per token
    target_ns: Fraction | None  # the unprofiled per-token time (None: not corrected)
    notes: list[str] = field(default_factory=list)
    host_scale: float = 1.0
    host_deduct: float = 0.0
    deduct_collective: float = 0.0
    device_scale: float = 1.0
    correction: str = "none"  # "none", "solved", "manifest calibration"
    calibration: ProfilerCalibration | None = None
    #: the calibration's own cost per rank (`per_rank_ns`), where it has every rank's: rank -> (per
    #: runtime call or host op, per collective launch); else None (one cost for every rank)
    rank_deduct: dict[int, tuple[float, float]] | None = None
    #: the classified events the graph was built from, for the masks a knob needs (found lazily)
    events: pd.DataFrame | None = field(default=None, repr=False)

    @cached_property
    def norm_after_all_reduce(self) -> np.ndarray | None:
        """Per graph edge: an operation `allreduce_norm=fused` zeroes (a vector kernel between an
        all-reduce and the next matrix kernel on its rank); None: none found. Found on first use."""
        ok = self.timeline == "gpu" and self.n_ranks > 1 and self.events is not None
        return norm_after_all_reduce(self.graph, self.events) if ok else None

    def corrected(self) -> Setting:
        """The unchanged graph at the model's profiler correction (`calibrate`), no knob."""
        return copy_fields(Setting, self)  # host_scale, host_deduct, deduct_collective, device_scale

    def replay(self, setting: Setting) -> np.ndarray:
        """Per steady step, the replayed token time (integer ns): from the previous step's end to
        its own (`path.graph.Graph.periods`), so time between steps counts and nothing is frozen."""
        return self.replay_many([setting])[0]

    def replay_many(self, settings: Sequence[Setting]) -> list[np.ndarray]:
        """`replay` of each setting, the graph re-timed for several settings in one forward pass
        (`path.graph.Graph.periods_of`; in chunks that keep the pass's arrays near 512 MB)."""
        g = self.graph
        per_col = 8 * (len(g.src) + 3 * g.n_nodes) + 1
        chunk = max(1, min(64, (512 << 20) // per_col))
        steady = self._steady_pos
        out: list[np.ndarray] = []
        for i in range(0, len(settings), chunk):
            lats = [self.latencies(s) for s in settings[i : i + chunk]]
            per = g.periods_of(lats)
            out.extend(per[steady, k].copy() for k in range(len(lats)))
        return out

    @property
    def _steady_pos(self) -> np.ndarray:
        pos = {s: i for i, s in enumerate(self.graph.steps)}
        return np.asarray([pos[s] for s in self.steps], dtype=np.int64)

    @cached_property
    def _masks(self) -> EdgeSets:
        """Edge subsets the knobs act on (fixed per graph), computed once."""
        g = self.graph
        role = g.role
        host_part = ~roles_in(role, (roles.ROLE_XFER, roles.ROLE_ORIGIN, roles.ROLE_ARRIVE))
        if self.timeline == "host":
            host_part &= role != roles.ROLE_OP
        else:
            host_part &= roles_in(role, (*_HOST_GAPS, roles.ROLE_CALL, roles.ROLE_SYNC, roles.ROLE_SYNC_WAIT))
        dev = (
            roles_in(role, (roles.ROLE_OP, roles.ROLE_QUEUE, roles.ROLE_CROSS, roles.ROLE_GRAPH))
            if self.timeline == "gpu"
            else (role == roles.ROLE_WORK)
        )
        rpos = self._rank_pos
        rho = np.asarray([g.rho_typ.get(int(r), 0) for r in self.ranks], dtype=np.int64)
        qt = np.asarray([g.q_typ.get(int(r), 0) for r in self.ranks], dtype=np.int64)
        lm = np.flatnonzero(role == roles.ROLE_LAUNCH)
        qm = np.flatnonzero((role == roles.ROLE_QUEUE) | (role == roles.ROLE_CROSS))
        return EdgeSets(
            host=np.flatnonzero(host_part),
            dev=np.flatnonzero(dev),
            xfer=np.flatnonzero(role == roles.ROLE_XFER),
            sync=np.flatnonzero(role == roles.ROLE_SYNC),
            sync_wait=np.flatnonzero(role == roles.ROLE_SYNC_WAIT),
            launch_zero=np.flatnonzero(
                (role == roles.ROLE_GAP) | (role == roles.ROLE_GAP_OUT) | (role == roles.ROLE_CALL)
            ),
            launch=lm,
            launch_rho=rho[rpos(lm)] if len(rho) else np.zeros(len(lm), dtype=np.int64),
            queue=qm,
            queue_typ=qt[rpos(qm)] if len(qt) else np.zeros(len(qm), dtype=np.int64),
            backpressure=np.flatnonzero(role == roles.ROLE_BACKPRESSURE),
        )

    def _rank_pos(self, e: np.ndarray) -> np.ndarray:
        """The edges `e`'s ranks' positions in `ranks`."""
        return np.minimum(np.searchsorted(np.asarray(self.ranks), self.graph.erank[e]), len(self.ranks) - 1)

    def latencies(self, s: Setting) -> np.ndarray:
        """The graph's edge latencies under a setting (integer ns)."""
        g = self.graph
        # the edge sets a knob acts on (`_masks`) made where one does (the deduction has its own)
        # the stages before the deduction depend on these two alone: kept for the settings that
        # differ only in the split of the profiler's cost (`Setting.rank_costs`)
        pre_key = (s.host_scale, bool(s.straggler_off and self.n_ranks > 1))
        pre: dict[tuple[float, bool], np.ndarray] = self.__dict__.setdefault("_pre_lat", {})
        if pre_key in pre:
            lat = pre[pre_key].copy()
        else:
            lat = g.lat.astype(np.float64)
            if s.host_scale != 1.0:
                h = self._masks.host
                lat[h] = lat[h] * s.host_scale
            if s.straggler_off and self.n_ranks > 1:
                idx, f = self._straggler_factors(lat)
                lat[idx] = lat[idx] * f
            if s.rank_costs is not None:
                pre[pre_key] = lat.copy()
        if s.host_deduct or s.deduct_collective or s.rank_costs:
            lat = self._deduct(lat, s)
        if s.device_scale != 1.0:
            d = self._masks.dev
            lat[d] = lat[d] * s.device_scale
        if s.compute_scale is not None and self.n_ranks > 1:
            lat = self._per_kernel(lat, s.compute_scale)
        if s.transfer is not None:
            xk = self._masks.xfer
            if s.transfer == "zero":
                lat[xk] = 0.0
            else:
                assert not isinstance(s.transfer, str)
                for k, op, nb in zip(xk, g.xfer_op, g.xfer_bytes, strict=True):
                    tp = s.transfer.time_ns(op, int(nb))
                    if tp is not None:
                        lat[k] = tp
        if s.coll_latency is not None:
            xk = self._masks.xfer
            for k, op, nb in zip(xk, g.xfer_op, g.xfer_bytes, strict=True):
                lat[k] = min(lat[k], s.coll_latency.transfer_ns(op, int(nb), self.n_ranks))
        if s.fuse_norm and self.norm_after_all_reduce is not None:
            lat = np.where(self.norm_after_all_reduce, 0.0, lat)
        out = np.rint(lat).astype(np.int64)
        if s.sync0:
            mk = self._masks
            out[mk.sync] = 0
            out[mk.sync_wait] = roles.NEVER
        if s.launch0 and self.timeline == "gpu":
            mk = self._masks
            out[mk.launch_zero] = 0
            lm, qm = mk.launch, mk.queue
            out[lm] = np.minimum(out[lm], mk.launch_rho)
            out[qm] = np.minimum(out[qm], mk.queue_typ)
            out[mk.backpressure] = roles.NEVER
        return out

    @cached_property
    def _straggler_groups(self) -> StragglerGroups | None:
        """The (segment, rank) groups of the host gaps `straggler=off` scales, computed once."""
        g = self.graph
        gm = roles_in(g.role, _HOST_GAPS) & (g.seg >= 0)
        out: StragglerGroups | None = None
        if gm.any():
            idx = np.flatnonzero(gm)
            seg, rk = g.seg[idx], g.erank[idx]
            if self.timeline == "gpu":
                seg = self._across_steps(seg, rk)
            # group codes in first-appearance order (as groupby(sort=False) keys them)
            codes, uniq = pd.factorize(pd.MultiIndex.from_arrays([seg, rk]))
            useg = uniq.get_level_values(0).to_numpy(np.int64)
            seg_code, seg_uniq = pd.factorize(useg)
            n_r = np.bincount(seg_code, minlength=len(seg_uniq))
            out = StragglerGroups(
                idx=idx,
                codes=codes.astype(np.int64),
                seg_code=seg_code.astype(np.int64),
                n_seg=len(seg_uniq),
                full=n_r[seg_code] == self.n_ranks,
            )
        return out

    def _across_steps(self, seg: np.ndarray, rk: np.ndarray) -> np.ndarray:
        """Segments between consecutive collectives across the step boundary: a step's host time
        after its last collective launch and the next step's before its first lie between the same
        two rendezvous, so they are one segment (the later step's first). Split at the boundary,
        each part was scaled to its own fastest rank, though no collective holds the ranks together
        there (a rank slow after its last collective and fast before the next step's first is not a
        straggler between them)."""
        g = self.graph
        launches = np.flatnonzero((g.role == roles.ROLE_CALL) & (g.ops > 0) & (g.seg >= 0))
        if not len(launches):
            return seg
        # per (rank, step): how many collectives it launched (each launch's segment counts those before)
        key_l = g.erank[launches] * (1 << 32) + g.seg[launches] // 100_000
        n_l = g.seg[launches] % 100_000 + 1
        last = pd.Series(n_l).groupby(key_l).max()
        key = rk * (1 << 32) + seg // 100_000
        n_coll = last.reindex(key).to_numpy()
        tail = ~np.isnan(n_coll.astype(np.float64)) & (seg % 100_000 == np.nan_to_num(n_coll, nan=-1))
        n_steps = len(g.steps)
        tail &= seg // 100_000 + 1 < n_steps
        return np.where(tail, (seg // 100_000 + 1) * 100_000, seg)

    def _straggler_factors(self, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The host gaps of a (rank, segment) and their factor, scaling their sum to the fastest
        rank's (segments every rank has; the others keep 1)."""
        gr = self._straggler_groups
        if gr is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        idx = gr.idx
        sums = pd.Series(lat[idx]).groupby(gr.codes, sort=True).sum().to_numpy()
        fastest = np.full(gr.n_seg, np.inf)
        np.minimum.at(fastest, gr.seg_code, sums)
        # a segment whose host gaps sum to 0 keeps factor 1 (nothing to scale; no 0/0)
        ratio = np.divide(
            fastest[gr.seg_code], sums, out=np.ones_like(sums, dtype=np.float64), where=sums > 0
        )
        ratio = np.where(gr.full, ratio, 1.0)
        return idx, ratio[gr.codes]

    def _deduct(self, lat: np.ndarray, s: Setting) -> np.ndarray:
        """The profiler's cost per call taken from the host time it lies in: from the call's own
        time first (the profiler's runtime callbacks run inside the recorded call, before its
        effect, so the operation it launched is released that much earlier too), the rest from the
        gap before the call (docs/METHOD.md section The dependency graph)."""
        g = self.graph
        lat = lat.copy()
        hd: float | np.ndarray = s.host_deduct
        dc: float | np.ndarray = s.deduct_collective
        by_rank: dict[int, tuple[float, float]] | None = None
        if s.rank_costs is not None:
            by_rank = {int(r): (float(c), 0.0) for r, c in s.rank_costs}
        elif self.rank_deduct is not None and s.host_deduct == self.host_deduct:  # the calibration's own
            by_rank = self.rank_deduct
        # the cost per edge (`per`) is 0 but on the edges with calls or operations (`_costed`): it is
        # computed there, and the deduction touches those edges and the gaps before calls alone
        cost_e, cost_pos, call_ops, deduct_e, lm = self._costed
        if by_rank is not None:
            costs = np.asarray(
                [by_rank.get(int(r), (s.host_deduct, s.deduct_collective)) for r in self.ranks]
            )
            hd, dc = costs[cost_pos, 0], costs[cost_pos, 1]
        if self.timeline == "host":
            per_c = hd * g.ops[cost_e].astype(np.float64)
        else:
            per_c = hd * g.calls[cost_e].astype(np.float64) + dc * call_ops
        need = np.zeros(len(lat))
        need[cost_e] = per_c
        call_e, gap_e = self._call_gap
        if len(call_e):
            # a call's own cost from the call first, what its time cannot hold from the gap before it
            per_call = need[call_e]
            own = np.minimum(per_call, np.maximum(lat[call_e], 0.0))
            lat[call_e] -= own
            need[call_e] = 0.0
            np.add.at(need, gap_e, per_call - own)
            if own.any():  # it ran before the call's effect: its operation is released earlier too
                by_node = np.zeros(len(g.t))
                by_node[g.src[call_e]] = own
                lat[lm] -= np.minimum(by_node[g.src[lm]], np.maximum(lat[lm], 0.0))
        take = np.minimum(need[deduct_e], np.maximum(lat[deduct_e], 0.0))
        lat[deduct_e] -= take
        # a synchronising call's cost also delays its return when the device was done before the
        # cost had run (the return latency then holds the cost): it comes off the wait edge's
        # latency by the part of the cost that ran after the awaited operation's end
        sw, se = self._sync_wait
        if len(sw):
            waited = np.maximum(g.t[g.src[sw]] - g.t[g.src[se]], 0)
            cut = np.maximum(need[se] - waited, 0.0)  # a sync call's cost: no call's or gap's
            lat[sw] = np.maximum(lat[sw] - cut, np.minimum(lat[sw], 0.0))
        return lat

    @cached_property
    def _costed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The edges a profiler's cost per call or op can be on (calls, or a call's operations;
        a host timeline: operations), their ranks' positions in `ranks`, their operations where
        they are calls (a cost per collective launch's count), the edges the cost can come out of
        (those and the gaps before calls, of the roles that give it) and the launch edges."""
        g = self.graph
        is_call = g.role == roles.ROLE_CALL
        if self.timeline == "host":
            cost_e = np.flatnonzero(g.ops != 0)
        else:
            cost_e = np.flatnonzero((g.calls != 0) | (is_call & (g.ops != 0)))
        pos = self._rank_pos(cost_e)
        call_ops = np.where(is_call[cost_e], g.ops[cost_e], 0)
        cand = np.zeros(len(g.src), dtype=bool)
        cand[cost_e] = True
        cand[self._call_gap[1]] = True
        cand &= roles_in(g.role, _DEDUCT_ROLES)
        return cost_e, pos, call_ops, np.flatnonzero(cand), np.flatnonzero(g.role == roles.ROLE_LAUNCH)

    @cached_property
    def _sync_wait(self) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (a blocking call's wait edge, the call's own edge): both end at its return."""
        g = self.graph
        waits = np.flatnonzero(g.role == roles.ROLE_SYNC_WAIT)
        own = np.flatnonzero(g.role == roles.ROLE_SYNC)
        return _first_at(waits, g.dst[waits], own, g.dst[own])

    @cached_property
    def _call_gap(self) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (call edge, the host gap edge into its begin)."""
        g = self.graph
        calls = np.flatnonzero(g.role == roles.ROLE_CALL)
        gaps = np.flatnonzero(roles_in(g.role, (roles.ROLE_GAP, roles.ROLE_GAP_OUT)))
        return _first_at(calls, g.src[calls], gaps, g.dst[gaps])

    def _per_kernel(self, lat: np.ndarray, factor: float) -> np.ndarray:
        """compute=/N per kernel: the k-th compute operation of a step takes, on every rank, the
        ranks' mean of it times `factor` (no per-collective imbalance is kept); operations not on
        every rank are scaled by the factor alone."""
        gr = self._kernel_groups
        lat = lat.copy()
        if gr is None:
            return lat
        idx = gr.idx
        mean = pd.Series(lat[idx]).groupby(gr.codes).transform("mean").to_numpy()
        lat[idx] = np.where(gr.full, mean, lat[idx]) * factor
        return lat

    @cached_property
    def _kernel_groups(self) -> KernelGroups | None:
        """The compute edges and their groups (the k-th compute operation of a step), once."""
        g = self.graph
        cm = (g.kind == roles.K_COMPUTE) & roles_in(g.role, (roles.ROLE_OP, roles.ROLE_WORK))
        out: KernelGroups | None = None
        if cm.any():
            idx = np.flatnonzero(cm)
            key = g.cidx[idx]
            codes, uniq = pd.factorize(key, sort=True)
            count = np.bincount(codes)[codes]
            out = KernelGroups(idx=idx, codes=codes, full=(count == self.n_ranks) & (key >= 0))
        return out

    def applicable(self, knob: NamedKnob) -> bool:
        if knob.name in ("transfer", "straggler", "compute", "collective_latency"):
            return self.n_ranks > 1
        if knob.name == "allreduce_norm":
            return self.n_ranks > 1 and self.timeline == "gpu"
        if knob.name == "launch":
            return self.timeline == "gpu"
        return True
