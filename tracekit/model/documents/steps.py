"""The `Steps` document: a run's step windows (`tracekit.load(run).steps().to_json()`, the
notebook API) (docs/JSON.md#steps)."""

from __future__ import annotations

from tracekit.model.documents.base import Doc, Header
from tracekit.model.documents.breakdown import BreakdownDataQuality


class StepWindow(Doc, kw_only=True):
    rank: int
    step: int
    name: str
    start_ns: int
    end_ns: int


class Steps(Header, kw_only=True):
    r"""`tracekit.load(RUN).steps().to_json()`: the step windows each rank's trace holds, as the
    step finder chose them (docs/METHOD.md section Steps and the partition).
    ```
    {"schema_version": "1.0", "kind": "tracekit.steps",
     "step_pattern": "decode_step",     # the pattern that found them
     "step_rule": "decode_step",        # decode_step, profiler_step, serving_engine, graph_launch, repeated_range, whole, pattern
     "steps": [ {"rank": 0, "step": 0, "name": "decode_step", "start_ns": ..., "end_ns": ...} ],   # each rank's own clock
     "data_quality": {"counts": {...}, "notes": [...]}}
    ```
    """

    step_pattern: str
    step_rule: str
    steps: list[StepWindow]
    data_quality: BreakdownDataQuality
