"""The per-step breakdown of a run: classify, find steps, partition them, summarise (docs/METHOD.md sections "Classes" and "Steps and the partition").

`breakdown(run)` returns a frozen `Breakdown` (steps chosen by `find_steps_detailed`: `auto` by
default, so a trace without step markers is one window, never a refusal): the per-(rank, step) partition table, a per-token
summary (per step index the slowest rank's window and that rank's parts; median, p10, p90, mean
over steps), a per-rank summary, GPU time by class and subclass, the unknown kernels, data quality
and the capture's dilation. `to_json()` is the documented contract docs/JSON.md#breakdown;
`to_csv()` has one row per rank and step.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from msgspec import UNSET

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.dilation import DILATION_BOUNDS, plausible_dilation
from tracekit.analyse.display import breakdown_html, breakdown_repr
from tracekit.analyse.timeline.compute_split import compute_split
from tracekit.analyse.timeline.kinds import kinds_summary, token_steps
from tracekit.analyse.timeline.partition import PARTITION_COLUMNS, cat_mask, partition_steps, rank_selectors
from tracekit.analyse.timeline.steps import StepsResult
from tracekit.analyse.timeline.trace_totals import assemble_trace_totals, rank_trace_totals
from tracekit.classify import classify
from tracekit.classify.rules import COMM_LIKE_HINT, GPU_KINDS
from tracekit.errors import StepError
from tracekit.model.documents import breakdown as doc
from tracekit.model.documents.base import Documented, given
from tracekit.model.documents.manifest import Manifest
from tracekit.model.events import DataQuality, Run
from tracekit.model.fields import copy_fields
from tracekit.model.parts import PARTS

SCHEMA_VERSION = "1.0"
KIND = "tracekit.breakdown"

#: The classes GPU activity can have (kernels_by_class always lists all four).
GPU_CLASSES: tuple[str, ...] = ("compute", "memory", "collective", "unknown")
UNKNOWN_TOP = 20

CSV_COLUMNS: tuple[str, ...] = PARTITION_COLUMNS


@dataclass(frozen=True)
class Breakdown(Documented):
    """Result of `breakdown`. Times are integer ns."""

    steps: pd.DataFrame  # one row per (rank, step): see CSV_COLUMNS
    step_pattern: str  # the pattern that found the steps
    per_token: doc.BreakdownPerToken  # step_ns {median, p10, p90, mean, n}, parts_ns {part: {...}}, ...
    per_rank: list[doc.BreakdownPerRankItem]  # per rank: steps, step_ns_median, parts_ns_median, timeline
    kernels_by_class: dict[str, dict[str, int]]  # class -> {count, total_ns} over GPU activity
    kernels_by_subclass: dict[str, dict[str, int]]  # subclass -> {count, total_ns}
    unknown_kernels: list[doc.BreakdownUnknownKernel]  # top UNKNOWN_TOP by total_ns: {name, count, total_ns}
    data_quality: DataQuality
    dilation: float | None  # from the capture manifest, when there is one
    paths: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    skipped_steps: int = 0  # per rank, from skip_first
    step_rule: str = "pattern"  # which rule chose the steps (tracekit.analyse.timeline.steps.STEP_RULES)
    #: whole-trace busy / idle: see trace_totals()
    trace_totals: doc.BreakdownTraceTotals = field(default_factory=lambda: assemble_trace_totals({}))
    #: per step kind and batch size (serving engines' step names; `steps.kinds_summary`), [] otherwise
    step_kinds: list[doc.BreakdownStepKind] = field(default_factory=list)
    #: GPU collectives by what classified them: {"launch_op" | "name": {count, total_ns}}
    collectives_by_source: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def timeline(self) -> str:
        """'gpu', 'host', or 'mixed' when some ranks have GPU activity and others not."""
        kinds = sorted(set(self.steps["timeline"])) if len(self.steps) else ["gpu"]
        return kinds[0] if len(kinds) == 1 else "mixed"

    def document(self) -> doc.Breakdown:
        """The document of docs/JSON.md#breakdown."""
        steps_out = [
            doc.BreakdownStep(
                rank=int(row.rank),
                step=int(row.step),
                name=str(row.name),
                start_ns=int(row.start_ns),
                window_ns=int(row.window_ns),
                parts_ns={p: int(getattr(row, f"{p}_ns")) for p in PARTS},
                compute_split_ns=doc.BreakdownComputeSplitNs(
                    matrix=int(row.matrix_ns), vector=int(row.vector_ns)
                ),
                overlapped_collective_ns=int(row.overlapped_collective_ns),
                timeline=str(row.timeline),
            )
            for row in self.steps.itertuples(index=False)
        ]
        # per_token, per_rank, unknown_kernels, trace_totals, dilation: the result's own
        return copy_fields(
            doc.Breakdown,
            self,
            schema_version=SCHEMA_VERSION,
            kind=KIND,
            source=copy_fields(
                doc.BreakdownSource,
                self,
                paths=list(self.paths),
                ranks=list(self.ranks),
                skipped_steps_per_rank=self.skipped_steps,
            ),
            steps=steps_out,
            kernels_by_class=_counted(self.kernels_by_class),
            kernels_by_subclass=_counted(self.kernels_by_subclass),
            collectives_by_source=_counted(self.collectives_by_source),
            data_quality=self.data_quality.document(),
            step_kinds=self.step_kinds or UNSET,
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per (rank, step): the JSON's `steps` as a table (CSV_COLUMNS, then the compute
        split `matrix_ns`, `vector_ns`; integer ns), then `start_ms` (the step's start in ms from the
        run's first step start, instead of the clock's epoch) and `window_ms`."""
        out = self.steps.loc[:, [*CSV_COLUMNS, "matrix_ns", "vector_ns"]].reset_index(drop=True).copy()
        return with_relative_ms(out)

    def __repr__(self) -> str:
        return breakdown_repr(self)

    def _repr_html_(self) -> str:
        return breakdown_html(self)

    def to_csv(self) -> str:
        """One row per rank and step, columns CSV_COLUMNS."""
        buf = io.StringIO()
        self.steps.loc[:, list(CSV_COLUMNS)].to_csv(buf, index=False)
        return buf.getvalue()


def _counted(by: dict[str, dict[str, int]]) -> dict[str, doc.BreakdownKernelsByClassValue]:
    return {
        k: doc.BreakdownKernelsByClassValue(count=v["count"], total_ns=v["total_ns"]) for k, v in by.items()
    }


def with_relative_ms(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` plus `start_ms` / `end_ms` (ms from the earliest `start_ns` of the frame: a notebook
    reads "12.3 ms into the run", not an epoch in ns) and `window_ms`, for the columns it has."""
    if "start_ns" not in frame.columns or frame.empty:
        return frame
    t0 = int(frame["start_ns"].min())
    frame["start_ms"] = (frame["start_ns"] - t0) / 1e6
    if "end_ns" in frame.columns:
        frame["end_ms"] = (frame["end_ns"] - t0) / 1e6
    if "window_ns" in frame.columns:
        frame["window_ms"] = frame["window_ns"] / 1e6
    return frame


def _stats(values: np.ndarray) -> doc.BreakdownPartsNsValue:
    """median, p10, p90, mean of integer ns values (rounded to integer ns); None when empty."""
    if not len(values):
        return doc.BreakdownPartsNsValue(median=None, p10=None, p90=None, mean=None)
    v = values.astype(np.float64)
    return doc.BreakdownPartsNsValue(
        median=int(round(float(np.median(v)))),
        p10=int(round(float(np.percentile(v, 10)))),
        p90=int(round(float(np.percentile(v, 90)))),
        mean=int(round(float(v.mean()))),
    )


def _stats_n(values: np.ndarray) -> doc.BreakdownStepNs:
    """`_stats` and the number of values."""
    st = _stats(values)
    return doc.BreakdownStepNs(median=st.median, p10=st.p10, p90=st.p90, mean=st.mean, n=int(len(values)))


def per_token_summary(steps: pd.DataFrame) -> doc.BreakdownPerToken:
    """Per step index: the step time is the longest window over ranks; each part is the mean over
    the ranks that have the step of that rank's part, a rank's window padded to the step time with
    idle (docs/METHOD.md section Steps and the partition: a step's parts are never taken from whichever rank had the longest window,
    so a tie of microseconds decides nothing). Stats over step indices; `slowest_rank_counts`
    says how often each rank had the longest window (information only)."""
    if not len(steps):
        return doc.BreakdownPerToken(
            step_ns=_stats_n(np.empty(0)),
            parts_ns={p: _stats(np.empty(0)) for p in PARTS},
            overlapped_collective_ns=_stats(np.empty(0)),
            slowest_rank_counts={},
        )
    order = steps.sort_values(["step", "window_ns", "rank"], ascending=[True, False, True], kind="stable")
    slowest = order.drop_duplicates("step", keep="first")
    counts = slowest["rank"].value_counts().sort_index()
    step_ns = steps.groupby("step")["window_ns"].transform("max")
    padded = steps.assign(idle_ns=steps["idle_ns"] + (step_ns - steps["window_ns"]))
    cols = [f"{p}_ns" for p in PARTS] + ["overlapped_collective_ns"]
    mean = padded.groupby("step", sort=True)[cols].mean()
    return doc.BreakdownPerToken(
        step_ns=_stats_n(slowest["window_ns"].to_numpy(np.int64)),
        parts_ns={p: _stats(mean[f"{p}_ns"].to_numpy(np.float64)) for p in PARTS},
        overlapped_collective_ns=_stats(mean["overlapped_collective_ns"].to_numpy(np.float64)),
        slowest_rank_counts={str(int(r)): int(c) for r, c in counts.items()},
        parts_rule="mean over ranks, each rank's window padded to the step time with idle",
    )


def per_rank_summary(steps: pd.DataFrame) -> list[doc.BreakdownPerRankItem]:
    return [
        doc.BreakdownPerRankItem(
            rank=int(r),  # type: ignore[call-overload]
            steps=int(len(g)),
            timeline=str(g["timeline"].iloc[0]),
            step_ns_median=_stats(g["window_ns"].to_numpy(np.int64)).median,
            parts_ns_median={p: _stats(g[f"{p}_ns"].to_numpy(np.int64)).median for p in PARTS},
            overlapped_collective_ns_median=_stats(g["overlapped_collective_ns"].to_numpy(np.int64)).median,
        )
        for r, g in steps.groupby("rank", sort=True)
    ]


def gpu_time_by(events: pd.DataFrame, column: str) -> dict[str, dict[str, int]]:
    """Count and summed duration of GPU activity (kernel, memcpy, memset) per value of a categorical
    `column` (grouped on the category codes: no per-event strings)."""
    gpu = cat_mask(events["kind"], GPU_KINDS)
    out: dict[str, dict[str, int]] = {}
    if column == "cls":
        out = {c: {"count": 0, "total_ns": 0} for c in GPU_CLASSES}
    col = events[column]
    if not isinstance(col.dtype, pd.CategoricalDtype):
        col = col.astype("category")
    codes = col.cat.codes.to_numpy()[gpu]
    dur = events["end_ns"].to_numpy(np.int64)[gpu] - events["start_ns"].to_numpy(np.int64)[gpu]
    ok = codes >= 0
    n_cats = len(col.cat.categories)
    counts = np.bincount(codes[ok], minlength=n_cats)
    totals = np.zeros(n_cats, dtype=np.int64)
    np.add.at(totals, codes[ok], dur[ok])
    for i, cat in enumerate(col.cat.categories):
        if counts[i]:
            out[str(cat)] = {"count": int(counts[i]), "total_ns": int(totals[i])}
    return dict(sorted(out.items())) if column != "cls" else out


def _unknown_gpu_mask(events: pd.DataFrame) -> np.ndarray:
    """GPU activity (kernel, memcpy, memset) that no rule classified."""
    return cat_mask(events["kind"], GPU_KINDS) & cat_mask(events["cls"], ("unknown",))


def unknown_kernel_table(events: pd.DataFrame, top: int = UNKNOWN_TOP) -> pd.DataFrame:
    """GPU activity no rule matched, per name: count and total_ns, largest total first."""
    return top_unknown([_unknown_names(events)], top)


def _unknown_names(events: pd.DataFrame) -> pd.DataFrame:
    """Every name of GPU activity no rule matched: name, count, total_ns (in order of first
    appearance)."""
    mask = _unknown_gpu_mask(events)
    names = events["name"]
    dur = events["end_ns"].to_numpy(np.int64)[mask] - events["start_ns"].to_numpy(np.int64)[mask]
    if isinstance(names.dtype, pd.CategoricalDtype):  # names from the codes: one string per distinct name
        cats = np.asarray(names.cat.categories.astype(str), dtype=object)
        codes = names.cat.codes.to_numpy()[mask]
        name_arr = np.where(codes >= 0, cats[np.maximum(codes, 0)] if len(cats) else "", "")
    else:
        name_arr = names.astype(str).to_numpy()[mask]
    frame = pd.DataFrame({"name": name_arr, "dur": dur})
    agg = frame.groupby("name", sort=False)["dur"].agg(["count", "sum"]).rename(columns={"sum": "total_ns"})
    return agg.reset_index()


def top_unknown(tables: list[pd.DataFrame], top: int = UNKNOWN_TOP) -> pd.DataFrame:
    """The unknown names of several ranks (`_unknown_names`, in rank order) together: count and
    total_ns summed per name, largest total first (ties: first appearance), the first `top`."""
    agg = _sum_unknown(tables)
    agg = agg.sort_values(["total_ns", "count"], ascending=False, kind="stable").head(top)
    return agg.reset_index(drop=True)


def _sum_unknown(tables: list[pd.DataFrame]) -> pd.DataFrame:
    frame = (
        pd.concat(tables, ignore_index=True)
        if tables
        else pd.DataFrame(columns=["name", "count", "total_ns"])
    )
    if not len(frame):
        return pd.DataFrame(
            {
                "name": np.zeros(0, dtype=object),
                "count": np.zeros(0, np.int64),
                "total_ns": np.zeros(0, np.int64),
            }
        )
    agg = frame.groupby("name", sort=False)[["count", "total_ns"]].sum()
    return agg.reset_index()


def manifest_dilation(manifest: Manifest | None, dq: DataQuality) -> float | None:
    """The manifest's `dilation` when it is a plausible number; else None, with a data-quality note
    when its `dilation` is a number out of bounds (one that is not a number the reader left out and
    noted, `manifest_field_malformed`; never raises)."""
    value = given(manifest.dilation) if manifest is not None else None
    if value is None:
        return None
    d = plausible_dilation(value)
    if d is not None:
        return d
    lo, hi = DILATION_BOUNDS
    dq.add(
        "manifest_dilation_not_a_number",
        1,
        f"the capture manifest's dilation is {str(value)[:40]!r}, not a number from {lo:g} to {hi:g}: it was "
        "ignored (no dilation)",
    )
    return None


@dataclass
class RankEvents:
    """One rank's share of the breakdown's event figures (small): GPU time by class and subclass
    (`gpu_time_by`), its unknown names (`_unknown_names`), its whole-trace totals."""

    rank: int
    by_class: dict[str, dict[str, int]]
    by_subclass: dict[str, dict[str, int]]
    unknown: pd.DataFrame
    totals: doc.BreakdownRanksValue | None
    #: GPU collectives by the source that classified them (`decided_by`: launch_op | name)
    collectives_by_source: dict[str, dict[str, int]] = field(default_factory=dict)


def collectives_by_source(events: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Count and time of the GPU collectives per `decided_by` (the launching op or the name rules,
    `tracekit.classify`); {} when the table has no `decided_by` column."""
    if "decided_by" not in events.columns:
        return {}
    return gpu_time_by(events[cat_mask(events["cls"], ("collective",))], "decided_by")


def rank_events(events: pd.DataFrame, rank: int) -> RankEvents:
    """`RankEvents` of one rank's classified events."""
    return RankEvents(
        rank=int(rank),
        by_class=gpu_time_by(events, "cls"),
        by_subclass=gpu_time_by(events, "subclass"),
        unknown=_unknown_names(events),
        totals=rank_trace_totals(events),
        collectives_by_source=collectives_by_source(events),
    )


def _sum_by(
    dicts: Iterable[dict[str, dict[str, int]]], start: Iterable[str] = ()
) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {k: {"count": 0, "total_ns": 0} for k in start}
    for d in dicts:
        for k, v in d.items():
            t = out.setdefault(k, {"count": 0, "total_ns": 0})
            t["count"] += v["count"]
            t["total_ns"] += v["total_ns"]
    return out


def rank_breakdown_table(
    ar: AnalysedRun | pd.DataFrame, steps: pd.DataFrame, skip_first: int
) -> tuple[pd.DataFrame, int]:
    """The partition table of step windows (`steps`, the first `skip_first` of each rank left
    out) with the compute split; and how many windows were left out. Per rank or per run alike
    (`ar`: an AnalysedRun, or one rank's classified events)."""
    dropped = 0
    if skip_first:
        order_in_rank = steps.groupby("rank").cumcount()
        dropped = int((order_in_rank < skip_first).sum())
        steps = steps[order_in_rank >= skip_first].reset_index(drop=True)
    if not len(steps):
        return pd.DataFrame(columns=[*PARTITION_COLUMNS, "matrix_ns", "vector_ns"]), dropped
    if isinstance(ar, AnalysedRun):
        table, events = ar.partition(steps), ar.events
    else:
        table, events = partition_steps(ar, steps), ar
    table = table.merge(compute_split(events, table), on=["rank", "step"], how="left")  # matrix vs vector
    return table, dropped


def breakdown(
    run: Run | AnalysedRun, step_pattern: str | None = None, skip_first: int = 0, *, rank: int | None = None
) -> Breakdown:
    """Classify the run, find its steps, partition every step window and summarise.

    `skip_first` drops the first N steps of each rank (warm-up) from the table and the summaries;
    `rank` restricts everything to one rank. Raises StepError when no step is found. Given an
    `AnalysedRun` (tracekit.analyse.analysed), its classified events, steps and partition are used
    and kept, so the shortfall of the same run does not compute them again.

    The figures are computed per rank (the step windows under the run's rule, the partition, the
    compute split, `rank_events`) and put together by `assemble_breakdown`: the Dask engine runs
    the per-rank pieces where each rank's events are and the assembly on the client.
    """
    if skip_first < 0:
        raise StepError(f"skip_first must be >= 0, not {skip_first}")
    if rank is not None:
        events = run.events
        events = events[events["rank"] == rank]
        if not len(events):
            have = ", ".join(str(r) for r in run.ranks) or "none"
            raise StepError(f"rank {rank} is not in this run (ranks: {have})")
        if "cls" not in events.columns:
            events = classify(events)
        base = run.run if isinstance(run, AnalysedRun) else run
        ar = AnalysedRun(run=replace(base, events=events))  # this rank's own analyses
    else:
        ar = AnalysedRun.of(run)
    found = ar.steps(step_pattern)
    table, dropped = rank_breakdown_table(ar, found.steps, skip_first)
    events = ar.events
    per_rank = [
        rank_events(events.iloc[sel], r)
        for r, sel in sorted(rank_selectors(events["rank"].to_numpy(np.int64)).items())
    ]
    return assemble_breakdown(
        ar.run, found, table, per_rank, skip_first=skip_first, dropped=dropped, rank=rank
    )


def assemble_breakdown(
    run: Run,
    found: StepsResult,
    table: pd.DataFrame,
    per_rank: Iterable[RankEvents],
    *,
    skip_first: int = 0,
    dropped: int = 0,
    rank: int | None = None,
) -> Breakdown:
    """The Breakdown from the run's metadata (`run`: its sources, manifest and data quality; its
    events are not read), the steps found, the partition table (with the compute split, the
    skipped windows left out) and each rank's `RankEvents`."""
    per_rank = sorted(per_rank, key=lambda x: x.rank)
    dq = DataQuality()
    dq.merge(run.data_quality)
    dq.merge(found.data_quality)
    if skip_first:
        dq.add(
            "skipped_warmup_steps",
            dropped,
            f"the first {skip_first} steps of each rank were skipped (warm-up)",
        )
        if not len(table):
            raise StepError(f"all {dropped} steps were skipped by skip_first={skip_first}")
    table = table.reset_index(drop=True)

    host_ranks = sorted(int(r) for r in table.loc[table["timeline"] == "host", "rank"].unique())
    if host_ranks:
        dq.add(
            "ranks_on_host_timeline",
            len(host_ranks),
            f"rank(s) {', '.join(map(str, host_ranks))} have no GPU activity: their steps are partitioned on "
            "the host timeline (CPU ops = compute, gloo/c10d ops = collective)",
        )
    per_step_counts = table.groupby("step")["rank"].nunique()
    n_ranks = table["rank"].nunique()
    partial = int((per_step_counts < n_ranks).sum())
    if partial:
        dq.add("steps_missing_on_some_ranks", partial, f"{partial} step indices are missing on some ranks")

    names = [x.unknown for x in per_rank]
    all_unknown = _sum_unknown(names)
    n_unknown = int(all_unknown["count"].sum())
    if n_unknown:
        unknown_ns = int(all_unknown["total_ns"].sum())
        n_names = len(all_unknown)
        dq.add(
            "unknown_kernel_events",
            n_unknown,
            f"{n_unknown} GPU events ({n_names} distinct names, {unknown_ns} ns) look like communication but "
            f"match no collective rule: counted as 'unknown', see unknown_kernels. Hint: {COMM_LIKE_HINT}",
        )
    unknown = top_unknown(names)

    dilation = manifest_dilation(run.manifest, dq)
    # a serving engine's steps say their kind: per-token figures from decode steps of one batch size
    tok = token_steps(table)
    per_token = per_token_summary(table if tok is None else table[table["step"].isin(tok.steps)])
    if tok is not None:
        per_token.steps_used = tok.document()
        dq.add("per_token_steps", 0, tok.statement)

    ranks = sorted(int(r) for r in table["rank"].unique())
    # one file can hold several ranks (an nsys report): list each file once
    paths = list(dict.fromkeys(str(run.sources[r]) for r in sorted(run.sources) if rank is None or r == rank))
    return Breakdown(
        steps=table,
        step_pattern=found.pattern,
        per_token=per_token,
        per_rank=per_rank_summary(table),
        kernels_by_class=_sum_by((x.by_class for x in per_rank), GPU_CLASSES),
        kernels_by_subclass=dict(sorted(_sum_by(x.by_subclass for x in per_rank).items())),
        unknown_kernels=[
            doc.BreakdownUnknownKernel(
                name=str(r.name),
                count=int(r.count),  # type: ignore[call-overload]
                total_ns=int(r.total_ns),  # type: ignore[call-overload]
                hint=COMM_LIKE_HINT,
            )
            for r in unknown.itertuples(index=False)
        ],
        data_quality=dq,
        dilation=dilation,
        paths=paths,
        ranks=ranks,
        skipped_steps=skip_first,
        step_rule=found.rule,
        trace_totals=assemble_trace_totals({x.rank: x.totals for x in per_rank}),
        step_kinds=kinds_summary(table),
        collectives_by_source=dict(sorted(_sum_by(x.collectives_by_source for x in per_rank).items())),
    )
