"""The per-token critical path across ranks (docs/METHOD.md section Critical path and what-if, the rendezvous model).

Waiting is a consequence, not a cause. A collective starts on every rank when its *last* rank
arrives (`a = max_r s_r`), so the time a token takes runs through that late rank's own work before
the collective, then the transfer, then on. Per step, walking backward in time on one clock:

1. start at the latest window end of the step (the token is done when its last rank is done), on
   that rank (ties: the lowest rank);
2. on the current rank X at time t, take X's latest collective of this step that ended by t. The
   segment [e_X, t) is X's own work: it is measured on X's timeline with the partition's priority
   (compute > memory > collective > unknown > sync > idle; idle on a GPU timeline is the device
   waiting for the host to launch, i.e. **host** time). The collective's piece [a, e_X) is the
   **transfer**; X's piece [s_X, a) is waiting, which is *not* on the path: the path jumps to the
   collective's last arriver L at time a (= s_L) and goes on from there;
3. when X has no earlier collective in the step, the segment [ws_X, t) to X's window start ends
   the walk.

The path is continuous in time, so its length is `max_r we_r - ws_X` where X is the rank the walk
ends on. The step time used everywhere else is the longest window (`max_r (we_r - ws_r)`); the
difference (ranks opening their step windows at slightly different times) is kept as
`offset_ns` so that the path components plus the offset sum to the step time exactly.

Per rank, the components are `compute_ns`, `memory_ns`, `transfer_ns`, `host_ns`, `sync_ns`,
`unknown_ns`. Time under a collective interval inside a segment that no matched instance covers
(the enqueueing `c10d::` op on a CPU run; an unmatched kernel) is counted as host time on a host
timeline and as transfer on a GPU timeline (a kernel holding the stream).

Clocks: windows, events and the collectives' `raw_*` times are on each rank's own clock; the
arrival `a` moves between ranks through the aligned clock (`offsets`: raw = aligned + offset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.steps import LayerUnions, layer_unions, rank_layer_unions

#: Components of the path on one rank, in report order.
PATH_PARTS: tuple[str, ...] = ("compute", "memory", "transfer", "host", "sync", "unknown")
#: Columns of `CriticalPath.segments`.
SEGMENT_COLUMNS: tuple[str, ...] = ("step", "rank", "start_ns", "end_ns", "piece", "instance")


#: One rank's cumulative layer unions: built once per rank by `tracekit.analyse.steps.layer_unions`,
#: which the step partition measures its windows with too (the names kept for older callers).
_Layers = LayerUnions
_layers_of = layer_unions


def _add_segment(acc: dict[str, int], m: dict[str, int], timeline: str, *, transfer: bool) -> None:
    acc["compute"] += m["compute"]
    acc["memory"] += m["memory"]
    acc["unknown"] += m["unknown"]
    acc["sync"] += m["sync"]
    acc["host"] += m["idle"]
    if transfer or timeline == "gpu":
        acc["transfer"] += m["collective"]
    else:
        acc["host"] += m["collective"]


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
    offsets: dict[int, int] | None = None,
    unions: Mapping[int, LayerUnions] | None = None,
) -> CriticalPath:
    """The per-step critical path (module doc).

    `windows`: rank, step, start_ns, end_ns (each rank's own clock); `per_rank`: the matched
    collectives (`CollectiveInstances.per_rank`: instance, rank, raw_start_ns, raw_end_ns,
    arrival_raw_ns, start_ns); `offsets`: rank -> clock offset (raw = aligned + offset);
    `unions`: each rank's layer unions when already built (the step partition's), else built here.

    The pieces, which the Dask engine runs apart: `path_inputs` (windows and matched collectives
    only: small), `walk_steps` (per step, with each rank's unions: a step-bucket task there, with
    the unions clipped to `path_spans`), `path_of` (the tables, in step order).
    """
    ranks = sorted(int(r) for r in windows["rank"].unique())
    if unions is not None and all(r in unions for r in ranks):
        layers = {r: unions[r] for r in ranks}
    else:
        layers = rank_layer_unions(classified, ranks)
    inputs = path_inputs(windows, per_rank, offsets)
    rows, segs = walk_steps(inputs, lambda r, _st: layers[r])
    return path_of(rows, segs, ranks, path_timeline(lay.timeline for lay in layers.values()))


def path_timeline(timelines: Iterable[str]) -> str:
    """The path's timeline from its ranks' ("gpu", "host" or "mixed")."""
    ts = set(timelines)
    return "gpu" if ts == {"gpu"} else ("host" if ts == {"host"} else "mixed")


@dataclass
class PathInputs:
    """What the walk needs besides the ranks' layer unions (small: windows and matched rows).

    `windows`: per (rank, step) the window with `off`, `a_start`, `a_end` (aligned) and `len`;
    `by_rs`: per (rank, step) its collectives in end order (raw_end, raw_start, arrival_raw,
    instance); `last_of`: instance -> its last arriver; `ranks`: every rank of the path table."""

    windows: pd.DataFrame
    by_rs: dict[tuple[int, int], tuple[np.ndarray, ...]]
    last_of: dict[int, int]
    ranks: list[int]

    def steps(self) -> list[int]:
        return sorted(int(s) for s in pd.unique(self.windows["step"]))

    def of_steps(self, steps: Iterable[int]) -> PathInputs:
        """The inputs of these steps only (a step-bucket task's share)."""
        keep = {int(s) for s in steps}
        by_rs = {k: v for k, v in self.by_rs.items() if k[1] in keep}
        insts = {int(i) for v in by_rs.values() for i in v[3]}
        return PathInputs(
            self.windows[self.windows["step"].isin(keep)],
            by_rs,
            {i: r for i, r in self.last_of.items() if i in insts},
            self.ranks,
        )


def path_inputs(
    windows: pd.DataFrame, per_rank: pd.DataFrame, offsets: dict[int, int] | None = None
) -> PathInputs:
    """The walk's inputs from the windows and the matched collectives (`critical_path`'s args)."""
    from tracekit.analyse.collectives import assign_steps

    offsets = offsets or {}
    ranks = sorted(int(r) for r in windows["rank"].unique())
    # the collectives of each (rank, step), in end order, on the rank's own clock
    pr = per_rank
    if len(pr):
        # each collective in the step window of its rank that holds its start (own clock)
        raw = pr.assign(start_ns=pr["raw_start_ns"])
        step_of = assign_steps(raw, windows)
        pr = pr.assign(step=step_of.to_numpy())
        pr = pr[pr["step"] >= 0]
        # the last arriver of each instance (ties: the lowest rank), over the ranks that have it
        last = (
            pr.sort_values(["instance", "start_ns", "rank"], ascending=[True, False, True])
            .drop_duplicates("instance")
            .set_index("instance")["rank"]
        )
        last_of = {int(k): int(v) for k, v in last.items()}
    else:
        last_of = {}
    by_rs: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
    if len(pr):
        for (r, st), g in pr.groupby(["rank", "step"], sort=False):
            g = g.sort_values("raw_end_ns", kind="stable")
            by_rs[(int(r), int(st))] = (
                g["raw_end_ns"].to_numpy(np.int64),
                g["raw_start_ns"].to_numpy(np.int64),
                g["arrival_raw_ns"].to_numpy(np.int64),
                g["instance"].to_numpy(np.int64),
            )

    w = windows.copy()
    w["off"] = w["rank"].map(lambda r: offsets.get(int(r), 0)).astype(np.int64)
    w["a_start"] = w["start_ns"].to_numpy(np.int64) - w["off"].to_numpy(np.int64)
    w["a_end"] = w["end_ns"].to_numpy(np.int64) - w["off"].to_numpy(np.int64)
    w["len"] = w["end_ns"] - w["start_ns"]
    return PathInputs(w, by_rs, last_of, ranks)


def path_spans(inputs: PathInputs) -> dict[tuple[int, int], tuple[int, int]]:
    """Per (rank, step), the span of the rank's own clock the walk can query: from its window
    start to the step's latest aligned window end on its clock (`t` only decreases from there; a
    collective of the step starts in the window, and its arrival is clipped to [start, end]; a
    walk reaching a rank before its window start measures nothing there). Unions clipped to it
    (`steps.LayerUnions.clipped`) measure what the whole unions do, and refuse anything outside."""
    w = inputs.windows
    top = w.groupby("step")["a_end"].transform("max").to_numpy(np.int64)
    out = {}
    for r, st, s, off, hi in zip(
        w["rank"].to_numpy(np.int64),
        w["step"].to_numpy(np.int64),
        w["start_ns"].to_numpy(np.int64),
        w["off"].to_numpy(np.int64),
        top,
        strict=True,
    ):
        out[(int(r), int(st))] = (int(s), int(hi + off))
    return out


PathRow = dict[str, Any]
Segment = tuple[int, int, int, int, str, int]


def walk_steps(
    inputs: PathInputs, layers_of: Callable[[int, int], LayerUnions]
) -> tuple[list[PathRow], list[Segment]]:
    """The walk of every step of `inputs` (module doc), in step order; `layers_of(rank, step)`:
    the rank's layer unions (whole, or clipped to the step's `path_spans`)."""
    ranks = inputs.ranks
    by_rs, last_of = inputs.by_rs, inputs.last_of
    rows: list[PathRow] = []
    segs: list[Segment] = []
    for st, g in inputs.windows.groupby("step", sort=True):
        st = int(st)
        step_ns = int(g["len"].max())
        g = g.sort_values(["a_end", "rank"], ascending=[False, True])
        win = {
            int(r): (int(s), int(e), int(o))
            for r, s, e, o in g[["rank", "start_ns", "end_ns", "off"]].itertuples(index=False)
        }
        acc = {r: dict.fromkeys(PATH_PARTS, 0) for r in ranks}
        x = int(g["rank"].iloc[0])
        t_al = int(g["a_end"].iloc[0])  # aligned time
        hops = 0
        limit: dict[int, int] = {}
        while True:
            ws, _we, off = win[x]
            lay = layers_of(x, st)
            t = t_al + off  # on x's clock
            coll = by_rs.get((x, st))
            k = int(np.searchsorted(coll[0], t, side="right")) - 1 if coll is not None else -1
            k = min(k, limit.get(x, k + 1) - 1)  # each collective of a rank is used once
            if k < 0:
                ws = min(ws, t)
                _add_segment(acc[x], lay.measure(ws, t), lay.timeline, transfer=False)
                segs.append((st, x, ws, t, "work", -1))
                t_al = ws - off
                break
            assert coll is not None
            e_x, s_x, a_x, inst = int(coll[0][k]), int(coll[1][k]), int(coll[2][k]), int(coll[3][k])
            _add_segment(acc[x], lay.measure(e_x, t), lay.timeline, transfer=False)
            a_x = max(min(a_x, e_x), s_x)  # an inconsistent trace (e < a): no transfer piece
            _add_segment(acc[x], lay.measure(a_x, e_x), lay.timeline, transfer=True)
            segs.append((st, x, e_x, t, "work", -1))
            segs.append((st, x, a_x, e_x, "transfer", inst))
            t_al = a_x - off
            limit[x] = k
            nxt = last_of.get(inst, x)
            if nxt not in win:
                nxt = x
            if nxt != x:
                hops += 1
            # on the last arriver the arrival is its own collective start; the walk goes on before it
            x = nxt
        path_len = int(g["a_end"].iloc[0]) - t_al
        for r in ranks:
            rows.append(
                {
                    "step": st,
                    "rank": r,
                    **{f"{p}_ns": acc[r][p] for p in PATH_PARTS},
                    "step_ns": step_ns,
                    "offset_ns": step_ns - path_len,
                    "hops": hops,
                }
            )
        total = sum(sum(acc[r].values()) for r in ranks)
        assert total == path_len, f"step {st}: path pieces {total} != path length {path_len}"
    return rows, segs


def path_of(rows: list[PathRow], segs: list[Segment], ranks: list[int], timeline: str) -> CriticalPath:
    """The CriticalPath of the walk's rows and segments (every step's, in step order)."""
    cols_out = ["step", "rank", *(f"{p}_ns" for p in PATH_PARTS), "step_ns", "offset_ns", "hops"]
    table = pd.DataFrame(rows, columns=cols_out)
    seg = pd.DataFrame(segs, columns=list(SEGMENT_COLUMNS))
    seg = seg[seg["end_ns"] > seg["start_ns"]].reset_index(drop=True)
    return CriticalPath(table, ranks, timeline, seg)
