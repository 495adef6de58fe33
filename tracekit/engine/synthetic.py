"""A synthetic many-rank run made from real traces, for scale tests and benchmarks (issue 19).

`make_synthetic_run(source, out, n_ranks)` writes `n_ranks` Kineto rank files and a manifest into
`out`. Rank `i` is the source run's rank `i % k` (k = the source's rank count), so every rank holds
a real captured decode loop; then, per rank:

- its clock is jittered: every timestamp moves by one offset drawn per rank (`jitter_us`, uniform),
  as on hosts whose clocks disagree;
- its events are shuffled (arrival order in the file is not time order);
- its `distributedInfo` names rank `i` of a world of `n_ranks`, in one process group of all ranks.

Collectives stay consistent: every rank issues the same collectives in the same order (the source's
ranks do), so matching by order within the group pairs them across all `n_ranks` ranks. The
manifest is the source's with `workload.tp = n_ranks` and its per-file table rewritten.
Used by tests/test_engine_dask.py (64 ranks) and benchmarks/bench_scale.py (64 and 256 ranks).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import msgspec
from msgspec import UNSET

from tracekit.model.documents.chrome import DistributedInfo, KinetoEvent, KinetoTrace
from tracekit.read import find_trace_files

__all__ = ["make_synthetic_run"]


def _load(path: Path) -> KinetoTrace:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        doc: KinetoTrace = json.load(fh)
    return doc


def make_synthetic_run(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    n_ranks: int,
    *,
    seed: int = 0,
    jitter_us: float = 200.0,
    compresslevel: int = 1,
    max_steps: int | None = None,
    jobs: int = 1,
) -> Path:
    """Write an `n_ranks` run made from the Kineto rank files of the run folder `source` into the
    folder `out` (created); returns `out`. See the module doc. `max_steps`: keep only each source
    rank's events before its (max_steps + 1)-th `decode_step` annotation (a smaller run for CI).
    `compresslevel` 0 writes plain `.json`; `jobs` processes write the files."""
    files, manifest = find_trace_files([source])
    files = [f for f in files if f.name.endswith((".json", ".json.gz"))]
    if not files:
        raise ValueError(f"{source}: no Kineto rank files to build a synthetic run from")
    rng = random.Random(seed)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ".pt.trace.json.gz" if compresslevel else ".pt.trace.json"
    tasks = [
        (tuple(str(f) for f in files), max_steps, i, n_ranks, rng.uniform(0.0, jitter_us), rng.randrange(2**32),
         str(out_dir / f"rank-{i}{suffix}"), compresslevel)
        for i in range(n_ranks)
    ]  # fmt: skip
    rng.shuffle(tasks)  # files are written (and so timestamped) in no particular rank order
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(_write_rank, tasks))
    else:
        for t in tasks:
            _write_rank(t)
    table = {
        Path(t[6]).name: {"rank": t[2], "bytes": Path(t[6]).stat().st_size}
        for t in sorted(tasks, key=lambda t: t[2])
    }
    if manifest is not None:
        src = manifest.manifest
        if src.workload is not UNSET:
            src = msgspec.structs.replace(src, workload=msgspec.structs.replace(src.workload, tp=n_ranks))
        m = src.to_json()  # the source's, as read (its unknown keys kept)
        m["files"] = table
        m.pop("rank_pids", None)
        m["synthetic"] = {"source": str(source), "n_ranks": n_ranks, "seed": seed, "jitter_us": jitter_us}
        (out_dir / "manifest.json").write_text(json.dumps(m, indent=1))
    return out_dir


_SOURCES: dict[tuple[tuple[str, ...], int | None], list[KinetoTrace]] = {}


def _sources(files: tuple[str, ...], max_steps: int | None) -> list[KinetoTrace]:
    """The source rank documents, in rank order (loaded once per process)."""
    key = (files, max_steps)
    if key not in _SOURCES:
        docs = [_load(Path(f)) for f in files]
        docs.sort(key=lambda d: int((d.get("distributedInfo") or {}).get("rank", 0)))
        if max_steps is not None:
            docs = [_first_steps(d, max_steps) for d in docs]
        _SOURCES[key] = docs
    return _SOURCES[key]


def _write_rank(task: tuple[tuple[str, ...], int | None, int, int, float, int, str, int]) -> None:
    """Write rank `i`: source rank i % k, clock shifted by `shift_us`, events shuffled."""
    files, max_steps, i, n_ranks, shift_us, shuffle_seed, path, compresslevel = task
    docs = _sources(files, max_steps)
    src = docs[i % len(docs)]
    events: list[KinetoEvent] = [
        {**ev, "ts": ev["ts"] + shift_us}
        if isinstance(ev.get("ts"), (int, float)) and ev.get("ph") != "M"
        else ev
        for ev in src["traceEvents"]
    ]
    random.Random(shuffle_seed).shuffle(events)
    info: DistributedInfo = {**(src.get("distributedInfo") or {})}
    info["rank"], info["world_size"] = i, n_ranks
    info["pg_config"] = [
        {**(info.get("pg_config") or [{}])[0], "pg_size": n_ranks, "ranks": list(range(n_ranks))}
    ]
    data = json.dumps({**src, "distributedInfo": info, "traceEvents": events}).encode()
    if compresslevel:
        with gzip.open(path, "wb", compresslevel=compresslevel) as fh:
            fh.write(data)
    else:
        Path(path).write_bytes(data)


def _first_steps(doc: KinetoTrace, max_steps: int) -> KinetoTrace:
    """`doc` with only the events before its (max_steps + 1)-th `decode_step` annotation."""
    starts = sorted(
        float(e["ts"])
        for e in doc["traceEvents"]
        if str(e.get("name", "")).startswith("decode_step") and e.get("ph") == "X"
    )
    if len(starts) <= max_steps:
        return doc
    cut = starts[max_steps]
    kept = [e for e in doc["traceEvents"] if e.get("ph") == "M" or float(e.get("ts", 0)) < cut]
    return {**doc, "traceEvents": kept}
