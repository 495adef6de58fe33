"""An attributed run's replay model (`tracekit.analyse.whatif`): `build_model`, the dependency graph
the attribution walked the path on (else built again over the same windows) as a `retime.RunModel`."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.path.build import build_graph
from tracekit.analyse.path.roles import K_COMPUTE, ROLE_OP, ROLE_WORK
from tracekit.analyse.retime.calibrate import manifest_calibration
from tracekit.analyse.retime.model import RunModel
from tracekit.analyse.timeline.align import as_tokens
from tracekit.analyse.timeline.steps import find_steps_detailed
from tracekit.model.documents.manifest import Manifest


def build_model(
    parts: RunParts, classified: pd.DataFrame | AnalysedRun, target_ns: Fraction | None, label: str
) -> RunModel:
    """The replay model of one attributed run (`attribution.plan.attribute_run`) over its steady steps."""
    steady = parts.steady
    steps = [int(s) for s in steady["step"]]
    manifest: Manifest | None = None
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
        g = build_graph(
            classified,
            wins,
            parts.collectives.per_rank,
            parts.collectives.clock.offsets_ns,
            timeline,
            inst_bytes,
        )
    cm = (g.kind == K_COMPUTE) & np.isin(g.role, (ROLE_OP, ROLE_WORK))
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
    model.calibration = manifest_calibration(manifest)
    model.events = events
    return model
