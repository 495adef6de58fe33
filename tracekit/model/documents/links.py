"""The `Links` document: tracekit compare-links --format json (docs/JSON.md#probe)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from tracekit.model.documents.base import Doc


class LinksConfig(Doc, kw_only=True):
    ops: list[str]
    modes: list[str]
    min_bytes: int
    max_bytes: int
    factor: int
    iters: int
    warmup: int
    dtype: str
    nccl_debug: str
    algo_pass: bool
    graph: bool | UnsetType = UNSET
    pcie_p2p_level: str | None


class LinksMode(Doc, kw_only=True):
    mode: str
    env: dict[str, str]
    backend: str
    device: str
    devices: list[int]
    ranks: int
    notes: list[str]


class LinksRow(Doc, kw_only=True):
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
    graph: bool | UnsetType = UNSET
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
    correct: bool
    wrong: int
    mode: str
    transport: str
    algo: str
    proto: str


class LinksAlgos(Doc, kw_only=True):
    all_reduce: dict[str, int] | UnsetType = UNSET
    all_gather: dict[str, int] | UnsetType = UNSET


class LinksTransportsValue(Doc, kw_only=True):
    transport: str
    transports: dict[str, int]
    kinds: dict[str, int]
    graph_types: list[str]
    p2p: bool
    wire: str
    nvls_available: bool
    nvls_used: bool
    collnet: bool
    rings_connected: bool
    algos: LinksAlgos
    nccl_version: str
    n_ranks: int
    connections: int
    lines: int
    nccl_debug_subsys: str
    algo_source: str | None
    uses_nvlink: bool
    notes: list[str]
    log_dir: str


class LinksLinksValueItem(Doc, kw_only=True):
    index: int | UnsetType = UNSET
    name: str | UnsetType = UNSET
    bus_id: str | UnsetType = UNSET
    gpu_a: int | UnsetType = UNSET
    gpu_b: int | UnsetType = UNSET
    link: str | UnsetType = UNSET
    nvlinks: int | UnsetType = UNSET
    nvlink_p2p: bool | UnsetType = UNSET
    nvswitch: bool | UnsetType = UNSET
    pcie_path: str | UnsetType = UNSET
    pcie_p2p: bool | UnsetType = UNSET
    source: str | UnsetType = UNSET
    names: list[str] | UnsetType = UNSET
    bus_ids: list[str] | UnsetType = UNSET


class LinksGpu(Doc, kw_only=True):
    index: int
    name: str


class LinksMeta(Doc, kw_only=True):
    torch: str
    python: str
    cuda: str
    nccl: str
    gpus: list[LinksGpu]


class LinksBusbwGbps(Doc, kw_only=True):
    nvlink: float
    pcie: float


class LinksCorrect(Doc, kw_only=True):
    nvlink: bool
    pcie: bool


class LinksSideBySideItem(Doc, kw_only=True):
    op: str
    bytes: int
    in_place: bool
    busbw_gbps: LinksBusbwGbps
    time_us: LinksBusbwGbps
    correct: LinksCorrect
    ratio: float
    decode: bool


class LinksSize(Doc, kw_only=True):
    op: str
    coll_op: str
    bytes: int
    n_ranks: int
    count: int
    per_token: float
    time_ns_median: float
    time_ns_total: float
    transfer_ns_per_token: float
    busbw_gbps: float
    bytes_source: str


class LinksTrace(Doc, kw_only=True):
    path: str
    ranks: list[int]
    mode: str
    mode_source: str
    level: str
    source: str
    steps: int
    sizes: list[LinksSize]
    transfer_ns_total: float
    transfer_ns_per_token: float
    notes: list[str]


class LinksPerTokenNs(Doc, kw_only=True):
    baseline: int
    sharded: int
    ideal: int


class LinksTermsNs(Doc, kw_only=True):
    compute: int
    memory: int
    transfer: int
    coordination: int


class LinksShares(Doc, kw_only=True):
    compute: float
    memory: float
    transfer: float
    coordination: float


class LinksShortfall(Doc, kw_only=True):
    baseline: str
    sharded: str
    n_ranks: int
    per_token_ns: LinksPerTokenNs
    per_token_source: str
    shortfall_ns: int
    terms_ns: LinksTermsNs
    transfer_ns: int
    shares: LinksShares
    verdict: str


class LinksProbeHow(Doc, kw_only=True):
    nvlink: str
    pcie: str


class LinksPerSizeItem(Doc, kw_only=True):
    op: str
    bytes: int
    count: int | UnsetType = UNSET
    per_token: float | UnsetType = UNSET
    transfer_weight: float | UnsetType = UNSET
    transfer_ns_per_token: float | UnsetType = UNSET
    realised_busbw_gbps: float | UnsetType = UNSET
    swept: bool | UnsetType = UNSET
    probe_busbw_gbps: LinksBusbwGbps | UnsetType = UNSET
    probe_time_us: LinksBusbwGbps | UnsetType = UNSET
    probe_how: LinksProbeHow | UnsetType = UNSET
    regime: str | UnsetType = UNSET
    realised_vs_probe: LinksBusbwGbps | UnsetType = UNSET
    k: float | UnsetType = UNSET
    bound_ns_per_token: float | UnsetType = UNSET
    busbw_gbps: LinksBusbwGbps | UnsetType = UNSET
    ratio: float | UnsetType = UNSET


class LinksModes(Doc, kw_only=True):
    fast: str
    slow: str


class LinksLarge(Doc, kw_only=True):
    op: str
    bytes: int
    busbw_gbps: LinksBusbwGbps
    k: float


class LinksVerdictDetails(Doc, kw_only=True):
    per_size: list[LinksPerSizeItem]
    modes: LinksModes | UnsetType = UNSET
    labels: LinksProbeHow | UnsetType = UNSET
    trace_mode: str | UnsetType = UNSET
    reference_mode: str | UnsetType = UNSET
    k: float | UnsetType = UNSET
    regime: str | UnsetType = UNSET
    large: LinksLarge | UnsetType = UNSET
    transfer_ns_per_token: float | UnsetType = UNSET
    xn_source: str | UnsetType = UNSET
    bound_ns_per_token: float | UnsetType = UNSET
    bound_inf_ns_per_token: float | UnsetType = UNSET
    shortfall_ns: float | UnsetType = UNSET
    transfer_share_of_shortfall: float | UnsetType = UNSET
    bound_share_of_shortfall: float | UnsetType = UNSET
    tuning_in_timed_loop: list[str] | UnsetType = UNSET
    source: str | UnsetType = UNSET
    answer: str | UnsetType = UNSET
    timing: LinksProbeHow | UnsetType = UNSET


class Links(Doc, kw_only=True):
    schema_version: str
    kind: str
    config: LinksConfig
    modes: list[LinksMode]
    rows: list[LinksRow]
    transports: dict[str, LinksTransportsValue]
    links: dict[str, list[LinksLinksValueItem] | str]
    probe_notes: list[str]
    meta: LinksMeta
    side_by_side: list[LinksSideBySideItem]
    trace: LinksTrace | None
    shortfall: LinksShortfall | None
    verdict: str
    verdict_details: LinksVerdictDetails
    notes: list[str]
