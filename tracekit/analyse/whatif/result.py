"""The what-if's result (`tracekit.analyse.whatif`): `WhatIf`, the predictions of both runs under
the knobs and the Shapley split of S, and its JSON."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from msgspec import UNSET

from tracekit.analyse.retime.model import RunModel
from tracekit.analyse.whatif.knobs import Knob
from tracekit.analyse.whatif.shapley import round_to_sum
from tracekit.model.documents.base import Documented
from tracekit.model.documents.whatif import (
    Whatif,
    WhatifAccounting,
    WhatifBaseline,
    WhatifCheck,
    WhatifKnob,
    WhatifProfilerCorrection,
    WhatifReplayError,
    WhatifResidualPartsNs,
    WhatifRuns,
)

SCHEMA_VERSION = "1.0"


@dataclass(frozen=True)
class SplitRanges:
    """Where the sharded run's profiler cost per rank is not identified: its predictions and the
    Shapley values over the splits of the cost the data allow (`pair.split_ranges`; ns, floor /
    ceil): combination spec -> [lo, hi], knob spec or "residual" -> [lo, hi], how many splits."""

    predicted: dict[str, list[int]]
    shapley: dict[str, list[int]]
    splits: int


@dataclass
class WhatIf(Documented):
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
    accounting: WhatifAccounting | None  # the shortfall's, beside
    check: WhatifCheck | None = None
    #: where the sharded run's profiler cost per rank is not identified: the ranges of its predictions
    #: and of the Shapley values over the splits the data allow (`pair.split_ranges`); else None
    ranges: SplitRanges | None = None

    def runs(self) -> list[RunModel]:
        """The runs replayed: the baseline, then the sharded one when there is one."""
        return [m for m in (self.baseline, self.sharded) if m is not None]

    def replay_error(self, model: RunModel) -> WhatifReplayError:
        """How far `model`'s unchanged replay is from its measured step times (JSON `replay_error`)."""
        key = "baseline" if model is self.baseline else "sharded"
        rep = self.replayed[key]
        meas = model.measured_ns
        per_step = (rep - meas) / meas
        return WhatifReplayError(
            traced_ns=int(round(float(meas.mean()))),
            replayed_ns=int(round(float(rep.mean()))),
            mean=float((rep.mean() - meas.mean()) / meas.mean()),
            max_step=float(np.max(np.abs(per_step))) if len(per_step) else 0.0,
            steps=len(meas),
        )

    def _run_doc(self, m: RunModel) -> WhatifBaseline:
        calibrated = m.correction == "manifest calibration" and m.calibration is not None
        return WhatifBaseline(
            label=m.label,
            ranks=m.n_ranks,
            timeline=m.timeline,
            per_token_ns=int(round(self.measured[m.n_ranks])),
            per_token_source="unprofiled" if m.target_ns is not None else "trace",
            host_cost_per_call_ns=round(m.host_deduct, 1),
            profiler_correction=WhatifProfilerCorrection(
                method=m.correction,
                per_call_ns=m.calibration["per_call_ns"]
                if calibrated and m.calibration is not None
                else UNSET,
            ),
            host_scale=m.host_scale,
            device_scale=m.device_scale,
            replay_error=self.replay_error(m),
        )

    def document(self) -> Whatif:
        """The what-if document (`tracekit.model.documents.whatif`, docs/JSON.md#whatif)."""
        doc = Whatif(
            schema_version=SCHEMA_VERSION,
            kind="tracekit.whatif",
            runs=WhatifRuns(
                baseline=self._run_doc(self.baseline),
                sharded=self._run_doc(self.sharded) if self.sharded is not None else UNSET,
            ),
            knobs=[
                WhatifKnob(
                    spec=k.spec,
                    definition=k.definition,
                    applies={str(m.n_ranks): m.applicable(k) for m in self.runs()},
                )
                for k in self.knobs
            ],
            predicted_ns={
                spec: {str(n): int(round(v)) for n, v in by_n.items()}
                for spec, by_n in self.predicted.items()
            },
            speedup_vs_tp1={
                spec: {
                    str(n): float(self.measured[self.baseline.n_ranks] / v) if v else None
                    for n, v in by_n.items()
                }
                for spec, by_n in self.predicted.items()
            },
            notes=[],
        )
        if self.shapley is not None and self.shortfall_ns is not None and self.ideal_ns is not None:
            n = self.sharded.n_ranks if self.sharded else 1
            s_int = int(round(self.measured[n])) - int(round(self.ideal_ns))
            doc.ideal_ns = int(round(self.ideal_ns))
            doc.shortfall_ns = s_int
            shapley_ns = round_to_sum(self.shapley, s_int)
            doc.shapley_ns = dict(shapley_ns)
            parts = {k: int(round(v)) for k, v in (self.residual_parts or {}).items()}
            doc.residual_parts_ns = WhatifResidualPartsNs(
                after_all_knobs=parts.get("after_all_knobs"), replay_gap=parts.get("replay_gap")
            )
            doc.shapley_shares = {k: (v / s_int if s_int else None) for k, v in shapley_ns.items()}
        if self.ranges is not None and self.sharded is not None:
            # the sharded run's profiler cost per rank is not identified: what the data allow
            doc.identified = False
            n_s = str(self.sharded.n_ranks)
            doc.predicted_ranges_ns = {spec: {n_s: list(v)} for spec, v in self.ranges.predicted.items()}
            doc.shapley_ranges_ns = {k: list(v) for k, v in self.ranges.shapley.items()}
        if self.accounting is not None:
            doc.accounting = self.accounting
        if self.check is not None:
            doc.check = self.check
        notes = [n for m in self.runs() for n in m.notes]
        if self.ranges is not None and self.sharded is not None:
            notes.append(
                f"the profiler's cost per rank of the TP={self.sharded.n_ranks} run is not identified (solved from "
                "one per-token time, no calibration in the manifest): its predictions and the Shapley values "
                f"are stated over the {self.ranges.splits} splits of the cost read (`predicted_ranges_ns`, "
                "`shapley_ranges_ns`); capture with `tracekit capture` to measure each rank's cost"
            )
        doc.notes = notes
        return doc
