"""The Python API, for notebooks (the way HTA users work): load a run, look at its event table, its
steps, its breakdown, and the shortfall of a sharded run against its baseline.

    import tracekit as tk
    run = tk.load("traces/cpu-tp2")        # a run folder, one trace file, Kineto JSON(.gz), nsys SQLite
    run.events                             # the event table (pandas; tracekit.model.events.COLUMNS)
    run.steps().to_frame()                 # one row per (rank, step): the step windows
    run.breakdown().to_frame()             # per (rank, step): compute / memory / collective / ... ns
    tk.shortfall("traces/cpu-tp1", run).to_frame()   # S = TN - T1/N and where it goes

Every result is a frozen dataclass with `to_json()` (the document `tracekit <command> --format json`
prints, docs/JSON.md) and `to_frame()` (a pandas table). Nothing here analyses anything: it calls
`tracekit.read.read_run`, `tracekit.classify.classify`, `tracekit.analyse.timeline.steps.find_steps_detailed`,
`tracekit.analyse.timeline.breakdown.breakdown` and `tracekit.analyse.attribution.pair.shortfall`, the functions the
CLI calls; a loaded run is analysed once (`TraceRun.analysed`, tracekit.analyse.analysed: classified,
its steps found and partitioned once) and that is shared by its steps, breakdown and shortfall.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import cached_property

import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.result import Shortfall
from tracekit.analyse.dilation import DEFAULT_THRESHOLD
from tracekit.analyse.timeline.breakdown import Breakdown
from tracekit.model.documents.base import Documented
from tracekit.model.documents.steps import Steps as StepsDoc
from tracekit.model.documents.steps import StepWindow
from tracekit.model.events import DataQuality, Run, RunFields

__all__ = ["Breakdown", "Shortfall", "Steps", "TraceRun", "load", "shortfall"]

PathLike = str | os.PathLike[str]

STEPS_KIND = "tracekit.steps"
STEPS_SCHEMA_VERSION = "1.0"


@dataclass(frozen=True)
class Steps(Documented):
    """The step windows of a run, as `find_steps_detailed` found them.

    `table`: one row per (rank, step), columns `tracekit.analyse.timeline.steps.STEP_COLUMNS` (integer ns on
    each rank's clock); `step_pattern`: the pattern that found them; `step_rule`: the rule that chose
    it (decode_step, profiler_step, serving_engine, graph_launch, repeated_range, whole, pattern)."""

    table: pd.DataFrame
    step_pattern: str
    step_rule: str
    data_quality: DataQuality

    def to_frame(self) -> pd.DataFrame:
        """The windows, one row per (rank, step), with `window_ns` = end_ns - start_ns, then
        `start_ms` / `end_ms` (ms from the run's first step start) and `window_ms`."""
        from tracekit.analyse.timeline.breakdown import with_relative_ms

        out = self.table.reset_index(drop=True).copy()
        out["window_ns"] = out["end_ns"] - out["start_ns"]
        return with_relative_ms(out)

    def __repr__(self) -> str:
        ranks = sorted({int(r) for r in self.table["rank"]}) if len(self.table) else []
        return (
            f"Steps({len(self.table)} windows on ranks {ranks}, rule {self.step_rule}, "
            f"pattern {self.step_pattern!r})"
        )

    def document(self) -> StepsDoc:
        """The step windows as their document (`tracekit.model.documents.steps`, docs/JSON.md#steps)."""
        return StepsDoc(
            schema_version=STEPS_SCHEMA_VERSION,
            kind=STEPS_KIND,
            step_pattern=self.step_pattern,
            step_rule=self.step_rule,
            steps=[
                StepWindow(
                    rank=int(r.rank),
                    step=int(r.step),
                    name=str(r.name),
                    start_ns=int(r.start_ns),
                    end_ns=int(r.end_ns),
                )
                for r in self.table.itertuples(index=False)
            ],
            data_quality=self.data_quality.document(),
        )


@dataclass(frozen=True, eq=False)
class TraceRun(RunFields):
    """One loaded run: every rank's events in one table, read once, classified once (on first use).

    `run` is the reader's `tracekit.model.events.Run` (sources, rank_info, manifest, data_quality);
    `paths` what was loaded."""

    run: Run
    paths: tuple[str, ...]

    @cached_property
    def classified(self) -> pd.DataFrame:
        """The event table plus `cls`, `subclass` and `rule` (tracekit.classify), computed once."""
        from tracekit.classify import classify

        return classify(self.run.events)

    @cached_property
    def _classified_run(self) -> Run:
        return dataclasses.replace(self.run, events=self.classified)

    @cached_property
    def analysed(self) -> AnalysedRun:
        """The run analysed once (tracekit.analyse.analysed): the classified events, and the step
        windows, their partition and the per-rank layer unions as first computed, shared by
        `steps()`, `breakdown()` and `tk.shortfall`."""
        return AnalysedRun(run=self._classified_run)

    def steps(self, step_pattern: str | None = None) -> Steps:
        """The step windows (`--steps`: None/"auto", "whole", or a regex of step annotations)."""
        found = self.analysed.steps(step_pattern)
        return Steps(
            table=found.steps,
            step_pattern=found.pattern,
            step_rule=found.rule,
            data_quality=DataQuality().merge(found.data_quality),
        )

    def breakdown(
        self, step_pattern: str | None = None, skip_first: int = 0, *, rank: int | None = None
    ) -> Breakdown:
        """`tracekit breakdown`: every step split into compute, memory, collective, unknown, sync
        and idle per rank. `to_json()` is what `tracekit breakdown --format json` prints."""
        from tracekit.analyse.timeline.breakdown import breakdown

        return breakdown(self.analysed, step_pattern=step_pattern, skip_first=skip_first, rank=rank)

    def __repr__(self) -> str:
        n = len(self.run.events)
        return f"TraceRun({', '.join(self.paths)}: ranks {self.ranks}, {n} events)"


def load(*paths: PathLike, rank: int | None = None, cache: bool = True, progress: bool = False) -> TraceRun:
    """Read a run: any input the CLI takes (a run folder of rank files, one trace file, Kineto JSON
    or .json.gz, Nsight Systems .sqlite / .nsys-rep, several of these). `rank` reads a single trace
    file as that rank. Raises the readers' errors (NoTracesError, RankError, TraceFormatError)."""
    from tracekit.read import read_run

    if not paths:
        from tracekit.errors import NoTracesError

        raise NoTracesError("no trace paths given: tk.load('traces/cpu-tp2')")
    run = read_run(list(paths), rank=rank, cache=cache, progress=progress)
    return TraceRun(run=run, paths=tuple(str(p) for p in paths))


def _as_run(x: TraceRun | PathLike) -> TraceRun:
    return x if isinstance(x, TraceRun) else load(x)


def shortfall(
    baseline: TraceRun | PathLike,
    sharded: TraceRun | PathLike,
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float = DEFAULT_THRESHOLD,
    allow_partial: bool = False,
) -> Shortfall:
    """`tracekit shortfall`: where the per-token shortfall S = TN - T1/N of `sharded` against
    `baseline` goes (loaded runs or paths). `to_json()` is what `tracekit shortfall --format json`
    prints; `to_frame()` the attribution of S, one row per term."""
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.analyse.attribution.pair import shortfall as _shortfall

    options = AttributionOptions(step_pattern, skip_first, dilation_threshold, allow_partial)
    b, s = _as_run(baseline), _as_run(sharded)
    return _shortfall(b.analysed, s.analysed, options)
