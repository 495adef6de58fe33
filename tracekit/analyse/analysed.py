"""One run analysed once: its classified events, step windows, their partition and the layer unions.

A report of a TP pair used to classify each run, find its steps and partition them twice (once in
`breakdown`, again in `attribution.plan.attribute_run`), and `critical_path` rebuilt the cumulative layer
unions the partition had just built. `AnalysedRun.of(run)` classifies once; `steps(pattern)`,
`partition(steps)` and `layer_unions()` compute on first use and keep the result, so `breakdown`,
`shortfall` (`attribute_run`), the report and the what-if given the same `AnalysedRun` share them;
a plan's per-rank stages (`tracekit.analyse.plans`) run on `of_rank`, which shares them too.

Partitions are kept per rank by the windows they partition (rank, steps, names, bounds), not by the
pattern that found them: `breakdown`'s auto rule and the shortfall's manifest pattern
(`decode_step`) find the same windows on the reference decoder's traces, and the partition is
computed once. Cached tables are handed out as copies, so a caller cannot change another's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.analyse.timeline.partition import LayerUnions, partition_steps, rank_layer_unions
from tracekit.analyse.timeline.steps import StepsResult, find_steps_detailed
from tracekit.classify import classify
from tracekit.model.events import DataQuality, Run, RunFields


@dataclass(eq=False)
class AnalysedRun(RunFields):
    """A run whose events are classified (`run.events` has `cls`, `subclass`, `rule`), with the
    analyses that depend only on the run kept once computed. Build with `AnalysedRun.of`."""

    run: Run
    _steps: dict[str | None, StepsResult] = field(default_factory=dict, repr=False)
    _partitions: dict[bytes, pd.DataFrame] = field(default_factory=dict, repr=False)
    _unions: dict[int, LayerUnions] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, run: Run | AnalysedRun) -> AnalysedRun:
        """`run` itself when already analysed; else the run with its events classified (once)."""
        if isinstance(run, AnalysedRun):
            return run
        if "cls" in run.events.columns:
            return cls(run=run)

        return cls(run=dataclasses.replace(run, events=classify(run.events)))

    def steps(self, pattern: str | None = None) -> StepsResult:
        """`find_steps_detailed(events, pattern)`, once per pattern (StepError is not kept); the
        windows and counts handed out are copies of the kept ones."""
        found = self._steps.get(pattern)
        if found is None:
            found = find_steps_detailed(self.events, pattern)
            self._steps[pattern] = found
        return dataclasses.replace(
            found, steps=found.steps.copy(), data_quality=DataQuality().merge(found.data_quality)
        )

    def layer_unions(self, ranks: list[int] | None = None) -> dict[int, LayerUnions]:
        """Each rank's cumulative layer unions (`steps.layer_unions`), built once per rank."""
        want = [int(r) for r in (self.ranks if ranks is None else ranks)]
        missing = [r for r in want if r not in self._unions]
        if missing:
            self._unions.update(rank_layer_unions(self.events, missing))
        return {r: self._unions[r] for r in want}

    def partition(self, steps: pd.DataFrame) -> pd.DataFrame:
        """`partition_steps(events, steps)`, each rank's rows once per set of that rank's windows
        (so a plan's per-rank stage and a run-wide caller share them); a copy of the kept rows."""
        ranks = sorted(int(x) for x in pd.unique(steps["rank"]))
        if not ranks:
            return partition_steps(self.events, steps, {})
        unions = self.layer_unions(ranks)
        s_rank = steps["rank"].to_numpy(np.int64)
        tables = []
        for r in ranks:
            st = steps[s_rank == r]
            key = _windows_key(st)
            table = self._partitions.get(key)
            if table is None:
                table = partition_steps(self.events, st, {r: unions[r]})
                self._partitions[key] = table
            # the windows' own step numbers (a plan's rank stage numbers them by order on the
            # rank, the run's assembly by the run's tokens: the same windows, one partition)
            table = table.assign(step=st["step"].to_numpy(np.int64))
            tables.append(table)
        return tables[0].copy() if len(tables) == 1 else pd.concat(tables, ignore_index=True)

    def of_rank(self, rank: int, events: pd.DataFrame) -> AnalysedRun:
        """The AnalysedRun of one rank's rows (`events`, this run's) sharing this run's kept layer
        unions and partitions (a plan's per-rank stages run on it)."""
        return AnalysedRun(
            run=dataclasses.replace(self.run, events=events),
            _unions=self._unions,
            _partitions=self._partitions,
        )


def _windows_key(steps: pd.DataFrame) -> bytes:
    """A digest of the windows a partition depends on: rank, name, start, end (and dtypes); not
    the step numbers, which the partition only copies."""
    h = hashlib.sha256()
    for col in ("rank", "start_ns", "end_ns"):
        arr = np.ascontiguousarray(steps[col].to_numpy())
        h.update(f"{col}:{arr.dtype}:{len(arr)};".encode())
        h.update(arr.tobytes())
    h.update("\0".join(str(n) for n in steps["name"]).encode("utf-8", "surrogatepass"))
    return h.digest()
