"""What-if: replay a decode trace per token across ranks under counterfactuals (docs/METHOD.md
sections "Critical path and what-if" and "The dependency graph").

The replay re-times the run's dependency graph (`tracekit.analyse.graph`), the one the critical
path is walked on: host calls per thread with the gaps between them, device operations per
stream, launch, stream, cross-stream and in-graph edges, collectives as rendezvous (a collective
starts on every rank when its last rank arrives and ends on rank r its transfer later), and the
host waiting for the device only at synchronising calls (or a full launch queue). Each knob
transforms the graph's edge latencies; every node is then the latest of its in-edges. A token's
replayed time is its period, from the previous step's latest window end over ranks to its own, so
time between steps is host work the knobs act on and no step start is frozen. Replaying the
unchanged trace gives back every measured time exactly (`replay_error`). Integer nanoseconds.

**Knobs** (`KNOB_DEFINITIONS`), each a transformation of the graph, combinable:
- `transfer=0`: every collective ends at its last arrival (an infinitely fast link).
- `transfer=probe:FILE[@MODE]`: every collective's transfer is the time a `tracekit probe` /
  `compare-links` JSON measured for its op and size (log-log interpolation between rows; in-place
  rows first; MODE picks the rows' `mode`, e.g. nvlink or pcie; default the first).
- `launch=0`: no host launch overhead (what CUDA graphs remove): every host gap (inside and
  between steps) and launch call takes no time, launch latencies and queued gaps are held to the
  rank's typical ones, no back-pressure. Synchronisations and rendezvous stay. Not applicable on a
  host timeline.
- `sync=0`: synchronisation calls return at once (no blocking, no time).
- `straggler=off`: per segment between collective launches (k-th segment on every rank), each
  rank's host gaps are scaled so their sum is the fastest rank's.
- `compute=/N`: perfect scaling of the TP=1 kernels, per kernel: the k-th compute operation of a
  step takes, on every rank, the ranks' mean of it times (C1 / N) / C, with C1 the baseline's and
  C the ranks' mean compute per token.
- `collective_latency=US[@GBPS]`: every collective's transfer (after its last arrival) is the
  lesser of its own and US microseconds + size x bus factor / GBPS (nccl-tests' size and bus
  factor, GBPS the bus bandwidth; without @GBPS the `--probe` JSON's best algorithm bandwidth for
  the op gives the bytes' time): what a one-shot custom all-reduce (a few us where NCCL takes
  10-20) buys, used where it is faster, as serving engines fall back to NCCL for large messages.
  Applied after `transfer` (with `transfer=0` it changes nothing).
- `allreduce_norm=fused`: the vector kernels between each all-reduce and the next matrix kernel on
  its rank (the residual add and RMSNorm the all-reduce feeds) take no device time, as in a fused
  all-reduce + add + norm kernel; their launches and the device's gaps stay.

**Correction to the unprofiled times** (docs/METHOD.md, "The dependency graph"): with the
manifest's `profiler_calibration` the profiler's cost per call of each kind is removed call by call
(`calibrate`); without one, one cost per runtime call (GPU) or one factor on host time (CPU) is
solved so that the unchanged replay's mean equals the unprofiled per-token time the accounting
uses. Knobs then apply to the corrected graph. A host sleep is one gap: it loses one call's cost.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse import graph as G
from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.run import RunParts
from tracekit.errors import TracekitError, load_json_file

SCHEMA_VERSION = "1.0"

#: The knob names, in report order.
KNOB_NAMES: tuple[str, ...] = (
    "transfer",
    "launch",
    "sync",
    "straggler",
    "compute",
    "collective_latency",
    "allreduce_norm",
)
#: The knobs whose Shapley values split S when none are given.
DEFAULT_KNOBS: tuple[str, ...] = ("transfer=0", "launch=0", "sync=0", "straggler=off", "compute=/N")
#: One line per knob: the transformation it applies (JSON `knobs[].definition`).
KNOB_DEFINITIONS: dict[str, str] = {
    "transfer=0": "every collective ends when its last rank arrives (infinitely fast link)",
    "transfer=probe": "every collective's transfer takes the probe's measured time for its op and size",
    "launch=0": "no host launch overhead (CUDA graphs): host gaps and launch calls take no time; the device "
    "runs back to back with its typical queued gap",
    "sync=0": "synchronisation calls return at once",
    "straggler=off": "per segment between collectives, every rank's host gaps scaled to the fastest rank's",
    "compute=/N": "every compute operation scaled so each rank's compute per token is the baseline's / N",
    "collective_latency=US": "every collective's transfer is the lesser of its own and US us + size x bus "
    "factor / bus bandwidth (a one-shot custom all-reduce where it is faster)",
    "allreduce_norm=fused": "the vector kernels between each all-reduce and the next matrix kernel (the "
    "residual add and norm) take no device time (a fused all-reduce + norm kernel); launches and gaps stay",
}
#: A device gap of at least this much before an operation means its stream was idle (`graph`).
IDLE_GAP_NS = G.IDLE_GAP_NS
#: Replays at most 2^MAX_SHAPLEY_KNOBS combinations.
MAX_SHAPLEY_KNOBS = 6


class ReplayError(TracekitError):
    """A knob or probe file that cannot be applied."""


# ------------------------------------------------------------------------------------------
# knobs


@dataclass(frozen=True)
class ProbeTimes:
    """Per op, the probe's (bytes, time ns) rows, sorted by bytes."""

    path: str
    mode: str | None
    rows: Mapping[str, tuple[tuple[int, float], ...]]

    def best_algbw(self, op: str) -> float:
        """The highest algorithm bandwidth (bytes/ns = GB/s) among `op`'s rows, else among all rows."""
        pts = self.rows.get(op) or tuple(p for rows in self.rows.values() for p in rows)
        return max(b / t for b, t in pts if t > 0)

    def time_ns(self, op: str, size: int) -> float | None:
        pts = self.rows.get(op)
        if not pts or size <= 0:
            return None
        xs = np.log([max(b, 1) for b, _ in pts])
        ys = np.log([max(t, 1e-3) for _, t in pts])
        return float(np.exp(np.interp(math.log(size), xs, ys)))


def load_probe(text: str) -> ProbeTimes:
    """`FILE[@MODE]`: the rows of a `tracekit probe` JSON (a list of rows) or a `compare-links` JSON
    (`rows[]`); each row: op, bytes, time_us, mode, in_place."""
    path, _, mode = text.partition("@")
    doc = load_json_file(path, "probe JSON", ReplayError)
    # `compare-links` JSON: an object with rows[]; `tracekit probe --format json`: the bare list of rows
    rows = doc.get("rows") if isinstance(doc, Mapping) else doc if isinstance(doc, list) else None
    if not isinstance(rows, list) or not rows:
        raise ReplayError(f"{path}: no probe rows (expected the JSON of `tracekit probe` or `compare-links`)")
    modes = [r.get("mode") for r in rows if isinstance(r, Mapping)]
    chosen = mode or next((m for m in modes if m), None)
    if mode and mode not in modes:
        raise ReplayError(
            f"{path}: no rows of mode {mode!r} (modes: {', '.join(sorted({str(m) for m in modes}))})"
        )
    table: dict[str, dict[int, list[tuple[bool, float]]]] = {}
    for r in rows:
        if not isinstance(r, Mapping) or (chosen and r.get("mode") not in (chosen, None)):
            continue
        op, b, t = r.get("op"), r.get("bytes"), r.get("time_us")
        if not isinstance(op, str) or not isinstance(b, int) or not isinstance(t, int | float):
            continue
        table.setdefault(op, {}).setdefault(b, []).append((bool(r.get("in_place")), float(t) * 1000.0))
    out: dict[str, tuple[tuple[int, float], ...]] = {}
    for op, by_size in table.items():
        pts = []
        for b, vals in sorted(by_size.items()):
            inplace = [t for ip, t in vals if ip]
            pts.append((b, min(inplace or [t for _, t in vals])))
        out[op] = tuple(pts)
    if not out:
        raise ReplayError(f"{path}: no usable rows (op, bytes, time_us)")
    return ProbeTimes(path, chosen, out)


@dataclass(frozen=True)
class Knob:
    """One knob: `name` in KNOB_NAMES, `value` as written (`0`, `probe:FILE`, `off`, `/N`)."""

    name: str
    value: str
    probe: ProbeTimes | None = None
    latency_ns: float | None = None  # collective_latency: the fixed part of every transfer
    busbw_gbps: float | None = None  # collective_latency: the bus bandwidth (else the probe's)

    @property
    def spec(self) -> str:
        return f"{self.name}={self.value}"

    @property
    def definition(self) -> str:
        if self.name == "collective_latency":
            bw = (
                f"{self.busbw_gbps:g} GB/s"
                if self.busbw_gbps is not None
                else f"the best algorithm bandwidth of the op in {self.probe.path if self.probe else '?'}"
            )
            return (
                f"every collective's transfer is the lesser of its own and "
                f"{self.latency_ns / 1e3 if self.latency_ns else 0:g} us + size x bus factor / bus bandwidth "
                f"({bw}): a one-shot custom all-reduce where it is faster"
            )
        key = "transfer=probe" if self.probe is not None else self.spec
        return KNOB_DEFINITIONS[key]

    def transfer_ns(self, op: str, size: int, n_ranks: int) -> float:
        """collective_latency: one collective's transfer (ns) for its op, nccl-tests size and ranks."""
        from tracekit.analyse.collectives.bandwidth import bus_factor

        lat = float(self.latency_ns or 0.0)
        if size <= 0:
            return lat
        if self.busbw_gbps is not None:
            try:
                factor = bus_factor(op, max(n_ranks, 1))
            except ValueError:
                factor = 1.0
            return lat + size * factor / self.busbw_gbps  # bytes / (GB/s) = ns
        assert self.probe is not None
        return lat + size / self.probe.best_algbw(op)


def parse_knob(text: str, probe: str | None = None) -> Knob:
    """One knob from its spec (see the module doc); `probe` is --probe's FILE for `transfer=probe`."""
    name, eq, value = text.strip().partition("=")
    name, value = name.strip(), value.strip()
    if not eq or name not in KNOB_NAMES:
        raise ReplayError(
            f"unknown knob {text!r}; knobs: transfer=0, transfer=probe:FILE, launch=0, sync=0, straggler=off, "
            "compute=/N, collective_latency=US[@GBPS], allreduce_norm=fused"
        )
    if name == "transfer" and value.startswith("probe"):
        src = value[len("probe") :].lstrip(":") or (probe or "")
        if not src:
            raise ReplayError("transfer=probe needs a file: transfer=probe:FILE or --probe FILE")
        return Knob("transfer", f"probe:{src}", load_probe(src))
    if name == "collective_latency":
        return _collective_latency(text, value, probe)
    allowed = {
        "transfer": "0",
        "launch": "0",
        "sync": "0",
        "straggler": "off",
        "compute": "/N",
        "allreduce_norm": "fused",
    }
    if value != allowed[name]:
        raise ReplayError(f"knob {name} takes {name}={allowed[name]}, got {text!r}")
    return Knob(name, value)


def _collective_latency(text: str, value: str, probe: str | None) -> Knob:
    """`collective_latency=US[@GBPS]`: US microseconds per collective + its bytes at GBPS bus
    bandwidth (without @GBPS: the --probe JSON's best algorithm bandwidth for the op)."""
    us_text, at, bw_text = value.partition("@")
    try:
        us = float(us_text)
        bw = float(bw_text) if at else None
    except ValueError:
        raise ReplayError(
            f"knob {text!r}: collective_latency=US or US@GBPS (microseconds, bus GB/s), e.g. "
            "collective_latency=5@400"
        ) from None
    if not math.isfinite(us) or us < 0 or (bw is not None and (not math.isfinite(bw) or bw <= 0)):
        raise ReplayError(f"knob {text!r}: the latency must be >= 0 us and the bandwidth > 0 GB/s")
    if bw is None and not probe:
        raise ReplayError(
            f"knob {text!r} needs a bandwidth for the bytes: collective_latency={us_text}@GBPS (bus GB/s) "
            "or --probe FILE (a `tracekit probe` / `compare-links` JSON)"
        )
    return Knob(
        "collective_latency",
        value,
        probe=load_probe(probe) if bw is None and probe else None,
        latency_ns=us * 1000.0,
        busbw_gbps=bw,
    )


def parse_combination(text: str, probe: str | None = None) -> tuple[Knob, ...]:
    """A combination `k1,k2,...` (each knob once)."""
    knobs = tuple(parse_knob(t, probe) for t in text.split(",") if t.strip())
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        raise ReplayError(f"a combination names a knob twice: {text!r}")
    return tuple(sorted(knobs, key=lambda k: KNOB_NAMES.index(k.name)))


def combination_spec(knobs: Iterable[Knob]) -> str:
    ks = sorted(knobs, key=lambda k: KNOB_NAMES.index(k.name))
    return ",".join(k.spec for k in ks) or "none"


@dataclass(frozen=True)
class _Setting:
    transfer: str | ProbeTimes | None = None  # None, "zero" or the probe
    launch0: bool = False
    sync0: bool = False
    straggler_off: bool = False
    compute_scale: float | None = None  # per kernel: (baseline compute / N) / the ranks' mean compute
    host_scale: float = 1.0
    host_deduct: float = 0.0  # ns per runtime call (host timeline: per op) taken from host time
    deduct_collective: float = 0.0  # ns per collective call taken from host time (manifest calibration)
    device_scale: float = 1.0  # factor on device op times and gaps (calibration of a device-bound run)
    coll_latency: Knob | None = None  # collective_latency=US[@GBPS]: every transfer latency + bytes / bw
    fuse_norm: bool = False  # allreduce_norm=fused: the vector kernels after each all-reduce take 0
    #: a cost per runtime call for each rank, (rank, ns) pairs, in place of `host_deduct` (and of the
    #: model's `rank_deduct`): one split of a solved cost (`correction._identify`); None: not set
    rank_costs: tuple[tuple[int, float], ...] | None = None


# ------------------------------------------------------------------------------------------
# one run's model: the dependency graph of its steady steps (tracekit.analyse.graph)


_HOST_GAPS = (G.ROLE_GAP, G.ROLE_GAP_OUT, G.ROLE_LEAD)


@dataclass
class RunModel:
    """The replay model of one run: the dependency graph of its steady steps, re-timed per knob."""

    label: str
    n_ranks: int
    ranks: list[int]
    timeline: str  # "gpu" | "host"
    steps: list[int]
    graph: G.Graph
    measured_ns: np.ndarray  # per steady step, the measured step time (longest window)
    compute_per_token: dict[int, float]  # rank -> mean compute per token
    target_ns: Fraction | None  # the unprofiled per-token time (None: not corrected)
    notes: list[str] = field(default_factory=list)
    host_scale: float = 1.0
    host_deduct: float = 0.0
    deduct_collective: float = 0.0
    device_scale: float = 1.0
    correction: str = "none"  # "none", "solved", "manifest calibration"
    calibration: dict[str, Any] | None = None
    #: the calibration's own cost per rank (`per_rank_ns`), where it has every rank's: rank -> (per
    #: runtime call or host op, per collective launch); else None (one cost for every rank)
    rank_deduct: dict[int, tuple[float, float]] | None = None
    #: the classified events the graph was built from, for the masks a knob needs (found lazily)
    events: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def norm_after_all_reduce(self) -> np.ndarray | None:
        """Per graph edge: an operation `allreduce_norm=fused` zeroes (a vector kernel between an
        all-reduce and the next matrix kernel on its rank); None: none found. Found on first use."""
        if not hasattr(self, "_norm_mask"):
            ok = self.timeline == "gpu" and self.n_ranks > 1 and self.events is not None
            self._norm_mask = norm_after_all_reduce(self.graph, self.events) if ok else None
        return self._norm_mask

    def replay(self, setting: _Setting) -> np.ndarray:
        """Per steady step, the replayed token time (integer ns): from the previous step's end to
        its own (`graph.Graph.periods`), so time between steps counts and nothing is frozen."""
        return self.replay_many([setting])[0]

    def replay_many(self, settings: Sequence[_Setting]) -> list[np.ndarray]:
        """`replay` of each setting, the graph re-timed for several settings in one forward pass
        (`graph.Graph.periods_of`; in chunks that keep the pass's arrays near 512 MB)."""
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

    def _masks(self) -> dict[str, Any]:
        """Edge subsets the knobs act on (fixed per graph), computed once."""
        got = self.__dict__.get("_mask_cache")
        if got is not None:
            return got
        g = self.graph
        role = g.role
        host_part = ~np.isin(role, (G.ROLE_XFER, G.ROLE_ORIGIN, G.ROLE_ARRIVE))
        if self.timeline == "host":
            host_part &= role != G.ROLE_OP
        else:
            host_part &= np.isin(role, (*_HOST_GAPS, G.ROLE_CALL, G.ROLE_SYNC, G.ROLE_SYNC_WAIT))
        dev = (
            np.isin(role, (G.ROLE_OP, G.ROLE_QUEUE, G.ROLE_CROSS, G.ROLE_GRAPH))
            if self.timeline == "gpu"
            else (role == G.ROLE_WORK)
        )
        rk = g.erank
        ranks = np.asarray(self.ranks)
        rpos = np.minimum(np.searchsorted(ranks, rk), len(self.ranks) - 1) if len(ranks) else rk
        rho = np.asarray([g.rho_typ.get(int(r), 0) for r in self.ranks], dtype=np.int64)
        qt = np.asarray([g.q_typ.get(int(r), 0) for r in self.ranks], dtype=np.int64)
        lm = np.flatnonzero(role == G.ROLE_LAUNCH)
        qm = np.flatnonzero((role == G.ROLE_QUEUE) | (role == G.ROLE_CROSS))
        got = {
            "host": np.flatnonzero(host_part),
            "dev": np.flatnonzero(dev),
            "xfer": np.flatnonzero(role == G.ROLE_XFER),
            "sync": np.flatnonzero(role == G.ROLE_SYNC),
            "sync_wait": np.flatnonzero(role == G.ROLE_SYNC_WAIT),
            "launch_zero": np.flatnonzero(
                (role == G.ROLE_GAP) | (role == G.ROLE_GAP_OUT) | (role == G.ROLE_CALL)
            ),
            "launch": lm,
            "launch_rho": rho[rpos[lm]] if len(rho) else np.zeros(len(lm), dtype=np.int64),
            "queue": qm,
            "queue_typ": qt[rpos[qm]] if len(qt) else np.zeros(len(qm), dtype=np.int64),
            "backpressure": np.flatnonzero(role == G.ROLE_BACKPRESSURE),
            "deduct_roles": np.isin(role, (*_HOST_GAPS, G.ROLE_CALL, G.ROLE_WORK, G.ROLE_SYNC)),
            "is_call": role == G.ROLE_CALL,
        }
        self.__dict__["_mask_cache"] = got
        return got

    def latencies(self, s: _Setting) -> np.ndarray:
        """The graph's edge latencies under a setting (integer ns)."""
        g = self.graph
        mk = self._masks()
        # the stages before the deduction depend on these two alone: kept for the settings that
        # differ only in the split of the profiler's cost (`_Setting.rank_costs`)
        pre_key = (s.host_scale, bool(s.straggler_off and self.n_ranks > 1))
        pre: dict[tuple[float, bool], np.ndarray] = self.__dict__.setdefault("_pre_lat", {})
        if pre_key in pre:
            lat = pre[pre_key].copy()
        else:
            lat = g.lat.astype(np.float64)
            if s.host_scale != 1.0:
                h = mk["host"]
                lat[h] = lat[h] * s.host_scale
            if s.straggler_off and self.n_ranks > 1:
                idx, f = self._straggler_factors(lat)
                lat[idx] = lat[idx] * f
            if s.rank_costs is not None:
                pre[pre_key] = lat.copy()
        if s.host_deduct or s.deduct_collective or s.rank_costs:
            lat = self._deduct(lat, s)
        if s.device_scale != 1.0:
            d = mk["dev"]
            lat[d] = lat[d] * s.device_scale
        if s.compute_scale is not None and self.n_ranks > 1:
            lat = self._per_kernel(lat, s.compute_scale)
        if s.transfer is not None:
            xk = mk["xfer"]
            if s.transfer == "zero":
                lat[xk] = 0.0
            else:
                assert isinstance(s.transfer, ProbeTimes)
                for k, op, nb in zip(xk, g.xfer_op, g.xfer_bytes, strict=True):
                    tp = s.transfer.time_ns(op, int(nb))
                    if tp is not None:
                        lat[k] = tp
        if s.coll_latency is not None:
            xk = mk["xfer"]
            for k, op, nb in zip(xk, g.xfer_op, g.xfer_bytes, strict=True):
                lat[k] = min(lat[k], s.coll_latency.transfer_ns(op, int(nb), self.n_ranks))
        if s.fuse_norm and self.norm_after_all_reduce is not None:
            lat = np.where(self.norm_after_all_reduce, 0.0, lat)
        out = np.rint(lat).astype(np.int64)
        if s.sync0:
            out[mk["sync"]] = 0
            out[mk["sync_wait"]] = G.NEVER
        if s.launch0 and self.timeline == "gpu":
            out[mk["launch_zero"]] = 0
            lm, qm = mk["launch"], mk["queue"]
            out[lm] = np.minimum(out[lm], mk["launch_rho"])
            out[qm] = np.minimum(out[qm], mk["queue_typ"])
            out[mk["backpressure"]] = G.NEVER
        return out

    def _straggler_groups(self) -> dict[str, Any] | None:
        """The (segment, rank) groups of the host gaps `straggler=off` scales, computed once."""
        if "_strag_cache" in self.__dict__:
            cached: dict[str, Any] | None = self.__dict__["_strag_cache"]
            return cached
        g = self.graph
        gm = np.isin(g.role, _HOST_GAPS) & (g.seg >= 0)
        out: dict[str, Any] | None = None
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
            out = {
                "idx": idx,
                "codes": codes.astype(np.int64),
                "seg_code": seg_code.astype(np.int64),
                "n_seg": len(seg_uniq),
                "full": n_r[seg_code] == self.n_ranks,
            }
        self.__dict__["_strag_cache"] = out
        return out

    def _across_steps(self, seg: np.ndarray, rk: np.ndarray) -> np.ndarray:
        """Segments between consecutive collectives across the step boundary: a step's host time
        after its last collective launch and the next step's before its first lie between the same
        two rendezvous, so they are one segment (the later step's first). Split at the boundary,
        each part was scaled to its own fastest rank, though no collective holds the ranks together
        there (a rank slow after its last collective and fast before the next step's first is not a
        straggler between them)."""
        g = self.graph
        launches = np.flatnonzero((g.role == G.ROLE_CALL) & (g.ops > 0) & (g.seg >= 0))
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
        gr = self._straggler_groups()
        if gr is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        idx = gr["idx"]
        sums = pd.Series(lat[idx]).groupby(gr["codes"], sort=True).sum().to_numpy()
        fastest = np.full(gr["n_seg"], np.inf)
        np.minimum.at(fastest, gr["seg_code"], sums)
        ratio = fastest[gr["seg_code"]] / sums
        ratio = np.where(sums > 0, ratio, 1.0)
        ratio = np.where(gr["full"], ratio, 1.0)
        return idx, ratio[gr["codes"]]

    def _deduct(self, lat: np.ndarray, s: _Setting) -> np.ndarray:
        """The profiler's cost per call taken from the host time it lies in: from the call's own
        time first (the profiler's runtime callbacks run inside the recorded call, before its
        effect, so the operation it launched is released that much earlier too), the rest from the
        gap before the call (docs/METHOD.md section The dependency graph)."""
        g = self.graph
        mk = self._masks()
        lat = lat.copy()
        hd: Any = s.host_deduct
        dc: Any = s.deduct_collective
        by_rank: dict[int, tuple[float, float]] | None = None
        if s.rank_costs is not None:
            by_rank = {int(r): (float(c), 0.0) for r, c in s.rank_costs}
        elif self.rank_deduct is not None and s.host_deduct == self.host_deduct:  # the calibration's own
            by_rank = self.rank_deduct
        if by_rank is not None:
            costs = np.asarray(
                [by_rank.get(int(r), (s.host_deduct, s.deduct_collective)) for r in self.ranks]
            )
            at = np.minimum(np.searchsorted(np.asarray(self.ranks), g.erank), len(self.ranks) - 1)
            hd, dc = costs[at, 0], costs[at, 1]
        per = hd * g.calls.astype(np.float64) + dc * np.where(mk["is_call"], g.ops, 0)
        if self.timeline == "host":
            per = hd * g.ops.astype(np.float64)
        call_e, gap_e = self._call_gap
        need = per.copy()
        if len(call_e):
            # a call's own cost from the call first, what its time cannot hold from the gap before it
            own = np.minimum(need[call_e], np.maximum(lat[call_e], 0.0))
            lat[call_e] -= own
            need[call_e] = 0.0
            np.add.at(need, gap_e, per[call_e] - own)
            if own.any():  # it ran before the call's effect: its operation is released earlier too
                by_node = np.zeros(len(g.t))
                by_node[g.src[call_e]] = own
                lm = np.flatnonzero(g.role == G.ROLE_LAUNCH)
                lat[lm] -= np.minimum(by_node[g.src[lm]], np.maximum(lat[lm], 0.0))
        take = np.minimum(need, np.maximum(lat, 0.0))
        lat -= np.where(mk["deduct_roles"], take, 0.0)
        # a synchronising call's cost also delays its return when the device was done before the
        # cost had run (the return latency then holds the cost): it comes off the wait edge's
        # latency by the part of the cost that ran after the awaited operation's end
        sw, se = self._sync_wait
        if len(sw):
            waited = np.maximum(g.t[g.src[sw]] - g.t[g.src[se]], 0)
            cut = np.maximum(per[se] - waited, 0.0)
            lat[sw] = np.maximum(lat[sw] - cut, np.minimum(lat[sw], 0.0))
        return lat

    @property
    def _sync_wait(self) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (a blocking call's wait edge, the call's own edge): both end at its return."""
        cached = getattr(self, "_sw", None)
        if cached is not None:
            return cached
        g = self.graph
        waits = np.flatnonzero(g.role == G.ROLE_SYNC_WAIT)
        own = np.flatnonzero(g.role == G.ROLE_SYNC)
        by_dst = pd.Series(own, index=g.dst[own])
        by_dst = by_dst[~by_dst.index.duplicated()]
        of = by_dst.reindex(g.dst[waits]).to_numpy()
        ok = ~np.isnan(of.astype(np.float64))
        out = (waits[ok], of[ok].astype(np.int64))
        self._sw = out
        return out

    @property
    def _call_gap(self) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (call edge, the host gap edge into its begin)."""
        cached = getattr(self, "_cg", None)
        if cached is not None:
            return cached
        g = self.graph
        calls = np.flatnonzero(g.role == G.ROLE_CALL)
        gaps = np.flatnonzero(np.isin(g.role, (G.ROLE_GAP, G.ROLE_GAP_OUT)))
        into = pd.Series(gaps, index=g.dst[gaps])
        into = into[~into.index.duplicated()]
        gap_of = into.reindex(g.src[calls]).to_numpy()
        ok = ~np.isnan(gap_of.astype(np.float64))
        out = (calls[ok], gap_of[ok].astype(np.int64))
        self._cg = out
        return out

    def _per_kernel(self, lat: np.ndarray, factor: float) -> np.ndarray:
        """compute=/N per kernel: the k-th compute operation of a step takes, on every rank, the
        ranks' mean of it times `factor` (no per-collective imbalance is kept); operations not on
        every rank are scaled by the factor alone."""
        gr = self._kernel_groups()
        lat = lat.copy()
        if gr is None:
            return lat
        idx = gr["idx"]
        mean = pd.Series(lat[idx]).groupby(gr["codes"]).transform("mean").to_numpy()
        lat[idx] = np.where(gr["full"], mean, lat[idx]) * factor
        return lat

    def _kernel_groups(self) -> dict[str, Any] | None:
        """The compute edges and their groups (the k-th compute operation of a step), once."""
        if "_kern_cache" in self.__dict__:
            cached: dict[str, Any] | None = self.__dict__["_kern_cache"]
            return cached
        g = self.graph
        cm = (g.kind == G.K_COMPUTE) & np.isin(g.role, (G.ROLE_OP, G.ROLE_WORK))
        out: dict[str, Any] | None = None
        if cm.any():
            idx = np.flatnonzero(cm)
            key = g.cidx[idx]
            codes, uniq = pd.factorize(key, sort=True)
            count = np.bincount(codes)[codes]
            out = {"idx": idx, "codes": codes, "full": (count == self.n_ranks) & (key >= 0)}
        self.__dict__["_kern_cache"] = out
        return out

    def applicable(self, knob: Knob) -> bool:
        if knob.name in ("transfer", "straggler", "compute", "collective_latency"):
            return self.n_ranks > 1
        if knob.name == "allreduce_norm":
            return self.n_ranks > 1 and self.timeline == "gpu"
        if knob.name == "launch":
            return self.timeline == "gpu"
        return True


# ------------------------------------------------------------------------------------------
# building the model from a trace


def build_model(
    parts: RunParts, classified: pd.DataFrame | AnalysedRun, target_ns: Fraction | None, label: str
) -> RunModel:
    """The replay model of one attributed run (`shortfall.attribute_run`) over its steady steps."""
    from tracekit.analyse.timeline.align import as_tokens
    from tracekit.analyse.timeline.steps import find_steps_detailed

    steady = parts.steady
    steps = [int(s) for s in steady["step"]]
    manifest: Mapping[str, Any] | None = None
    if isinstance(classified, AnalysedRun):
        manifest = classified.run.manifest
    events = classified.events if isinstance(classified, AnalysedRun) else classified
    inst_bytes: dict[int, int] = {}
    if len(parts.collectives.instances):
        ins = parts.collectives.instances
        inst_bytes = {
            int(i): int(b) for i, b in zip(ins["instance"], ins["size_bytes"].fillna(-1), strict=True)
        }
    timeline = parts.timeline if parts.timeline in ("gpu", "host") else "gpu"
    g = parts.graph
    if g is not None and g.timeline == timeline and len(g.ranks) == len(parts.ranks):
        # the graph attribute_run walked the path on (the same windows, events and offsets): its
        # collectives' sizes for the probe knob
        g.xfer_bytes = np.asarray([inst_bytes.get(int(i), -1) for i in g.xfer_inst], dtype=np.int64)
    else:
        if isinstance(classified, AnalysedRun):  # its step windows were found once, for attribute_run
            wins = classified.steps(parts.step_pattern).steps
            classified = classified.events
        else:
            wins = find_steps_detailed(classified, parts.step_pattern).steps
        wins = as_tokens(
            wins, parts.collectives.per_rank
        )  # the steps as attribute_run joined them (align.py)
        # every step in the graph: the warm-up step before the steady ones gives the first its start
        part_w = parts.steps[["rank", "step", "end_ns"]]
        wins = wins.drop(columns=["end_ns"]).merge(part_w, on=["rank", "step"])
        g = G.build_graph(
            classified,
            wins,
            parts.collectives.per_rank,
            parts.collectives.clock.offsets_ns,
            timeline,
            inst_bytes,
        )
    cm = (g.kind == G.K_COMPUTE) & np.isin(g.role, (G.ROLE_OP, G.ROLE_WORK))
    compute_tok = {int(r): float(g.lat[cm & (g.erank == r)].sum()) / max(len(g.steps), 1) for r in g.ranks}
    pos = {s: i for i, s in enumerate(g.steps)}
    measured = g.periods(g.t)[[pos[s] for s in steps]]
    notes = [f"{label}: {n}" for n in g.notes]
    model = RunModel(
        label=label,
        n_ranks=len(parts.ranks),
        ranks=list(g.ranks),
        timeline=timeline,
        steps=steps,
        graph=g,
        measured_ns=measured,
        compute_per_token=compute_tok,
        target_ns=target_ns,
        notes=notes,
    )
    model.calibration = _manifest_calibration(manifest)
    model.events = events
    return model


#: An all-reduce kernel by its name, where the event carries no collective metadata (a graph replay's
#: NCCL kernel): ncclDevKernel_AllReduce_Sum_bf16_RING_LL, cross_device_reduce_1stage (vLLM)
_ALL_REDUCE_NAME = r"(?i)all_?reduce|cross_device_reduce|one_?shot|two_?shot"


def norm_after_all_reduce(g: G.Graph, events: pd.DataFrame | None) -> np.ndarray | None:
    """Per edge of `g`: True for the device time of a vector compute kernel that runs, on its rank
    in device start order, after an all-reduce and before the next matrix kernel or collective
    (what `allreduce_norm=fused` removes: the residual add and norm the all-reduce feeds). The
    kernels are found in the classified `events` and matched to the graph's operation edges by
    rank, start and end. None when there are none."""
    if events is None or not len(events):
        return None
    kind = events["kind"].astype(str).to_numpy()
    dev = np.isin(kind, ("kernel", "memcpy", "memset"))
    if not dev.any():
        return None
    ev = events[dev]
    cls = ev["cls"].astype(str).to_numpy()
    sub = ev["subclass"].astype(str).to_numpy()
    op = ev["coll_op"].astype(str).to_numpy()
    named = ev["name"].astype(str).str.contains(_ALL_REDUCE_NAME, regex=True).to_numpy()
    ar = (cls == "collective") & ((op == "all_reduce") | ((op == "") & named))
    stop = ((cls == "compute") & (sub == "matrix")) | ((cls == "collective") & ~ar)
    vec = (cls == "compute") & (sub != "matrix")
    df = pd.DataFrame(
        {
            "rank": ev["rank"].to_numpy(np.int64),
            "start": ev["start_ns"].to_numpy(np.int64),
            "end": ev["end_ns"].to_numpy(np.int64),
            "mark": np.where(ar, 1.0, np.where(stop, 0.0, np.nan)),
            "vec": vec,
        }
    ).sort_values(["rank", "start", "end"], kind="stable")
    armed = df.groupby("rank")["mark"].transform(lambda m: m.ffill().shift(1)).to_numpy()
    hit = df[df["vec"].to_numpy() & (armed == 1.0)]
    if not len(hit):
        return None
    ops = np.flatnonzero((g.role == G.ROLE_OP) & (g.kind == G.K_COMPUTE))
    off = np.asarray([g.offsets.get(int(r), 0) for r in g.erank[ops]], dtype=np.int64)
    edges = pd.DataFrame(
        {
            "rank": g.erank[ops].astype(np.int64),
            "start": g.t[g.src[ops]].astype(np.int64) + off,
            "end": g.t[g.dst[ops]].astype(np.int64) + off,
            "edge": ops,
        }
    )
    matched = edges.merge(hit[["rank", "start", "end"]].drop_duplicates(), on=["rank", "start", "end"])
    if not len(matched):
        return None
    mask = np.zeros(len(g.role), dtype=bool)
    mask[matched["edge"].to_numpy(np.int64)] = True
    return mask


def _manifest_calibration(manifest: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's `profiler_calibration` ({"per_call_ns": {kind: int}, "method", "calls"}) when
    it is well formed, else None."""
    if not isinstance(manifest, Mapping):
        return None
    cal = manifest.get("profiler_calibration")
    if not isinstance(cal, Mapping):
        return None
    per = cal.get("per_call_ns")
    if not isinstance(per, Mapping):
        return None
    out = {
        str(k): int(v)
        for k, v in per.items()
        if k in ("runtime", "op", "collective")
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and v >= 0
    }
    if not out:
        return None
    # each rank's own costs (`capture`'s per_rank_ns): the replay removes each rank's where it has all
    per_rank: dict[int, dict[str, int]] = {}
    pr = cal.get("per_rank_ns")
    if isinstance(pr, Mapping):
        for rk, costs in pr.items():
            if not isinstance(costs, Mapping) or not str(rk).lstrip("-").isdigit():
                continue
            got = {
                str(k): int(v)
                for k, v in costs.items()
                if k in ("runtime", "op", "collective")
                and isinstance(v, int | float)
                and not isinstance(v, bool)
                and v >= 0
            }
            if got:
                per_rank[int(rk)] = got
    return {
        "per_call_ns": out,
        "method": str(cal.get("method", "")),
        "calls": cal.get("calls"),
        **({"per_rank_ns": per_rank} if per_rank else {}),
    }


# ------------------------------------------------------------------------------------------
# calibration, predictions, Shapley


def _solve_decreasing(err: Any, x0: float, step: float, tol: float, limit: float) -> float | None:
    """The x >= x0 (or below, when err(x0) < 0) where the non-increasing, piecewise-linear err crosses
    0: a bracket by doubling steps, then regula falsi (Illinois). None when no bracket within `limit`."""
    f0 = err(x0)
    if abs(f0) <= tol:
        return x0
    sign = 1.0 if f0 > 0 else -1.0
    # the farthest bracket end the doubling steps try: where err has not crossed 0 there, it crosses
    # nowhere before it (non-increasing), so one replay says None instead of one per step
    d_far = step
    while d_far * 2 <= limit:
        d_far *= 2
    f_far = err(x0 + sign * d_far)
    if (f_far > 0) if sign > 0 else (f_far < 0):
        return None
    lo, f_lo = x0, f0
    hi, d = x0, step
    while True:
        hi = x0 + sign * d
        f_hi = err(hi)
        if (f_hi <= 0) if sign > 0 else (f_hi >= 0):
            break
        lo, f_lo = hi, f_hi
        d *= 2
        if d > limit:
            return None
    side = 0
    best = hi
    for _ in range(60):
        mid = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else (lo + hi) / 2
        if not min(lo, hi) < mid < max(lo, hi):
            mid = (lo + hi) / 2
        f_mid = err(mid)
        best = mid
        if abs(f_mid) <= tol or abs(hi - lo) < 1e-9:
            break
        if (f_mid > 0) == (f_lo > 0):
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo /= 2
            side = 1
    return best


def calibrate(model: RunModel, rel_tol: float = 2e-5) -> float:
    """Correct the replay for the profiler's cost. With the manifest's `profiler_calibration` (the
    same calls timed with and without the profiler at capture time), its cost per call of each kind
    is removed call by call: per CUDA runtime call and per collective call on a GPU timeline, per
    op on a host timeline (`correction` "manifest calibration"). Without one, and with an
    unprofiled per-token time `target_ns`, one cost is solved for so that the unchanged replay's
    mean equals it within `rel_tol` (`correction` "solved"):

    - GPU timeline: a fixed `host_deduct` ns is taken from every runtime call's host time (the gap
      before it first, then the call); a host sleep is one gap and loses one deduction; a run the
      device sets (a CUDA-graph replay launches nothing per kernel) gets a factor on its device op
      times and gaps instead;
    - host timeline: one factor `host_scale` on every part but transfer, the rule
      `shortfall.reconcile` uses there.

    Returns the deduction (GPU) or the factor (host)."""
    model.host_scale, model.host_deduct, model.device_scale = 1.0, 0.0, 1.0
    model.deduct_collective, model.correction = 0.0, "none"
    model.rank_deduct = None
    cal = model.calibration
    if cal is not None:
        per = cal["per_call_ns"]
        call_key = "runtime" if model.timeline == "gpu" else "op"
        model.host_deduct = float(per.get(call_key, 0))
        if model.timeline == "gpu":
            model.deduct_collective = float(per.get("collective", 0))
        by_rank = cal.get("per_rank_ns") or {}
        if by_rank and all(r in by_rank and call_key in by_rank[r] for r in model.ranks):
            model.rank_deduct = {
                r: (
                    float(by_rank[r][call_key]),
                    float(by_rank[r].get("collective", 0)) if model.timeline == "gpu" else 0.0,
                )
                for r in model.ranks
            }
        model.correction = "manifest calibration"
        return model.host_deduct
    if model.target_ns is None:
        return 0.0
    target = float(model.target_ns)
    tol = max(rel_tol * target, 1.0)
    model.correction = "solved"
    if model.timeline == "gpu":

        def err_gpu(delta: float) -> float:
            return float(model.replay(_Setting(host_deduct=delta)).mean()) - target

        value = _solve_decreasing(err_gpu, 0.0, 1000.0, tol, 1e9)
        if value is not None and value < 0:
            # the replay is already short of the unprofiled time (a noisy host: the loop's own
            # per-token time differs from the token period): the profiler cannot have made it faster
            value = None
        elif value is None:  # device-bound (a CUDA-graph replay launches nothing per kernel)
            beta = _device_scale(model, target, tol)
            if beta is not None:
                model.device_scale = beta
                model.notes.append(
                    f"{model.label}: removing host time cannot reach the unprofiled per-token time "
                    f"{target / 1e6:.3f} ms (the device sets it: the profiler's cost is on the device "
                    f"here); device op times and gaps scaled by {beta:.4f} instead"
                )
                return 0.0
    else:

        def err_host(alpha: float) -> float:
            return target - float(model.replay(_Setting(host_scale=alpha)).mean())

        value = _solve_decreasing(err_host, 1.0, 0.25, tol, 63.0)
        if value is not None and value < 0:
            value = None
    if value is None:
        model.correction = "none"
        model.notes.append(
            f"{model.label}: the replay cannot reach the unprofiled per-token time {target / 1e6:.3f} ms by "
            "removing host time; not corrected"
        )
        return 0.0
    if model.timeline == "gpu":
        model.host_deduct = value
    else:
        model.host_scale = value
    return value


def _device_scale(model: RunModel, target: float, tol: float) -> float | None:
    """The factor in (0.1, 1] on every device op time and gap (collective transfers excepted: they
    are the link's) that brings the unchanged replay's mean to `target`; None if none does."""

    def err_dev(y: float) -> float:
        return float(model.replay(_Setting(device_scale=1.0 - y)).mean()) - target

    y = _solve_decreasing(err_dev, 0.0, 0.01, tol, 0.9)
    return None if y is None or not 0.0 <= y < 0.9 else 1.0 - y


def setting_for(
    model: RunModel, knobs: Iterable[Knob], baseline_compute: float | None, n_ranks: int
) -> _Setting:
    transfer: str | ProbeTimes | None = None
    kw: dict[str, Any] = {}
    for k in knobs:
        if not model.applicable(k):
            continue
        if k.name == "transfer":
            transfer = k.probe if k.probe is not None else "zero"
        elif k.name == "launch":
            kw["launch0"] = True
        elif k.name == "sync":
            kw["sync0"] = True
        elif k.name == "straggler":
            kw["straggler_off"] = True
        elif k.name == "collective_latency":
            kw["coll_latency"] = k
        elif k.name == "allreduce_norm":
            kw["fuse_norm"] = True
        elif k.name == "compute" and baseline_compute is not None:
            mean_c = (
                float(np.mean(list(model.compute_per_token.values()))) if model.compute_per_token else 0.0
            )
            kw["compute_scale"] = (baseline_compute / n_ranks) / mean_c if mean_c > 0 else 1.0
    return _Setting(
        transfer=transfer,
        host_scale=model.host_scale,
        host_deduct=model.host_deduct,
        deduct_collective=model.deduct_collective,
        device_scale=model.device_scale,
        **kw,
    )


def shapley(values: Mapping[frozenset[int], Fraction], k: int) -> list[Fraction]:
    """Shapley value of each of k players for the *reduction* v(empty) - v(all): phi_i is the mean over
    orders of v(S) - v(S + i). Exact; sums to v(empty) - v(all)."""
    out = []
    fact = math.factorial
    for i in range(k):
        phi = Fraction(0)
        others = [j for j in range(k) if j != i]
        for size in range(k):
            w = Fraction(fact(size) * fact(k - size - 1), fact(k))
            for sub in itertools.combinations(others, size):
                s = frozenset(sub)
                phi += w * (values[s] - values[s | {i}])
        out.append(phi)
    assert sum(out) == values[frozenset()] - values[frozenset(range(k))]
    return out


def round_to_sum(values: Mapping[str, Fraction], total: int) -> dict[str, int]:
    """Integers that sum exactly to `total`: floors, then the largest remainders get the rest."""
    floors = {k: math.floor(v) for k, v in values.items()}
    rest = total - sum(floors.values())
    order = sorted(values, key=lambda k: (-(values[k] - floors[k]), k))
    if rest >= 0:
        for k in order[:rest]:
            floors[k] += 1
    else:
        for k in order[::-1][:-rest]:
            floors[k] -= 1
    assert sum(floors.values()) == total
    return floors


def _mean_int(values: np.ndarray) -> Fraction:
    return Fraction(int(np.asarray(values, dtype=np.int64).sum()), len(values))


@dataclass
class WhatIf:
    """Predictions of the baseline (TP=1) and the sharded run (TP=N) under knobs, with the Shapley
    split of S. Build with `whatif`."""

    baseline: RunModel
    sharded: RunModel | None
    knobs: tuple[Knob, ...]
    combinations: list[tuple[Knob, ...]]
    predicted: dict[str, dict[int, Fraction]]  # combination spec -> ranks -> mean ns
    replayed: dict[str, np.ndarray]  # "baseline"/"sharded": traced replay per step
    shapley: dict[str, Fraction] | None
    residual_parts: dict[str, Fraction] | None
    ideal_ns: Fraction | None
    shortfall_ns: Fraction | None
    measured: dict[int, Fraction]  # ranks -> per-token time (unprofiled when corrected)
    accounting: dict[str, Any] | None
    check: dict[str, Any] | None = None
    #: where the sharded run's profiler cost per rank is not identified: the ranges of its predictions
    #: and of the Shapley values over the splits the data allow (`_split_ranges`); else None
    ranges: dict[str, Any] | None = None

    def runs(self) -> list[RunModel]:
        return [m for m in (self.baseline, self.sharded) if m is not None]

    def replay_error(self, model: RunModel) -> dict[str, Any]:
        key = "baseline" if model is self.baseline else "sharded"
        rep = self.replayed[key]
        meas = model.measured_ns
        per_step = (rep - meas) / meas
        return {
            "traced_ns": int(round(float(meas.mean()))),
            "replayed_ns": int(round(float(rep.mean()))),
            "mean": float((rep.mean() - meas.mean()) / meas.mean()),
            "max_step": float(np.max(np.abs(per_step))) if len(per_step) else 0.0,
            "steps": len(meas),
        }

    def to_json(self) -> dict[str, Any]:
        def run_doc(m: RunModel) -> dict[str, Any]:
            return {
                "label": m.label,
                "ranks": m.n_ranks,
                "timeline": m.timeline,
                "per_token_ns": int(round(self.measured[m.n_ranks])),
                "per_token_source": "unprofiled" if m.target_ns is not None else "trace",
                "host_cost_per_call_ns": round(m.host_deduct, 1),
                "profiler_correction": {
                    "method": m.correction,
                    **(
                        {"per_call_ns": m.calibration["per_call_ns"]}
                        if m.correction == "manifest calibration" and m.calibration is not None
                        else {}
                    ),
                },
                "host_scale": m.host_scale,
                "device_scale": m.device_scale,
                "replay_error": self.replay_error(m),
            }

        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "tracekit.whatif",
            "runs": {"baseline": run_doc(self.baseline)},
            "knobs": [
                {
                    "spec": k.spec,
                    "definition": k.definition,
                    "applies": {str(m.n_ranks): m.applicable(k) for m in self.runs()},
                }
                for k in self.knobs
            ],
            "predicted_ns": {
                spec: {str(n): int(round(v)) for n, v in by_n.items()}
                for spec, by_n in self.predicted.items()
            },
            "speedup_vs_tp1": {
                spec: {
                    str(n): float(self.measured[self.baseline.n_ranks] / v) if v else None
                    for n, v in by_n.items()
                }
                for spec, by_n in self.predicted.items()
            },
        }
        if self.sharded is not None:
            doc["runs"]["sharded"] = run_doc(self.sharded)
        if self.shapley is not None and self.shortfall_ns is not None and self.ideal_ns is not None:
            n = self.sharded.n_ranks if self.sharded else 1
            s_int = int(round(self.measured[n])) - int(round(self.ideal_ns))
            doc["ideal_ns"] = int(round(self.ideal_ns))
            doc["shortfall_ns"] = s_int
            doc["shapley_ns"] = round_to_sum(self.shapley, s_int)
            doc["residual_parts_ns"] = {k: int(round(v)) for k, v in (self.residual_parts or {}).items()}
            doc["shapley_shares"] = {k: (v / s_int if s_int else None) for k, v in doc["shapley_ns"].items()}
        if self.ranges is not None and self.sharded is not None:
            # the sharded run's profiler cost per rank is not identified: what the data allow
            doc["identified"] = False
            n_s = str(self.sharded.n_ranks)
            doc["predicted_ranges_ns"] = {
                spec: {n_s: list(v)} for spec, v in self.ranges["predicted"].items()
            }
            doc["shapley_ranges_ns"] = {k: list(v) for k, v in self.ranges["shapley"].items()}
        if self.accounting is not None:
            doc["accounting"] = self.accounting
        if self.check is not None:
            doc["check"] = self.check
        notes = [n for m in self.runs() for n in m.notes]
        if self.ranges is not None and self.sharded is not None:
            notes.append(
                f"the profiler's cost per rank of the TP={self.sharded.n_ranks} run is not identified (solved from "
                "one per-token time, no calibration in the manifest): its predictions and the Shapley values "
                f"are stated over the {self.ranges['splits']} splits of the cost read (`predicted_ranges_ns`, "
                "`shapley_ranges_ns`); capture with `tracekit capture` to measure each rank's cost"
            )
        doc["notes"] = notes
        return doc


def whatif(
    base_parts: RunParts,
    base_classified: pd.DataFrame | AnalysedRun,
    shard_parts: RunParts | None,
    shard_classified: pd.DataFrame | AnalysedRun | None,
    knobs: Sequence[Knob],
    combinations: Sequence[tuple[Knob, ...]] = (),
    check: tuple[RunParts, tuple[Knob, ...], str] | None = None,
) -> WhatIf:
    """Replay both runs, calibrate them to their unprofiled per-token times (as `shortfall` does),
    predict every knob and combination at both rank counts, and split S by Shapley values."""
    from tracekit.analyse.attribution.pair import shortfall_from_parts

    if len(knobs) > MAX_SHAPLEY_KNOBS:
        raise ReplayError(f"at most {MAX_SHAPLEY_KNOBS} knobs (2^k replays), got {len(knobs)}")
    sf = shortfall_from_parts(base_parts, shard_parts) if shard_parts is not None else None
    corrected = sf is not None and sf.per_token_source == "unprofiled"
    if sf is None:
        u = base_parts.dilation.unprofiled
        corrected = u is not None and u.n > 0 and u.mean_ns > 0
    # the per-token times the accounting states (T1, TN), so both splits share one S
    tgt_b: Fraction | None = None
    tgt_s: Fraction | None = None
    if corrected and sf is not None:
        tgt_b, tgt_s = Fraction(sf.corrected.baseline_ns), Fraction(sf.corrected.sharded_ns)
    elif corrected and base_parts.dilation.unprofiled is not None:
        tgt_b = Fraction(base_parts.dilation.unprofiled.mean_ns)
    base = build_model(base_parts, base_classified, tgt_b, "baseline")
    shard = None
    if shard_parts is not None and shard_classified is not None:
        shard = build_model(shard_parts, shard_classified, tgt_s, "sharded")
    replayed = {"baseline": base.replay(_Setting())}
    if shard is not None:
        replayed["sharded"] = shard.replay(_Setting())
    for m in (base, shard):
        if m is not None:
            calibrate(m)
    measured = {
        base.n_ranks: base.target_ns
        if base.target_ns is not None
        else Fraction(base_parts.per_token["window"])
    }
    if shard is not None and shard_parts is not None:
        measured[shard.n_ranks] = (
            shard.target_ns if shard.target_ns is not None else Fraction(shard_parts.per_token["window"])
        )
    base_compute = base.compute_per_token
    c1 = float(np.mean(list(base_compute.values()))) if base_compute else None
    n_shard = shard.n_ranks if shard is not None else base.n_ranks
    f = Fraction(base.n_ranks, n_shard)

    def setting(m: RunModel, ks: Iterable[Knob]) -> _Setting:
        # compute=/N scales to the baseline's compute x (baseline ranks / N)
        s = setting_for(m, ks, c1 * base.n_ranks if c1 is not None else None, m.n_ranks)
        if m is base:
            s = dataclasses.replace(s, compute_scale=None)
        return s

    memo: dict[tuple[int, str], Fraction] = {}

    def key_of(m: RunModel, ks: Sequence[Knob]) -> tuple[int, str]:
        return (id(m), combination_spec(k for k in ks if m.applicable(k)))

    def cached(m: RunModel, ks: Sequence[Knob]) -> Fraction:
        key = key_of(m, ks)
        if key not in memo:
            memo[key] = _mean_int(m.replay(setting(m, ks)))
        return memo[key]

    combos: list[tuple[Knob, ...]] = [()] + [(k,) for k in knobs] + list(combinations)
    if check is not None:
        combos.append(check[1])
    if len(knobs) > 1:
        combos.append(tuple(knobs))
    # every replay the predictions and the Shapley game need, per run in one forward pass
    wanted = list(combos)
    if shard is not None:
        wanted += [
            tuple(knobs[i] for i in sub)
            for size in range(len(knobs) + 1)
            for sub in itertools.combinations(range(len(knobs)), size)
        ]
    shard_settings: dict[tuple[int, str], _Setting] = {}
    for m in (base, shard):
        if m is None:
            continue
        todo: dict[tuple[int, str], _Setting] = {}
        for ks in wanted:
            key = key_of(m, ks)
            if key not in memo and key not in todo:
                todo[key] = setting(m, ks)
        if m is shard:
            shard_settings = dict(todo)
        for key, per in zip(todo, m.replay_many(list(todo.values())), strict=True):
            memo[key] = _mean_int(per)
    predicted: dict[str, dict[int, Fraction]] = {}
    for ks in combos:
        spec = combination_spec(ks)
        if spec in predicted:
            continue
        predicted[spec] = {base.n_ranks: cached(base, ks)}
        if shard is not None:
            predicted[spec][shard.n_ranks] = cached(shard, ks)
    shap: dict[str, Fraction] | None = None
    resid: dict[str, Fraction] | None = None
    ideal = s_ns = None
    if shard is not None:
        ideal = measured[base.n_ranks] * f
        s_ns = measured[shard.n_ranks] - ideal
        values: dict[frozenset[int], Fraction] = {}
        for size in range(len(knobs) + 1):
            for sub in itertools.combinations(range(len(knobs)), size):
                sub_knobs = [knobs[i] for i in sub]
                # the game: the shortfall under the knobs, TN(K) - f T1(K) (both runs replayed)
                values[frozenset(sub)] = cached(shard, sub_knobs) - f * cached(base, sub_knobs)
        phis = shapley(values, len(knobs))
        shap = {k.spec: phi for k, phi in zip(knobs, phis, strict=True)}
        after_all = values[frozenset(range(len(knobs)))]
        gap = s_ns - values[frozenset()]
        shap["residual"] = after_all + gap
        resid = {"after_all_knobs": after_all, "replay_gap": gap}
        assert sum(shap.values()) == s_ns
    ranges = None
    corr_s = sf.corrections.get("sharded") if sf is not None else None
    if (
        shard is not None
        and corr_s is not None
        and not corr_s.identified
        and corr_s.intervals
        and shard.correction == "solved"
        and s_ns is not None
    ):
        ranges = _split_ranges(
            shard, corr_s.intervals, shard_settings, memo, combos, knobs, key_of, base, cached, f, s_ns
        )
    check_doc = None
    if check is not None:
        same_n = base_parts if len(check[0].ranks) == base.n_ranks else shard_parts
        check_doc = _check(check, predicted, corrected, same_n)
    accounting = None
    if sf is not None:
        j = sf.to_json()
        accounting = {"shortfall_ns": j["shortfall_ns"], "terms_ns": j["terms_ns"], "shares": j["shares"]}
    return WhatIf(
        baseline=base,
        sharded=shard,
        knobs=tuple(knobs),
        combinations=list(combinations),
        predicted=predicted,
        replayed=replayed,
        shapley=shap,
        residual_parts=resid,
        ideal_ns=ideal,
        shortfall_ns=s_ns,
        measured=measured,
        accounting=accounting,
        check=check_doc,
        ranges=ranges,
    )


def _split_ranges(
    shard: RunModel,
    intervals: list[tuple[int, float, float]],
    settings: Mapping[tuple[int, str], _Setting],
    memo: Mapping[tuple[int, str], Fraction],
    combos: Sequence[tuple[Knob, ...]],
    knobs: Sequence[Knob],
    key_of: Any,
    base: RunModel,
    cached: Any,
    f: Fraction,
    s_ns: Fraction,
) -> dict[str, Any]:
    """Where the profiler's cost per rank is not identified (`correction._identify`): the sharded
    run's predictions and the Shapley values over the splits of the cost the data allow, the one
    cost on every rank and each rank's interval of costs that alone give the unprofiled time (read
    where the predictions bend: `correction.refine_splits`). {"predicted": {spec: [lo, hi]},
    "shapley": {knob spec or "residual": [lo, hi]}} (ns, floor / ceil)."""
    from tracekit.analyse.correction import _alone, refine_splits

    keys = list(settings)
    ranks = list(shard.ranks)
    exact: dict[tuple[int, float], dict[tuple[int, str], Fraction]] = {}

    def evaluate(points: list[tuple[int, float]]) -> list[np.ndarray]:
        todo = [
            dataclasses.replace(settings[k], rank_costs=_alone(ranks, r, c)) for r, c in points for k in keys
        ]
        per = shard.replay_many(todo)
        out = []
        for i, p in enumerate(points):
            vals = {k: _mean_int(per[i * len(keys) + j]) for j, k in enumerate(keys)}
            exact[p] = vals
            out.append(np.asarray([float(v) for v in vals.values()]))
        return out

    refine_splits(intervals, evaluate)
    splits = [dict(memo), *({**memo, **v} for v in exact.values())]
    predicted: dict[str, list[int]] = {}
    for ks in combos:
        spec = combination_spec(ks)
        vals = [sp[key_of(shard, ks)] for sp in splits]
        predicted[spec] = [math.floor(min(vals)), math.ceil(max(vals))]
    shap: dict[str, list[Fraction]] = {k.spec: [] for k in knobs}
    shap["residual"] = []
    subs = [
        frozenset(sub)
        for size in range(len(knobs) + 1)
        for sub in itertools.combinations(range(len(knobs)), size)
    ]
    for sp in splits:
        values = {
            sub: sp[key_of(shard, [knobs[i] for i in sub])] - f * cached(base, [knobs[i] for i in sub])
            for sub in subs
        }
        for k, phi in zip(knobs, shapley(values, len(knobs)), strict=True):
            shap[k.spec].append(phi)
        shap["residual"].append(values[frozenset(range(len(knobs)))] + s_ns - values[frozenset()])
    return {
        "predicted": predicted,
        "shapley": {k: [math.floor(min(v)), math.ceil(max(v))] for k, v in shap.items()},
        "splits": len(splits),
    }


def _check(
    check: tuple[RunParts, tuple[Knob, ...], str],
    predicted: Mapping[str, Mapping[int, Fraction]],
    corrected: bool,
    predicting: RunParts | None = None,
) -> dict[str, Any]:
    """A prediction set against a real run that was not used to make it (docs/METHOD.md section Critical path and what-if).

    Also the device work per token (compute + memory kernels, per rank, mean) of the check run and
    of the run the prediction replays: a knob re-times the work the trace holds, so when the check
    run does different device work (a CUDA-graph loop over a static KV cache runs masked attention
    over every cached position), that difference bounds the agreement and is stated beside the error."""
    parts, combo, label = check
    spec = combination_spec(combo)
    n = len(parts.ranks)
    by_n = predicted[spec]
    if n not in by_n:
        raise ReplayError(
            f"--check {label} has {n} rank(s) but the predictions are for {', '.join(map(str, by_n))} rank(s)"
        )
    pred = by_n[n]
    traced = Fraction(parts.per_token["window"])
    u = parts.dilation.unprofiled
    unprof = Fraction(u.mean_ns) if u is not None and u.n > 0 and u.mean_ns > 0 else None
    measured, source = (unprof, "unprofiled") if corrected and unprof is not None else (traced, "trace")
    return {
        "run": label,
        "knobs": spec,
        "ranks": n,
        "predicted_ns": int(round(pred)),
        "measured_ns": int(round(measured)),
        "measured_source": source,
        "measured_traced_ns": int(round(traced)),
        "measured_unprofiled_ns": int(round(unprof)) if unprof is not None else None,
        "error": float((pred - measured) / measured),
        "device_work_ns": {
            "check_run": _device_work(parts),
            "predicting_run": _device_work(predicting) if predicting is not None else None,
        },
    }


def _device_work(parts: RunParts) -> int:
    """Mean per-token device work (compute + memory kernels) over the run's ranks, integer ns."""
    per = [
        sum((Fraction(leaf.get(k, 0)) for k in ("compute", "memory")), Fraction(0))
        for leaf in parts.per_rank.values()
    ]
    return int(round(sum(per, Fraction(0)) / len(per))) if per else 0
