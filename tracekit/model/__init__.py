from tracekit.model.events import (
    COLUMNS,
    KINDS,
    DataQuality,
    Run,
    empty_events,
    make_events,
)

__all__ = ["COLUMNS", "KINDS", "DataQuality", "Run", "empty_events", "make_events"]
