"""The `Predict` document: tracekit predict --format json (docs/JSON.md#predict)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, Header


class PredictProbe(Doc, kw_only=True):
    path: str
    mode: str | None
    ranks: int | None
    graph_timed: bool | None


class PredictShard(Doc, kw_only=True):
    run: str
    per_token_ns: int
    interval_ns: list[int]
    rounds: int
    source: str
    cuda_graphs: bool
    decoder_impl: str


class PredictCollective(Doc, kw_only=True):
    op: str
    name: str
    size_bytes: int
    per_token: int
    time_ns_each: int
    time_ns_each_ring: int
    per_token_ns: int


class PredictTransfer(Doc, kw_only=True):
    flat: int
    ring: int


class PredictTotal(PredictTransfer, kw_only=True):
    """The prediction, flat and ring (`PredictTransfer`'s pair), and the flat one's interval."""

    flat_interval: list[int]


class PredictCheck(Doc, kw_only=True):
    run: str
    measured_ns: int
    error: float
    error_ring: float
    residual_ns: int


class Prediction(Doc, kw_only=True):
    tp: int
    shard: PredictShard
    collectives: list[PredictCollective]
    transfer_ns: PredictTransfer
    predicted_ns: PredictTotal
    probe_ranks: int | None
    ring_factor: float
    check: PredictCheck | UnsetType = UNSET


class Predict(Header, kw_only=True):
    r"""`tracekit predict --format json` (docs/METHOD.md section Predicting TP=N from one rank's shard).
    ```
    {"schema_version": "1.0", "kind": "tracekit.predict", "definition": "T_N = T_shard + ...",
     "probe": {"path": "links-graph.json", "mode": "nvlink" | null, "ranks": 2, "graph_timed": true},
     "predictions": [                                  # one per --shard, by tp
       {"tp": 2,
        "shard": {"run", "per_token_ns", "interval_ns": [lo, hi], "rounds", "source", "cuda_graphs", "decoder_impl"},
        "collectives": [ {"op", "name", "size_bytes", "per_token", "time_ns_each", "time_ns_each_ring", "per_token_ns"} ],
        "transfer_ns": {"flat": ..., "ring": ...},     # sum of per_token x probe time (ring: x (N-1)/(P-1))
        "predicted_ns": {"flat": T_shard + flat, "ring": T_shard + ring, "flat_interval": [lo, hi]},
        "probe_ranks": 2, "ring_factor": 1.0,
        "check": {"run", "measured_ns", "error", "error_ring", "residual_ns"}} ],   # with --check of that tp
     "caveat": "a prediction, not a measurement, ..."}
    ```
    """

    definition: str
    probe: PredictProbe
    predictions: list[Prediction]
    caveat: str
