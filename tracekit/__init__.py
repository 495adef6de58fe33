"""tracekit: where the per-token shortfall of a tensor-parallel decode loop goes.

Pipeline, one sub-package per stage (nothing flows backwards):

    capture  -> read  -> model -> classify -> analyse -> report
    (torch)     (Kineto JSON, nsys SQLite -> one event table)

`read`, `model`, `classify`, `analyse` and `report` never import torch.
"""

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: `tracekit.profile` without importing torch at `import tracekit`
    if name == "profile":
        from tracekit.capture.profile import profile

        return profile
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
