"""The `Decompose` document: tracekit decompose --format json (docs/JSON.md#decompose)."""

from __future__ import annotations

from tracekit.model.documents.base import Doc, Header
from tracekit.model.documents.breakdown import BreakdownDataQuality


class DecomposeBaseline(Doc, kw_only=True):
    path: str | None
    n_ranks: int | None
    timeline: str | None
    per_token_ns: int | None
    per_token_source: str | None
    samples: int | None
    sample_rounds: int | None
    steady_steps: int | None
    classes_ns: dict[str, int]
    matrix_share_of_compute: float | None
    reconciliation: str | None


class DecomposeRuns(Doc, kw_only=True):
    baseline: DecomposeBaseline
    intermediate: DecomposeBaseline
    full: DecomposeBaseline


class DecomposeSpeedup(Doc, kw_only=True):
    total: float | None
    runtime: float | None
    kernel: float | None


class DecomposeParts(Doc, kw_only=True):
    runtime: float | None
    kernel: float | None


class DecomposeIntervals(Doc, kw_only=True):
    speedup: list[float] | None
    runtime_speedup: list[float] | None
    kernel_speedup: list[float] | None
    runtime_part: list[float] | None
    kernel_part: list[float] | None


class DecomposeBootstrap(Doc, kw_only=True):
    resamples: int | None
    seed: int | None
    level: float | None
    levels: str | None


class DecomposeRuntime(Doc, kw_only=True):
    saved_ns: int | None
    saved_by_class_ns: dict[str, int]
    share_of_saving: dict[str, float | None]
    log_part_by_class: dict[str, float | None]
    top: str


class DecomposeMoved(Doc, kw_only=True):
    runtime: DecomposeRuntime
    kernel: DecomposeRuntime


class Decompose(Header, kw_only=True):
    r"""`tracekit decompose --format json` (`tracekit.analyse.compare.decompose.Decomposition.to_json`, docs/METHOD.md section Speedup decomposition).
    ```
    { "schema_version": "1.0", "kind": "tracekit.decompose",
      "verdict": "Speedup 11.69x (126.44 -> 46.62 -> 10.81 ms per token): the runtime part ...",
      "runs": {"baseline" | "intermediate" | "full":
                {"path": "...", "n_ranks": 2, "timeline": "gpu" | "host" | "mixed",
                 "per_token_ns": 126441980,          # tA / tB / tC: unprofiled mean when the manifest has it
                 "per_token_source": "unprofiled" | "trace",
                 "samples": 14, "sample_rounds": 2,  # per-token samples bootstrapped (unprofiled tokens by round,
                                                     # or the steady steps as one round)
                 "steady_steps": 7,
                 "classes_ns": {"matrix": ..., "vector": ..., "memory": ..., "collective": ...,
                                "coordination": ..., "unknown": ...},
                                                     # sum == per_token_ns exactly (largest remainder); per rank
                                                     # reconciled to the unprofiled time as the shortfall does,
                                                     # then the mean over ranks; collective = transfer,
                                                     # coordination = wait + sync + idle; compute split into
                                                     # matrix / vector by each rank's traced share
                 "matrix_share_of_compute": 0.41 | null,
                 "reconciliation": "..."}},
      "speedup": {"total": 11.69, "runtime": 2.71, "kernel": 4.31},     # tA/tC, tA/tB, tB/tC
      "parts": {"runtime": 0.406, "kernel": 0.594} ,    # log(tA/tB)/log(tA/tC), log(tB/tC)/log(tA/tC); sum 1;
                                                       # null when tA == tC; not clipped (negative when B is
                                                       # outside [C, A], with a note)
      "intervals": {"speedup": [lo, hi], "runtime_speedup": [...], "kernel_speedup": [...],
                    "runtime_part": [lo, hi], "kernel_part": [lo, hi]},
                                                       # 95% percentile bootstrap: each run's samples drawn with
                                                       # replacement independently, 2000 resamples, seed 0
      "bootstrap": {"resamples": 2000, "seed": 0, "level": 0.95,
                    "levels": "per run: its rounds with replacement, then tokens within each drawn round"},
      "moved": {"runtime" | "kernel": {"saved_ns": 79823000,           # tA - tB (runtime), tB - tC (kernel)
                                       "saved_by_class_ns": {"matrix": ..., ...},   # sums to saved_ns exactly
                                       "share_of_saving": {"matrix": -0.0003, ...},  # class / saved (null if 0)
                                       "log_part_by_class": {...},    # part x share: the class's log contribution
                                       "top": "coordination"}},       # the class that saved most
      "class_words": {"matrix": "matrix compute (GEMM, attention)", ...},
      "notes": [...], "data_quality": {"counts": {...}, "notes": [...]} }
    ```
    """

    verdict: str | None
    runs: DecomposeRuns
    speedup: DecomposeSpeedup
    parts: DecomposeParts
    intervals: DecomposeIntervals
    bootstrap: DecomposeBootstrap
    moved: DecomposeMoved
    class_words: dict[str, str | None]
    notes: list[str]
    data_quality: BreakdownDataQuality
