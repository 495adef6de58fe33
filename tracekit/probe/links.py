"""Which link joins each GPU pair: NVLink or PCIe (and how far over PCIe), recorded, not assumed.

Sources, in order:
1. NVML through nvidia-ml-py (`pynvml`): per pair `nvmlDeviceGetP2PStatus(a, b,
   NVML_P2P_CAPS_INDEX_NVLINK)` (NVLink P2P possible), per link of each GPU
   `nvmlDeviceGetNvLinkState` and `nvmlDeviceGetNvLinkRemotePciInfo` (links wired straight to the
   peer; on NVSwitch systems links end at a switch, so the direct count is 0 while P2P over NVLink
   is OK), `nvmlDeviceGetTopologyCommonAncestor` (the PCIe path: PIX, PXB, PHB, NODE, SYS) and the
   PCIe P2P read status.
2. `nvidia-smi topo -m`, parsed (`parse_topo_matrix`): NV# = # bonded NVLinks, else the PCIe path.
3. Neither (no GPU, no driver): an empty list and a note.

Indices are NVML / nvidia-smi indices (physical order), which equal CUDA indices unless
CUDA_VISIBLE_DEVICES reorders or hides devices (a note says so when it is set).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from tracekit.model.documents.links import LinksLinksValueItem, LinksTopology
from tracekit.model.fields import copy_fields

#: NVML topology levels (nvmlGpuTopologyLevel_t) -> nvidia-smi's legend names.
NVML_TOPOLOGY = {0: "SAME_BOARD", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: nvidia-smi topo legend names for a PCIe path (SOC is the old name of SYS).
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_NV_RE = re.compile(r"^NV(\d+)$")


@dataclass
class Link:
    """One GPU pair (gpu_a < gpu_b)."""

    gpu_a: int
    gpu_b: int
    link: str  # "nvlink" or "pcie"
    nvlinks: int | None  # bonded NVLinks wired straight between the two (None: unknown)
    nvlink_p2p: bool | None  # NVML: P2P over NVLink possible (also true through NVSwitch)
    nvswitch: bool | None  # NVLinks end at an NVSwitch rather than at the peer GPU
    pcie_path: str  # common ancestor on PCIe: PIX, PXB, PHB, NODE, SYS, SAME_BOARD, "" unknown
    pcie_p2p: bool | None  # NVML: P2P reads over PCIe possible
    source: str  # "nvml" or "nvidia-smi"
    names: tuple[str, str] = ("", "")
    bus_ids: tuple[str, str] = ("", "")

    def document(self) -> LinksLinksValueItem:
        """The pair as the compare-links result's `links.links[]` entry."""
        return copy_fields(LinksLinksValueItem, self, names=list(self.names), bus_ids=list(self.bus_ids))


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML lists it."""

    index: int
    name: str
    bus_id: str

    def document(self) -> LinksLinksValueItem:
        return LinksLinksValueItem(index=self.index, name=self.name, bus_id=self.bus_id)


@dataclass
class Topology:
    links: list[Link] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source: str = ""  # "nvml", "nvidia-smi" or "" (nothing found)
    gpus: list[Gpu] = field(default_factory=list)
    nvidia_smi_topo: str | None = None

    def document(self) -> LinksTopology:
        """The machine's links as the compare-links result's `links` (docs/JSON.md#probe)."""
        return LinksTopology(
            source=self.source,
            gpus=[g.document() for g in self.gpus],
            links=[link.document() for link in self.links],
            notes=list(self.notes),
            nvidia_smi_topo=self.nvidia_smi_topo,
        )

    def has_nvlink(self) -> bool:
        return any(link.link == "nvlink" for link in self.links)

    def pair(self, a: int, b: int) -> Link | None:
        lo, hi = min(a, b), max(a, b)
        return next((link for link in self.links if (link.gpu_a, link.gpu_b) == (lo, hi)), None)


# ---------------------------------------------------------------------------------------------
# nvidia-smi topo -m


def parse_topo_matrix(text: str) -> list[Link]:
    """GPU pairs from `nvidia-smi topo -m` output (tab- or space-separated; NIC / mlx columns,
    CPU/NUMA affinity columns and the legend are ignored)."""
    lines = [_ANSI_RE.sub("", ln).rstrip() for ln in text.splitlines()]
    header_idx = next((i for i, ln in enumerate(lines) if re.match(r"^\s*GPU0\b", ln)), None)
    if header_idx is None:
        return []
    columns: list[str] = []
    for tok in lines[header_idx].split():
        if tok in ("CPU", "NUMA", "GPU") or tok.startswith("Affinity"):
            break
        columns.append(tok)
    cells: dict[tuple[int, int], str] = {}
    for ln in lines[header_idx + 1 :]:
        m = re.match(r"^\s*GPU(\d+)\s", ln + " ")
        if not m:
            if ln.strip().startswith("Legend"):
                break
            continue
        row = int(m.group(1))
        toks = ln.split()[1:]
        for col, val in zip(columns, toks, strict=False):
            cm = re.match(r"^GPU(\d+)$", col)
            if cm:
                cells[(row, int(cm.group(1)))] = val
    n_gpus = sorted({a for a, _ in cells} | {b for _, b in cells})
    links: list[Link] = []
    for a in n_gpus:
        for b in n_gpus:
            if b <= a:
                continue
            found = cells.get((a, b)) or cells.get((b, a))
            if found is None or found == "X":
                continue
            cell: str = found
            nv = _NV_RE.match(cell)
            if nv:
                links.append(Link(a, b, "nvlink", int(nv.group(1)), True, None, "", None, "nvidia-smi"))
            else:
                path = "SYS" if cell == "SOC" else cell
                links.append(Link(a, b, "pcie", 0, False, None, path, None, "nvidia-smi"))
    return links


def nvidia_smi_topo() -> str | None:
    """`nvidia-smi topo -m` output, or None where nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


# ---------------------------------------------------------------------------------------------
# NVML


def _as_int(v: Any) -> int:
    # some nvidia-ml-py releases define NVML_P2P_CAPS_INDEX_READ as a one-element tuple
    return int(v[0]) if isinstance(v, tuple) else int(v)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _norm_bus(bus: str) -> str:
    """'00000000:18:00.0' and '0000:18:00.0' -> '18:00.0' (domain dropped, lower case)."""
    bus = bus.strip().lower()
    parts = bus.split(":")
    if len(parts) == 3:
        return f"{parts[1]}:{parts[2]}"
    return bus


def nvml_links(nvml: Any) -> tuple[list[Link], list[Gpu]]:
    """Pairs and GPU list through an initialised pynvml-like module `nvml`."""
    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    names = [_text(nvml.nvmlDeviceGetName(h)) for h in handles]
    buses = [_text(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    gpus = [Gpu(i, names[i], buses[i]) for i in range(count)]
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
    enabled = int(getattr(nvml, "NVML_FEATURE_ENABLED", 1))
    # per GPU: remote bus id of every active link
    remote: list[list[str]] = []
    for h in handles:
        ends = []
        for link in range(max_links):
            try:
                if int(nvml.nvmlDeviceGetNvLinkState(h, link)) != enabled:
                    continue
                ends.append(_norm_bus(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)))
            except Exception:  # NVMLError_NotSupported / InvalidArgument past the last link
                continue
        remote.append(ends)
    bus_norm = [_norm_bus(b) for b in buses]
    p2p_ok = int(getattr(nvml, "NVML_P2P_STATUS_OK", 0))
    nvlink_idx = _as_int(getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2))
    read_idx = _as_int(getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", 0))
    links: list[Link] = []
    for a in range(count):
        for b in range(a + 1, count):
            try:
                nvlink_p2p: bool | None = (
                    int(nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], nvlink_idx)) == p2p_ok
                )
            except Exception:
                nvlink_p2p = None
            try:
                pcie_p2p: bool | None = (
                    int(nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], read_idx)) == p2p_ok
                )
            except Exception:
                pcie_p2p = None
            try:
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
                path = NVML_TOPOLOGY.get(level, str(level))
            except Exception:
                path = ""
            direct = sum(1 for end in remote[a] if end == bus_norm[b])
            # links that end at neither GPU of this host's list: an NVSwitch
            to_switch = any(end not in bus_norm for end in remote[a]) and any(
                end not in bus_norm for end in remote[b]
            )
            is_nvlink = bool(direct) or bool(nvlink_p2p)
            links.append(
                Link(
                    a,
                    b,
                    "nvlink" if is_nvlink else "pcie",
                    direct,
                    nvlink_p2p,
                    to_switch if remote[a] or remote[b] else False,
                    path,
                    pcie_p2p,
                    "nvml",
                    (names[a], names[b]),
                    (buses[a], buses[b]),
                )
            )
    return links, gpus


def detect_topology(nvml: Any = None, topo_text: str | None = None) -> Topology:
    """Links per GPU pair with notes; never raises for a machine without GPUs.

    `nvml` (a pynvml-like module) and `topo_text` (nvidia-smi output) may be given for tests;
    otherwise pynvml is imported and `nvidia-smi topo -m` is run."""
    topo = Topology()
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        topo.notes.append(
            f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}: link indices are NVML (physical) indices"
        )
    owned = False
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            nvml, owned = pynvml, True
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError
            topo.notes.append(f"NVML not available ({type(exc).__name__}: {exc})")
            nvml = None
    if nvml is not None:
        try:
            topo.links, topo.gpus = nvml_links(nvml)
            topo.source = "nvml"
        except Exception as exc:
            topo.notes.append(f"NVML query failed ({type(exc).__name__}: {exc})")
        finally:
            if owned:
                try:
                    nvml.nvmlShutdown()
                except Exception:
                    pass
    text = topo_text if topo_text is not None else nvidia_smi_topo()
    topo.nvidia_smi_topo = text
    if topo.source == "" and text:
        topo.links = parse_topo_matrix(text)
        topo.source = "nvidia-smi" if topo.links else ""
    if topo.source == "" and not topo.gpus:
        topo.notes.append("no GPU found (neither NVML nor nvidia-smi answered): no links to report")
    elif len(topo.gpus) == 1 or (topo.source and not topo.links):
        topo.notes.append("one GPU only: no GPU pair, so no link to report")
    return topo


def detect_links() -> list[LinksLinksValueItem]:
    """Links per GPU pair (see `Link`), as the compare-links result's `links.links`; [] on a
    machine without GPUs (the note is in `detect_topology().notes`)."""
    return [link.document() for link in detect_topology().links]
