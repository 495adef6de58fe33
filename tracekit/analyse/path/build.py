"""The dependency graph built from a run's classified events (`tracekit.analyse.path`): one rank's
(`build_rank_graph`, on its timeline) and the run's (`build_graph`: every rank's, assembled)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from tracekit.analyse.path.gpu_rank import gpu_rank
from tracekit.analyse.path.graph import Graph, assemble
from tracekit.analyse.path.host_rank import host_rank
from tracekit.analyse.path.rank_graph import RankGraph, RankSource
from tracekit.analyse.timeline.partition import LayerUnions, rank_selectors
from tracekit.classify.rules import GPU_KINDS
from tracekit.model.strings import str_isin


def build_rank_graph(
    events: pd.DataFrame,
    rank: int,
    windows: pd.DataFrame,
    matched: pd.DataFrame,
    offset: int,
    timeline: str,
    inst_bytes: Mapping[int, int] | None = None,
    unions: LayerUnions | None = None,
) -> RankGraph:
    """One rank's graph over its `windows` (step, start_ns, end_ns, annotation_end_ns; the rank's
    own clock; consecutive steps), its classified `events` and its rows of the matched collectives.
    Times are stored on the aligned clock (own - `offset`). `unions`: the rank's layer unions
    (`steps.layer_unions` of these events) when already built, as the AnalysedRun keeps them; a
    host-timeline graph measures its host work with them (else it builds them here)."""
    w = windows.sort_values("start_ns", kind="stable")
    source = RankSource(events, int(rank), w, matched, int(offset), inst_bytes or {})
    return gpu_rank(source) if timeline == "gpu" else host_rank(source, unions)


def build_graph(
    classified: pd.DataFrame,
    windows: pd.DataFrame,
    per_rank: pd.DataFrame,
    offsets: Mapping[int, int] | None,
    timeline: str | None,
    inst_bytes: Mapping[int, int] | None = None,
) -> Graph:
    """The run's graph over `windows` (rank, step, start_ns, end_ns, annotation_end_ns);
    `timeline` "gpu" or "host" for every rank, None: each rank's from its events."""

    def rank_timeline(ev: pd.DataFrame) -> str:
        if timeline is not None:
            return timeline
        return "gpu" if str_isin(ev["kind"], GPU_KINDS).any() else "host"

    offsets = dict(offsets or {})
    ranks = sorted(int(r) for r in windows["rank"].unique())
    rows_of = rank_selectors(classified["rank"].to_numpy(np.int64))
    m_rank = per_rank["rank"].to_numpy(np.int64) if len(per_rank) else np.zeros(0, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    w_rank = windows["rank"].to_numpy(np.int64)
    rgs = []
    for r in ranks:
        ev = classified.iloc[rows_of.get(r, empty)]
        rgs.append(
            build_rank_graph(
                ev,
                r,
                windows[w_rank == r],
                per_rank[m_rank == r] if len(per_rank) else per_rank,
                int(offsets.get(r, 0)),
                rank_timeline(ev),
                inst_bytes,
            )
        )
    return assemble(rgs, offsets)
