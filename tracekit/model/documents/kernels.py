"""The top kernels per class of a run's steady steps (tracekit.analyse.compute.kernels.top_kernels):
what the analyses hand the report, and the report's `runs[].top_kernels` (docs/JSON.md#report)."""

from __future__ import annotations

from tracekit.model.documents.base import Doc


class TopKernel(Doc, kw_only=True):
    name: str
    subclass: str
    #: calls per token per rank
    count: float
    #: ns per token per rank
    total_ns: float
    #: ns per call
    mean_ns: float
    #: total_ns / step_ns_mean (null: no step time)
    share: float | None


class TopKernelsClass(Doc, kw_only=True):
    count: float
    total_ns: float
    share: float | None
    kernels: list[TopKernel]
    #: names of the class not listed
    more: int


class TopKernels(Doc, kw_only=True):
    #: steady step windows summed over (every rank's)
    windows: int
    #: per step the longest rank's window, mean over the steady steps (null: no window)
    step_ns_mean: float | None
    classes: dict[str, TopKernelsClass]
