"""The `Whatif` document: tracekit whatif --format json (docs/JSON.md#whatif)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, Header


class WhatifProfilerCorrection(Doc, kw_only=True):
    method: str | None
    per_call_ns: dict[str, int] | UnsetType = UNSET  # method "manifest calibration" only


class WhatifReplayError(Doc, kw_only=True):
    traced_ns: int | None
    replayed_ns: int | None
    mean: float | None
    max_step: float | None
    steps: int | None


class WhatifBaseline(Doc, kw_only=True):
    label: str | None
    ranks: int | None
    timeline: str | None
    per_token_ns: int | None
    per_token_source: str | None
    host_cost_per_call_ns: float | None
    profiler_correction: WhatifProfilerCorrection
    host_scale: float | None
    device_scale: float | None
    replay_error: WhatifReplayError
    path: str | None | UnsetType = UNSET  # the CLI's: the run's folder as given


class WhatifRuns(Doc, kw_only=True):
    baseline: WhatifBaseline
    sharded: WhatifBaseline | UnsetType = UNSET


class WhatifKnob(Doc, kw_only=True):
    spec: str | None
    definition: str | None
    applies: dict[str, bool | None]


class WhatifResidualPartsNs(Doc, kw_only=True):
    after_all_knobs: int | None
    replay_gap: int | None


class WhatifAccounting(Doc, kw_only=True):
    shortfall_ns: int | None
    terms_ns: dict[str, int | None]
    shares: dict[str, float | None]


class WhatifDeviceWork(Doc, kw_only=True):
    check_run: int | None
    predicting_run: int | None


class WhatifCheck(Doc, kw_only=True):
    run: str | None
    knobs: str | None
    ranks: int | None
    predicted_ns: int | None
    measured_ns: int | None
    measured_source: str | None
    measured_traced_ns: int | None
    measured_unprofiled_ns: int | None
    error: float | None
    device_work_ns: WhatifDeviceWork | UnsetType = UNSET


class Whatif(Header, kw_only=True):
    r"""`tracekit whatif --format json` (`tracekit/analyse/whatif/`, docs/METHOD-NOTES.md "What-if").
    Ranks are keys as strings ("1", "2"): the baseline's and the sharded run's rank counts.
    ```
    { "schema_version": "1.0", "kind": "tracekit.whatif",
      "runs": {"baseline": {"label": "baseline", "path": "traces/h200-tp1", "ranks": 1, "timeline": "gpu"|"host",
                            "per_token_ns": 7522653,          # T1: shortfall's (unprofiled when corrected)
                            "per_token_source": "unprofiled"|"trace",
                            "host_cost_per_call_ns": 6300.6,  # GPU timeline: profiler cost taken from every
                                                              # CUDA runtime call so that the unchanged replay
                                                              # equals per_token_ns (0: not corrected)
                            "host_scale": 1.0,                # host timeline: the factor on every part but
                                                              # transfer that does the same (1.0 otherwise)
                            "device_scale": 1.0,              # GPU timeline, device-bound run (a CUDA-graph
                                                              # replay: no host time to remove): the factor on
                                                              # device op times and gaps (not transfers) that
                                                              # does the same (1.0 otherwise; a note says so)
                            "profiler_correction": {"method": "manifest calibration"|"solved"|"none",
                                                    "per_call_ns": {"runtime": 4100, ...}},
                                                              # how the profiler's cost was removed: the
                                                              # manifest's profiler_calibration call by call
                                                              # (per_call_ns given), else solved (above)
                            "replay_error": {"traced_ns": 10330624, "replayed_ns": 10330624,
                                             "mean": 0.0,     # (replayed - traced) / traced, mean token period
                                             "max_step": 0.0, # worst |error| of one step
                                             "steps": 31}},
               "sharded": {...}},                             # absent without --sharded
      "knobs": [{"spec": "launch=0", "definition": "...", "applies": {"1": true, "2": true}}],
                                                              # the Shapley players, in the order given
      "predicted_ns": {"none": {"1": 7522653, "2": 12015266},  # per combination ("a,b"; "none": the
                       "launch=0": {"1": 2126650, "2": 2243489}, ...},   # calibrated replay), per rank count
      "speedup_vs_tp1": {"launch=0": {"1": 3.54, "2": 3.35}, ...},       # T1 / predicted
      "ideal_ns": 3761326, "shortfall_ns": 8253940,           # with --sharded: S = TN - f T1, as shortfall's
      "shapley_ns": {"transfer=0": 53930, "launch=0": 5484173, ..., "residual": 714363},
                                                              # sums to shortfall_ns exactly (largest remainder);
                                                              # game: v(K) = TN(K) - f T1(K), the shortfall with
                                                              # the knobs K applied to both runs
      "shapley_shares": {...},                                # shapley_ns / S
      "identified": false,                                    # only where the TP=N run's profiler cost
                                                              # per rank is not identified (solved, no
                                                              # calibration): then the ranges over the
                                                              # splits of the cost the data allow
      "predicted_ranges_ns": {"launch=0": {"2": [98000, 106700]}, ...},
      "shapley_ranges_ns": {"launch=0": [160944, 198475], ..., "residual": [13000, 13000]},
      "residual_parts_ns": {"after_all_knobs": 714000,        # v(all knobs): the shortfall no knob removes
                            "replay_gap": 0},                 # S - v(no knob): calibration tolerance
      "accounting": {"shortfall_ns": ..., "terms_ns": {...}, "shares": {...}},   # shortfall's, beside
      "check": {"run": "traces/h200-tp1-graphs", "knobs": "launch=0", "ranks": 1,   # --check only
                "predicted_ns": 2155148, "measured_ns": 1981000, "measured_source": "unprofiled"|"trace",
                "measured_traced_ns": ..., "measured_unprofiled_ns": ..., "error": 0.088},
      "notes": [...] }
    ```
    """

    runs: WhatifRuns
    knobs: list[WhatifKnob]
    predicted_ns: dict[str, dict[str, int | None]]
    speedup_vs_tp1: dict[str, dict[str, float | None]]
    ideal_ns: int | None | UnsetType = UNSET
    shortfall_ns: int | None | UnsetType = UNSET
    shapley_ns: dict[str, int | None] | UnsetType = UNSET
    residual_parts_ns: WhatifResidualPartsNs | UnsetType = UNSET
    shapley_shares: dict[str, float | None] | UnsetType = UNSET
    identified: bool | UnsetType = UNSET
    predicted_ranges_ns: dict[str, dict[str, list[int]]] | UnsetType = UNSET
    shapley_ranges_ns: dict[str, list[int]] | UnsetType = UNSET
    accounting: WhatifAccounting | UnsetType = UNSET
    check: WhatifCheck | UnsetType = UNSET
    notes: list[str]
