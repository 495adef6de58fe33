"""The Nsight Systems reader on real exports, against independent oracles (pipit's CSV rendering of
`nsys stats`, and sqlite3 queries written here), plus synthetic exports built in code."""

from __future__ import annotations

import csv
import os
import re
import shutil
import sqlite3
import stat
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import shared_trace
from tracekit.errors import RankError, TraceFormatError
from tracekit.model.events import check_events
from tracekit.read.nsys import read_nsys

H200 = "h200/nsys_matmul_nvtx.sqlite"
H200_REP = "h200/nsys_matmul_nvtx.nsys-rep"


def _kernel_rows(db: Path) -> int:
    """The export's kernel records, counted in SQL (the oracle of the reader's kernel events)."""
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0])
    finally:
        con.close()


T4 = "external/nsys/nsightful_power_iteration_t4_2025.3.sqlite"
CLOVER = "external/nsys/pipit_cloverleaf_perlmutter-cloverleaf-cuda.sqlite"
CLOVER_GPU_CSV = "external/nsys/pipit_cloverleaf_cloverleaf_gpu_trace.csv"
CLOVER_API_CSV = "external/nsys/pipit_cloverleaf_cloverleaf-cuda_api_trace.csv"


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)


def _csv_intervals(path: Path) -> list[dict[str, str]]:
    """pipit's Enter/Leave rows -> one dict per interval (Enter row + its Leave timestamp)."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for row in rows:
        if row["Event Type"] == "Enter":
            row = dict(row)
            row["start"] = row["Timestamp (ns)"]
            row["end"] = row["_matching_timestamp"]
            out.append(row)
    assert 2 * len(out) == len(rows), "every Enter has its Leave"
    return out


# --------------------------------------------------------------------------------------------------
# pipit cloverleaf (A100, nsys 2024.5) vs the CSV oracle


def test_cloverleaf_gpu_activity_matches_csv_oracle(shared_traces: Path) -> None:
    run = read_nsys(shared_trace(shared_traces, CLOVER))
    check_events(run.events)
    gpu = _csv_intervals(shared_trace(shared_traces, CLOVER_GPU_CSV))
    assert len(gpu) * 2 == 3182
    csv_kernels = [r for r in gpu if r["type"] == "kernel"]
    csv_copies = [r for r in gpu if r["type"].startswith("CUDA_MEMCPY_KIND_")]
    assert (len(csv_kernels), len(csv_copies)) == (1312, 279)

    ev = run.events
    for kind, oracle in (("kernel", csv_kernels), ("memcpy", csv_copies)):
        ours = ev[ev["kind"] == kind].sort_values(["start_ns", "end_ns"])
        theirs = sorted(oracle, key=lambda r: (int(r["start"]), int(r["end"])))
        assert len(ours) == len(theirs)
        assert ours["start_ns"].tolist() == [int(r["start"]) for r in theirs]
        assert ours["end_ns"].tolist() == [int(r["end"]) for r in theirs]
        assert ours["stream"].tolist() == [int(r["streamId"]) for r in theirs]
        if kind == "kernel":
            # the CSV carries the short name; ours is the demangled name, which contains it
            assert all(
                re.search(rf"\b{re.escape(r['Name'])}\b", str(n))
                for n, r in zip(ours["name"], theirs, strict=True)
            )
        else:
            direction = {"CUDA_MEMCPY_KIND_HTOD": "HtoD", "CUDA_MEMCPY_KIND_DTOH": "DtoH"}
            assert [str(n).split()[1] for n in ours["name"]] == [direction[r["type"]] for r in theirs]
    # Kineto's spelling: pageable host memory to the device
    assert "Memcpy HtoD (Pageable -> Device)" in set(ev.loc[ev["kind"] == "memcpy", "name"].astype(str))
    assert run.rank_info[0]["memcpy_bytes"] == sum(int(r["bytes"]) for r in csv_copies)


def test_cloverleaf_api_calls_match_csv_oracle(shared_traces: Path) -> None:
    run = read_nsys(shared_trace(shared_traces, CLOVER))
    api = _csv_intervals(shared_trace(shared_traces, CLOVER_API_CSV))
    ours = run.events[run.events["kind"] == "runtime"].sort_values(["start_ns", "end_ns"])
    theirs = sorted(api, key=lambda r: (int(r["start"]), int(r["end"])))
    assert len(ours) == len(theirs) == 3048
    assert ours["start_ns"].tolist() == [int(r["start"]) for r in theirs]
    assert ours["end_ns"].tolist() == [int(r["end"]) for r in theirs]
    assert ours["stream"].tolist() == [int(r["Thread"]) for r in theirs]  # host thread id
    # nsys names carry the API version ("cudaMalloc_v3020"); Kineto's do not: the reader drops it
    assert ours["name"].astype(str).tolist() == [re.sub(r"_v\d+$", "", r["Name"]) for r in theirs]
    names = Counter(ours["name"].astype(str))
    assert names["cudaDeviceSynchronize"] == 1312
    assert names["cudaLaunchKernel"] == 1312
    # CUPTI synchronisation records become kind sync, named as Kineto's cuda_sync events
    sync = run.events[run.events["kind"] == "sync"]
    assert len(sync) == 1312
    assert set(sync["name"].astype(str)) == {"Event Sync"}  # syncType 1 in this export
    assert run.rank_info[0]["pid"] == int(theirs[0]["Process"])


# --------------------------------------------------------------------------------------------------
# nsightful power iteration (T4, nsys 2025.3): registered strings and domains


def test_t4_kernels_and_registered_nvtx_strings(shared_traces: Path) -> None:
    path = shared_trace(shared_traces, T4)
    run = read_nsys(path)
    check_events(run.events)
    ev = run.events
    assert int((ev["kind"] == "kernel").sum()) == 3689

    with _ro(path) as con:
        oracle = con.execute(
            """SELECT n.start, n.end, COALESCE(n.text, s.value),
                      CASE WHEN n.domainId = 0 THEN '' ELSE d.text END
               FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
               LEFT JOIN NVTX_EVENTS d ON d.eventType = 75 AND d.domainId = n.domainId
               WHERE n.eventType IN (59, 60) ORDER BY n.start, n.end"""
        ).fetchall()
        n_text_ids = con.execute(
            "SELECT count(*) FROM NVTX_EVENTS WHERE text IS NULL AND textId IS NOT NULL"
        ).fetchone()[0]
        stream_syncs = con.execute(
            """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
               WHERE s.value LIKE 'cudaStreamSynchronize%'"""
        ).fetchone()[0]
    assert n_text_ids > 0, "this export names its ranges through registered strings"
    ann = ev[ev["kind"] == "annotation"].sort_values(["start_ns", "end_ns"], kind="stable")
    assert len(ann) == len(oracle) == 786
    assert ann["start_ns"].tolist() == [r[0] for r in oracle]
    assert ann["end_ns"].tolist() == [r[1] for r in oracle]
    assert sorted(ann["name"].astype(str)) == sorted(r[2] for r in oracle)
    assert "" not in set(ann["name"].astype(str))
    assert {"Setup", "Loop", "cub::DeviceReduce::Sum"} <= set(ann["name"].astype(str))
    assert run.rank_info[0]["nvtx_domains"] == dict(Counter(r[3] for r in oracle))
    assert set(run.rank_info[0]["nvtx_domains"]) == {"", "CCCL"}
    assert stream_syncs > 0
    assert int((ev["name"] == "cudaStreamSynchronize").sum()) == stream_syncs
    # host ranges sit on the host thread that issued them, like the runtime calls
    assert set(ann["stream"]) <= set(ev.loc[ev["kind"] == "runtime", "stream"])


# --------------------------------------------------------------------------------------------------
# the H200 capture: 20 decode_step ranges, each around one matmul kernel


def test_h200_decode_steps_contain_their_matmul(shared_traces: Path) -> None:
    path = shared_trace(shared_traces, H200)
    run = read_nsys(path)
    check_events(run.events)
    ev = run.events
    steps = ev[(ev["kind"] == "annotation") & ev["name"].astype(str).str.startswith("decode_step")]
    steps = steps.sort_values("start_ns")
    assert steps["name"].astype(str).tolist() == [f"decode_step {i}" for i in range(20)]

    runtime = ev[ev["kind"] == "runtime"]
    kernels = ev[ev["kind"] == "kernel"].set_index("correlation")
    per_step = []
    for _, s in steps.iterrows():
        inside = runtime[
            (runtime["stream"] == s["stream"])
            & (runtime["start_ns"] >= s["start_ns"])
            & (runtime["end_ns"] <= s["end_ns"])
        ]
        launched = kernels.loc[kernels.index.intersection(inside["correlation"])]
        per_step.append(sorted(launched["name"].astype(str)))
        assert len(launched) == 1
        # the kernel runs after the launch and finishes before the step's synchronize returns
        assert launched["start_ns"].iloc[0] >= inside["start_ns"].min()
        assert launched["end_ns"].iloc[0] <= s["end_ns"]
        assert (inside["name"] == "cudaDeviceSynchronize").sum() == 1

    with _ro(path) as con:
        oracle = con.execute(
            """SELECT n.text, sk.value
               FROM NVTX_EVENTS n
               JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                 ON r.globalTid = n.globalTid AND r.start >= n.start AND r.end <= n.end
               JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId
               JOIN StringIds sk ON sk.id = k.demangledName
               WHERE n.eventType = 59 ORDER BY n.start"""
        ).fetchall()
        n_kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        n_runtime = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    assert [r[0] for r in oracle] == steps["name"].astype(str).tolist()
    assert [[r[1]] for r in oracle] == per_step
    assert all("sgemm" in r[1] for r in oracle)
    assert int((ev["kind"] == "kernel").sum()) == n_kernels == 21
    assert int((ev["kind"] == "runtime").sum()) == n_runtime
    info = run.rank_info[0]
    assert info["session_start_utc_ns"] == 1795964461117570019
    assert info["devices"] == [{"id": 0, "name": "NVIDIA H200"}]
    assert run.data_quality.counts["nsys_rank_assumed"] == 1


# --------------------------------------------------------------------------------------------------
# ranks


def test_rank_from_argument_and_file_name(real_nsys_sqlite: Path, tmp_path: Path) -> None:
    src = real_nsys_sqlite
    assert read_nsys(src, rank=5).ranks == [5]
    named = tmp_path / "decode.rank-3.sqlite"
    shutil.copy(src, named)
    run = read_nsys(named)
    assert run.ranks == [3]
    assert set(run.events["rank"]) == {3}
    assert run.rank_info[3]["rank_source"] == "file name"
    assert "nsys_rank_assumed" not in run.data_quality.counts


# --------------------------------------------------------------------------------------------------
# synthetic exports with known answers


def _pid_tid(pid: int, tid: int) -> int:
    return (pid << 24) | tid  # NVIDIA's serialised globalTid (vmId 0)


def _make_db(path: Path, *, two_processes: bool = True, env: str | None = None) -> None:
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, contextId INT,
            streamId INT, correlationId INT, globalPid INT, demangledName INT, shortName INT, mangledName INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, contextId INT, streamId INT,
            correlationId INT, globalPid INT, bytes INT, copyKind INT, srcKind INT, dstKind INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT, end INT, deviceId INT, contextId INT, streamId INT,
            correlationId INT, globalPid INT, value INT, bytes INT, memKind INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT,
            correlationId INT, nameId INT, returnValue INT, callchainId INT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, rangeId INT, category INT, color INT,
            text TEXT, globalTid INT, endGlobalTid INT, textId INT, domainId INT, jsonText TEXT);
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT, utcTime TEXT, localTime TEXT);
        CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INT, devStateName TEXT, name TEXT, nameEnum INT, value TEXT);
        INSERT INTO StringIds VALUES (1, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)'),
            (2, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL'), (3, 'void ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)'),
            (4, 'cudaLaunchKernel_v7000'), (5, 'cudaStreamSynchronize_v3020'), (6, 'decode_step 0'),
            (7, 'ampere_bf16_s16816gemm'), (8, 'ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)');
        INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '');
        """
    )
    procs = [(100, 0), (200, 1)] if two_processes else [(100, 0)]
    for pid, dev in procs:
        g, t = _pid_tid(pid, 0), _pid_tid(pid, pid)
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,1,?,?,?,?,?,?)",
            [
                (1000, 2000, dev, 7, 11, g, 1, 2, 2),
                (2500, 2600, dev, 7, 12, g, 7, 7, 7),
                (3000, 3100, dev, 13, 13, g, 3, 3, 3),
                (3200, 3300, dev, 13, 14, g, 8, 8, 8),
            ],
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (4000, 4100, ?, 1, 7, 15, ?, 4096, 8, 2, 2)",
            (dev, g),
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (4200, 4300, ?, 1, 7, 16, ?, 100, 2, 2, 1)",
            (dev, g),
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (4400, 4500, ?, 1, 7, 17, ?, 0, 64, 2)", (dev, g)
        )
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,0,?,?,?,0,NULL)",
            [(900, 950, t, 11, 4), (2400, 2450, t, 12, 4), (5000, 6000, t, 18, 5)],
        )
        con.executemany(
            "INSERT INTO NVTX_EVENTS VALUES (?,?,?,NULL,NULL,NULL,?,?,NULL,?,?,?)",
            [
                (-5, None, 75, "NCCL", t, None, 7, None),  # domain create
                (800, 6500, 59, None, t, 6, 0, None),  # decode_step 0 (registered string)
                (850, 2100, 59, "AllReduce", t, None, 7, '{"Message size [bytes]": 8192}'),
                (2900, 3150, 60, "ncclAllGather", t, None, 7, None),  # no payload: bytes unknown
                (7000, None, 59, "unclosed", t, None, 0, None),
                (7100, 7100, 34, "a mark", t, None, 0, None),
            ],
        )
    if env is not None:
        con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'x', 'DeviceEnvironment', 610, ?)", (env,))
    con.commit()
    con.close()


def test_synthetic_two_processes_become_two_ranks(tmp_path: Path) -> None:
    db = tmp_path / "job.sqlite"
    _make_db(db)
    run = read_nsys(db)
    check_events(run.events)
    ev = run.events
    assert run.ranks == [0, 1]
    assert [run.rank_info[r]["pid"] for r in (0, 1)] == [100, 200]
    assert run.rank_info[0]["rank_source"] == "process order"
    assert run.data_quality.counts["nsys_ranks_from_processes"] == 2
    # rank 1 is the process on device 1; its host events are on its own thread
    assert set(ev.loc[(ev["rank"] == 1) & (ev["device"] >= 0), "device"]) == {1}
    assert set(ev.loc[(ev["rank"] == 1) & (ev["kind"] == "runtime"), "stream"]) == {200}
    for r in (0, 1):
        mine = ev[ev["rank"] == r]
        assert Counter(mine["kind"].astype(str)) == {
            "kernel": 4,
            "memcpy": 2,
            "memset": 1,
            "runtime": 3,
            "annotation": 3,
        }
        k = mine[mine["kind"] == "kernel"].sort_values("start_ns")
        assert k["coll_op"].astype(str).tolist() == ["all_reduce", "", "all_gather", "send_recv"]
        assert k["coll_name"].astype(str).tolist() == ["AllReduce", "", "AllGather", "SendRecv"]
        assert (
            k["name"].astype(str).iloc[0].startswith("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(")
        )  # demangled
        assert (k["coll_in_bytes"] == -1).all()
        assert mine.loc[mine["kind"] == "memcpy", "name"].astype(str).tolist() == [
            "Memcpy DtoD (Device -> Device)",
            "Memcpy DtoH (Device -> Pinned)",
        ]
        assert mine.loc[mine["kind"] == "memset", "name"].astype(str).tolist() == ["Memset (Device)"]
        assert mine.loc[mine["kind"] == "runtime", "name"].astype(str).tolist() == [
            "cudaLaunchKernel",
            "cudaLaunchKernel",
            "cudaStreamSynchronize",
        ]
        a = mine[mine["kind"] == "annotation"].sort_values("start_ns")
        assert a["name"].astype(str).tolist() == ["decode_step 0", "AllReduce", "ncclAllGather"]
        assert a["coll_op"].astype(str).tolist() == ["", "all_reduce", "all_gather"]
        assert a["coll_in_bytes"].tolist() == [-1, 8192, -1]
        info = run.rank_info[r]
        assert info["memcpy_bytes"] == 4196
        assert info["memset_bytes"] == 64
        assert info["nvtx_marks"] == 1
        assert info["nvtx_domains"] == {"": 1, "NCCL": 2}
        assert info["session_start_utc_ns"] == 1700000000000000000
    assert run.data_quality.counts["nvtx_unclosed_ranges"] == 2
    assert run.data_quality.counts["nccl_nvtx_bytes_unread"] == 2
    # events sorted by rank, then start
    assert (np.diff(ev["rank"].to_numpy()) >= 0).all()
    with pytest.raises(RankError, match="2 CUDA processes"):
        read_nsys(db, rank=0)


def test_synthetic_rank_from_profiled_environment(tmp_path: Path) -> None:
    db = tmp_path / "job.sqlite"
    _make_db(db, two_processes=False, env="PATH=/usr/bin;LOCAL_RANK=1;RANK=6;WORLD_SIZE=8")
    run = read_nsys(db)
    assert run.ranks == [6]
    assert run.rank_info[6]["rank_source"] == "environment RANK"


# --------------------------------------------------------------------------------------------------
# errors


def test_not_sqlite_is_a_format_error(tmp_path: Path) -> None:
    bad = tmp_path / "trace.sqlite"
    bad.write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match=r"trace\.sqlite at byte 0: not a SQLite database"):
        read_nsys(bad)
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty file"):
        read_nsys(empty)
    with pytest.raises(TraceFormatError, match="cannot read"):
        read_nsys(tmp_path / "absent.sqlite")


def test_sqlite_without_nsys_tables_names_them(tmp_path: Path) -> None:
    db = tmp_path / "other.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE foo (x INT)")
    with pytest.raises(TraceFormatError, match=r"other\.sqlite: .*CUPTI_ACTIVITY_KIND_KERNEL.*NVTX_EVENTS"):
        read_nsys(db)
    db2 = tmp_path / "nostrings.sqlite"
    with sqlite3.connect(db2) as con:
        con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT)")
    with pytest.raises(TraceFormatError, match=r"nostrings\.sqlite: missing table StringIds"):
        read_nsys(db2)


def test_empty_report_is_a_format_error(tmp_path: Path) -> None:
    db = tmp_path / "empty_report.sqlite"
    _make_db(db)
    with sqlite3.connect(db) as con:
        for t in (
            "CUPTI_ACTIVITY_KIND_KERNEL",
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            "CUPTI_ACTIVITY_KIND_MEMSET",
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            "NVTX_EVENTS",
        ):
            con.execute(f"DELETE FROM {t}")
    with pytest.raises(TraceFormatError, match=r"empty_report\.sqlite: empty report"):
        read_nsys(db)


# --------------------------------------------------------------------------------------------------
# .nsys-rep: exported with nsys when found, a clear error otherwise


def test_nsys_rep_without_nsys_says_how_to_export(
    real_nsys_sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"a stand-in report: only the stand-in nsys below reads it")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(TraceFormatError, match=r"nsys export --type sqlite -o run\.sqlite run\.nsys-rep"):
        read_nsys(rep)


@pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script as a stand-in nsys")
def test_nsys_rep_is_exported_once_with_the_nsys_binary(
    real_nsys_sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in `nsys` (found through NSYS) that copies the real export to its -o argument and logs
    its arguments: the reader calls `nsys export --type sqlite -o OUT REP` once, then reuses OUT."""
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"a stand-in report: only the stand-in nsys below reads it")
    real = real_nsys_sqlite
    log = tmp_path / "calls.log"
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        'while [ "$#" -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done\n'
        f'cp "{real}" "$out"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NSYS", str(fake))
    run = read_nsys(rep)
    assert int((run.events["kind"] == "kernel").sum()) == _kernel_rows(real_nsys_sqlite)
    assert (tmp_path / "run.sqlite").is_file()
    calls = log.read_text().splitlines()
    assert len(calls) == 1
    args = calls[0].split()
    assert args[:4] == ["export", "--type", "sqlite", "-o"] and args[-1] == str(rep)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # temporary name renamed away
    read_nsys(rep)
    assert len(log.read_text().splitlines()) == 1  # reused, not exported again


def test_nsys_rep_in_read_only_folder_exports_to_cache(
    real_nsys_sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the report's folder is not writable the export goes to $XDG_CACHE_HOME/tracekit/nsys."""
    import tracekit.read.nsys as nsys_mod

    folder = tmp_path / "ro"
    folder.mkdir()
    rep = folder / "run.nsys-rep"
    rep.write_bytes(b"a stand-in report: only the stand-in nsys below reads it")
    real_access = os.access
    # not writable, whoever runs the test (root ignores a 0o555 mode)
    monkeypatch.setattr(
        nsys_mod.os,
        "access",
        lambda p, mode: False if Path(p) == folder and mode == os.W_OK else real_access(p, mode),
    )
    fake = tmp_path / "nsys"
    fake.write_text(
        '#!/bin/sh\nwhile [ "$#" -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done\n'
        f'cp "{real_nsys_sqlite}" "$out"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("NSYS", str(fake))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run = read_nsys(rep)
    exported = Path(run.rank_info[0]["sqlite"])
    assert exported.parent == tmp_path / "cache" / "tracekit" / "nsys"
    assert exported.name.startswith("run-") and exported.suffix == ".sqlite"
    assert not (folder / "run.sqlite").exists()
    assert int((run.events["kind"] == "kernel").sum()) == _kernel_rows(real_nsys_sqlite)


# --------------------------------------------------------------------------------------------------
# integration with the rest of the pipeline (skipped until those parts land)


def test_read_run_dispatches_sqlite(real_nsys_sqlite: Path) -> None:
    path = real_nsys_sqlite
    import tracekit.read as read_pkg

    if getattr(read_pkg, "read_run", None) is None or ".sqlite" not in getattr(read_pkg, "READERS", {}):
        pytest.skip("tracekit.read.read_run does not dispatch .sqlite yet")
    run = read_pkg.read_run([path])
    direct = read_nsys(path)
    assert len(run.events) == len(direct.events)
    assert int((run.events["kind"] == "kernel").sum()) == _kernel_rows(real_nsys_sqlite)
    assert run.ranks == [0]
    assert sorted(run.events["name"].astype(str)) == sorted(direct.events["name"].astype(str))


def test_h200_steps_partition_with_classifier(shared_traces: Path) -> None:
    """classify + steps on the nsys read: 20 decode_step windows from the NVTX ranges; each window's
    compute part is exactly its matmul kernel's duration (one kernel per step, queried here with
    sqlite3), and the parts sum to the window."""
    path = shared_trace(shared_traces, H200)
    try:
        from tracekit.analyse.timeline.partition import partition_steps
        from tracekit.analyse.timeline.steps import find_steps
        from tracekit.classify import classify
    except ImportError as exc:
        pytest.skip(f"classifier / steps not there yet: {exc}")
    events = classify(read_nsys(path).events)
    table = partition_steps(events, find_steps(events))
    with _ro(path) as con:
        oracle = con.execute(
            """SELECT n.start, k.end - k.start
               FROM NVTX_EVENTS n
               JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                 ON r.globalTid = n.globalTid AND r.start >= n.start AND r.end <= n.end
               JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId
               WHERE n.eventType = 59 ORDER BY n.start"""
        ).fetchall()
    assert len(table) == len(oracle) == 20
    assert table["name"].tolist() == [f"decode_step {i}" for i in range(20)]
    assert table["start_ns"].tolist() == [r[0] for r in oracle]
    assert table["compute_ns"].tolist() == [r[1] for r in oracle]
    parts = table[["compute_ns", "memory_ns", "collective_ns", "unknown_ns", "sync_ns", "idle_ns"]].sum(
        axis=1
    )
    assert (parts == table["window_ns"]).all()
    assert (table["sync_ns"] > 0).all()  # cudaDeviceSynchronize returns after the kernel ends
    assert (table["collective_ns"] == 0).all() and (table["memory_ns"] == 0).all()


def test_breakdown_finds_the_20_decode_steps(shared_traces: Path) -> None:
    """`breakdown` (default step pattern) on the nsys read: the JSON contract lists the 20
    decode_step windows, parts summing to each window exactly, and 21 GPU kernels by class."""
    path = shared_trace(shared_traces, H200)
    try:
        from tracekit.analyse.timeline.breakdown import breakdown
    except ImportError as exc:
        pytest.skip(f"tracekit.analyse.timeline.breakdown is not there yet: {exc}")
    doc = breakdown(read_nsys(path)).to_json()
    steps = doc["steps"]
    assert [s["name"] for s in steps] == [f"decode_step {i}" for i in range(20)]
    assert {s["rank"] for s in steps} == {0}
    for s in steps:
        assert sum(s["parts_ns"].values()) == s["window_ns"]
        assert s["parts_ns"]["compute"] > 0
    assert sum(c["count"] for c in doc["kernels_by_class"].values()) == 21


# Exports of other nsys versions lack columns this one has; a GPU table without its process column
# (globalPid) must still give every kernel, copy and sync record its own rank.
_GPU_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
)


def test_export_without_process_or_stream_columns_reads_the_same_ranks(tmp_path: Path) -> None:
    import gzip

    src = Path(__file__).resolve().parents[1] / "traces" / "h200-tp2-nsys" / "nsys.sqlite.gz"
    db = tmp_path / "old.sqlite"
    db.write_bytes(gzip.decompress(src.read_bytes()))
    ref = read_nsys(db).events
    con = sqlite3.connect(db)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    dropped = 0
    for t in _GPU_TABLES:
        if t in tables:
            con.execute(f"ALTER TABLE {t} DROP COLUMN globalPid")
            dropped += 1
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN srcKind")
    con.commit()
    con.close()
    assert dropped >= 3
    got = read_nsys(db).events
    assert ref["rank"].nunique() == 2  # premise: two processes whose correlation ids overlap
    cols = ["rank", "kind", "start_ns", "end_ns", "stream"]
    key = lambda df: df[cols].astype(str).sort_values(cols).reset_index(drop=True)  # noqa: E731
    gpu = ["kernel", "memcpy", "memset", "sync"]
    a = key(ref[ref["kind"].astype(str).isin(gpu)])
    b = key(got[got["kind"].astype(str).isin(gpu)])
    assert len(a) > 1000 and a.equals(b)


@pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script as a stand-in nsys")
def test_qdrep_the_old_report_name_reads_like_nsys_rep(
    real_nsys_sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nsys named its reports `.qdrep` before 2021.4: given as a file or in a folder, it is exported
    and read like a `.nsys-rep` (it was "not a trace file"); beside its `.sqlite` export, read once."""
    from tracekit.read import read_run

    folder = tmp_path / "run"
    folder.mkdir()
    rep = folder / "old.qdrep"
    rep.write_bytes(b"a stand-in report: only the stand-in nsys below reads it")
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'while [ "$#" -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done\n'
        f'cp "{real_nsys_sqlite}" "$out"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NSYS", str(fake))
    assert int((read_run([rep], cache=False).events["kind"] == "kernel").sum()) == _kernel_rows(
        real_nsys_sqlite
    )
    assert (folder / "old.sqlite").is_file()  # the export, beside the report
    run = read_run([folder], cache=False)  # the report and its export: read once
    assert run.ranks == [0] and int((run.events["kind"] == "kernel").sum()) == _kernel_rows(real_nsys_sqlite)


def test_nvtx_event_types_come_from_the_exports_own_enum(real_nsys_sqlite: Path, tmp_path: Path) -> None:
    """An export whose nsys numbers its NVTX event types differently (ENUM_NSYS_EVENT_TYPE says
    which id is a push/pop range) reads the same ranges: here the ids are renumbered in both the
    events and the enum; with the fixed numbers the ranges were lost."""
    db = tmp_path / "renum.sqlite"
    shutil.copy(real_nsys_sqlite, db)
    ref = read_nsys(db).events
    con = sqlite3.connect(db)
    con.execute("UPDATE NVTX_EVENTS SET eventType = eventType + 1000")
    con.execute("UPDATE ENUM_NSYS_EVENT_TYPE SET id = id + 1000 WHERE name LIKE 'Nvtx%'")
    con.commit()
    con.close()
    got = read_nsys(db).events
    ann = lambda df: sorted(df.loc[df["kind"] == "annotation", "name"].astype(str))  # noqa: E731
    assert len(ann(ref)) > 0 and ann(got) == ann(ref)
