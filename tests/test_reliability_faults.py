"""Reliability (issue 16), the second pass: faults during a capture (a rank that hangs, a disk that
fills up, an earlier capture in --out), the Parquet cache never trusted, manifest paths kept inside
the run folder, hostile names escaped in the reports, usage errors in one line, --max-events per
run. Every test here is a row of docs/RELIABILITY.md; inputs are real traces (traces/,
../shared/traces) or CPU captures made here (torch.profiler + gloo)."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from session_captures import ROUNDS_TP2

from tracekit.cli.main import main

REPO = Path(__file__).resolve().parents[1]
CPU_TP1 = REPO / "traces" / "cpu-tp1"
CPU_TP2 = REPO / "traces" / "cpu-tp2"
H200_SMALL = REPO / "traces" / "h200-tp1-graphs-compile"


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str], *names: str) -> str:
    """`tracekit <argv>` in this process: exit 2 and exactly one line on stderr naming `names`."""
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), err
    for n in names:
        assert n in lines[0], lines[0]
    return lines[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, dst / f.name)
    return dst


def assert_run_folder_honest(out: Path) -> dict[str, Any] | None:
    """What a capture left in `out` never looks more complete than it is: no temporary, every
    trace a whole gzip; a listed trace has the manifest's SHA-256; the manifest (if any) is whole
    JSON and `complete: false` unless every rank's trace is listed."""
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.endswith(".tmp") or ".tmp-" in n], names
    for t in out.glob("rank-*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(t.read_bytes()))  # whole: decodes to the end
        assert isinstance(doc.get("traceEvents"), list)
    mp = out / "manifest.json"
    if not mp.exists():
        return None
    m: dict[str, Any] = json.loads(mp.read_text())
    for name, entry in m["files"].items():
        assert sha256(out / name) == entry["sha256"], name
    return m


# ----------------------------------------------------------------------------------------------
# 1. capture faults: a rank that hangs


@pytest.mark.slow
def test_capture_rank_hangs_after_its_trace_the_run_still_ends(tmp_path: Path) -> None:
    """Rank 1 hangs at the end of its traced pass, after rank 0 has nothing left to wait for (no
    collective follows, so no collective timeout can end it): the run's watchdog terminates it
    --timeout s after rank 0 finished; rank 0's trace is whole and verified."""
    pytest.importorskip("torch")
    from tracekit.capture.runner import CaptureConfig, capture
    from tracekit.errors import CaptureError
    from tracekit.read import read_run

    # calibrate=False: the profiler calibration runs before the passes (the hang after them) and
    # takes ~8 of a warm capture's ~10 s on the loaded 2-core VM
    cfg = CaptureConfig(
        tp=2, tokens=3, warmup=1, device="cpu", hang_rank=1, timeout_s=3, rounds=1, calibrate=False
    )
    with pytest.raises(CaptureError) as info:  # never "forever": the pytest timeout would end it
        capture(cfg, tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and "rank 1: hung: still running 3 s after rank 0 finished (--timeout 3)" in msg
    m = assert_run_folder_honest(tmp_path)
    assert m is not None and m["complete"] is False
    assert [(e["rank"], e["how"]) for e in m["errors"]] == [(1, "hung")]
    assert list(m["files"]) == ["rank-0.pt.trace.json.gz"]
    run = read_run([tmp_path / "rank-0.pt.trace.json.gz"], cache=False)  # whole, SHA-256 matches
    assert run.ranks == [0] and "checksum_mismatch" not in run.data_quality.counts
    # the folder read whole: rank 1's own export (written before it hung) is read but said unverified
    both = read_run([tmp_path], cache=False, jobs=1)
    assert both.data_quality.counts.get("trace_not_in_manifest") == 1
    assert any("rank-1.pt.trace.json.gz not listed" in n and "hung" in n for n in both.data_quality.notes)


@pytest.mark.slow
def test_capture_rank_hangs_in_a_collective_the_timeout_ends_the_run(tmp_path: Path) -> None:
    """Rank 1 hangs before an all-reduce: rank 0's gloo collective times out after --timeout s, then
    rank 1 is terminated; the manifest names rank 1 as the one that hung and rank 0 as waiting."""
    pytest.importorskip("torch")
    from tracekit.capture.runner import CaptureConfig, capture
    from tracekit.errors import CaptureError

    cfg = CaptureConfig(
        tp=2,
        tokens=3,
        warmup=1,
        device="cpu",
        hang_rank=1,
        hang_at="all_reduce",
        timeout_s=3,
        rounds=1,
        calibrate=False,  # before the passes, the hang in the traced one (see above)
    )
    with pytest.raises(CaptureError) as info:
        capture(cfg, tmp_path)
    msg = str(info.value)
    assert "\n" not in msg
    assert "rank 0: collective timed out waiting for rank 1, which hung" in msg
    assert "rank 1: hung: still running 3 s after rank 0 failed" in msg
    m = assert_run_folder_honest(tmp_path)
    assert m is not None and m["complete"] is False and m["files"] == {}
    assert [(e["rank"], e["how"]) for e in m["errors"]] == [(0, "collective_timeout"), (1, "hung")]


# ----------------------------------------------------------------------------------------------
# 2. capture faults: the output folder fills up


def _enospc(*_a: Any, **_k: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_writes_leave_nothing_half_written_on_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture's write layer: a full disk at the last moment (fsync) leaves the earlier file
    untouched and no temporary beside it; the error names the file."""
    from tracekit.capture import environment as env

    target = tmp_path / "manifest.json"
    target.write_text('{"earlier": true}\n')
    src = tmp_path / "raw.json"
    shutil.copy(CPU_TP1 / "manifest.json", src)
    monkeypatch.setattr(env.os, "fsync", _enospc)
    with pytest.raises(OSError) as info:
        env.atomic_write_json(target, {"new": 1})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    with pytest.raises(OSError):
        env.gzip_file_atomic(src, tmp_path / "rank-0.pt.trace.json.gz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "raw.json"]
    assert json.loads(target.read_text()) == {"earlier": True}


def test_manifest_that_cannot_be_written_is_one_line_and_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracekit.capture import environment as env
    from tracekit.capture.manifest import finish_run
    from tracekit.errors import CaptureError

    monkeypatch.setattr(env.os, "fsync", _enospc)
    from tracekit.model.documents.manifest import Manifest, ManifestError

    doc = Manifest(complete=True, errors=[], files={})
    with pytest.raises(CaptureError) as info:
        finish_run(tmp_path, doc)
    assert "no manifest written: cannot write" in str(info.value) and "No space left" in str(info.value)
    doc = Manifest(complete=False, errors=[ManifestError(rank=1, message="a\nb")], files={})
    with pytest.raises(CaptureError) as info:
        finish_run(tmp_path, doc)
    assert "\n" not in str(info.value) and "rank 1: a b" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def _unshare_tmpfs_works() -> bool:
    if not shutil.which("unshare") or not sys.platform.startswith("linux"):
        return False
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt && echo ok"],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() == "ok"


#: the capture the full-disk test runs into a tmpfs: the session's TP=2 rounds capture
#: (tests/session_captures.py ROUNDS_TP2), whose folder (taken with room) gives the footprint, without
#: the profiler calibration (~4 of its ~10 CPU-s): it runs after the warm-up, before the passes, and
#: writes no file (its profiler sessions export nothing), so the traces are the same size; the disk
#: fills at the traces' export or gzip, after it
DISK_ARGV = ["capture", *[a for k, v in ROUNDS_TP2.items() for a in (f"--{k}", str(v))], "--no-calibrate"]
PAGE = 4096  # tmpfs charges whole pages


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


def full_disk_sizes(folder: Path) -> dict[str, int]:
    """tmpfs sizes (bytes, whole pages) for DISK_ARGV's capture, from the footprint of that same
    capture in `folder` (taken with room to spare), so they hold whatever decoder writes the trace.
    Only the trace files' sizes count, so how the measured capture was started (in process or by
    the CLI) does not matter.

    Each rank writes its raw export (`raw`, the gzip's inflated size), gzips it beside it (`gz`),
    then removes the raw file; before that only its small result file is there (`pre`, at most
    two result files, each smaller than the manifest assembled from them, and one temporary page
    each). "export": less than half the smallest raw export past `pre`, so no rank's export fits,
    whatever order the ranks write in. "gzip": room for `pre`, one raw export and one gzip (one
    rank finishes, the other's export fits), but less than a raw export plus both gzips, which
    every run that succeeds holds at once (when the last rank's gzip ends the other rank's is
    there): the rank that gzips last fails (when both export at once, the second export fails)."""
    traces = sorted(folder.glob("rank-*.pt.trace.json.gz"))
    assert len(traces) == 2, sorted(p.name for p in folder.iterdir())
    raw = [len(gzip.decompress(t.read_bytes())) for t in traces]
    gz = [t.stat().st_size for t in traces]
    pre = 2 * _pages((folder / "manifest.json").stat().st_size) + 2 * PAGE
    export = (pre + (min(raw) - pre) // 2) // PAGE * PAGE
    lo, hi = pre + _pages(max(raw)) + _pages(max(gz)), min(raw) + sum(gz)
    assert pre < export < min(raw) and lo + PAGE < hi, (raw, gz, pre)
    return {"export": export, "gzip": (lo + hi) // 2 // PAGE * PAGE}


#: run in the user namespace: `tracekit capture DISK_ARGV --out OUT` (tracekit.cli.main.main, what
#: `python -m tracekit.cli.main` runs) once per full disk, in one interpreter, so that one fork server
#: imports torch for both captures (a fresh interpreter per capture: one more import, ~3 CPU-s); each
#: capture's fd 2 (its ranks' too: they get the fd 2 of their start) goes to its own file, its exit code
#: to a record; an exception out of main is a traceback in its stderr, which the test refuses
_DISK_RUNS = """
import json, os, sys, traceback
from tracekit.cli.main import main
argv, runs, record = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
codes = {}
for step, out, err in runs:
    saved = os.dup(2)
    with open(err, "wb") as f:
        os.dup2(f.fileno(), 2)
    try:
        codes[step] = main([*argv, "--out", out])
    except BaseException:
        traceback.print_exc()
        codes[step] = -1
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
with open(record, "w") as f:
    json.dump(codes, f)
"""


@pytest.fixture(scope="module")
def full_disk_runs(tmp_path_factory: pytest.TempPathFactory, session_captures: Any) -> dict[str, Any]:
    """Both full-disk captures (test_capture_into_a_disk_that_fills_up), each into its own tmpfs
    mounted in one user namespace and sized (full_disk_sizes) from the session's capture of the same
    workload taken with room to spare: per step its exit code, its stderr and the folder `seen`
    (what its tmpfs held when the command ended)."""
    pytest.importorskip("torch")
    if not _unshare_tmpfs_works():
        pytest.skip("cannot mount a tmpfs in a user namespace here")
    sizes = full_disk_sizes(session_captures.get("rounds-tp2", ROUNDS_TP2).path)
    base = tmp_path_factory.mktemp("full-disk")
    steps = ["export", "gzip"]
    runs = [(step, str(base / step / "mnt" / "run"), str(base / step / "stderr.txt")) for step in steps]
    mounts = " && ".join(
        f"mkdir -p {base / step / 'mnt'} && mount -t tmpfs -o size={sizes[step]} tracekit-full {base / step / 'mnt'}"
        for step in steps
    )
    copies = "; ".join(
        f"mkdir -p {base / step / 'seen'} && cp -a {base / step / 'mnt' / 'run'}/. {base / step / 'seen'}/ 2>/dev/null"
        for step in steps
    )
    record = base / "codes.json"
    cmd = (
        f"{mounts} && {shlex.quote(sys.executable)} -c {shlex.quote(_DISK_RUNS)} "
        f"{shlex.quote(json.dumps(DISK_ARGV))} {shlex.quote(json.dumps(runs))} {record}; rc=$?; {copies}; exit $rc"
    )
    r = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0 and record.exists(), r.stderr[-2000:]
    codes = json.loads(record.read_text())
    return {
        step: {
            "size": sizes[step],
            "returncode": codes[step],
            "stderr": (base / step / "stderr.txt").read_text(),
            "seen": base / step / "seen",
        }
        for step in steps
    }


@pytest.mark.slow
@pytest.mark.parametrize("step", ["export", "gzip"])
def test_capture_into_a_disk_that_fills_up(step: str, full_disk_runs: dict[str, Any]) -> None:
    """A real full disk: `tracekit capture` (TP=2 on CPU) into a tmpfs mounted in a user namespace,
    sized (full_disk_sizes) from the same capture taken with room to spare (both steps' captures run
    in one interpreter there: full_disk_runs). "export": the profiler's own export fails (its C++
    writer only logs it); "gzip": a rank's gzip fails (or, when both ranks export at once, the
    second export). Either way: one error line saying no space is left, exit 2, and nothing that
    looks more complete than it is (no temporary, no truncated trace, the manifest complete: false)."""
    got = full_disk_runs[step]
    err = got["stderr"]
    ours = [ln for ln in err.splitlines() if ln.startswith("tracekit: ")]
    assert got["returncode"] == 2, (got["size"], err[-2000:])
    assert len(ours) == 1 and "no space left" in ours[0].lower(), err[-2000:]
    assert "Traceback" not in err
    if step == "export":  # no rank's export fits: no trace written, the profiler's failure said
        assert "the profiler could not write its trace" in ours[0], ours[0]
    seen = got["seen"]  # what the namespace's tmpfs held when the command ended
    m = assert_run_folder_honest(seen)
    assert m is None or m["complete"] is False
    if step == "export":
        assert not list(seen.glob("rank-*.pt.trace.json.gz")), sorted(p.name for p in seen.iterdir())


# ----------------------------------------------------------------------------------------------
# 3. --force: an earlier capture in --out is not replaced without it


def test_capture_refuses_to_replace_an_earlier_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = copy_run(CPU_TP1, tmp_path / "run")
    before = {p.name: sha256(p) for p in out.iterdir()}
    line = one_error_line(
        capsys,
        ["capture", "--tp", "1", "--tokens", "2", "--device", "cpu", "--out", str(out)],
        str(out),
        "manifest.json",
        "rank-0.pt.trace.json.gz",
        "--force",
    )
    assert "earlier capture" in line
    assert {p.name: sha256(p) for p in out.iterdir()} == before  # nothing touched
    # a folder without a capture's files is fine (not refused): checked without running one
    from tracekit.capture.runner import check_out_dir

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("mine\n")
    check_out_dir(tmp_path / "notes", force=False)
    check_out_dir(tmp_path / "new", force=False)
    one_error_line(capsys, ["capture", "--out", str(CPU_TP1 / "manifest.json")], "--out", "manifest.json")


@pytest.mark.slow
def test_capture_force_replaces_an_earlier_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    out = copy_run(CPU_TP2, tmp_path / "run")  # an earlier TP=2 capture: 2 ranks
    (out / "mine.txt").write_text("kept\n")
    argv = ["capture", "--tp", "1", "--tokens", "2", "--warmup", "1", "--rounds", "1", "--device", "cpu"]
    assert main([*argv, "--out", str(out), "--force", "--quiet"]) == 0
    m = assert_run_folder_honest(out)
    assert m is not None and m["complete"] is True and list(m["files"]) == ["rank-0.pt.trace.json.gz"]
    assert not (out / "rank-1.pt.trace.json.gz").exists()  # the earlier run's rank 1 went with it
    assert (out / "mine.txt").read_text() == "kept\n"  # not a capture's file: left alone
    assert "--force" not in m["command"]


# ----------------------------------------------------------------------------------------------
# 4. security: the Parquet cache is never trusted


def test_tampered_cache_entry_is_detected_and_read_from_the_source(
    real_kineto_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracekit.read import cache as cache_mod
    from tracekit.read import read_run

    monkeypatch.delenv("TRACEKIT_NO_CACHE", raising=False)
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "t.pt.trace.json.gz"
    shutil.copy(real_kineto_file, f)
    truth = read_run([f], cache=False)
    read_run([f])  # writes the entry and its digest record
    entry = cache_mod.cache_path_for(f)
    assert entry is not None and entry.exists() and cache_mod.digest_path(entry).exists()
    assert oct(entry.parent.stat().st_mode & 0o777) == "0o700"

    # tamper: the same schema and key metadata (the old check passed it), other durations and names
    table = pq.read_table(entry)
    meta = table.schema.metadata
    ends = pa.array(
        [x + 10**12 for x in table.column("end_ns").to_pylist()], type=table.schema.field("end_ns").type
    )
    table = table.set_column(table.schema.get_field_index("end_ns"), "end_ns", ends)
    table = table.replace_schema_metadata(meta)
    pq.write_table(table, entry, compression="zstd")
    assert json.loads(pq.read_schema(entry).metadata[b"tracekit"])["key"] == msgspec.to_builtins(
        cache_mod._key(f, _kineto_version(), None)
    )

    again = read_run([f])
    assert (again.events["end_ns"] == truth.events["end_ns"]).all()  # from the source, not the entry
    assert cache_mod.load(f, _kineto_version()) is not None  # the entry was rewritten and verifies
    # a digest record that does not match, or is missing, is a miss too
    cache_mod.digest_path(entry).write_text(json.dumps({"sha256": "0" * 64, "key": {}}))
    assert cache_mod.load(f, _kineto_version()) is None
    cache_mod.digest_path(entry).unlink()
    assert cache_mod.load(f, _kineto_version()) is None


def _kineto_version() -> str:
    from tracekit.read.files import reader_for

    found = reader_for(Path("x.pt.trace.json.gz"))
    assert found is not None
    return found[1]


# ----------------------------------------------------------------------------------------------
# 5. security: manifest paths stay inside the run folder


@pytest.mark.parametrize(
    "name", ["../outside.json.gz", "/etc/passwd", "sub/../../outside.json.gz", "C:\\x\\y.json", "..\\x.json"]
)
def test_manifest_paths_outside_the_run_folder_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import tracekit.read.run as read_mod

    run = copy_run(CPU_TP2, tmp_path / "run")
    (tmp_path / "outside.json.gz").write_bytes(b"secret")
    m = json.loads((run / "manifest.json").read_text())
    m["files"][name] = {"rank": 0, "sha256": "0" * 64, "bytes": 6}
    (run / "manifest.json").write_text(json.dumps(m))
    opened: list[str] = []
    real = read_mod.sha256_of
    monkeypatch.setattr(read_mod, "sha256_of", lambda p: opened.append(str(p)) or real(p))
    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    capsys.readouterr()
    assert main(["breakdown", str(run), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    dq = doc.get("data_quality") or {}
    counts = dq.get("counts", dq)
    assert counts.get("manifest_path_outside_run") == 1
    assert "checksum_mismatch" not in counts
    assert sorted(Path(p).name for p in opened) == ["rank-0.pt.trace.json.gz", "rank-1.pt.trace.json.gz"]
    assert all(Path(p).parent == run for p in opened)


def test_inside_run_folder() -> None:
    from tracekit.read import inside_run_folder

    assert inside_run_folder("rank-0.pt.trace.json.gz") and inside_run_folder("rank-0/x.json")
    for bad in ("", "..", "../x", "/abs", "a/../../b", "C:x", "\\\\srv\\share", "a\x00b", None, 3):
        assert not inside_run_folder(bad), bad


# ----------------------------------------------------------------------------------------------
# 6. security: hostile names escaped in the HTML and Markdown reports; no file contents embedded

HOSTILE = "<script>alert(1)</script>|`tick`\nline2 *x* [a](http://e) &amp;"
SECRET = "SECRET-7f3a9c"
RUN_NAME = "run `x` <b>_1"  # a folder name is shown too (as a code span in Markdown)


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real H200 run (torch.compile + CUDA graphs) with hostile names in its kernels, step
    ranges and manifest, and secrets in places a report has no business reading; reported once."""
    d = tmp_path_factory.mktemp("hostile") / RUN_NAME
    d.mkdir()
    for f in H200_SMALL.iterdir():
        if f.name.endswith(".json.gz"):
            doc = json.loads(gzip.decompress(f.read_bytes()))
            seen = 0
            for e in doc["traceEvents"]:
                n = e.get("name")
                if not isinstance(n, str):
                    continue
                if n.startswith("decode_step"):
                    e["name"] = f"{n} {HOSTILE}"
                elif e.get("cat") == "kernel" and seen < 3:
                    seen += 1
                    e["name"] = f"my_all_gather_kernel {HOSTILE}"  # comm-like: listed as unknown
                if isinstance(e.get("args"), dict):
                    e["args"]["note"] = SECRET  # event args are contents, not names
            (d / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    m = json.loads((H200_SMALL / "manifest.json").read_text())
    m["host"]["hostname"] = HOSTILE
    m["command"] = f"tracekit capture {HOSTILE}"
    m["secret_field"] = SECRET
    m["files"]["../secret.txt"] = {"rank": None, "sha256": "0" * 64, "bytes": 1}
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "README.md").write_text(f"{SECRET}\n")
    (d.parent / "secret.txt").write_text(f"{SECRET}\n")
    outs = [str(d.parent / f"r.{ext}") for ext in ("html", "md", "json")]
    env = dict(os.environ, TRACEKIT_NO_CACHE="1")
    r = subprocess.run(
        [sys.executable, "-m", "tracekit.cli.main", "report", str(d), *[a for o in outs for a in ("-o", o)]],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return d.parent


def test_hostile_names_from_a_real_trace_are_escaped_in_html(hostile_report: Path) -> None:
    import html
    import re

    page = (hostile_report / "r.html").read_text()
    assert "<script>alert(1)" not in page and "alert(1)</script>" not in page
    assert len(re.findall(r"<script\b", page, flags=re.I)) == 3  # plotly, the figure JSON, the boot script
    # shown as text: the hostname in the manifest table, the kernel in the unclassified table
    assert (
        html.escape(HOSTILE).replace("\n", " ") in " ".join(page.split("\n")) or html.escape(HOSTILE) in page
    )
    assert "my_all_gather_kernel &lt;script&gt;" in page
    block = re.search(r'id="tk-figures">(.*?)</script>', page, flags=re.S)
    assert block is not None and not set("<>") & set(block.group(1))


def test_hostile_names_from_a_real_trace_are_escaped_in_markdown(hostile_report: Path) -> None:
    md = (hostile_report / "r.md").read_text()
    assert "<script>" not in md and "</script>" not in md
    assert "my\\_all\\_gather\\_kernel &lt;script&gt;alert(1)&lt;/script&gt;\\|\\`tick\\` line2" in md
    for line in md.splitlines():  # the names' | and newline never add or split a table row
        if line.startswith("|") and "my\\_all\\_gather" in line:
            assert line.count("|") - line.count("\\|") == 4, line
    assert "&amp;amp;" in md  # an entity in a name is shown as text, not resolved
    # the run's path as a code span whose fence its backticks cannot close (was `...` around md_esc)
    assert f"### run run: ``{hostile_report / RUN_NAME}``" in md


@pytest.mark.parametrize(
    ("value", "code"),
    [("a_b", "`a_b`"), ("x`y", "``x`y``"), ("`z", "`` `z ``"), ("a\nb<i>", "`a b<i>`"), (None, "``")],
)
def test_md_code_cannot_be_closed_by_the_value(value: Any, code: str) -> None:
    from tracekit.report.markdown import md_code

    assert md_code(value) == code


def test_report_embeds_no_file_contents(hostile_report: Path) -> None:
    for ext in ("html", "md", "json"):
        text = (hostile_report / f"r.{ext}").read_text()
        assert SECRET not in text, ext  # not README.md, event args, manifest extras or ../secret.txt
        # the path is named only where the report says it was ignored (names, never contents)
        assert text.count("secret.txt") == text.count("outside the run folder"), ext


# ----------------------------------------------------------------------------------------------
# 7. messy errors: a bad option value in one line; --max-events per run


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["breakdown", str(CPU_TP2), "--out", "."], ["--out", "'.'", "is a directory"]),
        (
            ["shortfall", "--baseline", str(CPU_TP1), "--sharded", str(CPU_TP2), "--out", "."],
            ["--out", "'.'"],
        ),
        (["breakdown", str(CPU_TP2), "--bogus"], ["--bogus", "tracekit breakdown -h"]),
        (["breakdown"], ["PATHS", "tracekit breakdown -h"]),
    ],
)
def test_usage_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], names: list[str]
) -> None:
    line = one_error_line(capsys, argv, *names)
    assert "Usage:" not in line


def test_max_events_is_per_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank file of cpu-tp2 is under the limit, both together are over it: refused, naming
    the file that took the run past it (in the process pool and in this process alike)."""
    from tracekit.read import read_run

    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    files = sorted(CPU_TP2.glob("rank-*.json.gz"))
    sizes = [len(read_run([f], cache=False).events) for f in files]
    # each file passes alone: the streaming limit counts every event of the file, kept or not
    limit = max(len(json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]) for f in files)
    assert limit < sum(sizes)
    one_error_line(
        capsys,
        ["breakdown", str(CPU_TP2), "--max-events", str(limit)],
        "rank-1.pt.trace.json.gz",
        f"more than {limit}",
        "events of one run",
    )
    monkeypatch.setenv("TRACEKIT_MAX_EVENTS", str(limit))
    from tracekit.errors import TraceFormatError

    for jobs in (1, 2):
        with pytest.raises(TraceFormatError, match="limit on events of one run"):
            read_run([CPU_TP2], cache=False, jobs=jobs)
    monkeypatch.setenv("TRACEKIT_MAX_EVENTS", str(sum(sizes)))
    assert len(read_run([CPU_TP2], cache=False).events) == sum(sizes)
    # the help says what the limit counts
    capsys.readouterr()
    main(["breakdown", "-h"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "Refuse a run of more than N events, all its trace files together" in helptext


def test_export_gzip_bomb_is_refused_at_max_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that sniffs as a tracekit export (read/export.py) inflated whole before: now at most
    --max-bytes, like every other reader."""
    f = tmp_path / "x.json.gz"
    f.write_bytes(gzip.compress(b'{"tracekitExport": 1, "traceEvents": [' + b" " * (8 << 20) + b"]}", 9))
    one_error_line(capsys, ["breakdown", str(f), "--no-cache", "--max-bytes", "1M"], "x.json.gz", "1 MiB")


def test_capture_out_dir_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    (tmp_path / "f").write_text("a file\n")
    out = tmp_path / "f" / "run"
    one_error_line(capsys, ["capture", "--device", "cpu", "--out", str(out)], str(out), "cannot write there")
