"""The transport NCCL really used, read from its NCCL_DEBUG=INFO output (no torch, no NCCL).

Lines understood (prefix `host:pid:tid [dev] NCCL INFO ` optional):
- connections: `Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`, `Channel 02 : 3[3] -> 0[0] via
  SHM/direct/direct`, `... [send] via NET/Socket/0`, old `Ring 00 : 12[41000] -> 11[2d000] via
  P2P/IPC`, `via P2P/direct pointer`; newer NCCL appends ` comm 0x... nRanks ..`.
- tuning (NCCL_DEBUG_SUBSYS=TUNING): `AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE
  channel{Lo..Hi}={0..7}`, and the older numeric `1026048 Bytes -> Algo 1 proto 2 time 34.69`.
- graph search (GRAPH): `Pattern 4, crossNic 0, nChannels 4, bw 24.000000/24.000000, type NVL/PIX,
  sameChannels 0` (older NCCL says `speed` for `bw`): the path type NCCL planned on (NVL = NVLink).
- NVLS: `NVLS multicast support is available on dev 0` (capability), `NVLS comm 0x...` /
  `Connected NVLS` (NVLink SHARP set up), `Algo NVLS` in tuning lines (used).
- `Connected all rings`, `Connected all trees`, CollNet lines, `NCCL version 2.28.9+cuda13.0`.

`P2P/...` says peer-to-peer between GPUs but not over which wire: with the GRAPH path type `NVL`
(or NVML saying the pair has NVLink) it is NVLink, else PCIe. `SHM/...` goes through host memory.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.model.documents.links import NcclSummary
from tracekit.model.fields import copy_fields

_CONN_RE = re.compile(
    r"\b(?:Channel|Ring) (?P<channel>\d+)(?:/(?P<sub>\d+))? : (?P<src>\d+)\[(?P<srcdev>[0-9a-fA-Fx]+)\] -> "
    r"(?P<dst>\d+)\[(?P<dstdev>[0-9a-fA-Fx]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)"
    r"(?: comm 0x[0-9a-fA-F]+.*)?\s*$"
)
_TUNE_RE = re.compile(
    r"(?:\b(?P<op>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?"
)
_PATTERN_RE = re.compile(
    r"Pattern (?P<pattern>\d+), crossNic (?P<crossnic>\d+), nChannels (?P<nch>\d+), (?:bw|speed) "
    r"(?P<bw_intra>[\d.]+)/(?P<bw_inter>[\d.]+), type (?P<intra>\w+)/(?P<inter>\w+)"
)
_VERSION_RE = re.compile(r"NCCL version (?P<version>[\w.+-]+)")
_NVLS_AVAILABLE_RE = re.compile(r"NVLS multicast support is available")
_NVLS_USED_RE = re.compile(r"\bNVLS comm 0x|Connected NVLS|nvlsSupport 1\b")
_COLLNET_RE = re.compile(r"Connected (?:all )?collnet|collNetSupport 1\b", re.IGNORECASE)
_RINGS_RE = re.compile(r"Connected all rings")
_COMM_RE = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nR[ae]nks (?P<nranks>\d+)")

#: nccl_common.h: algorithm and protocol indices, for the numeric tuning lines.
_ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
_PROTOS = ("LL", "LL128", "SIMPLE")

#: NCCL's camel-case collective names -> probe op names.
_NCCL_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "alltoall",
    "sendrecv": "sendrecv",
    "send": "sendrecv",
    "recv": "sendrecv",
}


@dataclass(frozen=True)
class Connection:
    channel: int
    src_rank: int
    src_dev: str
    dst_rank: int
    dst_dev: str
    transport: str  # "P2P/CUMEM/read", "SHM/direct/direct", "NET/Socket/0", ...
    direction: str  # "send" / "receive" / ""

    @property
    def kind(self) -> str:
        """P2P, SHM, NET, COLLNET... (the part before the first '/')."""
        return self.transport.split("/", 1)[0].strip().upper()

    @property
    def short(self) -> str:
        """Transport without the trailing NIC/device index (`NET/Socket/0` -> `NET/Socket`)."""
        parts = self.transport.split("/")
        if self.kind == "NET" and len(parts) > 2:
            return "/".join(parts[:2])
        return self.transport


@dataclass(frozen=True)
class TuningChoice:
    op: str  # probe op name ("all_reduce"), "" when the line does not say
    bytes: int
    algo: str  # RING, TREE, NVLS, ...
    proto: str  # LL, LL128, SIMPLE
    channels: int | None


@dataclass
class NcclLog:
    """Everything read from one or more NCCL logs."""

    connections: list[Connection] = field(default_factory=list)
    tuning: list[TuningChoice] = field(default_factory=list)
    graph_types: list[tuple[str, str]] = field(default_factory=list)  # (intra, inter) path types
    version: str = ""
    nvls_available: bool = False
    nvls_used: bool = False
    collnet: bool = False
    rings_connected: bool = False
    n_ranks: int | None = None
    lines: int = 0

    def merge(self, other: NcclLog) -> NcclLog:
        self.connections += other.connections
        self.tuning += other.tuning
        self.graph_types += other.graph_types
        self.version = self.version or other.version
        self.nvls_available |= other.nvls_available
        self.nvls_used |= other.nvls_used
        self.collnet |= other.collnet
        self.rings_connected |= other.rings_connected
        self.n_ranks = self.n_ranks or other.n_ranks
        self.lines += other.lines
        return self


def _algo_name(text: str, table: tuple[str, ...]) -> str:
    if text.isdigit():
        i = int(text)
        return table[i] if i < len(table) else text
    return text.upper()


def parse_line(line: str, log: NcclLog) -> None:
    """Read one log line into `log` (lines without NCCL content are ignored)."""
    log.lines += 1
    m = _CONN_RE.search(line)
    if m:
        log.connections.append(
            Connection(
                channel=int(m["channel"]),
                src_rank=int(m["src"]),
                src_dev=m["srcdev"],
                dst_rank=int(m["dst"]),
                dst_dev=m["dstdev"],
                transport=m["via"].strip(),
                direction=m["dir"] or "",
            )
        )
        return
    m = _TUNE_RE.search(line)
    if m:
        op = _NCCL_OPS.get((m["op"] or "").lower(), "")
        channels = int(m["hi"]) - int(m["lo"]) + 1 if m["lo"] is not None else None
        algo = _algo_name(m["algo"], _ALGOS)
        log.tuning.append(TuningChoice(op, int(m["bytes"]), algo, _algo_name(m["proto"], _PROTOS), channels))
        if algo.startswith("NVLS"):
            log.nvls_used = True
        if algo.startswith("COLLNET"):
            log.collnet = True
        return
    m = _PATTERN_RE.search(line)
    if m:
        log.graph_types.append((m["intra"], m["inter"]))
        return
    m = _VERSION_RE.search(line)
    if m and not log.version:
        log.version = m["version"]
    if _NVLS_AVAILABLE_RE.search(line):
        log.nvls_available = True
    if _NVLS_USED_RE.search(line):
        log.nvls_used = True
    if _RINGS_RE.search(line):
        log.rings_connected = True
    if _COLLNET_RE.search(line):
        log.collnet = True
    m = _COMM_RE.search(line)
    if m and log.n_ranks is None:
        log.n_ranks = int(m["nranks"])


def parse_lines(lines: Iterable[str]) -> NcclLog:
    log = NcclLog()
    for line in lines:
        if "NCCL" in line or "Bytes -> Algo" in line or " via " in line:
            parse_line(line.rstrip("\n"), log)
    return log


def parse_files(paths: Iterable[Path | str]) -> NcclLog:
    """Parse several log files (one per rank) into one NcclLog; missing files are skipped."""
    log = NcclLog()
    for p in paths:
        path = Path(p)
        if not path.is_file():
            continue
        with path.open("r", errors="replace") as fh:
            log.merge(parse_lines(fh))
    return log


def summarize(log: NcclLog) -> NcclSummary:
    """A JSON-able summary: which transports NCCL connected, the path types it planned on, NVLS,
    algorithms/protocols per (op, bytes), and one `transport` label for probe rows."""
    by_transport = Counter(c.short for c in log.connections)
    by_kind = Counter(c.kind for c in log.connections)
    graph = sorted({f"{a}/{b}" for a, b in log.graph_types})
    intra = {a for a, _ in log.graph_types}
    label = by_transport.most_common(1)[0][0] if by_transport else ""
    if not by_transport and log.nvls_used:
        label = "NVLS"
    p2p = by_kind.get("P2P", 0) > 0
    if p2p and "NVL" in intra:
        wire = "nvlink"
    elif p2p and intra and intra <= {"PIX", "PXB", "PHB", "NODE", "SYS", "PCI"}:
        wire = "pcie"
    elif by_kind.get("SHM", 0) and not p2p:
        wire = "host_memory"
    elif by_kind.get("NET", 0) and not p2p and not by_kind.get("SHM", 0):
        wire = "network"
    else:
        wire = "unknown"
    algos: dict[str, dict[str, int]] = {}
    for t in log.tuning:
        key = f"{t.algo}/{t.proto}"
        algos.setdefault(t.op or "?", {})
        algos[t.op or "?"][key] = algos[t.op or "?"].get(key, 0) + 1
    # nvls_available, nvls_used, collnet, rings_connected, n_ranks, lines: the log's own
    return copy_fields(
        NcclSummary,
        log,
        transport=label,
        transports=dict(by_transport),
        kinds=dict(by_kind),
        graph_types=graph,
        p2p=p2p,
        wire=wire,  # nvlink / pcie / host_memory / network / unknown (from NCCL's own log)
        algos=algos,
        nccl_version=log.version,
        connections=len(log.connections),
    )


def choice_for(log: NcclLog, op: str, sizes: Iterable[int]) -> TuningChoice | None:
    """The most frequent tuning choice logged for `op` at any of `sizes` bytes (NCCL logs the call's
    byte count; for all_gather / reduce_scatter that may be per rank or total depending on the
    version, so callers pass both)."""
    wanted = set(sizes)
    counts: Counter[TuningChoice] = Counter(
        TuningChoice(t.op, t.bytes, t.algo, t.proto, None)
        for t in log.tuning
        if t.bytes in wanted and (t.op == op or not t.op)
    )
    return counts.most_common(1)[0][0] if counts else None
