"""The `Links` document: tracekit compare-links --format json (docs/JSON.md#probe)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc, PerTokenOf
from tracekit.model.dtypes import DTYPE_BYTES, NCCL_TYPE


class LinksConfig(Doc, kw_only=True):
    ops: list[str | None]
    modes: list[str | None]
    min_bytes: int | None
    max_bytes: int | None
    factor: int | None
    iters: int | None
    warmup: int | None
    dtype: str | None
    nccl_debug: str | None
    algo_pass: bool | None
    graph: bool | None | UnsetType = UNSET
    pcie_p2p_level: str | None


class LinksMode(Doc, kw_only=True):
    mode: str
    env: dict[str, str | None]
    backend: str | None
    device: str
    devices: list[int] | None
    ranks: int | None
    notes: list[str]


class ProbeRow(Doc, kw_only=True):
    r"""`tracekit probe --format json` (or `-o rows.json`): a JSON **list of rows**, one per (op, size,
    form); `tracekit.probe.sweep.run_sweep(SweepConfig(...))` returns the same list. CSV has the same
    fields as columns (`tracekit.model.documents.links.ROW_FIELDS`, booleans `true`/`false`, null empty).
    ```
    [ {"op": "all_reduce",            # all_reduce | all_gather | reduce_scatter | broadcast | reduce | alltoall | sendrecv
       "ranks": 2, "backend": "nccl"|"gloo", "device": "cuda"|"cpu", "dtype": "float32",
       "bytes": 1048576,              # nccl-tests' size column: max(send, recv) bytes; for all_gather,
                                      # reduce_scatter, alltoall = per-rank count x typesize x ranks
       "count": 262144,               # nccl-tests' count column: the count passed to the NCCL call
       "in_place": false,             # all_reduce/broadcast/reduce: in-place rows only (torch.distributed has
                                      # no out-of-place form); alltoall/sendrecv: out-of-place only
       "root": -1,                    # 0 for broadcast/reduce
       "iters": 20, "warmup": 5,
       "timer": "cuda_event"|"host",  # what time_us is: CUDA events around the loop, or the host clock (CPU)
       "graph": false,                # true with --graph (CUDA/NCCL only; nccl-tests -G): the `iters` calls are
                                      # captured in one CUDA graph, replayed once un-timed, and one replay is
                                      # timed; time_us = replay time / iters, no host launch per call. false: one
                                      # Python call per iteration, so small sizes include host launch overhead
                                      # (~35-45 us a call on the H200 host). The check and the algo pass run eagerly
       "time_us": 12.3,               # per iteration, AVERAGE over ranks (nccl-tests' default, -a 1)
       "time_us_min": 12.1, "time_us_max": 12.6,          # fastest / slowest rank
       "host_time_us": 13.0, "host_time_us_min": ..., "host_time_us_max": ...,
                                      # host clock from the first launch to a stream synchronise after the
                                      # last, per iteration: nccl-tests' own timer
       "algbw_gbps": ..., "busbw_gbps": ...,              # from time_us; busbw = algbw x bus_factor
       "host_algbw_gbps": ..., "host_busbw_gbps": ...,    # from host_time_us (nccl-tests' method exactly)
       "bus_factor": 1.0,             # 2(n-1)/n all_reduce; (n-1)/n all_gather, reduce_scatter, alltoall; else 1
       "correct": true,               # the check iteration matched on every rank; null when --no-check
       "wrong": 0,                    # wrong elements summed over ranks (nccl-tests' #wrong); null when unchecked
       "mode": "default"|"nvlink"|"pcie",
       "transport": "P2P/CUMEM/read"|"SHM/direct/direct"|"NET/Socket"|"gloo/tcp"|"none (1 rank)"|...,
                                      # the most frequent connection NCCL logged (NCCL_DEBUG=INFO)
       "algo": "RING"|"TREE"|...|"", "proto": "SIMPLE"|"LL"|"LL128"|"" }   # NCCL's tuning choice at this size, when logged:
                                      # by default from a separate un-timed TUNING pass (--algo-pass); the timed
                                      # sweep logs INIT,GRAPH only (--nccl-debug init), no line per call
    ]
    ```
    Bandwidths are decimal GB/s (bytes / ns); times in microseconds (small sizes read as latency).
    JSON null in a number field is how a non-finite value (NaN: a zero time) is written; a probe
    file read through `tracekit.read.probe` has NaN there again (`nan_for_null`).
    """

    op: str
    ranks: int
    backend: str
    device: str
    dtype: str
    bytes: int
    count: int
    in_place: bool
    root: int
    iters: int
    warmup: int
    timer: str
    graph: bool | UnsetType = UNSET  # absent in rows written before --graph (eager timing)
    time_us: float
    time_us_min: float
    time_us_max: float
    host_time_us: float
    host_time_us_min: float
    host_time_us_max: float
    algbw_gbps: float
    busbw_gbps: float
    host_algbw_gbps: float
    host_busbw_gbps: float
    bus_factor: float
    correct: bool | None
    wrong: int | None
    mode: str
    transport: str
    algo: str
    proto: str


#: Row fields in the order JSON objects and CSV columns use (`ProbeRow`'s).
ROW_FIELDS: tuple[str, ...] = ProbeRow.__struct_fields__

#: a probe's dtype name (as given on the command line, torch spelling) -> (nccl-tests type name, bytes)
PROBE_DTYPES: dict[str, tuple[str, int]] = {d: (name, DTYPE_BYTES[d]) for d, name in NCCL_TYPE.items()}

#: the number fields of a probe row (JSON null there reads back as NaN)
ROW_FLOATS: tuple[str, ...] = tuple(f for f, t in ProbeRow.__annotations__.items() if t == "float")


def nan_for_null(rows: object) -> object:
    """Probe rows as JSON values (a list of objects) with NaN for null in their number fields, the
    way the writers write NaN; anything else as it is (the Struct's decode refuses it)."""
    if not isinstance(rows, list):
        return rows
    return [
        {k: (float("nan") if v is None and k in ROW_FLOATS else v) for k, v in r.items()}
        if isinstance(r, dict)
        else r
        for r in rows
    ]


class NcclSummary(Doc, kw_only=True):
    """What NCCL's logs of one sweep say (`tracekit.probe.nccl_log.summarize`): the transports it
    connected, the path types it planned, NVLS, the algorithm/protocol choices; the sweep adds
    which logging the timed run had and where the choices came from."""

    transport: str  # the most frequent connection: the rows' `transport`
    transports: dict[str, int]
    kinds: dict[str, int]
    graph_types: list[str]
    p2p: bool
    wire: str  # nvlink / pcie / host_memory / network / unknown (from NCCL's own log)
    nvls_available: bool
    nvls_used: bool
    collnet: bool
    rings_connected: bool
    algos: dict[str, dict[str, int]]
    nccl_version: str
    n_ranks: int | None
    connections: int
    lines: int
    nccl_debug_subsys: str | UnsetType = UNSET
    algo_source: str | None | UnsetType = UNSET


class LinksTransportsValue(Doc, kw_only=True):
    """One mode's transport as NCCL's log says it; a backend that writes no NCCL log (gloo on
    the CPU) has only `uses_nvlink`, `notes` and `log_dir`."""

    transport: str | None | UnsetType = UNSET
    transports: dict[str, int | None] | UnsetType = UNSET
    kinds: dict[str, int | None] | UnsetType = UNSET
    graph_types: list[str | None] | UnsetType = UNSET
    p2p: bool | None | UnsetType = UNSET
    wire: str | None | UnsetType = UNSET
    nvls_available: bool | None | UnsetType = UNSET
    nvls_used: bool | None | UnsetType = UNSET
    collnet: bool | None | UnsetType = UNSET
    rings_connected: bool | None | UnsetType = UNSET
    #: per op, how often NCCL chose each algorithm/protocol ("RING/LL": 12)
    algos: dict[str, dict[str, int]] | UnsetType = UNSET
    nccl_version: str | None | UnsetType = UNSET
    n_ranks: int | None | UnsetType = UNSET
    connections: int | None | UnsetType = UNSET
    lines: int | None | UnsetType = UNSET
    nccl_debug_subsys: str | None | UnsetType = UNSET
    algo_source: str | None | UnsetType = UNSET
    uses_nvlink: bool | None
    notes: list[str]
    log_dir: str | None


class LinksLinksValueItem(Doc, kw_only=True):
    index: int | None | UnsetType = UNSET
    name: str | None | UnsetType = UNSET
    bus_id: str | None | UnsetType = UNSET
    gpu_a: int | None | UnsetType = UNSET
    gpu_b: int | None | UnsetType = UNSET
    link: str | None | UnsetType = UNSET
    nvlinks: int | None | UnsetType = UNSET
    nvlink_p2p: bool | None | UnsetType = UNSET
    nvswitch: bool | None | UnsetType = UNSET
    pcie_path: str | None | UnsetType = UNSET
    pcie_p2p: bool | None | UnsetType = UNSET
    source: str | None | UnsetType = UNSET
    names: list[str | None] | UnsetType = UNSET
    bus_ids: list[str | None] | UnsetType = UNSET


class LinksTopology(Doc, kw_only=True):
    """The machine's GPUs and the link between each pair (NVML, else nvidia-smi); on a machine
    without GPUs both lists are empty and `notes` says why."""

    source: str
    gpus: list[LinksLinksValueItem]
    links: list[LinksLinksValueItem]
    notes: list[str]
    nvidia_smi_topo: str | None


class LinksGpu(Doc, kw_only=True):
    index: int | None
    name: str | None


class LinksMeta(Doc, kw_only=True):
    torch: str | None
    python: str | None
    cuda: str | None
    nccl: str | None | UnsetType = UNSET
    gpus: list[LinksGpu] | UnsetType = UNSET


class LinksSideBySideItem(Doc, kw_only=True):
    """One size of one op, every mode side by side: the per-mode figures are keyed by mode."""

    op: str | None
    bytes: int | None
    in_place: bool | None
    busbw_gbps: dict[str, float | None]
    time_us: dict[str, float | None]
    correct: dict[str, bool | None]
    ratio: float | None
    decode: bool | None


class LinksSize(Doc, kw_only=True):
    op: str | None
    coll_op: str | None
    bytes: int | None
    n_ranks: int | None
    count: int | None
    per_token: float | None
    time_ns_median: float | None
    time_ns_total: float | None | UnsetType = UNSET  # absent in results written before it
    transfer_ns_per_token: float | None | UnsetType = UNSET  # absent in results written before it
    busbw_gbps: float | None
    bytes_source: str | None | UnsetType = UNSET  # absent in results written before it


class LinksTrace(Doc, kw_only=True):
    path: str | None
    ranks: list[int]
    mode: str | None | UnsetType = UNSET  # absent in results written before it (schema 1.0)
    mode_source: str | None | UnsetType = UNSET
    level: str | None
    source: str | None
    steps: int | None
    sizes: list[LinksSize]
    transfer_ns_total: float | None
    transfer_ns_per_token: float | None
    notes: list[str]


class LinksPerTokenNs(PerTokenOf[int | None], kw_only=True):
    """Per token, the shortfall's figures (`PerTokenOf`)."""


class LinksShortfall(Doc, kw_only=True):
    baseline: str | None
    sharded: str | None
    n_ranks: int | None
    per_token_ns: LinksPerTokenNs
    per_token_source: str | None
    shortfall_ns: int | None
    terms_ns: dict[str, int | None]
    transfer_ns: int | None
    shares: dict[str, float | None]
    verdict: str | None


class LinksPerSizeItem(Doc, kw_only=True):
    op: str | None
    bytes: int | None
    count: int | None | UnsetType = UNSET
    per_token: float | None | UnsetType = UNSET
    transfer_weight: float | None | UnsetType = UNSET
    transfer_ns_per_token: float | None | UnsetType = UNSET
    realised_busbw_gbps: float | None | UnsetType = UNSET
    swept: bool | None | UnsetType = UNSET
    probe_busbw_gbps: dict[str, float | None] | UnsetType = UNSET
    probe_time_us: dict[str, float | None] | UnsetType = UNSET
    probe_how: dict[str, str | None] | UnsetType = UNSET
    regime: str | None | UnsetType = UNSET
    realised_vs_probe: dict[str, float | None] | UnsetType = UNSET
    k: float | None | UnsetType = UNSET
    bound_ratio_ns_per_token: float | None | UnsetType = UNSET
    bound_per_call_ns_per_token: float | None | UnsetType = UNSET
    bound_ns_per_token: float | None | UnsetType = UNSET
    busbw_gbps: dict[str, float | None] | UnsetType = UNSET
    ratio: float | None | UnsetType = UNSET


class LinksModes(Doc, kw_only=True):
    fast: str | None
    slow: str | None


class LinksLarge(Doc, kw_only=True):
    op: str | None
    bytes: int | None
    busbw_gbps: dict[str, float | None]
    k: float | None


class LinksVerdictDetails(Doc, kw_only=True):
    per_size: list[LinksPerSizeItem]
    modes: LinksModes | UnsetType = UNSET
    labels: dict[str, str | None] | UnsetType = UNSET
    trace_mode: str | None | UnsetType = UNSET
    reference_mode: str | None | UnsetType = UNSET
    k: float | None | UnsetType = UNSET
    regime: str | None | UnsetType = UNSET
    large: LinksLarge | None | UnsetType = UNSET
    transfer_ns_per_token: float | None | UnsetType = UNSET
    xn_source: str | None | UnsetType = UNSET
    bound_ns_per_token: float | None | UnsetType = UNSET
    bound_inf_ns_per_token: float | None | UnsetType = UNSET
    shortfall_ns: float | None | UnsetType = UNSET
    transfer_share_of_shortfall: float | None | UnsetType = UNSET
    bound_share_of_shortfall: float | None | UnsetType = UNSET
    tuning_in_timed_loop: list[str | None] | UnsetType = UNSET
    timing: dict[str, str | None] | UnsetType = UNSET
    source: str | None | UnsetType = UNSET
    answer: str | None | UnsetType = UNSET


class Links(Doc, kw_only=True):
    r"""`tracekit compare-links --load X.json [--trace DIR --baseline DIR]` /
    `recompute(load_compare(path), trace_dir=, baseline_dir=, loaded_from=)` redo `trace`, `shortfall`,
    `side_by_side`, `verdict*` and `notes` from the saved rows without a sweep (a 1.0 file loads too):
    ```
    { "schema_version": "1.1", "kind": "tracekit.compare_links",   # 1.1: shortfall, verdict_details below, probe_notes, config
      "config": {"ops": [...], "modes": [...], "min_bytes": 8, "max_bytes": ..., "factor": 2, "iters": 20, "warmup": 5,
                 "dtype": "float32", "nccl_debug": "init"|"tuning", "algo_pass": true, "graph": false,
                 "pcie_p2p_level": null},                  # graph: --graph (absent in files written before it)
      "modes": [ {"mode": "nvlink", "env": {"NCCL_NVLS_ENABLE": "0"}, "backend": "nccl", "device": "cuda",
                  "devices": [0, 1], "ranks": 2, "notes": ["nvlink: P2P over NVLink (P2P/CUMEM/read)"]},
                 {"mode": "pcie", "env": {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}, ...} ],
      "rows": [ probe rows as above, "mode" set ],          # draw a busbw-vs-bytes curve per (op, mode)
      "transports": { "nvlink": {"transport": "P2P/CUMEM/read", "transports": {"P2P/CUMEM/read": 48},
                                 "kinds": {"P2P": 48}, "graph_types": ["NVL/PIX"], "p2p": true,
                                 "wire": "nvlink"|"pcie"|"host_memory"|"network"|"unknown",
                                 "uses_nvlink": true|false|null, "nvls_available": ..., "nvls_used": false,
                                 "algos": {"all_reduce": {"RING/LL": 12, "RING/SIMPLE": 30}},
                                 "nccl_debug_subsys": "INIT,GRAPH",   # what the TIMED sweep logged (1.1)
                                 "algo_source": "un-timed TUNING pass" | "timed run" | null,   # where algos came from (1.1)
                                 "nccl_version": "2.28.9+cuda13.0", "notes": [...], "log_dir": "..."},
                      "pcie": {...} },
      "side_by_side": [ {"op": "all_reduce", "bytes": 8192, "in_place": true,
                         "busbw_gbps": {"nvlink": ..., "pcie": ...}, "time_us": {...}, "correct": {...},
                         "ratio": nvlink/pcie busbw | null, "decode": true} ],   # decode: a size the trace used
      "links": {"source": "nvml"|"nvidia-smi"|"", "gpus": [...], "links": [ {"gpu_a": 0, "gpu_b": 1,
                "link": "nvlink"|"pcie", "nvlinks": 18, "nvlink_p2p": true, "nvswitch": false,
                "pcie_path": "SYS", "pcie_p2p": true, "source": "nvml", ...} ], "notes": [...],
                "nvidia_smi_topo": "..." | null},
      "trace": null | {"path": "...", "ranks": [0, 1], "level": "gpu_kernel", "steps": 16,
                "mode": "nvlink" | "pcie" | null, "mode_source": "...",   # the decode's own NCCL mode (manifest nccl_env)
                "source": "transfer"|"duration",          # duration: wait not separable, busbw a lower bound
                "sizes": [ {"op": "all_reduce", "coll_op": "all_reduce", "bytes": 8192, "n_ranks": 2, "count": 512,
                            "per_token": 32.0, "time_ns_median": ..., "busbw_gbps": ...,
                            "time_ns_total": ..., "transfer_ns_per_token": ... | null,
                            "bytes_source": "trace" | "manifest"} ],   # where the size came from
                "transfer_ns_total": ..., "transfer_ns_per_token": ... | null, "notes": [...]},
      "shortfall": null | {"baseline": "...", "sharded": "...", "n_ranks": 2, "per_token_ns": {...},   # with --baseline
                "per_token_source": ..., "shortfall_ns": S, "terms_ns": {...}, "transfer_ns": XN - f X1, "shares": {...},
                "verdict": "the shortfall's own sentence"},
      "verdict": "a few sentences (docs/METHOD.md section Bandwidth and the link verdict): would a faster link shrink the per-token shortfall?",
                                                       # ends with "Probe timing: ..." (graph replay / eager / host)
      "verdict_details": {                             # with a trace (without one: per_size = ratios at the largest size)
          "answer": "no" | "little" | "yes" | "unknown",   # no: XN < 10% of S; little: the k-bound < 10% of S; unknown: no S
          "per_size": [ {"op", "bytes", "count", "per_token", "transfer_weight",   # share of the trace's transfer time
                         "transfer_ns_per_token",      # XN x transfer_weight
                         "realised_busbw_gbps", "swept",
                         "probe_busbw_gbps": {mode: v}, "probe_time_us": {mode: us},
                         "probe_how": {mode: "exact"|"interpolated ..."|"above the sweep ..."},
                         "regime": "latency"|"bandwidth"|"unknown",   # latency: probe time < 2 x its floor in every mode
                         "realised_vs_probe": {mode: realised / probe}, "k": fast / slow busbw,
                         "bound_ratio_ns_per_token": XN_i max(0, 1 - 1/k),
                         "bound_per_call_ns_per_token": per_token x (t_slow - t_fast) us x 1000 at a latency-bound size, else null,
                         "bound_ns_per_token": the larger of the two (unswept ops: XN_i)} ],   # sorted by transfer_weight
          "modes": {"fast": "nvlink", "slow": "pcie"},  # fast: higher busbw at the largest size both swept
          "labels": {"nvlink": "NVLink", "pcie": "the PCIe/SHM path"},   # from NCCL's log
          "trace_mode": ..., "reference_mode": ...,     # the mode the realised busbw is set against
          "k": ...,                                    # XN (1 - 1/k) == the sum of bound_ratio_ns_per_token
          "regime": "latency"|"bandwidth"|"mixed"|"unknown",
          "large": {"op", "bytes", "busbw_gbps": {mode: v}, "k"},   # the largest size both modes swept
          "transfer_ns_per_token": XN, "xn_source": "shortfall"|"trace",   # shortfall: its transfer term
          "bound_ns_per_token": ..., "bound_inf_ns_per_token": XN,   # k-times faster link; infinitely fast link
          "shortfall_ns": S | null, "transfer_share_of_shortfall": ..., "bound_share_of_shortfall": ...,
          "tuning_in_timed_loop": ["nvlink", ...],     # modes whose timed sweep logged TUNING (small sizes inflated;
                                                       # never a --graph mode: TUNING is logged at capture, not replay)
          "timing": {"nvlink": "graph"|"eager"|"host"|"mixed"|"none", ...},   # how each mode's rows were timed
                                                       # (rows without `graph` count as eager); the verdict says it
                                                       # and, when eager, that small-size times include host launch
          "source": "transfer"|"duration"},
      "probe_notes": [...],                            # the sweep's own notes (notes = these + load + trace notes)
      "loaded_from": "X.json",                         # only from --load
      "notes": [...], "meta": {"torch": ..., "nccl": ..., "gpus": [...]} }
    ```
    `tracekit.probe.links.detect_links()` returns the `links.links` list alone ([] on a machine without
    GPUs; `detect_topology().notes` says why).
    """

    schema_version: str
    kind: str
    config: LinksConfig | UnsetType = UNSET  # absent in a 1.0 result loaded with --load
    modes: list[LinksMode]
    rows: list[ProbeRow]
    transports: dict[str, LinksTransportsValue]
    links: LinksTopology
    probe_notes: list[str]
    meta: LinksMeta
    side_by_side: list[LinksSideBySideItem]
    trace: LinksTrace | None
    shortfall: LinksShortfall | None
    verdict: str | None
    verdict_details: LinksVerdictDetails
    notes: list[str]
    loaded_from: str | UnsetType = UNSET  # --load: the saved result the verdict was recomputed from


class LinksProbe(Doc, kw_only=True):
    """The probe's part of a compare-links result: what `tracekit.probe.compare.compare_links`
    measured, and what `tracekit.analyse.links.verdict.recompute` reads from a saved result of any
    schema (1.0 has no `config` and no `probe_notes`: its `notes` are the sweep's and the trace's);
    the rest of a saved file (its verdict, side by side, shortfall) is recomputed, not read."""

    schema_version: str
    kind: str
    config: LinksConfig | UnsetType = UNSET
    modes: list[LinksMode]
    rows: list[ProbeRow]
    transports: dict[str, LinksTransportsValue]
    links: LinksTopology
    probe_notes: list[str] | UnsetType = UNSET
    meta: LinksMeta
    trace: LinksTrace | None | UnsetType = UNSET  # a saved trace part, reused without --trace
    notes: list[str] | UnsetType = UNSET
