"""The clock of each rank (docs/METHOD.md section Clocks and step matching).

- clock (docs/METHOD.md section Clocks and step matching): each rank's offset is always
  estimated as the median over shared instances of (end_r - end_ref) (collectives end together
  by construction; `estimate_offsets`) and subtracted, whatever the manifest or the host names
  say; offsets and residuals are stated (`clock`, `data_quality`). Where they cannot be
  estimated (several ranks, no collective matched across them, or host ops only, whose ends need
  not agree) `clock.refusal` says so and `require_aligned` refuses cross-rank figures in one
  line. Instances are numbered on the aligned clock. Then the clock check (`end_spread_check`):
  matched instances whose aligned ends differ by more than the level's threshold
  (`END_SPREAD_THRESHOLD_NS`) are counted (`collective_end_spread`), the worst named; the
  summary is `clock.check` (`clock.raw_instances_over`: the same count on the unaligned clocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.collectives.checks import END_SPREAD_THRESHOLD_NS
from tracekit.analyse.collectives.instances import ClockAlignment, CollectiveInstances
from tracekit.errors import MatchError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import Manifest
from tracekit.model.events import DataQuality

# --------------------------------------------------------------------------------------------
# clocks (docs/METHOD.md section Clocks and step matching)


def _hosts(rank_info: Mapping[int, Mapping[str, Any]] | None, manifest: Manifest | None) -> dict[int, str]:
    hosts: dict[int, str] = {}
    for r, info in (rank_info or {}).items():
        for key in ("host_name", "hostname", "host"):
            v = info.get(key)
            if isinstance(v, str) and v:
                hosts[int(r)] = v
                break
    host = given(manifest.host) if manifest is not None else None
    if not hosts and host is not None:
        # one capture writes one manifest, and runs its ranks on the host it names
        mhost = given(host.hostname)
        if mhost:
            hosts = {int(r): mhost for r in (rank_info or {})}
    return hosts


def _median_int(d: np.ndarray) -> int:
    """The median of integers, as an integer: the middle value, or the floor of the two middle
    values' mean. Moving every value by an integer k moves it by exactly k."""
    s = np.sort(d.astype(np.int64))
    n = s.size
    if n % 2:
        return int(s[n // 2])
    return int((int(s[n // 2 - 1]) + int(s[n // 2])) // 2)


#: Levels whose matched intervals end together by construction (offsets can be estimated from them).
_ENDS_TOGETHER = ("gpu_kernel", "gloo")


@dataclass
class OffsetEstimate:
    """`estimate_offsets`' result: per rank its offset (raw = aligned + offset; 0 on the reference
    rank), the rank it was measured against, and the residual of the end differences around it."""

    reference: int
    offsets_ns: dict[int, int]
    against: dict[int, int]  # rank -> the rank its offset was measured against (itself on the reference)
    residual_ns: dict[int, dict[str, int]]  # rank -> {"instances", "median", "max"} (|d - offset|)
    unreached: list[
        int
    ]  # ranks sharing no matched collective, directly or through others, with the reference


def estimate_offsets(per_rank: pd.DataFrame, ranks: list[int]) -> OffsetEstimate | None:
    """Each rank's clock offset from matched collective instances that end together by
    construction: over the instances rank r shares with rank p, offset_r - offset_p is the median
    of (raw end_r - raw end_p) (`_median_int`). Ranks are reached breadth first from the lowest
    rank with instances, each measured against the lowest-numbered reached rank it shares the
    most instances with (one group: every rank against the reference). The residual per rank is
    the median and the largest |end difference - offset difference| over those instances. None
    when no rank has an instance; ranks no chain of shared instances reaches are in `unreached`.
    `per_rank`: instance, rank, raw_end_ns."""
    if per_rank.empty:
        return None
    ends = per_rank.pivot_table(index="instance", columns="rank", values="raw_end_ns", aggfunc="first")
    have = [r for r in ranks if r in ends.columns]
    if not have:
        return None
    ref = have[0]
    offsets = {ref: 0}
    against = {ref: ref}
    residual: dict[int, dict[str, int]] = {
        ref: {"instances": int(ends[ref].notna().sum()), "median": 0, "max": 0}
    }
    # instances each pair of ranks shares, all pairs at once (a product of the presence matrix:
    # exact counts in float64), not a pass over the table per pair
    col = {c: i for i, c in enumerate(ends.columns)}
    present = ends.notna().to_numpy(np.float64)
    shared = np.rint(present.T @ present).astype(np.int64)
    frontier = [ref]
    while frontier:
        nxt = []
        for r in have:
            if r in offsets:
                continue
            best, best_n = None, 0
            for p in sorted(offsets):
                n = int(shared[col[r], col[p]])
                if n > best_n:
                    best, best_n = p, n
            if best is None:
                continue
            d = (ends[r] - ends[best]).dropna().to_numpy(np.int64)
            med = _median_int(d)
            offsets[r] = offsets[best] + med
            against[r] = best
            dev = np.abs(d - med)
            residual[r] = {"instances": int(d.size), "median": _median_int(dev), "max": int(dev.max())}
            nxt.append(r)
        frontier = nxt
    unreached = [r for r in ranks if r not in offsets]
    return OffsetEstimate(ref, offsets, against, residual, unreached)


def _raw_spread_over(per_rank: pd.DataFrame, threshold: int | None) -> int | None:
    """Instances of more than one rank whose raw (unaligned) ends differ by more than `threshold`."""
    if threshold is None or per_rank.empty:
        return None
    g = per_rank.groupby("instance")["raw_end_ns"]
    multi = g.size() > 1
    spread = (g.max() - g.min())[multi]
    return int((spread > threshold).sum())


def align_clocks(
    per_rank: pd.DataFrame,
    ranks: list[int],
    rank_info: Mapping[int, Mapping[str, Any]] | None,
    manifest: Manifest | None,
    dq: DataQuality,
    clock: str = "auto",
    level: str = "none",
    threshold_ns: int | None = None,
) -> ClockAlignment:
    """The ranks' clocks on one time line (docs/METHOD.md section Clocks and step matching).

    "auto" / "estimate": the offsets are always estimated from the matched collectives that end
    together by construction (`estimate_offsets`) and always subtracted, whatever the manifest or
    the host names say: a policy on the data, so moving one rank's clock by any amount moves its
    offset by exactly that and changes no cross-rank figure. The threshold only qualifies it:
    `raw_instances_over` (the instances the unaligned clocks would have put over it) says whether
    the offsets mattered, the end-spread check on the aligned clock (`check`) whether the
    alignment left any. Where the offsets cannot be estimated (one of several ranks has no
    collective, or its collectives' ends do not agree by construction: host ops), `refusal` says
    so in one line and the offsets are 0: cross-rank figures are refused (`require_aligned`).
    "shared": the ranks' clocks are used as they are (an API caller's statement)."""
    hosts = _hosts(rank_info, manifest)
    if not hosts and manifest is not None:
        hosts = {r: h for r, h in _hosts({r: {} for r in ranks}, manifest).items()}
    if len(ranks) <= 1:
        return ClockAlignment(True, {r: 0 for r in ranks}, "single rank", hosts, estimated=False)
    if clock == "shared":
        return ClockAlignment(True, {r: 0 for r in ranks}, "one clock (as asked)", hosts, estimated=False)
    zero = {r: 0 for r in ranks}
    if level not in _ENDS_TOGETHER or per_rank.empty:
        why = (
            "there are no collectives matched across ranks"
            if per_rank.empty
            else "their only collectives are host ops, which return once the work is enqueued, so their "
            "ends do not agree"
        )
        refusal = (
            f"the clocks of ranks {', '.join(map(str, ranks))} cannot be aligned: {why}; cross-rank figures "
            "(wait, transfer, the critical path, the step join) are refused (capture the GPU kernels or the "
            "gloo ranges, or analyse each rank alone)"
        )
        dq.add("clock_not_estimated", 1, refusal)
        return ClockAlignment(False, zero, "not estimated", hosts, estimated=False, refusal=refusal)
    est = estimate_offsets(per_rank, ranks)
    assert est is not None
    if est.unreached:
        refusal = (
            f"the clocks of rank(s) {', '.join(map(str, est.unreached))} cannot be aligned with rank "
            f"{est.reference}'s: they share no matched collective with it, directly or through other ranks; "
            "cross-rank figures are refused"
        )
        dq.add("clock_not_estimated", len(est.unreached), refusal)
        return ClockAlignment(
            False, zero, "not estimated", hosts, estimated=False, refusal=refusal, residual_ns=est.residual_ns
        )
    thr = int(threshold_ns) if threshold_ns is not None else END_SPREAD_THRESHOLD_NS.get(level)
    raw_over = _raw_spread_over(per_rank, thr)
    n_multi = int((per_rank.groupby("instance").size() > 1).sum())
    parts = []
    for r in ranks:
        if r == est.reference:
            continue
        res = est.residual_ns[r]
        vs = f" vs rank {est.against[r]}" if est.against[r] != est.reference else ""
        parts.append(
            f"rank {r}: {est.offsets_ns[r]:+d} ns{vs} (residual median {res['median']} ns, max "
            f"{res['max']} ns over {res['instances']} collectives)"
        )
    raw_words = (
        f"; on the unaligned clocks {raw_over} of {n_multi} collectives ended more than {thr / 1e3:g} us apart"
        if raw_over and thr is not None
        else ""
    )
    dq.add(
        "clock_offsets",
        len(ranks) - 1,
        f"rank clocks aligned to rank {est.reference}'s by offsets estimated from the collectives' end times "
        f"(they end together): {'; '.join(parts)}{raw_words}",
    )
    method = f"median of collective end-time differences to rank {est.reference}"
    return ClockAlignment(
        True,
        dict(est.offsets_ns),
        method,
        hosts,
        estimated=True,
        residual_ns=est.residual_ns,
        raw_instances_over=raw_over,
    )


def require_aligned(coll: CollectiveInstances, label: str) -> None:
    """MatchError (one line) when the run's ranks' clocks could not be aligned
    (`ClockAlignment.refusal`): the cross-rank figures would rest on unaligned clocks."""
    if coll.clock.refusal:
        raise MatchError(f"{label}: {coll.clock.refusal}")
