"""Reliability (issue 16): hostile and broken inputs end in one error line naming the file (exit 2)
or in a result whose data_quality counts the problem; never a traceback, a hang or unbounded
memory. Every case here is a row of docs/RELIABILITY.md. Inputs are real traces (traces/,
../shared/traces) damaged in a temporary folder."""

from __future__ import annotations

import functools
import gzip
import json
import os
import pickle
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import real_kineto_doc
from frame_checks import assert_frames_equal

from tracekit.cli.main import main
from tracekit.errors import TraceFormatError
from tracekit.model.documents.base import given

REPO = Path(__file__).resolve().parents[1]
CPU_TP1 = REPO / "traces" / "cpu-tp1"
CPU_TP2 = REPO / "traces" / "cpu-tp2"


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")


def cli_error(capsys: pytest.CaptureFixture[str], argv: list[str], *names: str) -> str:
    """Run the CLI in this process: exit 2, exactly one line on stderr naming each of `names`."""
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), err
    for n in names:
        assert n in lines[0], lines[0]
    return lines[0]


def cli_ok(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    """Run `tracekit <argv> --format json`: exit 0; the JSON document."""
    capsys.readouterr()
    rc = main([*argv, "--format", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc: dict[str, Any] = json.loads(out.out)
    return doc


def dq_counts(doc: dict[str, Any]) -> dict[str, int]:
    dq = doc.get("data_quality") or doc.get("source", {}).get("data_quality") or {}
    return dict(dq.get("counts", dq)) if isinstance(dq, dict) else {}


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        shutil.copy(f, dst / f.name)
    return dst


def pool_for_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """read_run reads several files in its process pool whatever their size (by default only from
    POOL_MIN_BYTES on: the runs here are small), so the tests of the pool's errors take that path."""
    import tracekit.read.run as run_mod

    monkeypatch.setattr(run_mod, "POOL_MIN_BYTES", 0)


# ----------------------------------------------------------------------------------------------
# 1. a bad file among several (read in the process pool) is one error line naming that file


def test_format_error_survives_pickling() -> None:
    e = TraceFormatError("/x/rank-1.json", "truncated JSON", offset=12, event_index=3)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is TraceFormatError and str(back) == str(e)
    assert (back.path, back.offset, back.event_index, back.message) == (
        "/x/rank-1.json",
        12,
        3,
        "truncated JSON",
    )


@pytest.mark.parametrize("damage", ["truncated_gz", "junk_json", "empty_json", "symlink_to_non_trace"])
def test_bad_file_in_multi_rank_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    pool_for_any_size(monkeypatch)
    d = copy_run(CPU_TP2, tmp_path / "run")
    if damage == "truncated_gz":
        bad = d / "rank-1.pt.trace.json.gz"
        bad.write_bytes((CPU_TP2 / bad.name).read_bytes()[:5000])
    elif damage == "junk_json":
        bad = d / "notes.json"
        bad.write_text("this is not json\n")
    elif damage == "empty_json":
        bad = d / "rank-2.json"
        bad.write_bytes(b"")
    else:
        target = tmp_path / "passwd.txt"
        target.write_text("root:x:0:0:root:/root:/bin/bash\n")
        bad = d / "rank-2.json"
        os.symlink(target, bad)
    cli_error(capsys, ["breakdown", str(d), "--no-cache"], bad.name)


def test_gzip_of_the_right_name_but_garbage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool_for_any_size(monkeypatch)
    d = copy_run(CPU_TP2, tmp_path / "run")
    (d / "rank-1.pt.trace.json.gz").write_bytes(gzip.compress(b"\x00\xff" * 1000))
    cli_error(capsys, ["breakdown", str(d), "--no-cache"], "rank-1.pt.trace.json.gz")


# ----------------------------------------------------------------------------------------------
# 2. out-of-range and wrongly typed fields: value read as missing / event dropped, counted


def write_doc(tmp_path: Path, doc: dict[str, Any], name: str = "t.json", text: str | None = None) -> Path:
    p = tmp_path / name
    p.write_text(text if text is not None else json.dumps(doc))
    return p


def kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def read_ok(path: Path, **kw: Any) -> Any:
    """read_file(path): no exception; the Run."""
    from tracekit.read import read_file

    return read_file(path, cache=False, **kw)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pid", 2**63),
        ("pid", 10**30),
        ("tid", 2**64),
        ("args.correlation", 2**63),
        ("args.device", 2**63),
        ("args.device", 2**40),
        ("args.stream", -(2**70)),
    ],
)
def test_event_int_fields_beyond_int64(tmp_path: Path, field: str, value: int) -> None:
    doc = real_kineto_doc()
    k = kernels(doc)[3]
    if field.startswith("args."):
        k["args"][field[5:]] = value
    else:
        k[field] = value
    run = read_ok(write_doc(tmp_path, doc))
    n_kernels = len(kernels(doc))
    assert int((run.events["kind"] == "kernel").sum()) == n_kernels  # the event is kept
    assert int(run.events["device"].max()) < 2**31
    if value >= 2**63 or value < -(2**63):
        assert run.data_quality.counts.get("values_out_of_range") == 1


@pytest.mark.parametrize("value", ["inf", 1e30, 10**30, -5, "12x", True])
def test_base_time_unusable(tmp_path: Path, value: Any) -> None:
    doc = real_kineto_doc()
    doc["baseTimeNanoseconds"] = value
    run = read_ok(write_doc(tmp_path, doc))
    assert run.data_quality.counts.get("base_time_unusable") == 1
    assert len(run.events) > 0


def test_base_time_wraps_int64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = real_kineto_doc()
    doc["baseTimeNanoseconds"] = 2**63 - 1  # + any ts > 0 wraps around
    p = write_doc(tmp_path, doc)
    cli_error(capsys, ["breakdown", str(p), "--no-cache"], p.name, "int64")


def test_some_events_wrap_int64(tmp_path: Path) -> None:
    doc = real_kineto_doc()
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    base = int(doc["baseTimeNanoseconds"])
    xs[0]["ts"] = (2**63 - base) // 1000 + 10  # this one lands beyond int64 ns
    xs[1]["dur"] = 9.2e15  # and this one ends beyond it
    run = read_ok(write_doc(tmp_path, doc))
    assert (
        run.data_quality.counts.get("events_time_out_of_range", 0)
        + run.data_quality.counts.get("events_huge_dur", 0)
        == 2
    )
    assert (run.events["end_ns"] >= run.events["start_ns"]).all()


@pytest.mark.parametrize("value", ["inf", 1e30, 10**30, -1, "nan"])
def test_distributed_rank_unusable(tmp_path: Path, value: Any) -> None:
    doc = real_kineto_doc()
    doc["distributedInfo"]["rank"] = value
    run = read_ok(write_doc(tmp_path, doc, "rank-1.json"))
    assert run.ranks == [1]  # from the file name instead
    if value != -1:
        assert run.data_quality.counts.get("rank_unusable") == 1


def test_rank_in_file_name_beyond_int32(tmp_path: Path) -> None:
    doc = real_kineto_doc()
    del doc["distributedInfo"]
    run = read_ok(write_doc(tmp_path, doc, "rank-99999999999999999999.json"))
    assert run.ranks == [0]


def test_rank_argument_20_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write_doc(tmp_path, real_kineto_doc())
    cli_error(capsys, ["breakdown", str(p), "--no-cache", "--rank", "1" * 20], "not a rank")


@pytest.mark.parametrize("ts", ["1e999999", "1e900000", "-1e999999", '"123.5x"', "1" * 5000])
def test_ts_unusable_numbers(tmp_path: Path, ts: str) -> None:
    doc = real_kineto_doc()
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    xs[7]["ts"] = "@TS@"
    p = write_doc(tmp_path, doc, text=json.dumps(doc).replace('"@TS@"', ts))
    run = read_ok(p)
    assert run.data_quality.counts.get("events_without_ts") == 1
    assert len(run.events) == len(xs) - 1


@pytest.mark.parametrize("dur", [1e300, 9.3e15, -1e300])
def test_dur_huge(tmp_path: Path, dur: float, recwarn: pytest.WarningsRecorder) -> None:
    doc = real_kineto_doc()
    kernels(doc)[0]["dur"] = dur
    run = read_ok(write_doc(tmp_path, doc))
    dq = run.data_quality.counts
    assert dq.get("events_huge_dur", 0) + dq.get("events_negative_dur", 0) == 1
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_step_number_40_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = real_kineto_doc()
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = "ProfilerStep#" + "7" * 40
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "decode_step"]
    p = write_doc(tmp_path, doc)
    out = cli_ok(capsys, ["breakdown", str(p), "--no-cache", "--steps", r"ProfilerStep#\d+"])
    assert out


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("CUPTI_ACTIVITY_KIND_KERNEL", "start"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "end"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "deviceId"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "correlationId"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"),
        ("NVTX_EVENTS", "eventType"),
        ("NVTX_EVENTS", "globalTid"),
        ("NVTX_EVENTS", "start"),
        ("NVTX_EVENTS", "end"),
        ("NVTX_EVENTS", "domainId"),
        ("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"),
        ("PROCESSES", "pid"),
    ],
)
@pytest.mark.parametrize("value", ["abc", None, 1e30, "9" * 30])
def test_nsys_column_wrong_type(
    real_nsys_sqlite: Path, tmp_path: Path, table: str, column: str, value: Any
) -> None:
    import sqlite3

    src = real_nsys_sqlite
    p = tmp_path / "rank-0.sqlite"
    shutil.copy(src, p)
    con = sqlite3.connect(p)
    try:
        con.execute(
            f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = (SELECT min(rowid) FROM "{table}")', (value,)
        )
        con.commit()
    except sqlite3.IntegrityError:  # a NOT NULL column: no export of this schema can hold the damage
        assert value is None, (table, column, value)
        return
    finally:
        con.close()
    run = read_ok(p)
    assert len(run.events) > 0
    if value is None and column == "correlationId":
        # a record without a correlation id is still a timed GPU record: kept, unlinked (-1)
        assert "nsys_rows_bad_values" not in run.data_quality.counts
        assert (run.events["kind"] == "kernel").sum() == (read_ok(src).events["kind"] == "kernel").sum()
    elif table.startswith(("CUPTI", "NVTX")) and not (
        value is None and column in ("end", "globalTid", "domainId")
    ):
        assert run.data_quality.counts.get("nsys_rows_bad_values") == 1


# ----------------------------------------------------------------------------------------------
# 3. deep nesting, malformed closings, invalid UTF-8, hangs and blow-ups from manifest fields

DEEP = 100_000


@pytest.mark.parametrize(
    ("where", "needle", "insert"),
    [
        ("metadata", '"schemaVersion": 1', '"schemaVersion": 1, "deep": ' + "[" * DEEP + "]" * DEEP),
        ("event args", '"args": {', '"args": {"deep": ' + "[" * DEEP + "]" * DEEP + ", "),
        ("event args objects", '"args": {', '"args": {"deep": ' + '{"a":' * DEEP + "1" + "}" * DEEP + ", "),
        ("event", '"ph": "X"', '"zz": ' + "[" * DEEP + "]" * DEEP + ', "ph": "X"'),
    ],
)
def test_deep_nesting_in_trace(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
    needle: str,
    insert: str,
) -> None:
    text = json.dumps(real_kineto_doc()).replace(needle, insert, 1)
    p = write_doc(tmp_path, {}, text=text)
    cli_error(capsys, ["breakdown", str(p), "--no-cache"], p.name, "nested too deeply")


def test_trace_events_closed_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps(real_kineto_doc())
    end = text.rindex("]")
    p = write_doc(tmp_path, {}, text=text[:end] + "]]" + text[end + 1 :])
    cli_error(capsys, ["breakdown", str(p), "--no-cache"], p.name, "invalid JSON")


def test_invalid_utf8_in_event_names(tmp_path: Path) -> None:
    text = json.dumps(real_kineto_doc())
    # 100k instant events first, so a quadratic re-decode would show; then three names broken
    pad = ('{"ph": "i", "name": "' + "a" * 200 + '"}, ') * 100_000
    text = text.replace('"traceEvents": [', '"traceEvents": [' + pad, 1)
    raw = text.encode().replace(b'"name": "aten::', b'"name": "\xffaten::', 3)
    p = tmp_path / "t.json"
    p.write_bytes(raw)
    run = read_ok(p)
    assert run.data_quality.counts.get("invalid_utf8_replaced", 0) >= 1
    assert any("\ufffd" in str(n) for n in run.events["name"].cat.categories)


def test_invalid_utf8_in_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.dumps(real_kineto_doc()).encode().replace(b'"trace_id": "', b'"trace_id": "\xff', 1)
    p = tmp_path / "t.json"
    p.write_bytes(raw)
    line = cli_error(capsys, ["breakdown", str(p), "--no-cache"], p.name, "UTF-8")
    assert "truncated" not in line


@pytest.mark.parametrize("where", ["before the events", "between events"])
def test_long_whitespace_run(tmp_path: Path, where: str) -> None:
    text = json.dumps(real_kineto_doc())
    ws = " " * (48 << 20)  # 48 MiB: below the token limit, skipped at C speed
    if where == "before the events":
        text = text.replace('"traceEvents": [', '"traceEvents": [' + ws, 1)
    else:
        text = text.replace("}, {", "}, " + ws + "{", 1)
    p = write_doc(tmp_path, {}, text=text)
    run = read_ok(p)
    assert len(run.events) > 0


def manifest_run(tmp_path: Path, edit: Any = None, text: str | None = None) -> Path:
    d = copy_run(CPU_TP2, tmp_path / "run")
    m = json.loads((CPU_TP2 / "manifest.json").read_text())
    if edit is not None:
        edit(m)
    (d / "manifest.json").write_text(text if text is not None else json.dumps(m))
    return d


def test_manifest_deep_nesting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = (CPU_TP2 / "manifest.json").read_text().rstrip()
    d = manifest_run(tmp_path, text=m[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}")
    cli_error(capsys, ["breakdown", str(d), "--no-cache"], "manifest.json", "nested too deeply")


MANIFEST_BAD_FIELDS: list[tuple[str, Any]] = [
    ("tp", 10**30),
    ("tp", "2"),
    ("tp", 0),
    ("tp", -1),
    ("per_token", 1e9),
    ("per_token", 10**9),
    ("step_pattern", 123),
]


def _set_workload(m: dict[str, Any], field: str, value: Any) -> None:
    if field == "per_token":
        m["workload"]["collectives"][0]["per_token"] = value
    else:
        m["workload"][field] = value


@pytest.mark.parametrize(("field", "value"), MANIFEST_BAD_FIELDS)
def test_manifest_field_out_of_bounds_is_read_as_missing(tmp_path: Path, field: str, value: Any) -> None:
    """Each malformed workload field: left out of the manifest as read (what the analyses get), with
    a manifest_field_malformed note; the other collectives entries and fields kept."""
    from tracekit.read.manifests import read_manifest

    m = json.loads((CPU_TP2 / "manifest.json").read_text())
    _set_workload(m, field, value)
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps(m))
    got = read_manifest(p)
    assert [k for k, _ in got.notes] == ["manifest_field_malformed"], got.notes
    wl = got.manifest.workload
    if field == "per_token":  # the bad entry left out, the others kept
        assert len(wl.collectives) == len(m["workload"]["collectives"]) - 1
    else:
        assert given(getattr(wl, field)) is None
        assert len(wl.collectives) == len(m["workload"]["collectives"])


@pytest.mark.parametrize("command", ["breakdown", "shortfall"])
def test_manifest_fields_out_of_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The commands on a run whose manifest has every kind of malformed workload field at once (tp,
    a collective's per_token, step_pattern): a result that counts them (each value alone is read as
    missing: test_manifest_field_out_of_bounds_is_read_as_missing, so the analyses see the same
    missing fields whichever value it was; one command run per value, 14 in all, did the same)."""

    def edit(m: dict[str, Any]) -> None:
        for field, value in [("tp", 0), ("per_token", 1e9), ("step_pattern", 123)]:
            _set_workload(m, field, value)

    d = manifest_run(tmp_path, edit)
    if command == "breakdown":
        doc = cli_ok(capsys, ["breakdown", str(d), "--no-cache"])
    else:
        doc = cli_ok(capsys, ["shortfall", "--baseline", str(CPU_TP1), "--sharded", str(d), "--no-cache"])
    text = json.dumps(doc)
    assert "manifest_field_malformed" in text
    for said in ("workload.tp", "workload.collectives", "workload.step_pattern"):
        assert said in text, said


# ----------------------------------------------------------------------------------------------
# 4. limits: decompressed bytes, events, one token; enforced while streaming


def gzip_member(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def make_gzip_bomb(path: Path, total: int, prefix: bytes, piece: int = 64 << 20) -> None:
    """`prefix` then `total` bytes of spaces, gzipped without ever holding them: a 64 MiB member of
    spaces is compressed once (about 64 kB) and written total / piece times after the prefix's
    member (a multi-member gzip, as `cat a.gz b.gz` makes; every gzip reader inflates it whole)."""
    spaces = gzip_member(b" " * piece)
    with open(path, "wb") as f:
        f.write(gzip_member(prefix))
        for _ in range(total // piece):
            f.write(spaces)


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, float, int]:
    """`tracekit <argv>` in a fresh interpreter: (exit code, stderr, seconds in main, peak RSS in MiB).

    The peak is the child's VmHWM (/proc/self/status), else getrusage's ru_maxrss: Linux folds the
    pre-exec image's peak into ru_maxrss, so a child forked from a 1 GB pytest reads 1 GB."""
    code = (
        "import resource, sys, time\n"
        "from tracekit.cli.main import main\n"
        "t0 = time.perf_counter()\n"
        "rc = main(sys.argv[1:])\n"
        "took = time.perf_counter() - t0\n"
        "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
        "try:\n"  # ru_maxrss keeps the forking parent's peak across exec: VmHWM is this image's own
        "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
        "    rss = int(hwm[0].split()[1]) // 1024 if hwm else rss\n"
        "except OSError:\n"
        "    pass\n"
        "print(f'MEASURED {took:.3f} {rss}', file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRACEKIT_NO_CACHE": "1", **(env or {})},
    )
    lines = proc.stderr.strip().splitlines()
    took, rss = lines[-1].split()[1:]
    return proc.returncode, "\n".join(lines[:-1]), float(took), int(rss)


def test_gzip_bomb_4gib_whitespace_refused_fast_and_small(tmp_path: Path) -> None:
    bomb = tmp_path / "rank-0.pt.trace.json.gz"
    make_gzip_bomb(bomb, 4 << 30, b'{"traceEvents": [')
    assert bomb.stat().st_size < 8 << 20  # about 4 MB on disk
    rc, err, took, rss_mib = run_measured(["breakdown", str(bomb), "--no-cache"])
    assert rc == 2, err
    assert err.count("\n") == 0 and err.startswith("tracekit: error: ") and bomb.name in err
    assert "64 MiB" in err and "whitespace" in err
    assert rss_mib < 1024, rss_mib  # the time it takes: benchmarks/bench_refusals.py


def test_gzip_bomb_inside_a_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "t.json.gz"
    make_gzip_bomb(bomb, 256 << 20, b'{"traceEvents": [{"ph": "X", "name": "')
    cli_error(capsys, ["breakdown", str(bomb), "--no-cache"], bomb.name, "longer than 64 MiB")


def test_gzip_bomb_before_trace_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "t.json.gz"
    make_gzip_bomb(bomb, 256 << 20, b"{")
    cli_error(capsys, ["breakdown", str(bomb), "--no-cache"], bomb.name, "64 MiB")


def test_max_bytes_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = CPU_TP1 / "rank-0.pt.trace.json.gz"
    cli_error(
        capsys, ["breakdown", str(f), "--no-cache", "--max-bytes", "1M"], f.name, "1 MiB", "--max-bytes"
    )
    assert os.environ.get("TRACEKIT_MAX_BYTES") is None  # put back when the command ends


def test_max_events_option_and_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = CPU_TP1 / "rank-0.pt.trace.json.gz"
    cli_error(capsys, ["breakdown", str(f), "--no-cache", "--max-events", "1000"], f.name, "1000 events")
    monkeypatch.setenv("TRACEKIT_MAX_EVENTS", "2000")
    cli_error(capsys, ["breakdown", str(f), "--no-cache"], f.name, "2000 events")
    # several files, read in the process pool: the environment reaches the workers
    pool_for_any_size(monkeypatch)
    cli_error(capsys, ["breakdown", str(CPU_TP2), "--no-cache"], "2000 events")


def test_many_tiny_events_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip_member(b'{"traceEvents": [' + b'{"ph": "i"}, ' * 300_000))
    monkeypatch.setenv("TRACEKIT_MAX_EVENTS", "100k")
    cli_error(capsys, ["breakdown", str(p), "--no-cache"], p.name, "102400 events")


def test_limit_value_not_a_size(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["breakdown", str(CPU_TP1), "--max-bytes", "lots"]) != 0
    assert "Traceback" not in capsys.readouterr().err


def test_nsys_limits(
    real_nsys_sqlite: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = real_nsys_sqlite
    gz = tmp_path / "rank-0.sqlite.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    cli_error(capsys, ["breakdown", str(gz), "--no-cache", "--max-bytes", "64K"], gz.name, "64 KiB")
    cli_error(capsys, ["breakdown", str(src), "--no-cache", "--max-events", "10"], src.name, "event rows")


# ----------------------------------------------------------------------------------------------
# 5. silent wrong answers: missing ranks, wrong baselines, checksums, wrap-around, string times


@pytest.mark.parametrize("how", ["deleted", "renamed", "a directory", "a dangling link"])
def test_rank_file_missing_from_a_tp2_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    d = copy_run(CPU_TP2, tmp_path / "run")
    f = d / "rank-1.pt.trace.json.gz"
    f.unlink()
    if how == "renamed":
        shutil.copy(CPU_TP2 / f.name, d / "rank-1.pt.trace.json.gz.bak")
    elif how == "a directory":
        f.mkdir()
    elif how == "a dangling link":
        os.symlink(tmp_path / "nowhere.json.gz", f)
    doc = cli_ok(capsys, ["breakdown", str(d), "--no-cache"])
    text = json.dumps(doc)
    assert "ranks_missing" in text and "tp=2" in text
    if how in ("a directory", "a dangling link"):
        assert "trace_names_not_files" in text


def test_shortfall_names_the_missing_rank_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder holding one rank of a TP=2 run (its manifest says tp=2) as --sharded beside a TP=1
    baseline: the error is the missing rank, not 'both have 1 rank(s)' from the pair check."""
    d = copy_run(CPU_TP2, tmp_path / "run")
    (d / "rank-1.pt.trace.json.gz").unlink()
    line = cli_error(
        capsys, ["shortfall", "--baseline", str(CPU_TP1), "--sharded", str(d), "--no-cache"], "rank(s) 1"
    )
    assert "sharded: the manifest says tp=2" in line and "both have" not in line


def test_shortfall_sharded_run_as_its_own_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    cli_error(
        capsys,
        ["shortfall", "--baseline", str(CPU_TP2), "--sharded", str(CPU_TP2), "--no-cache"],
        "same trace",
    )


def test_shortfall_baseline_with_as_many_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = copy_run(CPU_TP2, tmp_path / "other")
    cli_error(
        capsys,
        ["shortfall", "--baseline", str(other), "--sharded", str(CPU_TP2), "--no-cache"],
        "rank-0.pt.trace.json.gz: the sharded run has 2 rank(s), as many as the baseline",
    )


def test_shortfall_baseline_of_another_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = copy_run(CPU_TP1, tmp_path / "tp1")
    m = json.loads((base / "manifest.json").read_text())
    m["workload"]["shape"]["hidden"] = 4096
    m["workload"]["batch"] = 8
    (base / "manifest.json").write_text(json.dumps(m))
    doc = cli_ok(capsys, ["shortfall", "--baseline", str(base), "--sharded", str(CPU_TP2), "--no-cache"])
    text = json.dumps(doc)
    assert "baseline_workload_differs" in text and "batch 8 vs 1" in text


@pytest.mark.parametrize("damage", ["bytes changed", "size changed"])
def test_manifest_checksum_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    d = copy_run(CPU_TP2, tmp_path / "run")
    f = d / "rank-1.pt.trace.json.gz"
    if damage == "bytes changed":  # same size, other bytes: re-gzipped at another level
        with gzip.open(CPU_TP2 / f.name) as src:
            data = src.read()
        m = json.loads((d / "manifest.json").read_text())
        f.write_bytes(gzip.compress(data, compresslevel=1))
        m["files"][f.name]["bytes"] = f.stat().st_size
        (d / "manifest.json").write_text(json.dumps(m))
    else:
        with gzip.open(CPU_TP2 / f.name) as src:
            f.write_bytes(gzip.compress(src.read(), compresslevel=1))
    doc = cli_ok(capsys, ["breakdown", str(d), "--no-cache"])
    text = json.dumps(doc)
    assert "checksum_mismatch" in text and f.name in text


def test_nsys_times_out_of_range(real_nsys_sqlite: Path, tmp_path: Path) -> None:
    import sqlite3

    src = real_nsys_sqlite
    p = tmp_path / "rank-0.sqlite"
    shutil.copy(src, p)
    con = sqlite3.connect(p)
    con.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = -49000000000 WHERE rowid = (SELECT min(rowid) FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL)"
    )
    con.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 9223372036854775000, end = 9223372036854775800 WHERE "
        "rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
    )
    con.commit()
    con.close()
    run = read_ok(p)
    assert run.data_quality.counts.get("nsys_times_out_of_range") == 2
    assert int(run.events["start_ns"].min()) >= 0


def test_string_timestamps_are_exact_or_counted(tmp_path: Path) -> None:
    doc = real_kineto_doc()
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    xs[3]["ts"] = str(xs[3]["ts"])  # a number written as a string: read as that number
    xs[4]["ts"] = "123.5x"  # not a number: skipped, counted
    run = read_ok(write_doc(tmp_path, doc))
    assert run.data_quality.counts.get("events_without_ts") == 1
    assert len(run.events) == len(xs) - 1


def test_string_timestamp_far_from_the_others(tmp_path: Path) -> None:
    doc = real_kineto_doc()
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    xs[3]["ts"] = "123.5"  # a number in a string, and 59 days before the rest: skipped, counted
    run = read_ok(write_doc(tmp_path, doc))
    assert run.data_quality.counts.get("ts_as_string") == 1
    assert run.data_quality.counts.get("events_time_outliers") == 1
    span = int(run.events["end_ns"].max() - run.events["start_ns"].min())
    assert span < 3600 * 10**9


# ----------------------------------------------------------------------------------------------
# 6. the corpus of broken inputs, generated from the real traces: each ends in a result (the
#    problem counted in data_quality where there is one) or one error line naming the file


def outcome(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[str, str]:
    """('ok', stdout) or ('error', the one line); never a traceback."""
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    if rc == 0:
        return "ok", out.out
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("tracekit: error: "), out.err
    return "error", lines[0]


@functools.lru_cache(maxsize=1)
def _plain(_: Any = None) -> bytes:
    """The real single-rank trace as JSON bytes (made once: bytes cannot be edited in place)."""
    return json.dumps(real_kineto_doc()).encode()


def _events_edit(_: Any, edit: Any) -> bytes:
    doc = real_kineto_doc()
    edit(doc, [e for e in doc["traceEvents"] if e.get("ph") == "X"])
    return json.dumps(doc).encode()


def _set(field: str, value: Any, every: int = 7) -> Any:
    def edit(doc: dict[str, Any], xs: list[dict[str, Any]]) -> None:
        for e in xs[::every]:
            e[field] = value

    return edit


def _drop(field: str, every: int = 5) -> Any:
    def edit(doc: dict[str, Any], xs: list[dict[str, Any]]) -> None:
        for e in xs[::every]:
            e.pop(field, None)

    return edit


def _duplicate(doc: dict[str, Any], xs: list[dict[str, Any]]) -> None:
    doc["traceEvents"] = doc["traceEvents"] + [dict(e) for e in xs[::3]]


def _overlap_kernels(doc: dict[str, Any], xs: list[dict[str, Any]]) -> None:
    ks = [e for e in xs if e.get("cat") == "kernel"]
    for a, b in zip(ks[::2], ks[1::2], strict=False):
        b["ts"] = a["ts"] + a["dur"] / 2  # the next kernel on the stream starts inside this one


def _shuffle(doc: dict[str, Any], xs: list[dict[str, Any]]) -> None:
    import random

    random.Random(0).shuffle(doc["traceEvents"])


#: name -> bytes of a broken `.json` made from the real single-rank trace, and what is expected:
#: "ok" (with this data_quality key when not empty), "error" (one line naming the file) or "any"
JSON_CORPUS: dict[str, tuple[Any, str, str]] = {
    "empty file": (lambda t: b"", "error", ""),
    "whitespace only": (lambda t: b"   \n\t ", "error", ""),
    "not JSON": (lambda t: b"PK\x03\x04 a zip file", "error", ""),
    "JSON array": (lambda t: b"[1, 2, 3]", "error", ""),
    "JSON string": (lambda t: b'"traceEvents"', "error", ""),
    "traceEvents not a list": (lambda t: b'{"traceEvents": {"a": 1}}', "error", ""),
    "traceEvents of numbers": (lambda t: b'{"traceEvents": [1, 2, 3]}', "error", ""),
    "traceEvents empty": (lambda t: b'{"traceEvents": []}', "error", ""),
    "truncated at 10%": (lambda t: _plain(t)[: len(_plain(t)) // 10], "error", ""),
    "truncated at 50%": (lambda t: _plain(t)[: len(_plain(t)) // 2], "error", ""),
    "truncated before the last brace": (lambda t: _plain(t)[:-1], "error", ""),
    "non-UTF-8 bytes in names": (
        lambda t: _plain(t).replace(b'"name": "aten::', b'"name": "\xc3\x28aten::'),
        "ok",
        "invalid_utf8_replaced",
    ),
    "1 MB event name": (
        lambda t: _events_edit(t, lambda d, xs: xs[2].__setitem__("name", "k" * (1 << 20))),
        "ok",
        "",
    ),
    "missing ts": (lambda t: _events_edit(t, _drop("ts")), "ok", "events_without_ts"),
    "missing dur": (lambda t: _events_edit(t, _drop("dur")), "ok", "events_without_dur"),
    "missing name and cat": (
        lambda t: _events_edit(t, lambda d, xs: [e.pop(k, None) for e in xs[::4] for k in ("name", "cat")]),
        "any",
        "",
    ),
    "ts of the wrong type": (lambda t: _events_edit(t, _set("ts", [1, 2])), "ok", "events_without_ts"),
    "dur as a string": (lambda t: _events_edit(t, _set("dur", "12.5")), "ok", "events_fields_wrong_type"),
    "dur negative": (lambda t: _events_edit(t, _set("dur", -5.0)), "ok", "events_negative_dur"),
    "dur huge": (lambda t: _events_edit(t, _set("dur", 1e300)), "ok", "events_huge_dur"),
    "dur NaN text": (lambda t: _events_edit(t, _set("dur", "NaN")), "ok", "events_without_dur"),
    "pid and tid objects": (
        lambda t: _events_edit(t, lambda d, xs: [e.update(pid={"a": 1}, tid=[1]) for e in xs[::6]]),
        "ok",
        "events_fields_wrong_type",
    ),
    "args not an object": (
        lambda t: _events_edit(t, _set("args", [1, 2, 3])),
        "ok",
        "events_fields_wrong_type",
    ),
    "duplicate events": (lambda t: _events_edit(t, _duplicate), "ok", "gpu_events_duplicated"),
    "overlapping kernels on one stream": (
        lambda t: _events_edit(t, _overlap_kernels),
        "ok",
        "gpu_stream_overlaps",
    ),
    "events out of order": (lambda t: _events_edit(t, _shuffle), "ok", ""),
    "all X events without ts": (lambda t: _events_edit(t, _drop("ts", every=1)), "error", ""),
    "ph unknown": (lambda t: _events_edit(t, _set("ph", "Q", every=3)), "ok", "skipped_other_phase_events"),
    "NaN literal": (lambda t: _plain(t).replace(b'"dur": ', b'"dur": NaN, "x": ', 1), "error", ""),
}


#: the corpus cases the CLI also runs gzipped, one that ends in an error and one in a result; every
#: case's gzip is read by the reader as its plain JSON is (test_json_corpus_gzip_reads_as_plain), which
#: with the plain case's CLI outcome gives the gzip's
GZIP_CLI_CASES = ("truncated at 50%", "missing ts")


@pytest.mark.parametrize(
    ("packing", "case"), [("plain", c) for c in JSON_CORPUS] + [("gzip", c) for c in GZIP_CLI_CASES]
)
def test_json_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, packing: str) -> None:
    make, expect, key = JSON_CORPUS[case]
    data = make(None)
    p = tmp_path / ("t.json" if packing == "plain" else "t.json.gz")
    # gzip level 1: the same gzip stream format as level 9 (what the reader inflates), ~10x less CPU
    p.write_bytes(data if packing == "plain" else gzip.compress(data, compresslevel=1))
    got, text = outcome(capsys, ["breakdown", str(p), "--no-cache", "--format", "json"])
    if expect != "any":
        assert got == expect, text
    if got == "error":
        assert p.name in text
    elif key:
        assert key in text


def _read_outcome(path: Path) -> tuple[str, Any]:
    """read_file(path): ('ok', the Run) or ('error', the TraceFormatError); nothing else raised."""
    from tracekit.read import read_file

    try:
        return "ok", read_file(path, cache=False)
    except TraceFormatError as e:
        return "error", e


@pytest.mark.parametrize("case", list(JSON_CORPUS))
def test_json_corpus_gzip_reads_as_plain(tmp_path: Path, case: str) -> None:
    """Every corpus case gzipped reads as its plain JSON does (the same events and data_quality, or
    the same error naming the .gz file): what the CLI makes of a Run does not depend on the packing,
    so with test_json_corpus's plain outcome this is the gzip's (the CLI runs GZIP_CLI_CASES gzipped
    too). The CLI on every case gzipped (~0.2 CPU-s of analysis each) did the same at 29 CLI runs."""
    data = JSON_CORPUS[case][0](None)
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data, compresslevel=1))  # level 1: the same stream format as 9
    (got_p, a), (got_g, b) = _read_outcome(plain), _read_outcome(packed)
    assert got_p == got_g, (a, b)
    if got_p == "error":
        assert b.path == str(packed) and (b.message, b.offset, b.event_index) == (
            a.message,
            a.offset,
            a.event_index,
        ), (str(a), str(b))
    else:
        assert a.ranks == b.ranks
        assert_frames_equal(a.events, b.events)  # pandas' assert_frame_equal: ~0.4 CPU-s a case
        assert a.data_quality.counts == b.data_quality.counts
        # the notes name the file they are about
        assert [n.replace(packed.name, plain.name) for n in b.data_quality.notes] == a.data_quality.notes


@pytest.mark.parametrize("seed", range(6))
def test_truncated_gzip_at_random_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    import random

    raw = (CPU_TP1 / "rank-0.pt.trace.json.gz").read_bytes()
    cut = random.Random(seed).randrange(1, len(raw) - 1)
    p = tmp_path / "rank-0.pt.trace.json.gz"
    p.write_bytes(raw[:cut])
    got, text = outcome(capsys, ["breakdown", str(p), "--no-cache"])
    assert got == "error" and p.name in text


@pytest.mark.parametrize("seed", range(6))
def test_corrupt_gzip_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int) -> None:
    import random

    raw = bytearray((CPU_TP1 / "rank-0.pt.trace.json.gz").read_bytes())
    rng = random.Random(seed)
    for _ in range(4):
        raw[rng.randrange(10, len(raw) - 8)] ^= 1 << rng.randrange(8)
    p = tmp_path / "rank-0.pt.trace.json.gz"
    p.write_bytes(bytes(raw))
    got, text = outcome(capsys, ["breakdown", str(p), "--no-cache"])
    assert got == "error" and p.name in text


def test_mixed_timestamp_conventions_across_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy_run(CPU_TP2, tmp_path / "run")
    f = d / "rank-1.pt.trace.json.gz"
    with gzip.open(f, "rt") as src:
        doc = json.load(src)
    base = int(doc.pop("baseTimeNanoseconds"))
    for e in doc["traceEvents"]:  # rank 1 in absolute microseconds since the epoch
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + base / 1000
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    got, text = outcome(capsys, ["breakdown", str(d), "--no-cache", "--format", "json"])
    assert got in ("ok", "error")


def test_ranks_with_different_collective_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy_run(CPU_TP2, tmp_path / "run")
    f = d / "rank-1.pt.trace.json.gz"
    with gzip.open(f, "rt") as src:
        doc = json.load(src)
    gone = [i for i, e in enumerate(doc["traceEvents"]) if str(e.get("name", "")).startswith("gloo:")][:3]
    doc["traceEvents"] = [e for i, e in enumerate(doc["traceEvents"]) if i not in gone]
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for argv in (["breakdown", str(d)], ["shortfall", "--baseline", str(CPU_TP1), "--sharded", str(d)]):
        got, text = outcome(capsys, [*argv, "--no-cache", "--format", "json"])
        if got == "ok":
            assert "collective" in text


def test_folder_with_unrelated_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy_run(CPU_TP2, tmp_path / "run")
    (d / "README.txt").write_text("notes")
    (d / "plot.png").write_bytes(b"\x89PNG\r\n")
    (d / ".hidden.json").write_text("{")
    (d / "sub").mkdir()
    (d / "sub" / "x.json").write_text("{")
    got, _ = outcome(capsys, ["breakdown", str(d), "--no-cache"])
    assert got == "ok"
    (d / "config.json").write_text(
        '{"lr": 0.1}'
    )  # a JSON beside the ranks is read as a trace: refused by name
    got, text = outcome(capsys, ["breakdown", str(d), "--no-cache"])
    assert got == "error" and "config.json" in text


def test_file_name_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = os.fsdecode(b"rank-0-\xff\xfe.pt.trace.json.gz")
    p = tmp_path / name
    shutil.copy(CPU_TP1 / "rank-0.pt.trace.json.gz", p)
    got, _ = outcome(capsys, ["breakdown", str(p), "--no-cache"])
    assert got == "ok"
    p.write_bytes(b"{")
    got, text = outcome(capsys, ["breakdown", str(p), "--no-cache"])
    assert got == "error"


def _sqlite_copy(real_nsys_sqlite: Path, tmp_path: Path) -> Path:
    src = real_nsys_sqlite
    p = tmp_path / "rank-0.sqlite"
    shutil.copy(src, p)
    return p


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL",
        "DROP TABLE StringIds",
        "DROP TABLE NVTX_EVENTS",
        "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME",
        "DROP TABLE TARGET_INFO_SESSION_START_TIME",
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN demangledName",
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN correlationId",
        "ALTER TABLE NVTX_EVENTS DROP COLUMN textId",
        "ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME DROP COLUMN globalTid",
        "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL",
        "DELETE FROM StringIds",
    ],
)
def test_sqlite_missing_tables_and_columns(
    real_nsys_sqlite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sql: str
) -> None:
    import sqlite3

    p = _sqlite_copy(real_nsys_sqlite, tmp_path)
    con = sqlite3.connect(p)
    try:
        for stmt in (
            "DROP INDEX IF EXISTS " + r[0]
            for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type='index' AND sql IS NOT NULL"
            ).fetchall()
        ):
            con.execute(stmt)
        con.execute(sql)
        con.commit()
    except sqlite3.OperationalError as exc:
        pytest.skip(f"this SQLite cannot: {exc}")
    finally:
        con.close()
    got, text = outcome(capsys, ["breakdown", str(p), "--no-cache", "--format", "json"])
    if got == "error":
        assert p.name in text


@pytest.mark.parametrize("damage", ["header only", "truncated", "zeroed pages", "random bytes"])
def test_corrupt_sqlite(
    real_nsys_sqlite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    import random

    p = _sqlite_copy(real_nsys_sqlite, tmp_path)
    raw = bytearray(p.read_bytes())
    if damage == "header only":
        raw = raw[:100]
    elif damage == "truncated":
        raw = raw[: len(raw) // 3]
    elif damage == "zeroed pages":
        raw[4096 : 4096 * 8] = bytes(4096 * 7)
    else:
        rng = random.Random(1)
        for _ in range(200):
            raw[rng.randrange(100, len(raw))] = rng.randrange(256)
    p.write_bytes(bytes(raw))
    got, text = outcome(capsys, ["breakdown", str(p), "--no-cache"])
    if got == "error":
        assert p.name in text


@pytest.mark.parametrize("where", ["no such folder", "a full disk (/dev/full)"])
def test_output_file_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    out = str(tmp_path / "no" / "such" / "x.json") if where == "no such folder" else "/dev/full"
    if where.startswith("a full") and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    cli_error(capsys, ["breakdown", str(CPU_TP1), "--no-cache", "--out", out], out, "cannot write")
    assert os.path.exists("/dev/full") or where == "no such folder"


def test_output_file_written_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "b.json"
    out.write_text("old")
    assert main(["breakdown", str(CPU_TP1), "--no-cache", "--format", "json", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["kind"] == "tracekit.breakdown"
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]  # no temporary left


# ----------------------------------------------------------------------------------------------
# 7. capture faults: a rank killed mid-run, Ctrl-C


@pytest.mark.slow
def test_capture_rank_killed_keeps_the_other_rank_verified(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tracekit.capture.runner import CaptureConfig, capture
    from tracekit.errors import CaptureError
    from tracekit.read import read_run

    # calibrate=False: the profiler calibration runs before the passes (the kill after them) and
    # takes ~8 of a warm capture's ~10 s on the loaded 2-core VM
    cfg = CaptureConfig(
        tp=2, tokens=3, warmup=1, device="cpu", kill_rank=1, timeout_s=60, rounds=1, calibrate=False
    )
    with pytest.raises(CaptureError, match=r"rank 1: killed by SIGKILL"):
        capture(cfg, tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["complete"] is False and [e["rank"] for e in m["errors"]] == [1]
    assert list(m["files"]) == ["rank-0.pt.trace.json.gz"]
    run = read_run([tmp_path / "rank-0.pt.trace.json.gz"], cache=False)  # complete, and its SHA-256 matches
    assert run.ranks == [0] and "checksum_mismatch" not in run.data_quality.counts


def test_exit_codes_in_words() -> None:
    from tracekit.capture.runner import exit_words

    assert exit_words(-9).startswith("killed by SIGKILL (out of memory?")
    assert exit_words(-15) == "killed by SIGTERM"
    assert exit_words(3) == "process exited with code 3"


def _children(pid: int) -> list[int]:
    try:
        return [
            int(k) for t in Path(f"/proc/{pid}/task").iterdir() for k in (t / "children").read_text().split()
        ]
    except OSError:
        return []


def _rank_like_descendants(pid: int) -> list[int]:
    """Descendants of `pid` without children, multiprocessing's resource tracker left out."""
    out, todo = [], _children(pid)
    while todo:
        p = todo.pop()
        kids = _children(p)
        todo += kids
        try:
            tracker = b"resource_tracker" in Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if not kids and not tracker:
            out.append(p)
    return out


@pytest.mark.slow
def test_capture_ctrl_c_ends_with_one_line_and_a_manifest(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracekit.cli.main",
            "capture",
            "--tp",
            "2",
            "--tokens",
            "5000",
            "--rounds",
            "1",
            # rank 1 sleeps 200 ms before each all-reduce and rank 0 waits in gloo's (blocking)
            # receive meanwhile: the decode loop the Ctrl-C lands in keeps both ranks nearly idle
            # instead of burning two cores for the seconds the test waits
            "--inject-delay",
            "1:200",
            # no profiler calibration (~4 CPU-s of a capture's ~9, before the passes): the ranks are
            # in the decode loop sooner, where the Ctrl-C is meant to land
            "--no-calibrate",
        ]
        + ["--device", "cpu", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a user's terminal delivers Ctrl-C; a suite started in the background (`cmd &` in a
        # script) ignores SIGINT and its children inherit that, so Python never installs its
        # handler and the capture runs on: give the capture the terminal's default disposition
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    # the ranks are up once both processes exist: wait for them (or for the deadline). They are the
    # capture's descendants with no child of their own, but for multiprocessing's resource tracker
    # (on a CPU forked from the fork server, a child of the capture that has children once they are)
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if len(_rank_like_descendants(proc.pid)) >= 2:
            time.sleep(4)  # into the decode loop
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("[W", "W1", "[rank"))]
    assert "Traceback" not in "\n".join(lines[-3:])
    assert proc.returncode in (2, 130), err
    if proc.returncode == 2:  # interrupted while the ranks ran: the manifest says which
        assert "interrupted" in lines[-1]
        m = json.loads((out / "manifest.json").read_text())
        assert m["complete"] is False and all("interrupted" in e["message"] for e in m["errors"])


def test_capture_ctrl_c_while_the_ranks_start_ends_the_started_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C lands while rank 1 is being spawned (seconds on a loaded host): rank 0 is already up
    # and waits at the rendezvous for rank 1. It must be ended and the run said incomplete; left
    # running, the interpreter's exit joins it and the capture hangs (seen once in a full suite)
    pytest.importorskip("torch")
    import multiprocessing.process as mpp

    from tracekit.capture.runner import CaptureConfig, capture
    from tracekit.errors import CaptureError

    started: list[mpp.BaseProcess] = []
    real_start = mpp.BaseProcess.start

    def start(self: mpp.BaseProcess) -> None:
        if started:  # the second rank: the user presses Ctrl-C now
            raise KeyboardInterrupt
        real_start(self)
        started.append(self)

    monkeypatch.setattr(mpp.BaseProcess, "start", start)
    cfg = CaptureConfig(tp=2, tokens=3, warmup=1, device="cpu", timeout_s=60, rounds=1)
    with pytest.raises(CaptureError, match=r"rank 0: interrupted \(Ctrl-C\).*rank 1: interrupted"):
        capture(cfg, tmp_path)
    assert started and not started[0].is_alive()
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["complete"] is False and sorted(e["rank"] for e in m["errors"]) == [0, 1]
