"""The `Whatif` document: tracekit whatif --format json (docs/JSON.md#whatif)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class WhatifProfilerCorrection(Doc, kw_only=True):
    method: str


class WhatifReplayError(Doc, kw_only=True):
    traced_ns: int
    replayed_ns: int
    mean: float
    max_step: float
    steps: int


class WhatifBaseline(Doc, kw_only=True):
    label: str
    ranks: int
    timeline: str
    per_token_ns: int
    per_token_source: str
    host_cost_per_call_ns: float
    profiler_correction: WhatifProfilerCorrection
    host_scale: float
    device_scale: float
    replay_error: WhatifReplayError
    path: str


class WhatifRuns(Doc, kw_only=True):
    baseline: WhatifBaseline
    sharded: WhatifBaseline | UnsetType = UNSET


class WhatifKnob(Doc, kw_only=True):
    spec: str
    definition: str
    applies: dict[str, bool]


class WhatifResidualPartsNs(Doc, kw_only=True):
    after_all_knobs: int
    replay_gap: int


class WhatifTermsNs(Doc, kw_only=True):
    compute: int
    memory: int
    transfer: int
    coordination: int


class WhatifShares(Doc, kw_only=True):
    compute: float
    memory: float
    transfer: float
    coordination: float


class WhatifAccounting(Doc, kw_only=True):
    shortfall_ns: int
    terms_ns: WhatifTermsNs
    shares: WhatifShares


class WhatifCheck(Doc, kw_only=True):
    run: str
    knobs: str
    ranks: int
    predicted_ns: int
    measured_ns: int
    measured_source: str
    measured_traced_ns: int
    measured_unprofiled_ns: int
    error: float


class Whatif(Doc, kw_only=True):
    schema_version: str
    kind: str
    runs: WhatifRuns
    knobs: list[WhatifKnob]
    predicted_ns: dict[str, dict[str, int]]
    speedup_vs_tp1: dict[str, dict[str, float]]
    ideal_ns: int | UnsetType = UNSET
    shortfall_ns: int | UnsetType = UNSET
    shapley_ns: dict[str, int] | UnsetType = UNSET
    residual_parts_ns: WhatifResidualPartsNs | UnsetType = UNSET
    shapley_shares: dict[str, float] | UnsetType = UNSET
    accounting: WhatifAccounting | UnsetType = UNSET
    check: WhatifCheck | UnsetType = UNSET
    notes: list[str]
