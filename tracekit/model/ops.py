"""The normalised collective operations: the event table's `coll_op` values
(tracekit.model.events) and the probe's op names (tracekit.probe.spec), in a module that imports
no pandas (a probe rank needs the names, not the table)."""

from __future__ import annotations

#: Normalised collective operations (the `coll_op` column).
COLLECTIVE_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
    "send",
    "recv",
    "barrier",
    "gather",
    "scatter",
)
