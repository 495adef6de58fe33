"""Parquet cache of parsed traces: a second read of the same file is near-instant and identical.

Where: the user's cache folder, never beside the input (a shared or read-only trace folder stays
untouched): `--cache-dir DIR` (the CLI sets `$TRACEKIT_CACHE_DIR`), else `$TRACEKIT_CACHE_DIR`, else
`$XDG_CACHE_HOME/tracekit`, else `~/.cache/tracekit`. When that folder cannot be written, nothing
is cached (never an error).

Key: file identity = absolute path + size + mtime_ns, plus the reader version, the event-model
columns and the rank argument. One cache file per (trace path, rank argument), named by a hash of
both; the rest of the key is stored inside and checked on load, so a changed trace is re-read and
its entry rewritten.

Stored: the event table (categoricals stay categoricals) + rank_info + sources + data_quality in the
Parquet schema metadata. Written atomically (temp file + os.replace). A corrupt or unreadable entry
is ignored (and rewritten by the next store), never an error. Disabled with `TRACEKIT_NO_CACHE=1`
(`--no-cache`, or `cache=False` in `read_run`).

Never trusted (issue 16): beside each entry `<entry>.sha256` records the SHA-256 of the Parquet
bytes and the key. A load reads the entry's bytes once, checks their digest and the key against
that record *before* Parquet parses anything, and parses those same bytes (no second read a swap
could slip into); a mismatch (an entry edited, replaced or truncated by anything but `store`) is a
miss: the trace is read again from its source and the entry rewritten. The table must then have
exactly the event model's columns. Nothing in an entry is evaluated or unpickled (pyarrow >= 14
refuses pickled extension types; the columns are checked before pandas sees them). The digest
stops damage and tampering by anything that does not also rewrite the record; someone who can
write the cache folder and knows this scheme can rewrite both, which is why the cache lives in the
user's own folder (mode 0700 when tracekit creates it), never beside shared traces.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import msgspec

from tracekit.model.events import COLUMNS, DataQuality, Run, check_events

_META_KEY = b"tracekit"
_FORMAT = "tracekit-cache-1"


def cache_enabled() -> bool:
    """False when TRACEKIT_NO_CACHE is set to a true value."""
    return os.environ.get("TRACEKIT_NO_CACHE", "").strip().lower() not in {"1", "true", "yes", "on"}


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracekit"


def cache_root() -> Path:
    """The cache folder in use: $TRACEKIT_CACHE_DIR (set by --cache-dir), else $XDG_CACHE_HOME/tracekit,
    else ~/.cache/tracekit (whether or not it exists yet)."""
    env = os.environ.get("TRACEKIT_CACHE_DIR")
    return Path(env) if env else _user_cache_dir()


def folder_writable(d: Path) -> bool:
    """True when `d` may be written: os.access says so AND its mode has a write bit.

    The mode check matters when running as root, where os.access is always true: a folder marked
    read-only (dr-xr-xr-x, like a shared trace folder) is left alone.
    """
    try:
        st = d.stat()
    except OSError:
        return False
    return bool(st.st_mode & 0o222) and os.access(d, os.W_OK | os.X_OK)


def _writable_dir(d: Path) -> bool:
    if not d.exists():
        parent = d.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not folder_writable(parent):
            return False
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return False
    return folder_writable(d)


def cache_dir_for(trace: Path) -> Path | None:
    """The folder the cache entry of `trace` lives in (`cache_root()`, never beside the trace), or
    None when it cannot be written."""
    d = cache_root()
    return d if _writable_dir(d) else None


class CacheKey(msgspec.Struct, frozen=True):
    """What a cache entry was written from: an entry is used only for the same key (the file by
    path, size and mtime, the reader's version, the table's columns, the --rank asked for)."""

    format: str
    path: str
    size: int
    mtime_ns: int
    reader: str
    columns: str
    rank_arg: int | None


class _DigestRecord(msgspec.Struct):
    """`<entry>.sha256`: the entry's SHA-256 and the key it was written for."""

    sha256: str
    key: CacheKey


def _key(trace: Path, reader_version: str, rank: int | None) -> CacheKey:
    st = trace.stat()
    return CacheKey(
        format=_FORMAT,
        path=str(trace.resolve()),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        reader=reader_version,
        columns=hashlib.sha1(json.dumps(COLUMNS).encode()).hexdigest()[:12],
        rank_arg=rank,
    )


def cache_path_for(trace: Path, rank: int | None = None) -> Path | None:
    """The cache file of `trace` (whether or not it exists yet)."""
    d = cache_dir_for(trace)
    if d is None:
        return None
    return d / entry_name(trace, rank)


def entry_name(trace: Path, rank: int | None = None) -> str:
    """The file name of `trace`'s cache entry in the cache folder (`cache_root()`)."""
    h = hashlib.sha1(f"{trace.resolve()}\0{rank}".encode()).hexdigest()[:16]
    stem = trace.name.split(".")[0][:60] or "trace"
    return f"{stem}-{h}.parquet"


def digest_path(entry: Path) -> Path:
    """The record of an entry's SHA-256 and key: `<entry>.sha256` beside it."""
    return entry.with_name(entry.name + ".sha256")


def _verified_bytes(cp: Path, key: CacheKey) -> bytes | None:
    """The entry's bytes when its digest record names this key and their SHA-256, else None."""
    try:
        record = msgspec.json.decode(digest_path(cp).read_bytes(), type=_DigestRecord)
        data = cp.read_bytes()
    except (OSError, msgspec.DecodeError):  # a ValidationError is a DecodeError
        return None
    if record.key != key or record.sha256 != hashlib.sha256(data).hexdigest():
        return None
    return data


def load(trace: Path, reader_version: str, rank: int | None = None) -> Run | None:
    """The cached Run of `trace`, or None (absent, stale, corrupt, or its bytes not the ones
    `store` wrote: read the trace again)."""
    try:
        cp = cache_path_for(trace, rank)
        if cp is None or not cp.exists():
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        key = _key(trace, reader_version, rank)
        data = _verified_bytes(cp, key)
        if data is None:
            return None
        table = pq.read_table(pa.BufferReader(data))
        del data
        if table.column_names != list(COLUMNS):
            return None
        meta_raw = (table.schema.metadata or {}).get(_META_KEY)
        if meta_raw is None:
            return None
        meta = json.loads(meta_raw)
        if meta.get("key") != msgspec.to_builtins(key):
            return None
        # one block per column (no consolidation copy); Arrow buffers are released as they convert
        df = table.to_pandas(split_blocks=True, self_destruct=True)
        del table
        check_events(df)
        dq = DataQuality(
            counts=Counter(meta["data_quality"]["counts"]), notes=list(meta["data_quality"]["notes"])
        )
        return Run(
            events=df,
            # the trace as this call spells it (the key is the file, not its spelling: a run read first
            # by its absolute path and then by a relative one names the relative one, as a fresh read does)
            sources={int(k): str(trace) for k in meta["sources"]},
            rank_info={int(k): v for k, v in meta["rank_info"].items()},
            data_quality=dq,
        )
    except Exception:  # a broken cache entry is never an error: read the trace again
        return None


def store(trace: Path, reader_version: str, run: Run, rank: int | None = None) -> Path | None:
    """Write `run` as the cache entry of `trace`, atomically. Returns the path, or None if it could not."""
    tmp_name = None
    try:
        cp = cache_path_for(trace, rank)
        if cp is None:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = {
            "key": msgspec.to_builtins(_key(trace, reader_version, rank)),
            "sources": {str(k): v for k, v in run.sources.items()},
            "rank_info": {str(k): v for k, v in run.rank_info.items()},
            "data_quality": run.data_quality.to_dict(),
        }
        table = pa.Table.from_pandas(run.events, preserve_index=False)
        md = dict(table.schema.metadata or {})
        md[_META_KEY] = json.dumps(meta, default=str).encode()
        table = table.replace_schema_metadata(md)
        fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=cp.parent)
        os.close(fd)
        pq.write_table(table, tmp_name, compression="zstd")
        h = hashlib.sha256()
        with open(tmp_name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        fd, tmp_digest = tempfile.mkstemp(prefix=".tmp-", suffix=".sha256", dir=cp.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"sha256": h.hexdigest(), "key": meta["key"]}, f)
        # the entry first, then its record: until the record lands, a load sees a mismatch (a miss)
        os.replace(tmp_name, cp)
        tmp_name = tmp_digest
        os.replace(tmp_digest, digest_path(cp))
        tmp_name = None
        return cp
    except Exception:
        return None
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass
