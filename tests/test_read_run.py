"""read_run: folders of rank files as one run, manifest, duplicate ranks, no traces, the Parquet
cache (hit identical, invalidated on change, corrupt entry ignored, never written into a read-only
folder), and the parallel path."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import write_real_tp2_run
from frame_checks import assert_frames_equal
from msgspec import UNSET

from tracekit.errors import NoTracesError, RankError, TraceFormatError
from tracekit.read import cache as cache_mod
from tracekit.read import read_run


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TRACEKIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRACEKIT_NO_CACHE", raising=False)


def _sampled(tmp_path: Path) -> Path:
    """A real two-rank run of the project's own (traces/h200-tp2-full, one step per rank)."""
    return write_real_tp2_run(tmp_path / "run")


def _x_kernels(path: Path) -> int:
    with gzip.open(path, "rt") as f:
        return sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel")


def test_two_ranks_one_run(tmp_path: Path) -> None:
    d = _sampled(tmp_path)
    (d / "manifest.json").write_text(json.dumps({"world_size": 2, "note": "test"}))
    run = read_run([d], cache=False, jobs=1)
    assert run.ranks == [0, 1]
    # a manifest of another tool: read, its keys (none a capture's) kept as they were
    assert run.manifest is not None and run.manifest.unknown_fields == {"world_size": 2, "note": "test"}
    assert run.manifest.to_json() == {"world_size": 2, "note": "test"}
    ev = run.events
    for r in (0, 1):
        assert int(((ev["rank"] == r) & (ev["kind"] == "kernel")).sum()) == _x_kernels(
            d / f"rank-{r}.json.gz"
        )
    assert str(ev["name"].dtype) == "category" and str(ev["kind"].dtype) == "category"
    # the same files given one by one
    again = read_run(sorted(d.glob("*.json.gz")), cache=False, jobs=1)
    assert_frames_equal(run.events, again.events)


@pytest.mark.slow
def test_parallel_equals_sequential(tmp_path: Path) -> None:
    d = _sampled(tmp_path)
    seq = read_run([d], cache=False, jobs=1)
    par = read_run([d], cache=False, jobs=2)
    assert_frames_equal(seq.events, par.events)
    assert seq.data_quality.to_dict() == par.data_quality.to_dict()


def test_small_runs_read_in_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `jobs`, several files holding less than POOL_MIN_BYTES together are read in this
    process (a pool's start and the Runs sent back cost more than the reading); from that size on
    (or with jobs=2) in a process pool, with the same events."""
    import tracekit.read.run as run_mod

    d = _sampled(tmp_path)
    size = sum(f.stat().st_size for f in d.glob("*.json.gz"))
    pools: list[int] = []
    real = run_mod.ProcessPoolExecutor

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, max_workers: int) -> None:
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(run_mod, "ProcessPoolExecutor", Counted)
    default = [2] if (os.cpu_count() or 1) >= 2 else []  # min(files, CPUs) workers; 1: this process
    assert size < run_mod.POOL_MIN_BYTES
    here = read_run([d], cache=False)
    assert pools == []
    monkeypatch.setattr(run_mod, "POOL_MIN_BYTES", size)
    pooled = read_run([d], cache=False)
    assert pools == default
    assert_frames_equal(here.events, pooled.events)
    monkeypatch.setattr(run_mod, "POOL_MIN_BYTES", size + 1)
    read_run([d], cache=False)
    assert pools == default
    read_run([d], cache=False, jobs=2)  # asked for: a pool whatever the size
    assert pools == [*default, 2]


def test_frame_check_is_exact() -> None:
    """frame_checks.assert_frames_equal, which these tests compare event tables with, refuses what
    pandas' assert_frame_equal refuses: another value, dtype, column order, index or order of a
    categorical's categories."""
    ev = read_run([REPO / "traces" / "cpu-tp2"], cache=False, jobs=1).events
    assert_frames_equal(ev, ev.copy())
    one = ev.copy()
    one.loc[5, "start_ns"] += 1
    names = ev.copy()
    names["name"] = names["name"].cat.reorder_categories(list(names["name"].cat.categories)[::-1])
    text = ev.copy()
    text["name"] = text["name"].astype(str)
    moved = ev.copy()
    moved.index = moved.index + 1
    for other in (one, names, text, ev[list(ev.columns)[::-1]], moved):
        with pytest.raises(AssertionError):
            assert_frames_equal(ev, other)


def test_duplicate_ranks(tmp_path: Path) -> None:
    d = _sampled(tmp_path)
    shutil.copy(d / "rank-0.json.gz", d / "copy_of_rank0.json.gz")
    with pytest.raises(
        RankError,
        match=r"rank 0 appears in two files: .*copy_of_rank0.*rank-0|rank 0 appears in two files: .*rank-0.*copy_of_rank0",
    ):
        read_run([d], cache=False, jobs=1)


def test_no_traces(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("nothing")
    with pytest.raises(NoTracesError, match="empty: no trace files"):
        read_run([empty])
    with pytest.raises(NoTracesError, match="no such file"):
        read_run([tmp_path / "absent"])


def test_rank_argument_needs_one_file(tmp_path: Path) -> None:
    d = _sampled(tmp_path)
    with pytest.raises(RankError, match="one trace file"):
        read_run([d], rank=3)
    assert read_run([d / "rank-1.json.gz"], rank=3, cache=False).ranks == [3]


def test_bad_file_in_folder(tmp_path: Path) -> None:
    d = _sampled(tmp_path)
    data = (d / "rank-1.json.gz").read_bytes()
    (d / "rank-1.json.gz").write_bytes(data[:1000])
    with pytest.raises(TraceFormatError, match="rank-1.json.gz"):
        read_run([d], cache=False, jobs=1)


# ------------------------------------------------------------------------------------------------
# cache


def test_cache_hit_identical_and_invalidated(tmp_path: Path) -> None:
    d = _sampled(tmp_path)
    f = d / "rank-0.json.gz"
    first = read_run([f])
    entry = cache_mod.cache_path_for(f)
    # in the user's cache folder, never beside the input (issue 15)
    assert entry is not None and entry.exists() and entry.parent == tmp_path / "xdg" / "tracekit"
    assert not (d / ".tracekit-cache").exists()
    stamp = entry.stat().st_mtime_ns
    hit = read_run([f])
    assert entry.stat().st_mtime_ns == stamp  # served from the cache, not rewritten
    assert_frames_equal(first.events, hit.events)
    for col in ("kind", "name", "coll_op"):
        assert list(first.events[col].cat.categories) == list(hit.events[col].cat.categories)
    assert hit.rank_info == first.rank_info and hit.data_quality.to_dict() == first.data_quality.to_dict()
    uncached = read_run([f], cache=False)
    assert_frames_equal(first.events, uncached.events)

    # modify the trace: drop the kernels -> the cache must not answer with the old table
    with gzip.open(f, "rt") as fh:
        doc = json.load(fh)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kernel"]
    with gzip.open(f, "wt") as fh:
        fh.write(json.dumps(doc))  # one C-encoded string: json.dump encodes in Python
    changed = read_run([f])
    assert int((changed.events["kind"] == "kernel").sum()) == 0
    assert len(changed.events) == len(first.events) - int((first.events["kind"] == "kernel").sum())

    # touching alone (same content, new mtime) also re-reads: the entry is rewritten
    before = entry.stat().st_mtime_ns
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    read_run([f])
    assert entry.stat().st_mtime_ns != before


def test_cache_corrupt_entry_ignored(tmp_path: Path) -> None:
    d = _sampled(tmp_path)
    f = d / "rank-1.json.gz"
    good = read_run([f])
    entry = cache_mod.cache_path_for(f)
    assert entry is not None
    entry.write_bytes(b"PAR1 this is not parquet")
    again = read_run([f])
    assert_frames_equal(good.events, again.events)
    assert entry.read_bytes()[:4] == b"PAR1" and entry.stat().st_size > 1000  # rewritten


def test_cache_disabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _sampled(tmp_path)
    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    read_run([d / "rank-0.json.gz"])
    assert not (d / ".tracekit-cache").exists()
    monkeypatch.delenv("TRACEKIT_NO_CACHE")
    read_run([d / "rank-0.json.gz"], cache=False)
    assert not (d / ".tracekit-cache").exists()
    assert not (tmp_path / "xdg" / "tracekit").exists() or not list(
        (tmp_path / "xdg" / "tracekit").glob("*.parquet")
    )


def test_cache_never_in_read_only_folder(shared_traces: Path, tmp_path: Path) -> None:
    """../shared is mounted read-only here: the one folder a test cannot make read-only itself."""
    f = shared_traces / "h200" / "kineto_decode_ws1.pt.trace.json.gz"
    if not f.exists():
        pytest.skip("h200 trace missing")
    if f.parent.stat().st_mode & 0o222:
        pytest.skip("../shared is not marked read-only here; the fallback cannot be shown")
    read_run([f])
    entry = cache_mod.cache_path_for(f)
    assert entry is not None and entry.exists()
    assert entry.parent == tmp_path / "xdg" / "tracekit"
    assert not (f.parent / ".tracekit-cache").exists()


def test_cache_fallback_for_read_only_folder(tmp_path: Path) -> None:
    """A folder marked read-only (even to root, who may write anywhere) gets no cache folder."""
    d = _sampled(tmp_path)
    f = d / "rank-0.json.gz"
    d.chmod(0o555)
    try:
        read_run([f])
        entry = cache_mod.cache_path_for(f)
        assert entry is not None and entry.exists() and entry.parent == tmp_path / "xdg" / "tracekit"
        assert not (d / ".tracekit-cache").exists()
    finally:
        d.chmod(0o755)


def test_cache_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _sampled(tmp_path)
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cc"))
    read_run([d / "rank-0.json.gz"])
    assert len(list((tmp_path / "cc").glob("*.parquet"))) == 1
    assert not (d / ".tracekit-cache").exists()


# ------------------------------------------------------------------------------------------
# malformed manifest.json (review finding 2): one TraceFormatError naming the file

_TINY_TRACE = {
    "traceEvents": [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "decode_step#0",
            "pid": 1,
            "tid": 1,
            "ts": 100,
            "dur": 50,
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 7,
            "ts": 110,
            "dur": 10,
            "args": {"device": 0, "stream": 7},
        },
    ]
}


def _run_with_manifest(tmp_path: Path, manifest: bytes) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "rank-0.pt.trace.json").write_text(json.dumps(_TINY_TRACE))
    (d / "manifest.json").write_bytes(manifest)
    return d


@pytest.mark.parametrize(
    ("text", "what"),
    [(b"[1, 2]", "array"), (b'"x"', "string"), (b"null", "null"), (b"3", "number")],
)
def test_manifest_not_an_object_is_a_format_error(tmp_path: Path, text: bytes, what: str) -> None:
    d = _run_with_manifest(tmp_path, text)
    for paths in ([d], [d / "rank-0.pt.trace.json"]):  # a folder, or one file beside its manifest
        with pytest.raises(TraceFormatError, match=f"top level is a JSON {what}, not an object") as ei:
            read_run(paths, cache=False, jobs=1)
        assert ei.value.path == str(d / "manifest.json")


def test_manifest_invalid_json_names_the_byte_offset(tmp_path: Path) -> None:
    # 'é' is two bytes in UTF-8: the stray second comma is at character 14 but byte 15
    text = '{"note": "é", , "x": 1}'
    assert text.index(", ,") + 2 == 14 and len(text[:14].encode("utf-8")) == 15
    d = _run_with_manifest(tmp_path, text.encode("utf-8"))
    with pytest.raises(TraceFormatError, match="not valid JSON") as ei:
        read_run([d], cache=False, jobs=1)
    assert ei.value.offset == 15 and ei.value.path == str(d / "manifest.json")
    assert str(ei.value).startswith(f"{d / 'manifest.json'} at byte 15:")


def test_manifest_not_utf8_names_the_byte_offset(tmp_path: Path) -> None:
    d = _run_with_manifest(tmp_path, b'{"a": "\xff"}')
    with pytest.raises(TraceFormatError, match="not UTF-8") as ei:
        read_run([d], cache=False, jobs=1)
    assert ei.value.offset == 7


def test_malformed_manifest_is_one_cli_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracekit.cli.main import main

    d = _run_with_manifest(tmp_path, b"[1, 2]")
    for argv in (["breakdown", str(d)], ["dilation", str(d)]):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("tracekit: error:") and err.count("\n") == 1, err
        assert "manifest.json" in err


def test_a_cached_run_names_its_files_as_this_call_spells_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a run read first by its absolute path, then (from the cache) by a relative one: the second
    # names the relative path, as a fresh read does (breakdown's source.paths followed whichever
    # spelling filled the cache first, so the same command's JSON depended on the tests' order)
    d = _sampled(tmp_path)
    first = read_run([d.resolve()], jobs=1)
    assert all(Path(s).is_absolute() for s in first.sources.values())
    assert list(cache_mod.cache_root().rglob("*.parquet")), "the first read filled the cache"
    monkeypatch.chdir(tmp_path)
    again = read_run([Path("run")], jobs=1)
    fresh = read_run([Path("run")], cache=False, jobs=1)
    assert again.sources == fresh.sources
    assert all(not Path(s).is_absolute() and s.startswith("run") for s in again.sources.values())
    assert_frames_equal(again.events, first.events)


# ------------------------------------------------------------------------------------------
# the manifest read once into its typed document (issue 27): unknown keys kept, a value of the
# wrong type left out on its own (the rest of the manifest read), noted in data_quality

REPO = Path(__file__).resolve().parents[1]


def test_manifest_unknown_and_wrong_typed_fields_read_as_the_rules_say(tmp_path: Path) -> None:
    from tracekit.analyse.dilation import dilation_of
    from tracekit.read.manifests import workload_tp

    d = tmp_path / "cpu-tp2"
    shutil.copytree(REPO / "traces" / "cpu-tp2", d)
    original = json.loads((d / "manifest.json").read_text())
    edited = json.loads(json.dumps(original))
    edited["other_tool"] = {"run_id": "abc", "tags": [1, "x"]}  # another tool's key
    edited["host"] = "box-1"  # an object in a capture's manifest
    edited["rank_pids"] = {"0": "x", "1": 911}  # a value of an object keyed by rank
    edited["workload"]["decoder_impl"] = 7  # a string
    (d / "manifest.json").write_text(json.dumps(edited))

    run = read_run([d], cache=False, jobs=1)
    m = run.manifest
    assert m is not None
    assert m.unknown_fields == {"other_tool": {"run_id": "abc", "tags": [1, "x"]}}
    # each wrong-typed value is left out where it is, nothing else: what is left is the file's
    back = m.to_json()
    want = {k: v for k, v in edited.items() if k not in ("host", "rank_pids")}
    want["workload"] = {k: v for k, v in edited["workload"].items() if k != "decoder_impl"}
    assert json.dumps(back, sort_keys=True) == json.dumps(want, sort_keys=True)
    notes = [n for n in run.data_quality.notes if "does not fit" in n]
    assert run.data_quality.counts["manifest_field_malformed"] == 3 == len(notes)
    for name in ("'host'", "'rank_pids'", "'workload.decoder_impl'"):
        assert any(f"manifest.json field {name}" in n and "treated as missing" in n for n in notes), name
    # the consumers read the rest as from the pristine manifest
    pristine = read_run([REPO / "traces" / "cpu-tp2"], cache=False, jobs=1).manifest
    assert pristine is not None and pristine.unknown_fields is UNSET
    assert workload_tp(m) == workload_tp(pristine) == original["workload"]["tp"]
    assert dilation_of(m).dilation == dilation_of(pristine).dilation is not None
    assert m.files == pristine.files and m.unprofiled == pristine.unprofiled
