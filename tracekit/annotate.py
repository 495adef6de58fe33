"""`from tracekit import annotate`: step/region ranges (see tracekit.capture.annotate)."""

from tracekit.capture.annotate import STEP_PREFIX, Range, nvtx_source, region, step

__all__ = ["STEP_PREFIX", "Range", "nvtx_source", "region", "step"]
