"""The `Copy` document: tracekit probe copy --format json (a list of rows) (docs/JSON.md#probe)."""

from __future__ import annotations

from tracekit.model.documents.base import Doc


class Copy(Doc, kw_only=True):
    probe: str
    kind: str
    src: int
    dst: int
    device: str
    bytes: int
    iters: int
    time_us: float
    host_time_us: float
    gbps: float
    total_gbps: float
    rw_gbps: float | None
    baseline_gbps: float | None
    ratio: float | None
    p2p: bool | None
    correct: bool
