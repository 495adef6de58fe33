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
from typing import Any

from tracekit.read import find_trace_files

__all__ = ["make_synthetic_run"]


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        doc: dict[str, Any] = json.load(fh)
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
) -> Path:
    """Write an `n_ranks` run made from the Kineto rank files of the run folder `source` into the
    folder `out` (created); returns `out`. See the module doc. `max_steps`: keep only each source rank's events before its
    (max_steps + 1)-th `decode_step` annotation (a smaller run for CI)."""
    files, manifest = find_trace_files([source])
    files = [f for f in files if f.name.endswith((".json", ".json.gz"))]
    if not files:
        raise ValueError(f"{source}: no Kineto rank files to build a synthetic run from")
    docs = [_load(f) for f in files]
    docs.sort(key=lambda d: int((d.get("distributedInfo") or {}).get("rank", 0)))
    if max_steps is not None:
        docs = [_first_steps(d, max_steps) for d in docs]
    rng = random.Random(seed)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    order = list(range(n_ranks))
    rng.shuffle(order)  # files are written (and so timestamped) in no particular rank order
    table: dict[str, Any] = {}
    for i in order:
        src = docs[i % len(docs)]
        shift_us = rng.uniform(0.0, jitter_us)
        events = [
            {**ev, "ts": ev["ts"] + shift_us}
            if isinstance(ev.get("ts"), (int, float)) and ev.get("ph") != "M"
            else ev
            for ev in src["traceEvents"]
        ]
        rng.shuffle(events)
        info = dict(src.get("distributedInfo") or {})
        info.update(rank=i, world_size=n_ranks)
        info["pg_config"] = [
            {**(info.get("pg_config") or [{}])[0], "pg_size": n_ranks, "ranks": list(range(n_ranks))}
        ]
        doc = {**src, "distributedInfo": info, "traceEvents": events}
        name = f"rank-{i}.pt.trace.json.gz"
        data = json.dumps(doc).encode()
        with gzip.open(out_dir / name, "wb", compresslevel=compresslevel) as fh:
            fh.write(data)
        table[name] = {"rank": i, "bytes": (out_dir / name).stat().st_size}
    if manifest is not None:
        m = json.loads(json.dumps(manifest))
        if isinstance(m.get("workload"), dict):
            m["workload"]["tp"] = n_ranks
        m["files"] = dict(sorted(table.items(), key=lambda kv: kv[1]["rank"]))
        m.pop("rank_pids", None)
        m["synthetic"] = {"source": str(source), "n_ranks": n_ranks, "seed": seed, "jitter_us": jitter_us}
        (out_dir / "manifest.json").write_text(json.dumps(m, indent=1))
    return out_dir


def _first_steps(doc: dict[str, Any], max_steps: int) -> dict[str, Any]:
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
