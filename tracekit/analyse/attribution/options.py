"""How a run is attributed: the options every attributing command shares (shortfall, diff,
decompose, whatif), said once.

`AttributionOptions` is built once where the options come in (a CLI command's flags,
`tracekit.api.shortfall`'s keywords) and passed on as one value through the engine
(`tracekit.engine`), the command plans (`tracekit.analyse.command_plans`) and the analyses
(`pair.shortfall`, `run.attribute_run`, `compare.diff.diff`, `compare.decompose.decompose_runs`);
`plan(label)` is the one place they become `plans.attribution_plan`'s keywords.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tracekit.analyse.dilation import DEFAULT_THRESHOLD
from tracekit.analyse.plans import Plan, attribution_plan

__all__ = ["DEFAULT_OPTIONS", "AttributionOptions"]


@dataclass(frozen=True)
class AttributionOptions:
    """The attribution's options (docs/METHOD.md sections "Shortfall attribution" and "Dilation").

    `step_pattern`: how the steps are found (None: the manifest's pattern, else auto; "whole"; or a
    regex of the step annotations); `skip_first`: warm-up steps left out of the per-token figures;
    `dilation_threshold`: dilation above 1 + this is reported as inflating the coordination share;
    `allow_partial`: match collectives even when their group names ranks that are not in the run."""

    step_pattern: str | None = None
    skip_first: int = 1
    dilation_threshold: float = DEFAULT_THRESHOLD
    allow_partial: bool = False

    def plan(self, label: str, *, correct: str | None = None, keep_graph: bool = True) -> Plan:
        """`plans.attribution_plan` of a run labelled `label` with these options (`correct`,
        `keep_graph`: what the caller needs of the result, not an option of the attribution)."""
        # the fields are attribution_plan's keywords, by name
        return attribution_plan(label=label, correct=correct, keep_graph=keep_graph, **asdict(self))


#: the defaults (what a command without flags attributes with)
DEFAULT_OPTIONS = AttributionOptions()
