"""The data model: the events table (`tracekit.model.events`), shapes, units, typed documents.

The events table's names are loaded on first use (PEP 562): `import tracekit.model.shape` (a
capture rank's, through tracekit.capture.decoder_shape) then imports no pandas, ~0.5-0.9 CPU-s per
rank process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit.model.events import (
        COLUMNS,
        KINDS,
        DataQuality,
        Run,
        empty_events,
        make_events,
    )

__all__ = ["COLUMNS", "KINDS", "DataQuality", "Run", "empty_events", "make_events"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tracekit.model import events

        return getattr(events, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
