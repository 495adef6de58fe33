"""Gzipped Nsight Systems exports (`.sqlite.gz`): read as the same table as the plain export,
decompressed once into the cache folder (keyed by path + size + mtime), through `read_run`'s
registry too; corrupt files are format errors naming the file."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from frame_checks import assert_frames_equal

from tracekit.errors import TraceFormatError
from tracekit.read import read_run
from tracekit.read.nsys import read_nsys

H200 = "h200/nsys_matmul_nvtx.sqlite"


@pytest.fixture
def pair(real_nsys_sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A plain copy of a real export (the project's own, traces/h200-tp1-nsys) and a gzipped copy,
    in folders of their own; the cache folder pinned to tmp_path/cache."""
    src = real_nsys_sqlite
    (tmp_path / "plain").mkdir()
    (tmp_path / "gz").mkdir()
    plain = tmp_path / "plain" / "trace.sqlite"
    shutil.copyfile(src, plain)
    gz = tmp_path / "gz" / "trace.sqlite.gz"
    with open(src, "rb") as fi, gzip.open(gz, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACEKIT_NO_CACHE", raising=False)
    return plain, gz


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert_frames_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_gz_reads_as_the_plain_export_and_decompresses_once(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, gz = pair
    want = read_nsys(plain)
    got = read_nsys(gz)
    assert len(want.events) > 0
    _same(got.events, want.events)
    assert got.rank_info.keys() == want.rank_info.keys() and got.ranks == want.ranks
    copies = sorted((tmp_path / "cache").glob("trace-*.sqlite"))
    assert len(copies) == 1 and copies[0].read_bytes() == plain.read_bytes()
    # a second read finds the copy: no gzip stream is opened
    monkeypatch.setattr(gzip, "GzipFile", _no_gzip)
    _same(read_nsys(gz).events, want.events)
    monkeypatch.undo()
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    # a changed file (new mtime) is decompressed again and the old copy goes
    st = gz.stat()
    os.utime(gz, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _same(read_nsys(gz).events, want.events)
    again = sorted((tmp_path / "cache").glob("trace-*.sqlite"))
    assert len(again) == 1 and again != copies


def _no_gzip(*_a: object, **_k: object) -> None:
    raise AssertionError("decompressed again")


def test_read_run_finds_gz_in_a_folder(pair: tuple[Path, Path]) -> None:
    plain, gz = pair
    want = read_run(plain.parent, cache=False, jobs=1)
    got = read_run(gz.parent, cache=False, jobs=1)
    _same(got.events, want.events)
    _same(read_run(gz, jobs=1).events, want.events)  # the file itself, through the Parquet cache
    _same(read_run(gz, jobs=1).events, want.events)  # and its cache hit


def test_no_cache_decompresses_into_a_temporary_folder(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, gz = pair
    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    _same(read_nsys(gz).events, read_nsys(plain).events)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_corrupt_gz_is_a_format_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACEKIT_NO_CACHE", raising=False)
    not_gz = tmp_path / "a.sqlite.gz"
    not_gz.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    with pytest.raises(TraceFormatError, match=r"a\.sqlite\.gz at byte 0: not a gzip file"):
        read_nsys(not_gz)
    whole = gzip.compress(b"SQLite format 3\x00" + os.urandom(200_000))
    cut = tmp_path / "b.sqlite.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        TraceFormatError, match=r"b\.sqlite\.gz at byte \d+: gzip data is corrupt or truncated"
    ):
        read_nsys(cut)
    assert not list((tmp_path / "cache").glob("*.sqlite"))  # nothing half-written left behind
    not_sqlite = tmp_path / "c.sqlite.gz"
    not_sqlite.write_bytes(gzip.compress(b"hello"))
    with pytest.raises(TraceFormatError, match=r"c\.sqlite\.gz at byte 0: not a SQLite database"):
        read_nsys(not_sqlite)
