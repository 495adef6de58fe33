"""Benchmark: the dependency graph's build, the critical path and the replay under every Shapley
coalition, on a long generated run (issue 23: 1,000 tokens x 8 ranks, under 20 s on one core),
against main's replay (`git show main:tracekit/analyse/replay.py`, run from a `git archive` of
main in a temporary folder, in a subprocess).

The run is written by the ground-truth simulator (`tests/groundtruth`: faithful Kineto traces and
a capture manifest): TP=8 and its TP=1 baseline, `--tokens` tokens, `--layers` layers, CUDA mode.
Reading and attributing the traces is not timed (both implementations share it); timed: building
the replay model (the graph here), the critical path, and the 2^5 coalitions of the default knobs
on both runs (with the profiler correction's solve).

    python benchmarks/bench_graph.py [--tokens 1000] [--ranks 8] [--layers 4] [--peer main]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMED = r"""
import itertools, json, sys, time
from fractions import Fraction
from tracekit.read import read_run
from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.shortfall import attribute_run, shortfall_from_parts
from tracekit.analyse import replay as R
from tracekit.analyse import critical_path as CP

base_dir, shard_dir = sys.argv[1], sys.argv[2]
runs = {}
for label, d in (("baseline", base_dir), ("sharded", shard_dir)):
    ar = AnalysedRun.of(read_run([d]))
    runs[label] = (ar, attribute_run(ar, label=label))
sf = shortfall_from_parts(runs["baseline"][1], runs["sharded"][1])
out = {}
t0 = time.perf_counter()
models = {}
for label, (ar, parts) in runs.items():
    tgt = Fraction(sf.corrected.baseline_ns if label == "baseline" else sf.corrected.sharded_ns)
    models[label] = R.build_model(parts, ar, tgt, label)
out["build_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
ar, parts = runs["sharded"]
if hasattr(CP, "path_of_graph"):
    CP.path_of_graph(models["sharded"].graph)
else:
    w = parts.steps[["rank", "step", "start_ns", "end_ns"]]
    CP.critical_path(ar.events, w, parts.collectives.per_rank, parts.collectives.clock.offsets_ns)
out["path_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
for m in models.values():
    R.calibrate(m)
out["calibrate_s"] = time.perf_counter() - t0
knobs = [R.parse_knob(k) for k in R.DEFAULT_KNOBS]
c1 = sum(models["baseline"].compute_per_token.values()) / max(len(models["baseline"].compute_per_token), 1)
t0 = time.perf_counter()
n = 0
for size in range(len(knobs) + 1):
    for sub in itertools.combinations(knobs, size):
        for m in models.values():
            R._mean_int(m.replay(R.setting_for(m, sub, c1, m.n_ranks))) if hasattr(R, "_mean_int") else m.replay(
                R.setting_for(m, sub, c1, m.n_ranks)
            )
            n += 1
out["replays"] = n
out["replay_s"] = time.perf_counter() - t0
out["total_s"] = out["build_s"] + out["path_s"] + out["calibrate_s"] + out["replay_s"]
out["steps"] = len(models["sharded"].steps)
print(json.dumps(out))
"""


def write_runs(out: Path, tokens: int, ranks: int, layers: int) -> tuple[Path, Path]:
    sys.path.insert(0, str(ROOT))
    from tests.groundtruth.cases import decoder
    from tests.groundtruth.kineto import write_run

    base, shard = out / "tp1", out / f"tp{ranks}"
    if not (shard / "manifest.json").exists():
        block = (60_000, 30_000, 45_000)
        write_run(
            decoder(1, name="bench-tp1", layers=layers, tokens=tokens, block=block, mode="cuda"),
            base,
            rounds=1,
        )
        write_run(
            decoder(ranks, name="bench-tpn", layers=layers, tokens=tokens, block=block, mode="cuda"),
            shard,
            rounds=1,
        )
    return base, shard


def timed(src: Path, base: Path, shard: Path) -> dict[str, float]:
    env = dict(
        os.environ,
        PYTHONPATH=str(src),
        TRACEKIT_CACHE_DIR=str(Path(tempfile.gettempdir()) / f"bench-graph-{src.name}"),
    )
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(
        [sys.executable, "-c", TIMED, str(base), str(shard)], cwd=src, env=env, capture_output=True, text=True
    )
    if res.returncode != 0:
        raise SystemExit(f"{src}: {res.stderr[-2000:]}")
    doc: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--peer", default="main", help="git ref of the implementation to compare with")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-graph")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    base, shard = write_runs(
        args.work / f"run-{args.tokens}x{args.ranks}x{args.layers}", args.tokens, args.ranks, args.layers
    )
    peer = args.work / f"peer-{args.peer.replace('/', '_')}"
    if not peer.exists():
        peer.mkdir()
        arch = subprocess.run(["git", "archive", args.peer], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(peer)], input=arch, check=True)
    ours = timed(ROOT, base, shard)
    theirs = timed(peer, base, shard)
    print(f"run: {args.tokens} tokens x {args.ranks} ranks, {args.layers} layers (+ its TP=1 baseline)")
    for key in ("build_s", "path_s", "calibrate_s", "replay_s", "total_s"):
        r = theirs[key] / ours[key] if ours[key] else float("nan")
        print(
            f"{key:12s} graph {ours[key]:8.2f} s   {args.peer} {theirs[key]:8.2f} s   ratio {args.peer}/graph {r:6.2f}"
        )
    print(f"replays: {int(ours['replays'])} (2^5 coalitions x 2 runs); target: total under 20 s on one core")


if __name__ == "__main__":
    main()
