"""Benchmark: the dependency graph's build, the critical path and the replay under every Shapley
coalition, on a long generated run (issue 23: 1,000 tokens x 8 ranks, under 20 s on one core),
against the 20 s budget and, with `--peer REF`, against another implementation (e.g. `main`'s
replay before the vectorised forward pass; `git archive REF` in a temporary folder, run in a
subprocess on the same traces).

The run is written by the ground-truth simulator (`tests/groundtruth`: faithful Kineto traces and
a capture manifest): TP=`--ranks` and its TP=1 baseline, `--tokens` tokens, `--layers` layers,
CUDA mode. Reading and attributing the traces is not timed (both implementations share it);
timed, for both runs: building the graph once (`whatif.build.build_model` with the graph attribute_run
kept dropped, so it is built again from the events), the critical path on it, the profiler
correction (`calibrate`) and the 2^5 coalitions of the default knobs (in one batched forward pass
where the implementation has `RunModel.replay_many`). Each child is pinned to one core
(`--cpu`, default 0). The replayed means of every coalition are compared between the two.

    python benchmarks/bench_graph.py                          # 1,000 tokens x 8 ranks, vs the budget
    python benchmarks/bench_graph.py --tokens 100 --peer main # smaller, with the old implementation
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
BUDGET_S = 20.0

TIMED = r"""
import itertools, json, sys, time
from fractions import Fraction
from tracekit.read import read_run
from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.pair import shortfall_from_parts
try:  # the rooms (issue 27)
    from tracekit.analyse.retime.calibrate import calibrate
    from tracekit.analyse.whatif.build import build_model
    from tracekit.analyse.whatif.knobs import DEFAULT_KNOBS, parse_knob, setting_for
    from tracekit.analyse.path.critical_path import path_of_graph
except ImportError:  # a --peer from before them: analyse/replay.py, critical_path.py
    from tracekit.analyse.replay import DEFAULT_KNOBS, build_model, calibrate, parse_knob, setting_for
    from tracekit.analyse.critical_path import path_of_graph

base_dir, shard_dir = sys.argv[1], sys.argv[2]
runs = {}
for label, d in (("baseline", base_dir), ("sharded", shard_dir)):
    ar = AnalysedRun.of(read_run([d]))
    parts = attribute_run(ar, label=label)
    if getattr(parts, "graph", None) is not None:
        parts.graph = None  # build it again below, timed
    runs[label] = (ar, parts)
sf = shortfall_from_parts(runs["baseline"][1], runs["sharded"][1])
out = {}
t0, c0 = time.perf_counter(), time.process_time()
models = {}
for label, (ar, parts) in runs.items():
    tgt = Fraction(sf.corrected.baseline_ns if label == "baseline" else sf.corrected.sharded_ns)
    models[label] = build_model(parts, ar, tgt, label)
out["build_s"] = time.perf_counter() - t0
out["build_cpu"] = time.process_time() - c0
out["nodes"] = int(models["sharded"].graph.n_nodes)
out["edges"] = int(len(models["sharded"].graph.src))
t0, c0 = time.perf_counter(), time.process_time()
path = path_of_graph(models["sharded"].graph)
out["path_s"] = time.perf_counter() - t0
out["path_cpu"] = time.process_time() - c0
out["path_sum"] = int(path.per_step[[c for c in path.per_step.columns if c.endswith("_ns")]].to_numpy().sum())
t0, c0 = time.perf_counter(), time.process_time()
for m in models.values():
    calibrate(m)
out["calibrate_s"] = time.perf_counter() - t0
out["calibrate_cpu"] = time.process_time() - c0
knobs = [parse_knob(k) for k in DEFAULT_KNOBS]
c1 = sum(models["baseline"].compute_per_token.values()) / max(len(models["baseline"].compute_per_token), 1)
t0, c0 = time.perf_counter(), time.process_time()
means = {}
for label, m in models.items():
    subs = [sub for size in range(len(knobs) + 1) for sub in itertools.combinations(knobs, size)]
    settings = [setting_for(m, sub, c1, m.n_ranks) for sub in subs]
    if hasattr(m, "replay_many"):
        pers = m.replay_many(settings)
    else:
        pers = [m.replay(s) for s in settings]
    for sub, per in zip(subs, pers):
        means[label + ":" + ",".join(k.spec for k in sub)] = str(Fraction(int(per.sum()), len(per)))
out["replays"] = len(means)
out["replay_s"] = time.perf_counter() - t0
out["replay_cpu"] = time.process_time() - c0
out["total_s"] = out["build_s"] + out["path_s"] + out["calibrate_s"] + out["replay_s"]
out["total_cpu"] = out["build_cpu"] + out["path_cpu"] + out["calibrate_cpu"] + out["replay_cpu"]
out["steps"] = len(models["sharded"].steps)
out["means"] = means
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


def timed(src: Path, base: Path, shard: Path, cpu: int | None) -> dict[str, object]:
    env = dict(
        os.environ,
        PYTHONPATH=str(src),
        TRACEKIT_CACHE_DIR=str(Path(tempfile.gettempdir()) / f"bench-graph-{src.name}"),
    )
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = "1"
    pin = (
        (lambda: os.sched_setaffinity(0, {cpu}))
        if cpu is not None and hasattr(os, "sched_setaffinity")
        else None
    )
    res = subprocess.run(
        [sys.executable, "-c", TIMED, str(base), str(shard)],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=pin,
    )
    if res.returncode != 0:
        raise SystemExit(f"{src}: {res.stderr[-2000:]}")
    doc: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return doc


def load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--peer", default=None, help="git ref of an implementation to compare with (e.g. main)")
    ap.add_argument(
        "--cpu", type=int, default=0, help="the core each timed child is pinned to (-1: not pinned)"
    )
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-graph")
    args = ap.parse_args()
    cpu = None if args.cpu < 0 else args.cpu
    args.work.mkdir(parents=True, exist_ok=True)
    base, shard = write_runs(
        args.work / f"run-{args.tokens}x{args.ranks}x{args.layers}", args.tokens, args.ranks, args.layers
    )
    print(f"run: {args.tokens} tokens x {args.ranks} ranks, {args.layers} layers (+ its TP=1 baseline)")
    print(f"load average (1/5/15 min) before: {load()}")
    ours = timed(ROOT, base, shard, cpu)
    print(f"load average after ours: {load()}")
    theirs = None
    if args.peer:
        sha = subprocess.run(
            ["git", "rev-parse", args.peer], cwd=ROOT, capture_output=True, text=True, check=True
        )
        peer = args.work / f"peer-{sha.stdout.strip()[:12]}"
        if not peer.exists():
            peer.mkdir()
            arch = subprocess.run(
                ["git", "archive", args.peer], cwd=ROOT, capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(peer)], input=arch, check=True)
        theirs = timed(peer, base, shard, cpu)
        print(f"load average after {args.peer}: {load()}")
    print(
        f"graph of the TP={args.ranks} run: {ours['nodes']} nodes, {ours['edges']} edges, {ours['steps']} steady steps"
    )
    print(
        "part         wall s   cpu s"
        + (f"   {args.peer}: wall s  cpu s  ratio {args.peer}/this (cpu)" if theirs else "")
    )
    for key in ("build", "path", "calibrate", "replay", "total"):
        w, c = float(ours[key + "_s"]), float(ours[key + "_cpu"])  # type: ignore[arg-type]
        line = f"{key:12s} {w:7.2f} {c:7.2f}"
        if theirs is not None:
            tw, tc = float(theirs[key + "_s"]), float(theirs[key + "_cpu"])  # type: ignore[arg-type]
            line += f"   {tw:14.2f} {tc:6.2f} {tc / c if c else float('nan'):8.2f}"
        print(line)
    total = float(ours["total_cpu"])  # type: ignore[arg-type]
    print(
        f"replays: {ours['replays']} (2^5 coalitions x 2 runs); budget {BUDGET_S:.0f} s on one core (cpu time: the "
        f"machine may be shared): {total:.2f} s = {total / BUDGET_S:.2f} of it ({'met' if total < BUDGET_S else 'NOT met'})"
    )
    if theirs is not None:
        same = ours["means"] == theirs["means"] and ours["path_sum"] == theirs["path_sum"]
        print(
            f"replayed means of every coalition and the path identical to {args.peer}'s: {'yes' if same else 'NO'}"
        )


if __name__ == "__main__":
    main()
