"""Benchmark: tracekit read (+ classify + per-step breakdown) vs HTA on tiled real traces (issue 7).

Builds large Kineto traces by tiling ../shared/traces/h200/kineto_decode_ws1.pt.trace.json.gz in
time (100x and 1000x; variant A keeps every tile's `ProfilerStep#N` / `decode_step` ranges,
renumbered, as in a capture that steps the profiler every token; variant B keeps only the first
tile's), writes them uncompressed to a work folder, then measures each case in a fresh subprocess:
wall time, MB/s, events/s, peak RSS (the child's own ru_maxrss), the HTA/tracekit ratio,
time(1000x)/time(100x), 8 rank files read in parallel, and the cached re-analysis.

    .venv/bin/python benchmarks/bench_read.py                    # everything (HTA 1000x-A takes ~8 min)
    .venv/bin/python benchmarks/bench_read.py --skip-hta-large   # HTA on 100x only
    .venv/bin/python benchmarks/bench_read.py --hta-large-variants B --big   # HTA 1000x-B, not -A
    .venv/bin/python benchmarks/bench_read.py --no-hta --big     # + the 2 GB streaming case

HTA (HolisticTraceAnalysis 0.5.0) runs in the project venv: it works with pandas 3.1 here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "traces" / "h200" / "kineto_decode_ws1.pt.trace.json.gz"
_STEP_RE = re.compile(r"^(ProfilerStep#(\d+)|decode_step)$")
_TOKEN_RE = re.compile(r'"@(TS|DU|ID|CO|EX)(-?\d+)@"')
_ID_SHIFT = 10_000_000  # per tile, for correlation / External id / flow id


# ----------------------------------------------------------------------------------------------
# Building tiled traces


def _ts_ns(v: Any, text_by_id: dict[int, str]) -> int:
    """Exact ns of a ts value as written (3 decimals at most)."""
    s = repr(v) if isinstance(v, float) else str(v)
    if "." in s:
        ip, fp = s.split(".")
        return int(ip) * 1000 + int((fp + "000")[:3])
    return int(s) * 1000


def build_tiled(out: Path, factor: int, keep_all_steps: bool, rank: int = 0) -> Path:
    """Write the source trace tiled `factor` times in time to `out` (uncompressed JSON)."""
    if out.exists():
        return out
    with gzip.open(SOURCE, "rb") as f:
        raw = f.read()
    doc = json.loads(raw)
    exact = json.loads(raw, parse_float=str)["traceEvents"]  # the exact text of ts / dur
    events = doc.pop("traceEvents")
    for e, x in zip(events, exact, strict=True):
        for key in ("ts", "dur"):
            if key in x:
                e[key] = x[key]
    meta = doc
    if isinstance(meta.get("distributedInfo"), dict):
        meta["distributedInfo"]["rank"] = rank
    ts_vals = [_ns(e["ts"]) for e in events if "ts" in e]
    ends = [_ns(e["ts"]) + _ns(e.get("dur", "0")) for e in events if "ts" in e]
    period = max(ends) - min(ts_vals) + 50_000  # 50 us gap between tiles
    trace_span = None
    templates: list[list[Any]] = []  # per event: literal parts and tokens
    step_flags: list[bool] = []
    for e in events:
        if e.get("cat") == "Trace":
            trace_span = e
            continue
        e2 = dict(e)
        if "ts" in e2:
            e2["ts"] = f"@TS{_ns(e2['ts'])}@"
        if "dur" in e2:
            e2["dur"] = f"@DU{_ns(e2['dur'])}@"
        if e2.get("ph") in ("s", "f", "t") and "id" in e2:
            e2["id"] = f"@ID{int(e2['id'])}@"
        args = e2.get("args")
        if isinstance(args, dict):
            args = dict(args)
            if "correlation" in args:
                args["correlation"] = f"@CO{int(args['correlation'])}@"
            if "External id" in args:
                args["External id"] = f"@EX{int(args['External id'])}@"
            e2["args"] = args
        text = json.dumps(e2)
        parts: list[Any] = []
        pos = 0
        for m in _TOKEN_RE.finditer(text):
            parts.append(text[pos : m.start()])
            parts.append((m.group(1), int(m.group(2))))
            pos = m.end()
        parts.append(text[pos:])
        templates.append(parts)
        name = str(e.get("name", ""))
        step_flags.append(
            e.get("cat") in ("user_annotation", "gpu_user_annotation") and bool(_STEP_RE.match(name))
        )
    nsteps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        head = json.dumps(meta)[:-1]  # without the closing brace
        f.write(head + ', "traceEvents": [\n')
        first = True
        if trace_span is not None:
            ts0 = _ns(trace_span["ts"])
            span = dict(trace_span)
            span["dur"] = "@DUR@"
            span["ts"] = "@TS0@"
            span.pop("args", None)
            t = json.dumps(span)
            t = t.replace('"@TS0@"', _fmt(ts0)).replace('"@DUR@"', _fmt(period * factor))
            f.write(t)
            first = False
        for k in range(factor):
            shift = k * period
            chunk: list[str] = []
            for parts, is_step in zip(templates, step_flags, strict=True):
                if is_step and k > 0 and not keep_all_steps:
                    continue
                out_parts: list[str] = []
                for p in parts:
                    if isinstance(p, str):
                        out_parts.append(p)
                        continue
                    kind, v = p
                    if kind == "TS":
                        out_parts.append(_fmt(v + shift))
                    elif kind == "DU":
                        out_parts.append(_fmt(v))
                    else:
                        out_parts.append(str(v + k * _ID_SHIFT))
                s = "".join(out_parts)
                if is_step and k > 0 and nsteps:
                    s = re.sub(
                        r'"ProfilerStep#(\d+)"',
                        lambda m, k=k: f'"ProfilerStep#{int(m.group(1)) + k * nsteps}"',  # type: ignore[misc]
                        s,
                    )
                chunk.append(s)
            if chunk:
                f.write(("" if first else ",\n") + ",\n".join(chunk))
                first = False
        f.write("\n]}\n")
    tmp.rename(out)
    return out


def _ns(v: Any) -> int:
    s = str(v)
    neg = s.startswith("-")
    s = s.lstrip("-")
    if "." in s:
        ip, fp = s.split(".")
        n = int(ip or "0") * 1000 + int((fp + "000")[:3])
    else:
        n = int(s) * 1000
    return -n if neg else n


def _fmt(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


# ----------------------------------------------------------------------------------------------
# Children: one measurement per fresh process


def _child(kind: str, target: str, jobs: int) -> None:
    sys.path.insert(0, str(REPO))
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    if kind.startswith("hta"):
        import contextlib
        import io

        from hta.trace_analysis import TraceAnalysis

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            analyzer = TraceAnalysis(trace_dir=target)
            df = analyzer.get_temporal_breakdown(visualize=False)
        info["hta_idle_us"] = float(df["idle_time(us)"].iloc[0])
        info["events"] = None
    else:
        from tracekit.read import read_run

        try:  # import the analysis up front: its import time is reported separately
            import tracekit.analyse.timeline.breakdown  # noqa: F401
        except ImportError:
            pass
        if kind == "tracekit-cached":
            import pyarrow.parquet  # noqa: F401  (the cache's reader: an import, reported in import_s)
        info["import_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        run = read_run([target], cache=(kind == "tracekit-cached"), jobs=jobs)
        info["events"] = len(run.events)
        info["read_s"] = time.perf_counter() - t0
        info["stage"] = "read"
        try:
            from tracekit.analyse.timeline.breakdown import breakdown  # type: ignore[import-not-found]
            from tracekit.classify import classify  # type: ignore[attr-defined]
        except ImportError as exc:
            info["note"] = f"read only (classify/breakdown not importable: {exc})"
        else:
            try:
                res = breakdown(run)  # classifies inside
                assert classify is not None
                info["stage"] = "read+classify+breakdown"
                info["result_type"] = type(res).__name__
            except Exception as exc:  # report, do not hide
                info["note"] = f"breakdown failed: {type(exc).__name__}: {exc}"
    info["wall_s"] = time.perf_counter() - t0
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    info["peak_rss_mb"] = max(self_kb, kids_kb) / 1024
    info["self_rss_mb"] = self_kb / 1024
    print("RESULT " + json.dumps(info))


def _takes_run(fn: Any) -> bool:
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return True
    return bool(params) and params[0] in ("run", "r")


def measure(
    kind: str, target: Path, jobs: int = 1, timeout: float | None = None, repeat: int = 1
) -> dict[str, Any]:
    """Best (lowest wall) of `repeat` fresh-process runs; `load` = 1-min load average before/after,
    `walls` = every run's wall time."""
    best: dict[str, Any] | None = None
    walls: list[float] = []
    peak = 0.0
    load_before = os.getloadavg()[0]
    for _ in range(max(1, repeat)):
        res = _measure_once(kind, target, jobs, timeout)
        if "error" in res:
            return res
        walls.append(round(res["wall_s"], 3))
        peak = max(peak, res["peak_rss_mb"])
        if best is None or res["wall_s"] < best["wall_s"]:
            best = res
    assert best is not None
    best["walls"] = walls
    best["peak_rss_mb"] = peak  # the highest of the runs
    best["load"] = f"{load_before:.1f}/{os.getloadavg()[0]:.1f}"
    return best


def _measure_once(kind: str, target: Path, jobs: int = 1, timeout: float | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, str(target), "--jobs", str(jobs)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    wall = time.perf_counter() - t0
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            res: dict[str, Any] = json.loads(line[7:])
            res["process_wall_s"] = wall
            return res
    return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]}


# ----------------------------------------------------------------------------------------------


def _size_mb(path: Path) -> float:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6
    return path.stat().st_size / 1e6


def _row(label: str, target: Path, res: dict[str, Any], mb: float | None = None) -> str:
    """One table row; `mb` = the JSON size when `target` is compressed."""
    if "error" in res:
        return f"| {label} | {_size_mb(target):.0f} | error: {res['error']} | | | | | | | |"
    mb = mb if mb is not None else _size_mb(target)
    ev = res.get("events")
    evs = f"{ev / res['wall_s'] / 1e6:.2f}" if ev else ""
    note = res.get("stage", "") + (f" ({res['note']})" if res.get("note") else "")
    runs = ", ".join(f"{w:.2f}" for w in res.get("walls", [res["wall_s"]]))
    return (
        f"| {label} | {mb:.0f} | {res['wall_s']:.2f} | {mb / res['wall_s']:.0f} | {evs} | "
        f"{res['peak_rss_mb']:.0f} ({res['peak_rss_mb'] / mb:.2f}x) | {res.get('read_s', 0):.2f} | "
        f"{runs} | {res.get('load', '')} | {note} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "tracekit-bench")
    ap.add_argument("--factors", default="100,1000")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA entirely")
    ap.add_argument("--skip-hta-large", action="store_true", help="run HTA on the smallest factor only")
    ap.add_argument("--hta-timeout", type=float, default=1200)
    ap.add_argument(
        "--hta-large-variants",
        default="A,B",
        help="variants HTA runs on the larger factors (e.g. B: skip the ~10 min 1000x-A)",
    )
    ap.add_argument("--no-ranks", action="store_true", help="skip the 8-rank parallel case")
    ap.add_argument("--no-gzip", action="store_true", help="skip the .json.gz case")
    ap.add_argument("--big", action="store_true", help="also the ~2 GB streaming case (7000x)")
    ap.add_argument("--clean", action="store_true", help="delete the work folder at the end")
    ap.add_argument("--repeat", type=int, default=3, help="tracekit runs per case (best of); HTA runs once")
    ap.add_argument("--only-big", action="store_true", help="only the ~2 GB streaming case")
    a = ap.parse_args()
    if a.child:
        _child(a.child[0], a.child[1], a.jobs)
        return
    if not SOURCE.exists():
        sys.exit(f"source trace not found: {SOURCE}")
    factors = [int(x) for x in a.factors.split(",")]
    wd: Path = a.workdir
    wd.mkdir(parents=True, exist_ok=True)
    print(
        f"work folder: {wd}  (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()})"
    )
    rows = [
        "| case | MB | wall s (best) | MB/s | M events/s | peak RSS MB (x file) | read s | runs s | load 1-min before/after | what |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    times: dict[tuple[str, int, str], float] = {}
    if a.only_big:
        factors, a.no_ranks, a.big = [], True, True
    for factor in factors:
        for variant in ("A", "B"):
            d = wd / f"tile{factor}{variant}"
            d.mkdir(exist_ok=True)
            t0 = time.perf_counter()
            path = build_tiled(d / "rank-0.pt.trace.json", factor, keep_all_steps=(variant == "A"))
            print(f"built {path} ({_size_mb(path):.0f} MB) in {time.perf_counter() - t0:.1f} s", flush=True)
            res = measure("tracekit", path, repeat=a.repeat)
            rows.append(_row(f"tracekit {factor}x-{variant}", path, res))
            if "wall_s" in res:
                times[("tracekit", factor, variant)] = res["wall_s"]
            print(rows[-1], flush=True)
            run_hta = not a.no_hta and (
                factor == min(factors)
                or (not a.skip_hta_large and variant in a.hta_large_variants.split(","))
            )
            if run_hta:
                res = measure("hta", d, timeout=a.hta_timeout)
                rows.append(_row(f"HTA {factor}x-{variant}", path, res))
                if "wall_s" in res:
                    times[("hta", factor, variant)] = res["wall_s"]
                print(rows[-1], flush=True)
            if factor == max(factors) and variant == "A" and not a.no_gzip:
                gz = wd / f"gz{factor}{variant}" / "rank-0.pt.trace.json.gz"
                if not gz.exists():
                    gz.parent.mkdir(exist_ok=True)
                    with (
                        open(path, "rb") as fin,
                        gzip.open(gz.with_suffix(".tmp"), "wb", compresslevel=1) as fout,
                    ):
                        shutil.copyfileobj(fin, fout, 16 << 20)
                    gz.with_suffix(".tmp").rename(gz)
                res = measure("tracekit", gz, repeat=a.repeat)
                label = f"tracekit {factor}x-{variant} .json.gz ({_size_mb(gz):.0f} MB gzip -1; MB = JSON)"
                rows.append(_row(label, gz, res, mb=_size_mb(path)))
                print(rows[-1], flush=True)
            if factor == max(factors):
                measure("tracekit-cached", path)  # fills the cache
                res = measure("tracekit-cached", path, repeat=a.repeat)
                rows.append(_row(f"tracekit cached re-analysis {factor}x-{variant}", path, res))
                print(rows[-1], flush=True)
    big = max(factors) if factors else 0
    if not a.no_ranks:
        rd = wd / f"ranks8x{big}"
        rd.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        src = wd / f"tile{big}B" / "rank-0.pt.trace.json"
        for r in range(8):
            dst = rd / f"rank-{r}.pt.trace.json"
            if not dst.exists():
                _copy_with_rank(src, dst, r)
        print(f"built {rd} ({_size_mb(rd):.0f} MB) in {time.perf_counter() - t0:.1f} s", flush=True)
        res = measure("tracekit", rd, jobs=2, repeat=a.repeat)
        rows.append(_row(f"tracekit 8 ranks x {big}x-B, 2 processes", rd, res))
        print(rows[-1], flush=True)
    if a.big:
        d = wd / "tile7000B"
        d.mkdir(exist_ok=True)
        path = build_tiled(d / "rank-0.pt.trace.json", 7000, keep_all_steps=False)
        res = measure("tracekit", path, repeat=a.repeat)
        rows.append(_row("tracekit 7000x-B (streaming)", path, res))
        print(rows[-1], flush=True)

    print()
    print("\n".join(rows))
    print()
    for variant in ("A", "B"):
        for factor in factors:
            h, t = times.get(("hta", factor, variant)), times.get(("tracekit", factor, variant))
            if h and t:
                print(f"HTA/tracekit {factor}x-{variant}: {h / t:.1f}x")
        if len(factors) >= 2:
            lo, hi = min(factors), max(factors)
            t_lo, t_hi = times.get(("tracekit", lo, variant)), times.get(("tracekit", hi, variant))
            if t_lo and t_hi:
                print(
                    f"tracekit time({hi}x)/time({lo}x) variant {variant}: {t_hi / t_lo:.1f} (linear = {hi / lo:.0f})"
                )
    if a.clean:
        shutil.rmtree(wd, ignore_errors=True)


def _copy_with_rank(src: Path, dst: Path, rank: int) -> None:
    """Copy a tiled trace, changing distributedInfo.rank (in the header, before traceEvents)."""
    with open(src, "rb") as f:
        head = f.read(1 << 20)
        idx = head.index(b'"traceEvents"')
        header, rest_start = head[:idx], idx
        new_header = re.sub(
            rb'("rank"\s*:\s*)\d+', lambda m: m.group(1) + str(rank).encode(), header, count=1
        )
        with open(dst, "wb") as g:
            g.write(new_header)
            g.write(head[rest_start:])
            shutil.copyfileobj(f, g, 16 << 20)


if __name__ == "__main__":
    main()
