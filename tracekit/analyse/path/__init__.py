"""The path room: one dependency graph of a run's tokens and the critical path walked back on it
(docs/METHOD.md section "The dependency graph"). The replay (`tracekit.analyse.retime`) re-times
the same graph under the what-if's knobs (`tracekit.analyse.whatif`) and the profiler correction
(`tracekit.analyse.attribution.correction`): all read the same nodes and edges.

Modules: `roles` (the edge roles, the parts an edge's time is, the thresholds), `rank_graph`
(`RankGraph`: one rank's share, its builder and columns), `gpu_rank` (a GPU timeline's rank graph)
over `gpu_host` (its host chain: each thread's calls and markers in program order, on arrays) and
`gpu_waits` (event waits, a window's end nodes), `host_rank` (a CPU-only timeline's),
`graph` (`Graph`: the run's graph, `assemble`), `forward` (the forward pass re-timing it),
`build` (`build_rank_graph`, `build_graph`), `walk` (`walk_path`: the path walked on the graph),
`critical_path` (`CriticalPath`, `critical_path`, `path_of`). Above the collectives and the
timeline, below the replay (docs/ARCHITECTURE.md).

**Nodes are instants** (integer nanoseconds on the aligned clock: a rank's own time minus its clock
offset): the begin and the end of every kept host call (per thread), the begin and the end of every
device operation (per stream), a marker at each step annotation's start and end, one rendezvous per
matched collective instance, and one origin per rank (the first window's start: the only fixed time).

**Edges** carry a latency and say whose time it is (rank, path part) and what it is (`ROLE_*`, the
knobs act on roles):

- host program order per thread: the gap before a call or marker (Python, dispatch, the profiler,
  folded runtime calls that launch nothing), then the call's own time (begin -> end);
- launch: a call's begin -> the operation's begin, the launch latency;
- stream order: the previous operation's end on the stream -> the next one's begin (its queue
  gap); inside one CUDA-graph replay stream order does not hold (its branches run concurrently on
  one stream), so operations of one graph launch are not chained by it;
- cross-stream (and in-graph) waits: the end of the operation on another stream that an operation
  waits for through an event (`gpu_waits.event_waits`: the host's `cudaEventRecord` / `cudaStreamWaitEvent`
  calls in program order), else, in a trace without them, of the one (or the one earlier in the
  same graph replay) that ended last before an operation that neither its launch nor its stream
  released;
- a collective: every member's begin (its arrival) -> the instance's rendezvous (0), which starts
  when the last rank arrives; the rendezvous -> the collective's end on each rank: its transfer;
- a host waits for the device only at a synchronising call (`cls == "sync"`: stream / device /
  event synchronize, `.item()`-style syncs; blocking copies `cudaMemcpy`): the last operation it
  waited for -> the call's end (its return latency). Asynchronous launches and collectives block
  nothing, except a long launch call that ended right after an operation ended (the launch queue
  was full: back-pressure), which gets the edge that operation's end -> the call's end.

Each node's time is the latest over its in-edges of (source time + latency). Which edge binds an
operation is read from the trace: the stream when its queue gap is under `IDLE_GAP_NS`, else its
launch when the launch latency is within `max(3 rho_typ, rho_typ + 20 us)`, else a cross wait if
one ended within `IDLE_GAP_NS` before it, else its stream (the device's own gap; its launch when it
is the first on its stream); the binding edge keeps its measured
latency and the others the rank's typical one (never more than measured), so the graph re-timed
unchanged gives back every measured time exactly.

A CPU-only (host) timeline has no separate device: its host work between collectives is a chain of
edges of its measured parts (compute, memory, unknown, sync, idle), and time between steps is host
work too (`ROLE_GAP_OUT`). No step start is frozen: the next step begins where the host's program
order brings it.
"""
