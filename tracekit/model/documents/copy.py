"""The `Copy` document: tracekit probe copy --format json (a list of rows) (docs/JSON.md#probe)."""

from __future__ import annotations

from tracekit.model.documents.base import Doc


class Copy(Doc, kw_only=True):
    r"""```
    [ {"probe": "copy", "kind": "local"|"peer"|"peer_bidir", "src": 0, "dst": 1, "device": "cuda"|"cpu",
       "bytes": 1073741824, "iters": 20,
       "time_us": ..., "host_time_us": ...,     # per copy (events; host clock closed by a synchronize)
       "gbps": ...,                             # bytes / time, each byte counted once (peer_bidir: mean per direction)
       "total_gbps": ...,                       # peer_bidir: 2 x bytes x iters / host wall time; else = gbps
       "rw_gbps": ... | null,                   # local only: 2 x bytes / time (read + write DRAM traffic)
       "baseline_gbps": ... | null,             # local only: plain `b.copy_(a)` loop between two synchronize()
       "ratio": ... | null,                     # local only: gbps / baseline_gbps
       "p2p": true | null, "correct": true } ]
    ```
    """

    probe: str | None
    kind: str
    src: int | None
    dst: int | None
    device: str | None
    bytes: int | None
    iters: int | None
    time_us: float | None
    host_time_us: float | None
    gbps: float | None
    total_gbps: float | None
    rw_gbps: float | None
    baseline_gbps: float | None
    ratio: float | None
    p2p: bool | None
    correct: bool | None
