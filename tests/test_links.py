"""Link detection: `nvidia-smi topo -m` parsing on published matrices, NVML logic on a stand-in
module with a known wiring, and the no-GPU case."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tracekit.probe.links import detect_links, detect_topology, parse_topo_matrix

# HazyResearch/ThunderKittens issue #167: 8x H100 SXM, every pair NV18 (space separated)
TOPO_H100_NV18 = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV18    NV18    NV18    NV18    NV18    NV18    NV18    0-47,96-143     0               N/A
GPU1    NV18     X      NV18    NV18    NV18    NV18    NV18    NV18    0-47,96-143     0               N/A
GPU2    NV18    NV18     X      NV18    NV18    NV18    NV18    NV18    0-47,96-143     0               N/A
GPU3    NV18    NV18    NV18     X      NV18    NV18    NV18    NV18    0-47,96-143     0               N/A
GPU4    NV18    NV18    NV18    NV18     X      NV18    NV18    NV18    48-95,144-191   1               N/A
GPU5    NV18    NV18    NV18    NV18    NV18     X      NV18    NV18    48-95,144-191   1               N/A
GPU6    NV18    NV18    NV18    NV18    NV18    NV18     X      NV18    48-95,144-191   1               N/A
GPU7    NV18    NV18    NV18    NV18    NV18    NV18    NV18     X      48-95,144-191   1               N/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# noonghunna/club-3090 issue #1229: 2x RTX 5090 on PCIe through the host bridge (tab separated)
TOPO_2X_PHB = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPHB\t0-63\t0\t\tN/A\n"
    "GPU1\tPHB\t X \t0-63\t0\t\tN/A\n"
)

# kubernetes/kubernetes issue #53497: 8 PCIe GPUs and a NIC column (the first five rows, as quoted)
TOPO_PCIE_NIC = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    mlx4_0  CPU Affinity
GPU0     X      PIX     PHB     PHB     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU1    PIX      X      PHB     PHB     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU2    PHB     PHB      X      PIX     SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU3    PHB     PHB     PIX      X      SYS     SYS     SYS     SYS     PHB     0-9,20-29
GPU4    SYS     SYS     SYS     SYS      X      PIX     PHB     PHB     SYS     10-19,30-39
"""


def test_topo_all_nvlink() -> None:
    links = parse_topo_matrix(TOPO_H100_NV18)
    assert len(links) == 28  # 8 choose 2
    assert all(link.link == "nvlink" and link.nvlinks == 18 and link.source == "nvidia-smi" for link in links)
    assert {(link.gpu_a, link.gpu_b) for link in links} == {(a, b) for a in range(8) for b in range(a + 1, 8)}


def test_topo_pcie_two_gpus_tabs() -> None:
    (link,) = parse_topo_matrix(TOPO_2X_PHB)
    assert (link.gpu_a, link.gpu_b, link.link, link.pcie_path, link.nvlinks) == (0, 1, "pcie", "PHB", 0)


def test_topo_pcie_paths_and_nic_column_ignored() -> None:
    links = {(x.gpu_a, x.gpu_b): x for x in parse_topo_matrix(TOPO_PCIE_NIC)}
    assert links[(0, 1)].pcie_path == "PIX"
    assert links[(0, 2)].pcie_path == "PHB"
    assert links[(2, 3)].pcie_path == "PIX"
    assert links[(0, 4)].pcie_path == "SYS"
    assert links[(4, 5)].pcie_path == "PIX" and links[(4, 7)].pcie_path == "PHB"
    assert all(x.link == "pcie" for x in links.values())
    assert (5, 6) not in links  # the rows of GPU5..7 are not in the quoted text
    assert not any("mlx" in str(k) for k in links)


def test_topo_garbage_is_empty() -> None:
    assert parse_topo_matrix("") == []
    assert parse_topo_matrix("No devices were found\n") == []


class FakeNvml:
    """pynvml stand-in: GPUs 0-1 joined by 4 NVLinks, GPU 2 on PCIe (PHB) only; or all GPUs on an
    NVSwitch (links end at a switch bus id)."""

    NVML_NVLINK_MAX_LINKS = 6
    NVML_FEATURE_ENABLED = 1
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_CAPS_INDEX_READ = (0,)  # as some nvidia-ml-py releases spell it

    def __init__(self, switch: bool = False) -> None:
        self.bus = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0"]
        self.switch = switch

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"Fake GPU"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.bus[h].encode())

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if self.switch:
            return 1
        if h in (0, 1) and link < 4:
            return 1
        if link >= 4:
            raise RuntimeError("NVMLError_InvalidArgument")
        return 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        if self.switch:
            return SimpleNamespace(busId=b"00000000:C5:00.0")
        peer = {0: 1, 1: 0}[h]
        return SimpleNamespace(busId=self.bus[peer].replace("00000000:", "0000:").lower())

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, idx: int) -> int:
        if idx == 2:
            return 0 if self.switch or {a, b} == {0, 1} else 4
        return 0

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 30


def test_nvml_direct_nvlink_and_pcie() -> None:
    topo = detect_topology(nvml=FakeNvml(), topo_text="")
    assert topo.source == "nvml"
    links = {(x.gpu_a, x.gpu_b): x for x in topo.links}
    assert links[(0, 1)].link == "nvlink" and links[(0, 1)].nvlinks == 4 and links[(0, 1)].nvswitch is False
    assert links[(0, 2)].link == "pcie" and links[(0, 2)].nvlinks == 0 and links[(0, 2)].pcie_path == "PHB"
    assert links[(1, 2)].nvlink_p2p is False and links[(1, 2)].pcie_p2p is True
    assert topo.has_nvlink() and topo.pair(1, 0) is links[(0, 1)]
    assert [g.bus_id for g in topo.gpus] == FakeNvml().bus
    # the topology as the compare-links result holds it: each GPU, and each pair with its ends
    doc = topo.document()
    assert [(g.index, g.bus_id) for g in doc.gpus] == list(enumerate(FakeNvml().bus))
    assert [(x.gpu_a, x.gpu_b, x.link) for x in doc.links] == [
        (0, 1, "nvlink"),
        (0, 2, "pcie"),
        (1, 2, "pcie"),
    ]


def test_nvml_nvswitch() -> None:
    topo = detect_topology(nvml=FakeNvml(switch=True), topo_text="")
    assert all(x.link == "nvlink" and x.nvlinks == 0 and x.nvswitch for x in topo.links)


def test_no_gpu_gives_empty_list_and_note() -> None:
    topo = detect_topology(topo_text="")
    if topo.gpus or topo.links:
        pytest.skip("this machine has GPUs")
    assert topo.links == [] and topo.source == ""
    assert any("no GPU" in n for n in topo.notes)
    assert detect_links() == []


def test_probe_links_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tracekit.cli.main import main

    assert main(["probe", "--op", "links", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"source", "gpus", "links", "notes", "nvidia_smi_topo"}
    assert isinstance(doc["links"], list) and (doc["links"] or doc["notes"])


def test_probe_links_text_is_a_row_per_pair_from_the_topology() -> None:
    """`render.links.topology_text` (`tracekit probe --links`) of the topology's document: the
    source in the first line, then per pair of the detection its link, NVLink count, NVLink P2P,
    NVSwitch, PCIe path and PCIe P2P, `?` where unknown; on no GPUs, no row and the note."""
    from tracekit.render.links import topology_text

    topo = detect_topology(nvml=FakeNvml(), topo_text="")
    lines = topology_text(topo.document()).splitlines()
    assert lines[0] == "# links per GPU pair (source: nvml)"
    rows = [ln.split() for ln in lines if not ln.startswith("#")]
    assert rows == [
        [
            f"{x.gpu_a}-{x.gpu_b}", x.link, str(x.nvlinks if x.nvlinks is not None else "?"), str(x.nvlink_p2p),
            str(x.nvswitch), x.pcie_path or "?", str(x.pcie_p2p),
        ]
        for x in topo.links
    ]  # fmt: skip
    none = detect_topology(topo_text="")
    if not none.links:
        text = topology_text(none.document())
        assert "(source: none)" in text and all(ln.startswith("#") for ln in text.splitlines())
        assert any(ln.startswith("# note: ") for ln in text.splitlines())
