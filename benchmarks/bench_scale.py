"""Scale-out benchmark of the Dask engine on a synthetic many-rank run (issue 19).

    python benchmarks/bench_scale.py --ranks 64 --workers 1,2,4,8,16 --local
    python benchmarks/bench_scale.py --ranks 256 --workers 16 --local --what shortfall

Builds a synthetic run of `--ranks` ranks from `--source` (default traces/h200-tp2: every rank a
real captured H200 rank, its clock jittered by up to 200 us and its events shuffled; plain JSON, so
the read is the parse and not gunzip) under `--workdir` (kept for the next call), then measures
each case in a fresh child process:

- `local`: `read_run` (its process pool, one process per CPU) + the analysis; `local:1`
  (`--local-one`): the same with the rank files read in the one process (the work of `dask:1`);
- `dask:W`: a LocalCluster of W single-threaded worker processes, `tracekit.engine.dask_engine`
  (`DaskExecutor`: per rank file one read task holding its classified events in its worker's
  memory, then one task per file and rank stage of the plan; the critical path's Reduce in one
  task on a worker, which keeps the run's graph, and the profiler correction's Reduce on it there;
  the combines on the client, which never holds the graph).

With `--calibrated` the run's manifest carries a `profiler_calibration` (traces/h200-tp1-calibrated's
cost per call, measured on the same H200 host; the rank files are links to the uncalibrated run's):
the correction then removes that cost and solves nothing. Without it the cost is solved from the
unprofiled per-token time and checked for identifiability (`correction._identify`: the replay
redone with the cost on each rank alone, ~7 forward passes of the whole graph per rank, work that
grows as ranks x graph), which the plan runs as one `identify` task per rank (`plans.Fan`).

Reported per case: wall seconds of the analysis and its JSON (cluster start separately), the
read tasks' and the stage tasks' seconds, the sharded run's Reduces (the serial part on the
workers: the matching; the path's walk beside the graph's assembly and its forward pass's build,
on two workers: "path ∥ graph"; the correction's calibration and re-timing), the
identifiability check's tasks (sum / longest / count: one per rank, spread over the workers), the
client's own work (metadata, the plans' starts, combines and finishes, the command's tail) and its
share of the wall, with the part of it done while the workers ran tasks ("beside": the combines'
`plans.Later` work) and the share of the rest (the client on the critical path), the client's peak RSS, a worker's idle
and peak RSS (the whole worker process: interpreter, pandas and dask included), and whether the
JSON document equals the local engine's (sha256 of the bytes the CLI writes). The Parquet read
cache is off in every case (each one parses the JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_now_mb() -> float:
    """This process's resident memory now (Linux /proc), MB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _warm_rss_mb() -> float:
    """Import what the tasks import (pandas, pyarrow, tracekit's readers and analyses), then the
    resident memory: a worker's idle baseline, without the run's data."""
    import pyarrow.parquet  # noqa: F401

    import tracekit.analyse.attribution.pair  # noqa: F401
    import tracekit.analyse.timeline.breakdown  # noqa: F401
    import tracekit.read.kineto  # noqa: F401

    return _rss_now_mb()


def _digest(doc: dict) -> str:
    return hashlib.sha256((json.dumps(doc, indent=1) + "\n").encode()).hexdigest()[:16]


def _stream_summary(data: list[dict], t_start: float) -> dict:
    """The task stream (distributed's `get_task_stream`) as phases: per key group (the task key
    without its file / round suffix: `tracekit-run1-p0-s3-f7` -> `run1-s3`), the first start, the
    last stop and the summed compute seconds, relative to the analysis' start; and per worker its
    busy seconds. Where the groups' spans leave the workers idle is the serial part."""
    import re

    t0 = time.time() - (time.perf_counter() - t_start)  # wall clock of the analysis' start
    groups: dict[str, list[float]] = {}
    busy: dict[str, float] = {}
    for rec in data:
        key = str(rec.get("key", ""))
        name = re.sub(r"^tracekit-", "", key)
        name = re.sub(r"^(read|prep)-.*", r"\1", name)
        name = re.sub(r"-(f|x)\d+", "", re.sub(r"-[0-9a-f]{6,}$", "", name))
        for ss in rec.get("startstops", []):
            if ss.get("action") != "compute":
                continue
            a, b = ss["start"] - t0, ss["stop"] - t0
            g = groups.setdefault(name, [a, b, 0.0, 0])
            g[0], g[1], g[2], g[3] = min(g[0], a), max(g[1], b), g[2] + (b - a), g[3] + 1
            busy[rec.get("worker", "?")] = busy.get(rec.get("worker", "?"), 0.0) + (b - a)
    return {
        "groups": {
            k: [round(v, 3) for v in g[:3]] + [g[3]]
            for k, g in sorted(groups.items(), key=lambda kv: kv[1][0])
        },
        "busy_s": sorted(round(v, 2) for v in busy.values()),
    }


def _union_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the (start, stop) spans (tracekit's one interval union)."""
    import numpy as np

    from tracekit.analyse.intervals import union

    starts, stops = union(np.asarray([a for a, _ in spans], float), np.asarray([b for _, b in spans], float))
    return float((stops - starts).sum())


def phase_scaling(rows: list[dict], files: int) -> list[str]:
    """The per-rank phases' scaling, from the task streams (`--stream`) of dask:1 and each other dask
    case: per task group of one task per rank file (the reads, each rank stage of the sharded run;
    not the small hand-on tasks), its span (first start to last stop) at 1 worker, at W and their
    ratio; then the union of those spans against the rest of the wall (the Reduces, the combines,
    the gaps between phases: the serial chain). Issue 27's shape check asks 8 workers against 1;
    this says which part of the run scales and which does not. Markdown lines; none without the
    streams of dask:1 and another case."""
    streams = {r["case"]: r for r in rows if "stream" in r and "wall_s" in r}
    one = streams.get("dask:1")
    if one is None or len(streams) < 2:
        return []

    def phases(r: dict) -> dict[str, tuple[float, float, int]]:
        return {
            k: (g[0], g[1], g[3])
            for k, g in r["stream"]["groups"].items()
            if g[3] >= files - 1 and not k.endswith("-small") and "-kept-" not in k
        }

    p1 = phases(one)
    out = []
    for case, r in streams.items():
        if case == "dask:1":
            continue
        pw = phases(r)
        out += [
            "",
            f"{case} against dask:1, the per-rank phases (task stream; span = first start to last stop)",
            "| phase | tasks | span s at 1 worker | span s here | speed-up |",
            "|---|---|---|---|---|",
        ]
        for k in [k for k in p1 if k in pw]:
            a, b = p1[k][1] - p1[k][0], pw[k][1] - pw[k][0]
            out.append(
                f"| {k} | {pw[k][2]} | {a:.2f} | {b:.2f} | {a / b:.2f}x |"
                if b > 0
                else f"| {k} | {pw[k][2]} | {a:.2f} | {b:.2f} | |"
            )
        u1 = _union_s([(a, b) for a, b, _n in p1.values()])
        uw = _union_s([(a, b) for a, b, _n in pw.values()])
        r1, rw = one["wall_s"] - u1, r["wall_s"] - uw
        out.append(
            f"| all per-rank phases (union) | | {u1:.2f} | {uw:.2f} | {u1 / uw:.2f}x |"
            if uw > 0
            else "| all per-rank phases | | | | |"
        )
        out.append(
            f"| the rest of the wall (Reduces, combines, gaps) | | {r1:.2f} | {rw:.2f} | {r1 / rw:.2f}x |"
            if rw > 0
            else ""
        )
    return out


def child(case: str, run: str, what: str, baseline: str, stream: bool = False) -> dict:
    """One case, in this (fresh) process."""
    sys.path.insert(0, str(ROOT))
    import pandas  # noqa: F401 - imports outside the timed part, as a CLI run pays them once

    from tracekit.engine import Engine

    out: dict = {"case": case}
    if case in ("local", "local:1"):
        from tracekit.analyse.attribution.pair import shortfall
        from tracekit.analyse.timeline.breakdown import breakdown
        from tracekit.read import read_run

        jobs = 1 if case == "local:1" else None  # local:1: the rank files read in this process too
        t0 = time.perf_counter()
        r = read_run([run], cache=False, jobs=jobs)
        t1 = time.perf_counter()
        if what == "breakdown":
            doc = breakdown(r).to_json()
        else:
            doc = shortfall(read_run([baseline], cache=False, jobs=jobs), r).to_json()
        t2 = time.perf_counter()
        out.update(wall_s=t2 - t0, stage1_s=t1 - t0, stage2_s=t2 - t1, n_events=len(r.events))
    else:
        from distributed import Client, LocalCluster

        from tracekit.analyse.attribution.pair import shortfall_of_pair
        from tracekit.analyse.command_plans import breakdown_plan
        from tracekit.engine import pair_check, shortfall_plan
        from tracekit.engine.dask_engine import DaskExecutor
        from tracekit.engine.executor import Job

        workers = int(case.split(":")[1])
        t0 = time.perf_counter()
        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                worker_dashboard_address=":0",
                silence_logs=50,
                # no per-worker cap (the default is the host's memory / W): the worker of the run's
                # Reduces holds the assembled graph, its forward pass and its pieces (~7 GB at 256
                # ranks), which would pause it at 80% of a 16th of 125 GiB
                memory_limit=0,
            ) as lc,
            Client(lc) as client,
        ):
            before = client.run(_warm_rss_mb)
            out["client_rss_idle_mb"] = _warm_rss_mb()
            t1 = time.perf_counter()
            engine = Engine(kind="dask", scheduler=lc.scheduler_address)
            if what == "breakdown":
                jobs = [Job((run,), (breakdown_plan(),), cache=False)]
                check = None
            else:
                jobs = [  # the plans shortfall_paths runs
                    Job((baseline,), (shortfall_plan(None, "baseline"),), cache=False),
                    Job((run,), (shortfall_plan(None, "sharded"),), cache=False),
                ]
                check = pair_check
            if stream:
                from distributed import get_task_stream

                with get_task_stream(client) as ts:
                    results, notes = DaskExecutor(engine, client).run(jobs, check)
                out["stream"] = _stream_summary(ts.data, t1)
            else:
                results, notes = DaskExecutor(engine, client).run(jobs, check)
            t_doc = time.perf_counter()
            doc = (
                results[0].results[0].breakdown.to_json()
                if what == "breakdown"
                else shortfall_of_pair(results[0].results[0], results[1].results[0], notes).to_json()
            )
            t2 = time.perf_counter()
            out["client_doc_s"] = t2 - t_doc  # the command's tail on the client: shortfall_of_pair, to_json
            worker_peak = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        res = results[-1]
        tasks = [t for r in results for t in r.tasks]
        reads = [t for t in tasks if t.stage == "read"]
        stages: dict[str, list[float]] = {}
        for t in tasks:
            if t.stage != "read":
                stages.setdefault(t.stage, []).append(t.seconds)
        out.update(
            cluster_start_s=t1 - t0,
            wall_s=t2 - t1,
            # the client's own serial work: metadata, plan starts, combines, finishes, the tail
            client_s=sum(r.client_s for r in results) + out["client_doc_s"],
            # of it, the combines' deferred work done while the workers ran tasks (plans.Later)
            client_beside_s=sum(r.client_beside_s for r in results),
            stage1_task_s_sum=sum(t.seconds for t in reads),
            stage1_task_s_max=max(t.seconds for t in reads),
            stages={k: [round(sum(v), 3), round(max(v), 3), len(v)] for k, v in stages.items()},
            stage2_task_s_sum=sum(sum(v) for v in stages.values()),
            stage1_peak_rss_mb=max(t.peak_rss_bytes for t in reads) / 2**20,
            stage2_peak_rss_mb=max((t.peak_rss_bytes for t in tasks if t.stage != "read"), default=0) / 2**20,
            worker_peak_rss_mb_at_end=max(worker_peak.values()),
            worker_rss_before_mb=max(before.values()),
            n_events=res.n_events,
            read_tasks=len(reads),
            files=sum(r.files for r in results),
        )
    out["client_peak_rss_mb"] = _peak_rss_mb()
    out["json_sha256"] = _digest(doc)
    return out


def tile_rank_file(source: Path, out: Path, min_mb: float) -> Path:
    """One big rank file: `source`'s events repeated back to back in time (ids offset per copy so
    that kernels still pair with their launches) until the JSON is at least `min_mb` MB."""
    import gzip

    opener = gzip.open if source.name.endswith(".gz") else open
    with opener(source, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    timed = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    span = max(timed) - min(timed) + 1000.0
    one_mb = len(json.dumps(events)) / 1e6
    copies = max(1, int(-(-min_mb // one_mb)))
    tiled = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        off = k * 10**9
        for e in events:
            if e.get("ph") == "M":
                continue
            e2 = {**e, "ts": e["ts"] + k * span}
            if isinstance(e.get("id"), int):
                e2["id"] = e["id"] + off
            args = e.get("args")
            if args:
                a2 = dict(args)
                for key in ("correlation", "External id", "Record function id", "Ev Idx"):
                    if isinstance(a2.get(key), int) and a2[key] > 0:
                        a2[key] = a2[key] + off
                e2["args"] = a2
            tiled.append(e2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**doc, "traceEvents": tiled}))
    return out


def calibrated_copy(run: Path, calibrated_source: Path) -> Path:
    """`run` with a manifest that carries `calibrated_source`'s profiler_calibration (one cost per
    call for every rank: its per-rank costs left out), its rank files linked, not copied."""
    out = run.with_name(run.name + "-cal")
    if (out / "manifest.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in run.iterdir():
        if f.name != "manifest.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    man = json.loads((run / "manifest.json").read_text())
    cal = json.loads((calibrated_source / "manifest.json").read_text())["profiler_calibration"]
    man["profiler_calibration"] = {k: v for k, v in cal.items() if k != "per_rank_ns"}
    (out / "manifest.json").write_text(json.dumps(man, indent=1))
    return out


def one_file_child(path: str) -> dict:
    """Stage 1 on one rank file in this process: idle RSS after the imports, peak after the task."""
    sys.path.insert(0, str(ROOT))
    idle = _warm_rss_mb()
    from tracekit.engine.dask_engine import read_rank_file

    t0 = time.perf_counter()
    part = read_rank_file(path, None, False)
    return {
        "file_mb": os.path.getsize(path) / 1e6,
        "events": part.meta.n_events,
        "seconds": time.perf_counter() - t0,
        "idle_rss_mb": idle,
        "peak_rss_mb": _peak_rss_mb(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--workers", default="1,2,4,8,16", help="comma-separated LocalCluster sizes")
    ap.add_argument("--local", action="store_true", help="also the local engine (the reference JSON)")
    ap.add_argument(
        "--local-one",
        action="store_true",
        help="also the local engine reading the rank files in its own process (read_run jobs=1: the same "
        "work as dask:1, without Dask)",
    )
    ap.add_argument("--what", choices=["breakdown", "shortfall"], default="breakdown")
    ap.add_argument("--source", default=str(ROOT / "traces" / "h200-tp2"))
    ap.add_argument("--baseline", default=str(ROOT / "traces" / "h200-tp1"))
    ap.add_argument(
        "--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tracekit-bench-scale")
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument(
        "--one-file-mb",
        type=float,
        default=None,
        help="instead: stage 1's memory on one rank file of at least this many MB (the source's rank 0 tiled)",
    )
    ap.add_argument(
        "--calibrated", action="store_true", help="the run's manifest with a profiler_calibration (see above)"
    )
    ap.add_argument("--case-timeout", type=float, default=None, help="seconds per case (then: timed out)")
    ap.add_argument(
        "--stream",
        action="store_true",
        help="record the Dask task stream of each dask case: its phases (first start, last stop, compute "
        "seconds per task group) and each worker's busy seconds, printed after the table",
    )
    ap.add_argument("--child", nargs=2, metavar=("CASE", "RUN"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child and args.child[0] == "one-file":
        print(json.dumps(one_file_child(args.child[1])))
        return
    if args.one_file_mb:
        src = sorted(Path(args.source).glob("rank-0.*json*"))[0]
        big = Path(args.workdir) / f"{Path(args.source).name}-tile{int(args.one_file_mb)}mb.json"
        if not big.is_file():
            tile_rank_file(src, big, args.one_file_mb)
        proc = subprocess.run(
            [sys.executable, __file__, "--child", "one-file", str(big)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["growth_x_file"] = (r["peak_rss_mb"] - r["idle_rss_mb"]) * 2**20 / (r["file_mb"] * 1e6)
        print(json.dumps(r))
        return
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.what, args.baseline, args.stream)))
        return

    sys.path.insert(0, str(ROOT))
    from tracekit.engine.synthetic import make_synthetic_run

    run = Path(args.workdir) / f"{Path(args.source).name}-x{args.ranks}"
    if not (run / "manifest.json").is_file():
        t0 = time.perf_counter()
        make_synthetic_run(args.source, run, args.ranks, compresslevel=0, jobs=os.cpu_count() or 1)
        print(f"built {run} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.calibrated:
        run = calibrated_copy(run, ROOT / "traces" / "h200-tp1-calibrated")
    sizes = [p.stat().st_size for p in run.glob("rank-*.pt.trace.json")]
    print(
        f"{args.ranks} ranks, {sum(sizes) / 1e9:.2f} GB of JSON, largest file {max(sizes) / 1e6:.1f} MB, "
        f"{os.cpu_count()} CPUs, analysis: {args.what}",
        file=sys.stderr,
    )
    cases = (["local"] if args.local else []) + (["local:1"] if args.local_one else [])
    cases += [f"dask:{w}" for w in args.workers.split(",") if w]
    rows = []
    for case in cases:
        cmd = [
            sys.executable,
            __file__,
            "--what",
            args.what,
            "--baseline",
            args.baseline,
            *(["--stream"] if args.stream else []),
            "--child",
            case,
            str(run),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.case_timeout)
        except subprocess.TimeoutExpired:
            print(f"{case}: timed out after {args.case_timeout:.0f} s", file=sys.stderr)
            rows.append({"case": case, "timed_out_s": args.case_timeout})
            continue
        if proc.returncode != 0:
            print(f"{case}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    largest_mb = max(sizes) / 1e6
    ref = next((r["json_sha256"] for r in rows if r["case"] == "local" and "wall_s" in r), None)
    local_s = next((r["wall_s"] for r in rows if r["case"] == "local" and "wall_s" in r), None)
    one = next((r["wall_s"] for r in rows if r["case"] == "dask:1" and "wall_s" in r), None)
    print(
        "| case | wall s | vs local | vs 1 worker | read tasks s (sum / max) | stage tasks s (sum) | "
        "Reduce s (match + path ∥ graph + correction) | retime tasks s (sum / n) | identify tasks s (sum / max, n) | "
        "client s (share of wall; beside tasks) | worker RSS MB idle / peak | client peak RSS MB | JSON = local |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "timed_out_s" in r:
            print(f"| {r['case']} | > {r['timed_out_s']:.0f} (timed out) | | | | | | | | | | | |")
            continue
        if r["case"] in ("local", "local:1"):
            same = "reference" if r["case"] == "local" else ("yes" if r["json_sha256"] == ref else "no")
            vs = f"{local_s / r['wall_s']:.2f}x" if local_s else ""
            print(
                f"| {r['case']} | {r['wall_s']:.1f} | {vs} | | {r['stage1_s']:.1f} "
                f"(read_run) | {r['stage2_s']:.1f} (in process) | | | | | | {r['client_peak_rss_mb']:.0f} | {same} |"
            )
            continue
        vs_local = f"{local_s / r['wall_s']:.2f}x" if local_s else ""
        sp = f"{one / r['wall_s']:.2f}x" if one else ""
        # the serial part: the sharded run's Reduces (the baseline's run beside them, on another worker)
        red_m, red_p, red_g, red_c = (
            r["stages"].get(k, [0, 0, 0])[1] for k in ("match", "path", "graph", "correction")
        )
        red = f"{red_m:.1f} + {red_p:.1f} ∥ {red_g:.1f} + {red_c:.1f}"
        # the client's work on the critical path: less what it did while the workers ran tasks
        serial = r["client_s"] - r.get("client_beside_s", 0.0)
        # the correction's re-timing split per rank: one task per file and round (docs/SCALE.md)
        rt = r["stages"].get("attribution.retime", [0, 0, 0])
        rt_s = f"{rt[0]:.1f} / {rt[2]}" if rt[2] else "-"
        fan = [r["stages"].get(k, [0, 0, 0]) for k in ("identify", "identify_between")]
        fan_s = (
            f"{sum(f[0] for f in fan):.1f} / {max(f[1] for f in fan):.2f}, {sum(f[2] for f in fan)}"
            if any(f[2] for f in fan)
            else "-"
        )
        print(
            f"| {r['case']} (+{r['cluster_start_s']:.1f} s start) | {r['wall_s']:.1f} | {vs_local} | {sp} | "
            f"{r['stage1_task_s_sum']:.1f} / {r['stage1_task_s_max']:.2f} | {r['stage2_task_s_sum']:.1f} | "
            f"{red} | {rt_s} | {fan_s} | {r['client_s']:.2f} ({100 * r['client_s'] / r['wall_s']:.0f}%; "
            f"{r.get('client_beside_s', 0.0):.2f} s beside: {100 * serial / r['wall_s']:.1f}% serial) | "
            f"{r['worker_rss_before_mb']:.0f} / {r['worker_peak_rss_mb_at_end']:.0f} | "
            f"{r['client_peak_rss_mb']:.0f} ({r['client_rss_idle_mb']:.0f} idle) | "
            f"{'yes' if ref and r['json_sha256'] == ref else ('no' if ref else '-')} |"
        )
    for r in rows:
        if "stream" in r:
            print(f"\n{r['case']}: task groups (start / stop / compute s / tasks), wall {r['wall_s']:.1f} s")
            for k, g in r["stream"]["groups"].items():
                print(f"  {g[0]:7.2f} {g[1]:7.2f} {g[2]:8.2f} {g[3]:5d}  {k}")
            print(f"  worker busy s: {r['stream']['busy_s']}")
    for line in phase_scaling(rows, len(sizes) + 1):
        print(line)
    print(f"largest rank file {largest_mb:.1f} MB", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"ranks": args.ranks, "largest_file_mb": largest_mb, "rows": rows})
        )


if __name__ == "__main__":
    main()
