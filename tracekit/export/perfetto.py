"""A run as one Chrome-trace JSON (the Trace Event Format that the Perfetto UI and chrome://tracing
open) with tracekit's view of it beside each rank's own tracks.

One process per rank (`pid` = rank, named "rank R"). Its threads:
- the run's own events, one track per host thread ("host thread T") and per GPU stream
  ("GPU D stream S"), as complete (X) events with the Kineto `cat` of their kind and their
  event-table columns in `args` (rank, device, stream, correlation, kind, the collective columns)
  plus the class tracekit gave them (`class`, `subclass`);
- "tracekit: steps": each step window ("step N"), its partition in `args` (compute, memory,
  collective, unknown, sync, idle ns; wait / transfer of the exposed collective);
- "tracekit: class, GPU D stream S": every GPU interval (kernel, memcpy, memset) again, named by its
  class (compute, memory, collective, unknown), so the stream reads as a colour band of classes;
- "tracekit: collectives": each matched collective instance on that rank as a slice
  ("all_reduce #I") holding its two pieces, "wait" (from its start to the last rank's arrival) and
  "transfer" (from the arrival to its end), with flow arrows (`ph` s / t / f, one `id` per
  instance, `bp` "e") joining the instance across the ranks;
- "tracekit: critical path": the pieces of the per-token critical path that run on that rank
  (tracekit.analyse.path.critical_path: "work" on the rank, "transfer" of a collective), with flow arrows
  where the path hops to another rank.
A track whose slices would overlap without nesting is split into lanes ("... (2)"), the run's own
host threads and GPU streams as the tracekit tracks: on every track, slices are disjoint or nested.
The profiler's launch -> kernel links are kept as flow arrows (`cat` "ac2g", as Kineto writes them):
from each runtime call to every GPU operation with its correlation id.

Times: `ts` / `dur` in microseconds with three decimals (every nanosecond kept) from `base_ns`,
each rank on its own clock as the trace had it. The document's first key `tracekitExport` lets
`tracekit.read` read the file back into the same event table (tracekit.read.export).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from tracekit.analyse.attribution.options import AttributionOptions
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.timeline.partition import partition_steps
from tracekit.analyse.timeline.steps import find_steps_detailed
from tracekit.classify import classify
from tracekit.errors import OutputError, TracekitError
from tracekit.model.documents.chrome import ChromeEvent, ExportArgs, ExportObject
from tracekit.model.events import COLUMNS, Run
from tracekit.model.parts import PARTS
from tracekit.read import read_run

FORMAT = "tracekit.perfetto"
VERSION = 1

#: event kind -> the Kineto `cat` written for it (tracekit.read.kineto.KIND_OF_CAT reversed)
CAT_OF_KIND: dict[str, str] = {
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "runtime": "cuda_runtime",
    "sync": "cuda_sync",
    "cpu_op": "cpu_op",
    "annotation": "user_annotation",
    "gpu_annotation": "gpu_user_annotation",
    "other": "other",
}
GPU_KINDS = ("kernel", "memcpy", "memset")
#: the collective columns written in args when set
_COLL_COLS = tuple(c for c in COLUMNS if c.startswith("coll_"))


@dataclass
class ExportSummary:
    """What `write_perfetto` wrote: counts per kind of tracekit slice, and notes."""

    path: Path
    ranks: list[int]
    events: int  # the run's own events
    view: dict[str, int] = field(default_factory=dict)  # steps, class, wait, transfer, path, flows
    notes: list[str] = field(default_factory=list)
    bytes: int = 0


def _us(ns: int) -> float:
    """ns as microseconds; written by orjson as the shortest text that reads back to the same
    double, which for |ns| < 2**53 / 1000 is the exact decimal with at most three decimals."""
    return ns / 1000.0


class _Tracks:
    """Thread ids of one rank's tracks, with their names (thread_name metadata)."""

    def __init__(self) -> None:
        self.tid: dict[tuple[Any, ...], int] = {}
        self.names: dict[int, str] = {}

    def get(self, key: tuple[Any, ...], name: str) -> int:
        if key not in self.tid:
            t = len(self.tid) + 1
            self.tid[key] = t
            self.names[t] = name
        return self.tid[key]


def _lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A lane per interval such that the intervals of one lane do not overlap (greedy, by start)."""
    order = np.argsort(starts, kind="stable")
    lane = np.zeros(len(starts), np.int64)
    lane_end: list[int] = []
    for i in order.tolist():
        s, e = int(starts[i]), int(ends[i])
        for k, le in enumerate(lane_end):
            if le <= s:
                lane[i] = k
                lane_end[k] = e
                break
        else:
            lane[i] = len(lane_end)
            lane_end.append(e)
    return lane


def _nested_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A lane per interval such that within a lane any two intervals are disjoint or one holds the
    other (a track Perfetto draws: its importer drops a slice that overlaps another without nesting).
    First fit, by start then longest first; each lane keeps the stack of its open intervals' ends."""
    order = np.lexsort((-(ends - starts), starts))
    lane = np.zeros(len(starts), np.int64)
    stacks: list[list[int]] = []
    for i in order.tolist():
        s, e = int(starts[i]), int(ends[i])
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                lane[i] = k
                stack.append(e)
                break
        else:
            lane[i] = len(stacks)
            stacks.append([e])
    return lane


def _analyse(run: Run, step_pattern: str | None) -> tuple[pd.DataFrame, Any, list[str]]:
    """Classified events, and the analysed run (steps with their partition, collectives, critical
    path) or None with a note when the run cannot be attributed (then only steps and classes)."""
    classified = run.events if "cls" in run.events.columns else classify(run.events)
    crun = Run(classified, run.sources, run.rank_info, run.data_quality, run.manifest)
    try:
        parts = attribute_run(crun, AttributionOptions(step_pattern, skip_first=0), label="run")
    except TracekitError as exc:
        return classified, None, [f"no collectives or critical path in the view: {exc}"]
    return classified, parts, []


def _steps_only(classified: pd.DataFrame, step_pattern: str | None) -> pd.DataFrame:
    found = find_steps_detailed(classified, step_pattern)
    return partition_steps(classified, found.steps)


def perfetto_document(run: Run, *, step_pattern: str | None = None) -> tuple[ExportObject, ExportSummary]:
    """The export of `run` as a JSON-ready document (module doc) and its summary (path unset)."""
    classified, parts, notes = _analyse(run, step_pattern)
    ev = classified
    n = len(ev)
    ranks = sorted(int(r) for r in ev["rank"].unique()) if n else []
    base = int(ev["start_ns"].min()) if n else 0
    out: list[ChromeEvent] = []
    summary = ExportSummary(path=Path(), ranks=ranks, events=n)
    view = summary.view

    tracks = {r: _Tracks() for r in ranks}
    rank_a = ev["rank"].to_numpy(np.int64)
    dev_a = ev["device"].to_numpy(np.int64)
    stream_a = ev["stream"].to_numpy(np.int64)
    start_a = ev["start_ns"].to_numpy(np.int64)
    end_a = ev["end_ns"].to_numpy(np.int64)
    corr_a = ev["correlation"].to_numpy(np.int64)
    kind_a = ev["kind"].astype(str).to_numpy()
    name_a = ev["name"].astype(str).to_numpy()
    cls_a = ev["cls"].astype(str).to_numpy()
    sub_a = ev["subclass"].astype(str).to_numpy()
    coll = {c: ev[c].to_numpy() for c in _COLL_COLS}
    coll_str = {c for c in _COLL_COLS if COLUMNS[c] == "category"}
    coll_vals = {
        c: (ev[c].astype(str).to_numpy() if c in coll_str else coll[c].astype(np.int64)) for c in coll
    }
    has_coll = np.zeros(n, bool)
    for c, v in coll_vals.items():
        has_coll |= (v != "") if c in coll_str else (v != -1)

    # track order: host threads first, then GPU streams (by device, stream); a thread or stream
    # whose events overlap without nesting (Kineto records kernels of one stream overlapping by a
    # few ns, and async ranges on a thread) is split into lanes "... (2)", each of which nests
    is_gpu_track = (dev_a >= 0) & np.isin(kind_a, [*GPU_KINDS, "gpu_annotation"])
    frame = pd.DataFrame({"r": rank_a, "g": is_gpu_track, "d": dev_a, "s": stream_a})
    lane_a = np.zeros(n, np.int64)
    for _k, idx in frame.groupby(["r", "g", "d", "s"], sort=False).indices.items():
        lane_a[idx] = _nested_lanes(start_a[idx], end_a[idx])
    keys = frame.assign(lanes=lane_a).groupby(["r", "g", "d", "s"], sort=True)["lanes"].max().reset_index()
    for r, g, d, s, lanes in keys.itertuples(index=False):
        for k in range(int(lanes) + 1):
            more = "" if k == 0 else f" ({k + 1})"
            if g:
                tracks[int(r)].get(("gpu", int(d), int(s), k), f"GPU {int(d)} stream {int(s)}{more}")
            else:
                tracks[int(r)].get(("host", int(s), k), f"host thread {int(s)}{more}")
    view["lanes"] = int(sum(int(x) for x in keys["lanes"]))
    tid_a = np.zeros(n, np.int64)

    for i in range(n):
        r = int(rank_a[i])
        k = int(lane_a[i])
        key = (
            ("gpu", int(dev_a[i]), int(stream_a[i]), k) if is_gpu_track[i] else ("host", int(stream_a[i]), k)
        )
        tid_a[i] = tracks[r].tid[key]
        args: ExportArgs = {
            "rank": r,
            "device": int(dev_a[i]),
            "stream": int(stream_a[i]),
            "correlation": int(corr_a[i]),
            "kind": str(kind_a[i]),
            "class": str(cls_a[i]),
            "subclass": str(sub_a[i]),
        }
        if has_coll[i]:
            for c, v in coll_vals.items():
                x = v[i]
                if (c in coll_str and x != "") or (c not in coll_str and x != -1):
                    args[c] = str(x) if c in coll_str else int(x)
        out.append(
            {
                "ph": "X",
                "cat": CAT_OF_KIND.get(str(kind_a[i]), "other"),
                "name": str(name_a[i]),
                "pid": r,
                "tid": int(tid_a[i]),
                "ts": _us(int(start_a[i]) - base),
                "dur": _us(int(end_a[i] - start_a[i])),
                "args": args,
            }
        )

    def slices(
        r: int, track: str, items: Iterable[tuple[int, int, str, str, ExportArgs]], lanes: bool = True
    ) -> list[ChromeEvent]:
        """X events on a tracekit track of rank r (split into lanes where they would overlap)."""
        items = list(items)
        if not items:
            return []
        st = np.array([it[0] for it in items], np.int64)
        en = np.array([it[1] for it in items], np.int64)
        lane = _lanes(st, en) if lanes else np.zeros(len(items), np.int64)
        made: list[ChromeEvent] = []
        for (s, e, name, cat, args), k in zip(items, lane.tolist(), strict=True):
            label = track if k == 0 else f"{track} ({k + 1})"
            made.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": r,
                    "tid": tracks[r].get(("tk", track, k), label),
                    "ts": _us(s - base),
                    "dur": _us(e - s),
                    "args": args,
                }
            )
        return made

    # steps, with their partition
    steps_table = parts.steps if parts is not None else _steps_only(classified, step_pattern)
    view["steps"] = 0
    for r in ranks:
        g = steps_table[steps_table["rank"] == r]
        items: list[tuple[int, int, str, str, ExportArgs]] = []
        for row in g.itertuples(index=False):
            a: ExportArgs = {"step": int(row.step), "window_ns": int(row.window_ns), "name": str(row.name)}
            a.update({f"{p}_ns": int(getattr(row, f"{p}_ns")) for p in PARTS})
            for extra in ("wait_ns", "transfer_ns", "overlapped_collective_ns"):
                if hasattr(row, extra):
                    a[extra] = int(getattr(row, extra))
            items.append((int(row.start_ns), int(row.end_ns), f"step {int(row.step)}", "tracekit.step", a))
        made = slices(r, "tracekit: steps", items)
        view["steps"] += len(made)
        out.extend(made)

    # the class of every GPU interval, one class track per GPU stream
    gpu = np.isin(kind_a, GPU_KINDS) & (dev_a >= 0)
    view["class"] = 0
    for r in ranks:
        sel = np.flatnonzero(gpu & (rank_a == r))
        by_stream: dict[tuple[int, int], list[tuple[int, int, str, str, ExportArgs]]] = {}
        for i in sel.tolist():
            by_stream.setdefault((int(dev_a[i]), int(stream_a[i])), []).append(
                (
                    int(start_a[i]),
                    int(end_a[i]),
                    str(cls_a[i]),
                    f"tracekit.class.{cls_a[i]}",
                    {"subclass": str(sub_a[i]), "kernel": str(name_a[i])},
                )
            )
        for (d, s), items in sorted(by_stream.items()):
            made = slices(r, f"tracekit: class, GPU {d} stream {s}", items)
            view["class"] += len(made)
            out.extend(made)

    # the profiler's launch -> GPU operation links (Kineto's `ac2g` flows, from the correlation id
    # every reader keeps): one arrow from the runtime call (the earliest of the rank's calls with
    # that id) to each kernel, copy or set it launched (a graph launch has several)
    flow_id = 0
    view["ac2g"] = 0
    for r in ranks:
        on = rank_a == r
        rt = np.flatnonzero(on & (kind_a == "runtime") & (corr_a > 0))
        rt = rt[np.lexsort((start_a[rt], corr_a[rt]))]
        first: dict[int, int] = {}
        for i in rt.tolist():
            first.setdefault(int(corr_a[i]), int(i))
        for j in np.flatnonzero(on & np.isin(kind_a, GPU_KINDS) & (corr_a > 0)).tolist():
            launch = first.get(int(corr_a[j]))
            if launch is None:
                continue
            i = launch
            flow_id += 1
            out.append(
                {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": flow_id, "pid": r, "tid": int(tid_a[i]),
                 "ts": _us(int(start_a[i]) - base)}
            )  # fmt: skip
            out.append(
                {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": flow_id, "pid": r, "tid": int(tid_a[j]),
                 "ts": _us(int(start_a[j]) - base), "bp": "e"}
            )  # fmt: skip
            view["ac2g"] += 1

    view["wait"] = view["transfer"] = view["collectives"] = view["flows"] = view["path"] = 0
    if parts is not None and len(parts.collectives.per_rank):
        pr = parts.collectives.per_rank
        for r in ranks:
            g = pr[pr["rank"] == r]
            items = []
            for row in g.itertuples(index=False):
                s, e = int(row.raw_start_ns), int(row.raw_end_ns)
                a_ = max(min(int(row.arrival_raw_ns), e), s)
                common: ExportArgs = {
                    "instance": int(row.instance),
                    "op": str(row.op),
                    "group": str(row.group),
                }
                items.append(
                    (
                        s,
                        e,
                        f"{row.op} #{int(row.instance)}",
                        "tracekit.collective",
                        {**common, "wait_ns": a_ - s, "transfer_ns": e - a_, "in_bytes": int(row.in_bytes)},
                    )
                )
            made = slices(r, "tracekit: collectives", items)
            # the wait / transfer pieces nest inside their collective's slice, on its lane
            pieces: list[ChromeEvent] = []
            for m, row in zip(made, g.itertuples(index=False), strict=True):
                s, e = int(row.raw_start_ns), int(row.raw_end_ns)
                a_ = max(min(int(row.arrival_raw_ns), e), s)
                for lo, hi, what in ((s, a_, "wait"), (a_, e, "transfer")):
                    if hi > lo:
                        pieces.append(
                            {
                                **m,
                                "name": what,
                                "cat": f"tracekit.collective.{what}",
                                "ts": _us(lo - base),
                                "dur": _us(hi - lo),
                                "args": {"instance": int(row.instance), "op": str(row.op)},
                            }
                        )
                        view[what] += 1
            view["collectives"] += len(made)
            out.extend(made)
            out.extend(pieces)
        # flow arrows: one chain per instance over its ranks, in the order they started
        tid_of = {
            (int(m["pid"]), int(m["args"]["instance"])): (m["tid"], m["ts"])
            for m in out
            if m.get("cat") == "tracekit.collective"
        }
        for inst, g in pr.groupby("instance", sort=True):
            members = [
                (tid_of[(int(r), int(inst))][1], int(r)) for r in g["rank"] if (int(r), int(inst)) in tid_of
            ]
            if len(members) < 2:
                continue
            members.sort()
            flow_id += 1
            for k, (ts, r) in enumerate(members):
                ph = "s" if k == 0 else ("f" if k == len(members) - 1 else "t")
                fe: ChromeEvent = {
                    "ph": ph,
                    "cat": "tracekit.flow.collective",
                    "name": f"{g['op'].iloc[0]} #{int(inst)}",
                    "id": flow_id,
                    "pid": r,
                    "tid": tid_of[(r, int(inst))][0],
                    "ts": ts,
                }
                if ph != "s":
                    fe["bp"] = "e"
                out.append(fe)
                view["flows"] += 1

    # the critical path: its pieces on each rank, with an arrow where it changes rank
    if parts is not None and len(parts.critical.segments):
        seg = parts.critical.segments.reset_index(drop=True)
        # the track (lane) each segment's slice went to: one rank's pieces of consecutive steps
        # can overlap (a step's path can start on a rank before that rank's own window does, at
        # another rank's step start on the aligned clock), and an arrow binds to its own slice
        seg_tid: dict[int, int] = {}
        for r in ranks:
            g = seg[seg["rank"] == r]
            items = [
                (
                    int(x.start_ns),
                    int(x.end_ns),
                    f"critical path: {x.piece}",
                    f"tracekit.critical_path.{x.piece}",
                    {"step": int(x.step), "piece": str(x.piece), "instance": int(x.instance)},
                )
                for x in g.itertuples(index=False)
            ]
            made = slices(r, "tracekit: critical path", items)
            seg_tid.update(zip(g.index.tolist(), (int(m["tid"]) for m in made), strict=True))
            view["path"] += len(made)
            out.extend(made)
        for _st, g in seg.groupby("step", sort=True):
            rows = list(g.itertuples(index=True))  # backward in time
            for later, earlier in zip(rows, rows[1:], strict=False):
                if int(later.rank) == int(earlier.rank):
                    continue
                flow_id += 1
                for ph, x, ts in (("s", earlier, int(earlier.end_ns) - 1), ("f", later, int(later.start_ns))):
                    fe = {
                        "ph": ph,
                        "cat": "tracekit.flow.critical_path",
                        "name": "critical path",
                        "id": flow_id,
                        "pid": int(x.rank),
                        "tid": seg_tid[int(x.Index)],
                        "ts": _us(max(ts, int(x.start_ns)) - base),
                    }
                    if ph == "f":
                        fe["bp"] = "e"
                    out.append(fe)
                    view["flows"] += 1

    # metadata: process and thread names, sort order
    meta: list[ChromeEvent] = []
    for r in ranks:
        meta.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for t, label in tracks[r].names.items():
            meta.append({"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": label}})
            meta.append(
                {"ph": "M", "name": "thread_sort_index", "pid": r, "tid": t, "args": {"sort_index": t}}
            )

    rank_info = {str(r): _jsonable(run.rank_info.get(r, {})) for r in ranks}
    reader_keys = (
        "source",
        "reader",
        "rank_source",
        "events_total",
        "events_kept",
        "json_bytes",
        "file_bytes",
    )
    for info in rank_info.values():
        for reader_key in reader_keys:
            info.pop(reader_key, None)
    summary.notes = notes
    doc: ExportObject = {
        "tracekitExport": {
            "format": FORMAT,
            "version": VERSION,
            "base_ns": base,
            "sources": {str(r): run.sources.get(r, "") for r in ranks},
            "ranks": rank_info,
            "view": dict(view),
            "notes": notes,
        },
        "displayTimeUnit": "ns",
        "traceEvents": meta + out,
    }
    return doc, summary


def _jsonable(x: Any) -> Any:
    """`x` with what JSON cannot hold (non-finite floats, odd objects) as text."""
    try:
        return orjson.loads(orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))
    except (TypeError, orjson.JSONEncodeError):
        return str(x)


def write_perfetto(
    paths: list[str | os.PathLike[str]] | Run,
    out: str | os.PathLike[str],
    *,
    step_pattern: str | None = None,
    cache: bool = True,
) -> ExportSummary:
    """Read a run (paths, or a Run) and write its export to `out` (gzipped when it ends in .gz)."""
    if isinstance(paths, Run):
        run = paths
    else:
        run = read_run(list(paths), cache=cache)
    doc, summary = perfetto_document(run, step_pattern=step_pattern)
    data = orjson.dumps(doc)
    p = Path(out)
    if p.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    except OSError as exc:
        raise OutputError(f"{p}: cannot write ({exc.strerror or exc})") from None
    summary.path = p
    summary.bytes = len(data)
    return summary
