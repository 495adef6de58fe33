"""The graph's vocabulary (`tracekit.analyse.path`): the part an edge's time is (`K_*`, `PARTS`),
what the edge is (`ROLE_*`: the knobs act on roles) and the thresholds the build reads the trace with."""

from __future__ import annotations

#: The parts an edge's time is (`kind`), in this order (`tracekit.model.parts.PATH_PARTS` is the report order).
PARTS: tuple[str, ...] = ("compute", "memory", "transfer", "host", "sync", "unknown")
K_COMPUTE, K_MEMORY, K_TRANSFER, K_HOST, K_SYNC, K_UNKNOWN = range(6)
#: an operation's part by its class (`cls`); any other class is unknown
KIND_OF_CLS = {"compute": K_COMPUTE, "memory": K_MEMORY, "collective": K_TRANSFER, "sync": K_SYNC}

# edge roles
ROLE_ORIGIN = 0  # the rank's origin -> the first node of a thread / an unreleased operation
ROLE_GAP = 1  # host gap inside a step window
ROLE_GAP_OUT = 2  # host gap between step windows
ROLE_CALL = 3  # a launch call's (or other kept call's) own time
ROLE_SYNC = 4  # a synchronising call's own time (0 when it blocked: its time is ROLE_SYNC_WAIT)
ROLE_SYNC_WAIT = 5  # the awaited operation's end -> a blocking call's return
ROLE_LAUNCH = 6  # call begin -> operation begin
ROLE_QUEUE = 7  # previous operation's end on the stream -> operation begin
ROLE_CROSS = 8  # another stream's / the same graph replay's operation end -> operation begin
ROLE_OP = 9  # operation begin -> end (not a matched collective)
ROLE_ARRIVE = 10  # collective begin -> rendezvous
ROLE_XFER = 11  # rendezvous -> collective end on the rank
ROLE_BACKPRESSURE = 12  # operation end -> a long launch call's end (launch queue full)
ROLE_WORK = 13  # host timeline: a measured host-executed part (kind says which)
ROLE_LEAD = 14  # host timeline: the idle time from a segment's start to its first op
ROLE_GRAPH = 15  # inside a CUDA-graph replay: the in-graph predecessor's end -> operation begin

#: A device gap of at least this much before an operation means its stream was idle.
IDLE_GAP_NS = 2000
#: Launch latencies above this are queueing, not latency, when estimating the typical latency.
LAUNCH_LATENCY_CAP_NS = 100_000
#: A launch call at least this long (and 8x the rank's median launch call) may be back-pressure.
BACKPRESSURE_MIN_NS = 20_000
#: Disabled edges carry this latency.
NEVER = -(1 << 60)
