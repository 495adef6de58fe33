"""The NCCL_DEBUG=INFO parser on real log lines pasted in public GitHub issues (source above each)."""

from __future__ import annotations

from pathlib import Path

from tracekit.probe.nccl_log import choice_for, parse_files, parse_lines, summarize

# NVIDIA/nccl issue #1189 (H20, NCCL 2.2x): P2P over NVLink within a node, IB between nodes
NCCL_1189 = """\
H20-GPU-06:4015539:4015652 [0] NCCL INFO Channel 07/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA
H20-GPU-06:4015540:4015653 [1] NCCL INFO Channel 00/0 : 3[1] -> 2[0] via P2P/CUMEM
H20-GPU-05:1789225:1789736 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM
H20-GPU-05:1789225:1789736 [1] NCCL INFO Pattern 4, crossNic 1, nChannels 4, bw 24.000000/24.000000, type NVL/PIX, sameChannels 0
"""

# NVIDIA/nccl issue #1609 (H800 node): host shared memory between GPUs
NCCL_1609 = """\
tj5-sc-ai-h800r-dev01:533:1765 [2] NCCL INFO Channel 07 : 2[6] -> 3[7] via SHM/direct/direct
tj5-sc-ai-h800r-dev01:533:1765 [2] NCCL INFO Channel 08 : 2[6] -> 3[7] via SHM/direct/direct
tj5-sc-ai-h800r-dev01:532:1764 [1] NCCL INFO Connected all rings
tj5-sc-ai-h800r-dev01:534:1763 [3] NCCL INFO Channel 00 : 3[7] -> 2[6] via SHM/direct/direct
"""

# NVIDIA/nccl issue #952: P2P/IPC/read inside a node, sockets between nodes
NCCL_952 = """\
<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
<cluster_name>:921:1146 [2] NCCL INFO Channel 00/0 : 10[2] -> 9[1] via P2P/IPC/read
"""

# NVIDIA/nccl issue #1817: "P2P/direct pointer" (one process, several GPUs)
NCCL_1817 = "sh9-machine-20250813085604-64df4c99dc-m27xf:3884994:3885084 [0] NCCL INFO Channel 01/1 : 0[0] -> 3[3] via P2P/direct pointer\n"

# NVIDIA/nccl issue #385 (NCCL 2.7 era): the old "Ring" wording with bus ids in brackets
NCCL_385 = "[4] NCCL INFO Ring 00 : 12[41000] -> 11[2d000] via P2P/IPC\n[1] NCCL INFO Ring 00 : 1[23000] -> 8[1e000] [send] via NET/IB/1/GDRDMA\n"

# NVIDIA/nccl issue #1595: numeric tuning line; the maintainer reads it as RING/SIMPLE
NCCL_1595 = "[0] NCCL INFO 1026048 Bytes -> Algo 1 proto 2 time 34.693867\n"

# NVIDIA/nccl issue #1453 (H100 cluster): Algo 0 proto 1 = TREE/LL128
NCCL_1453 = (
    "[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 262144 Bytes -> Algo 0 proto 1 time 54.707825\n"
)

# NVIDIA/nccl issue #1538: NVLS capability line (capability, not use)
NCCL_1538 = "job-3bb823c0-6d27-4312-8094-1c5910bf9b51-worker-0:5668:5722 [5] NCCL INFO NVLS multicast support is available on dev 5\n"

# NVIDIA/nccl issue #601 (older NCCL): "speed" instead of "bw", SYS path
NCCL_601 = "gpu23:1513:1528 [2] NCCL INFO Pattern 4, crossNic 0, nChannels 4, speed 1.200000/1.200000, type SYS/SYS, sameChannels 0\n"

# Text tuning format (NCCL >= 2.19, src/enqueue.cc), as pasted in a public NCCL_DEBUG log
# (GitHub code search: "tpgds-aihub0007 ... AllReduce: 4 Bytes -> Algo RING proto SIMPLE")
NCCL_TUNING_TEXT = (
    "tpgds-aihub0007:185302:185302 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f757de00400 recvbuff 0x7f757de00400 "
    "count 1 datatype 7 op 0 root 0 comm 0x55a0be47d620 [nranks=16] stream 0x55a0c85fa4a0\n"
    "tpgds-aihub0007:185302:185302 [0] NCCL INFO AllReduce: 4 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..0}\n"
)


def test_p2p_over_nvlink_from_graph_type() -> None:
    log = parse_lines(NCCL_1189.splitlines())
    assert len(log.connections) == 3
    net = log.connections[0]
    assert (net.channel, net.src_rank, net.dst_rank, net.direction) == (7, 0, 2, "receive")
    assert net.transport == "NET/IB/3/GDRDMA" and net.kind == "NET" and net.short == "NET/IB"
    s = summarize(log)
    assert s.transports == {"NET/IB": 1, "P2P/CUMEM": 2}
    assert s.transport == "P2P/CUMEM"
    assert s.graph_types == ["NVL/PIX"]
    assert s.p2p and s.wire == "nvlink"


def test_shm_is_host_memory() -> None:
    log = parse_lines(NCCL_1609.splitlines())
    s = summarize(log)
    assert s.transports == {"SHM/direct/direct": 3}
    assert s.kinds == {"SHM": 3}
    assert not s.p2p and s.wire == "host_memory"
    assert s.rings_connected
    c = log.connections[0]
    assert (c.channel, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev) == (7, 2, "6", 3, "7")


def test_ipc_read_socket_direct_pointer_and_old_ring() -> None:
    s = summarize(parse_lines(NCCL_952.splitlines()))
    assert s.transports == {"P2P/IPC/read": 2, "NET/Socket": 1}
    log = parse_lines([NCCL_1817])
    assert log.connections[0].transport == "P2P/direct pointer" and log.connections[0].channel == 1
    old = parse_lines(NCCL_385.splitlines())
    assert [c.transport for c in old.connections] == ["P2P/IPC", "NET/IB/1/GDRDMA"]
    assert old.connections[0].src_dev == "41000" and old.connections[1].direction == "send"


def test_tuning_lines_numeric_and_text() -> None:
    log = parse_lines([NCCL_1595, NCCL_1453])
    assert [(t.bytes, t.algo, t.proto) for t in log.tuning] == [
        (1026048, "RING", "SIMPLE"),
        (262144, "TREE", "LL128"),
    ]
    text = parse_lines(NCCL_TUNING_TEXT.splitlines())
    assert len(text.tuning) == 1  # the opCount line is not a tuning line
    t = text.tuning[0]
    assert (t.op, t.bytes, t.algo, t.proto, t.channels) == ("all_reduce", 4, "RING", "SIMPLE", 1)
    assert choice_for(text, "all_reduce", {4}) is not None
    assert choice_for(text, "all_reduce", {8}) is None
    assert summarize(text).algos == {"all_reduce": {"RING/SIMPLE": 1}}


def test_nvls_capability_is_not_use_and_old_pattern() -> None:
    log = parse_lines([NCCL_1538, NCCL_601])
    assert log.nvls_available and not log.nvls_used
    assert log.graph_types == [("SYS", "SYS")]
    used = parse_lines(
        ["x:1:2 [0] NCCL INFO AllReduce: 33554432 Bytes -> Algo NVLS proto SIMPLE channel{Lo..Hi}={0..15}"]
    )
    assert used.nvls_used


def test_files_per_rank(tmp_path: Path) -> None:
    (tmp_path / "nccl-rank0.log").write_text(NCCL_1189)
    (tmp_path / "nccl-rank1.log").write_text(NCCL_952)
    log = parse_files([tmp_path / "nccl-rank0.log", tmp_path / "nccl-rank1.log", tmp_path / "missing.log"])
    assert len(log.connections) == 6
    assert summarize(parse_lines([])).transport == ""
