"""The `Decompose` document: tracekit decompose --format json (docs/JSON.md#decompose)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class DecomposeClassesNs(Doc, kw_only=True):
    matrix: int
    vector: int
    memory: int
    collective: int
    coordination: int
    unknown: int


class DecomposeBaseline(Doc, kw_only=True):
    path: str
    n_ranks: int
    timeline: str
    per_token_ns: int
    per_token_source: str
    samples: int
    sample_rounds: int
    steady_steps: int
    classes_ns: DecomposeClassesNs
    matrix_share_of_compute: float
    reconciliation: str


class DecomposeRuns(Doc, kw_only=True):
    baseline: DecomposeBaseline
    intermediate: DecomposeBaseline
    full: DecomposeBaseline


class DecomposeSpeedup(Doc, kw_only=True):
    total: float
    runtime: float
    kernel: float


class DecomposeParts(Doc, kw_only=True):
    runtime: float
    kernel: float


class DecomposeIntervals(Doc, kw_only=True):
    speedup: list[float]
    runtime_speedup: list[float]
    kernel_speedup: list[float]
    runtime_part: list[float]
    kernel_part: list[float]


class DecomposeBootstrap(Doc, kw_only=True):
    resamples: int
    seed: int
    level: float
    levels: str


class DecomposeShareOfSaving(Doc, kw_only=True):
    matrix: float
    vector: float
    memory: float
    collective: float
    coordination: float
    unknown: float


class DecomposeRuntime(Doc, kw_only=True):
    saved_ns: int
    saved_by_class_ns: DecomposeClassesNs
    share_of_saving: DecomposeShareOfSaving
    log_part_by_class: DecomposeShareOfSaving
    top: str


class DecomposeMoved(Doc, kw_only=True):
    runtime: DecomposeRuntime
    kernel: DecomposeRuntime


class DecomposeClassWords(Doc, kw_only=True):
    matrix: str
    vector: str
    memory: str
    collective: str
    coordination: str
    unknown: str


class DecomposeCounts(Doc, kw_only=True):
    clock_offsets: int | UnsetType = UNSET
    skipped_instant_events: int | UnsetType = UNSET
    skipped_metadata_events: int | UnsetType = UNSET


class DecomposeDataQuality(Doc, kw_only=True):
    counts: DecomposeCounts
    notes: list[str]


class Decompose(Doc, kw_only=True):
    schema_version: str
    kind: str
    verdict: str
    runs: DecomposeRuns
    speedup: DecomposeSpeedup
    parts: DecomposeParts
    intervals: DecomposeIntervals
    bootstrap: DecomposeBootstrap
    moved: DecomposeMoved
    class_words: DecomposeClassWords
    notes: list[str]
    data_quality: DecomposeDataQuality
