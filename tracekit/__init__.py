"""tracekit: where the per-token shortfall of a tensor-parallel decode loop goes.

Pipeline, one sub-package per stage (nothing flows backwards):

    capture  -> read  -> model -> classify -> analyse -> report
    (torch)     (Kineto JSON, nsys SQLite -> one event table)

`read`, `model`, `classify`, `analyse` and `report` never import torch.

For notebooks (docs/API.md): `import tracekit as tk; run = tk.load("traces/cpu-tp2")`, then
`run.events`, `run.steps()`, `run.breakdown()`, `tk.shortfall(baseline, sharded)`.
"""

from typing import Any

from tracekit._version import __version__

#: the notebook API (tracekit.api), imported on first use: `import tracekit` stays light
_API = ("load", "shortfall", "TraceRun", "Steps", "Breakdown", "Shortfall")

__all__ = ["__version__", "profile", *_API]


def __dir__() -> list[str]:
    """What `tk.<Tab>` offers: the API (imported lazily, so not yet in the module's namespace)."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})


def __getattr__(name: str) -> Any:  # lazy: `tracekit.profile` without importing torch at `import tracekit`
    if name == "profile":
        from tracekit.capture.profile import profile

        return profile
    if name in _API:
        from tracekit import api

        return getattr(api, name)
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
