"""How a run is attributed: the options every attributing command shares (shortfall, diff,
decompose, whatif), said once.

`AttributionOptions` is built once where the options come in (a CLI command's flags,
`tracekit.api.shortfall`'s keywords) and passed on as one value through the engine
(`tracekit.engine`), the command plans (`tracekit.analyse.command_plans`) and the analyses
(`pair.shortfall`, `plan.attribute_run`, `compare.diff.diff`, `compare.decompose.decompose_runs`);
`plan.plan_of(options, label)` is the one place they become `plan.attribution_plan`'s keywords.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.analyse.dilation import DEFAULT_THRESHOLD

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


#: the defaults (what a command without flags attributes with)
DEFAULT_OPTIONS = AttributionOptions()
