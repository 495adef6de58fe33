"""The retime room: the replay engine. The run's dependency graph (`tracekit.analyse.path`) re-timed
under a `setting.Setting` (what the what-if's knobs and the profiler correction ask for): each edge's
latency transformed (`model.RunModel.latencies`), then every node the latest of its in-edges
(`path.forward`); a token's replayed time is its period, from the previous step's latest window end
over ranks to its own (docs/METHOD.md sections "Critical path and what-if" and "The dependency
graph"). Replaying the unchanged trace gives back every measured time exactly. Integer nanoseconds.

Modules: `setting` (`Setting`: one re-timing, what it needs of a probe and a latency knob),
`model` (`RunModel`: one run's graph of its steady steps and the edge sets the settings act on),
`norm` (the kernels a fused all-reduce + norm removes), `calibrate` (the profiler's cost removed:
the manifest's `profiler_calibration`, else one cost solved so that the unchanged replay's mean is
the unprofiled per-token time; `solve_decreasing`). Above the path, below the attribution
(docs/ARCHITECTURE.md).
"""
