"""The whatif room: replay a decode trace per token across ranks under counterfactuals (docs/METHOD.md
sections "Critical path and what-if" and "The dependency graph").

The replay (`tracekit.analyse.retime`) re-times the run's dependency graph (`tracekit.analyse.path`), the one the critical
path is walked on: host calls per thread with the gaps between them, device operations per
stream, launch, stream, cross-stream and in-graph edges, collectives as rendezvous (a collective
starts on every rank when its last rank arrives and ends on rank r its transfer later), and the
host waiting for the device only at synchronising calls (or a full launch queue). Each knob
transforms the graph's edge latencies; every node is then the latest of its in-edges. A token's
replayed time is its period, from the previous step's latest window end over ranks to its own, so
time between steps is host work the knobs act on and no step start is frozen. Replaying the
unchanged trace gives back every measured time exactly (`WhatIf.replay_error`). Integer nanoseconds.

**Knobs** (`knobs.KNOB_DEFINITIONS`), each a transformation of the graph, combinable:
- `transfer=0`: every collective ends at its last arrival (an infinitely fast link).
- `transfer=probe:FILE[@MODE]`: every collective's transfer is the time a `tracekit probe` /
  `compare-links` JSON measured for its op and size (log-log interpolation between rows; in-place
  rows first; MODE picks the rows' `mode`, e.g. nvlink or pcie; default the first).
- `launch=0`: no host launch overhead (what CUDA graphs remove): every host gap (inside and
  between steps) and launch call takes no time, launch latencies and queued gaps are held to the
  rank's typical ones, no back-pressure. Synchronisations and rendezvous stay. Not applicable on a
  host timeline.
- `sync=0`: synchronisation calls return at once (no blocking, no time).
- `straggler=off`: per segment between collective launches (k-th segment on every rank), each
  rank's host gaps are scaled so their sum is the fastest rank's.
- `compute=/N`: perfect scaling of the TP=1 kernels, per kernel: the k-th compute operation of a
  step takes, on every rank, the ranks' mean of it times (C1 / N) / C, with C1 the baseline's and
  C the ranks' mean compute per token.
- `collective_latency=US[@GBPS]`: every collective's transfer (after its last arrival) is the
  lesser of its own and US microseconds + size x bus factor / GBPS (nccl-tests' size and bus
  factor, GBPS the bus bandwidth; without @GBPS the `--probe` JSON's best algorithm bandwidth for
  the op gives the bytes' time): what a one-shot custom all-reduce (a few us where NCCL takes
  10-20) buys, used where it is faster, as serving engines fall back to NCCL for large messages.
  Applied after `transfer` (with `transfer=0` it changes nothing).
- `allreduce_norm=fused`: the vector kernels between each all-reduce and the next matrix kernel on
  its rank (the residual add and RMSNorm the all-reduce feeds) take no device time, as in a fused
  all-reduce + add + norm kernel; their launches and the device's gaps stay.

**Correction to the unprofiled times** (docs/METHOD.md, "The dependency graph"): with the
manifest's `profiler_calibration` the profiler's cost per call of each kind is removed call by call
(`retime.calibrate`); without one, one cost per runtime call (GPU) or one factor on host time (CPU) is
solved so that the unchanged replay's mean equals the unprofiled per-token time the accounting
uses. Knobs then apply to the corrected graph. A host sleep is one gap: it loses one call's cost.

Modules: `knobs` (the knobs, the probe's transfer times, `setting_for`: a combination's
`retime.Setting`), `build` (`build_model`: an attributed run's replay model), `shapley` (the
exact Shapley split), `result` (`WhatIf`, its JSON), `pair` (`whatif`: both runs replayed,
calibrated and predicted, S split; the ranges where the profiler's cost per rank is not
identified; `--check`). Above the attribution (docs/ARCHITECTURE.md).
"""
