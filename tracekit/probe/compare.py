"""NVLink vs PCIe on the same GPUs: the same sweep in each mode, the transport NCCL really used in
each, a side-by-side table, and (given a decode trace) the verdict of METHOD.md section 7.

Modes (each a separate set of rank processes with its own environment; NCCL_NVLS_ENABLE=0 always):
- `nvlink`: NCCL's default (P2P allowed: NVLink where the pair has it);
- `pcie`: NCCL_P2P_DISABLE=1 (GPU peer-to-peer off: NCCL goes through host memory, `SHM`, i.e.
  over PCIe via the CPU), or NCCL_P2P_LEVEL=<level> when `pcie_p2p_level` is given (P2P only up to
  that PCIe distance; this never turns NVLink off);
- `default`: nothing set (label only).
What each run really used is read from NCCL's log and said plainly (a "pcie" run that still used
P2P over NVLink, a machine without NVLink).

With a decode trace (`trace_dir`), the verdict compares (a) the probe's busbw per mode at the
message sizes the decode used, (b) the busbw the trace realised (transfer time from
`tracekit.analyse.collectives`: wait removed; kernel duration when it cannot match ranks, said so),
(c) the most a k-times faster link could remove per token: XN (1 - 1/k), k = fast / slow busbw.

The result is a plain dict (see docs/JSON.md#probe, `tracekit.compare_links`). No torch here
except through `run_sweep_detailed`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tracekit.errors import MatchError, ProbeError, StepError
from tracekit.probe import spec
from tracekit.probe.links import Topology, detect_topology
from tracekit.probe.sweep import SweepConfig, SweepResult, run_sweep_detailed

SCHEMA_VERSION = "1.0"
MODES = ("nvlink", "pcie", "default")

#: realised / probe busbw at or above which the link's bandwidth is what sets the transfer time
LINK_BOUND_SHARE = 0.7


@dataclass(frozen=True)
class CompareConfig:
    ops: tuple[str, ...] = ("all_reduce", "all_gather")
    modes: tuple[str, ...] = ("nvlink", "pcie")
    gpus: tuple[int, ...] | None = None  # default: every visible GPU (2 on CPU ranks)
    min_bytes: int = 8
    max_bytes: int | None = None  # None: 1G on CUDA, 1M on CPU
    factor: int = 2
    iters: int = 20
    warmup: int = 5
    dtype: str = "float32"
    device: str = "auto"
    ranks: int | None = None  # CPU only (on CUDA: one rank per GPU)
    pcie_p2p_level: str | None = None  # use NCCL_P2P_LEVEL=<this> for "pcie" instead of NCCL_P2P_DISABLE=1
    trace_dir: str | None = None
    nccl_debug: str = "tuning"
    log_dir: str | None = None  # per-mode subfolders
    progress: bool = False


def mode_env(mode: str, pcie_p2p_level: str | None = None) -> dict[str, str]:
    if mode == "pcie":
        return {"NCCL_P2P_LEVEL": pcie_p2p_level} if pcie_p2p_level else {"NCCL_P2P_DISABLE": "1"}
    if mode in ("nvlink", "default"):
        return {}
    raise ProbeError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


# ---------------------------------------------------------------------------------------------
# transports


def judge_transport(
    mode: str, summary: dict[str, Any], topo: Topology, devices: Sequence[int] | None, backend: str
) -> tuple[bool | None, list[str]]:
    """Did this mode's run use NVLink? Plus plain sentences about what it used."""
    notes: list[str] = []
    if backend != "nccl":
        notes.append(
            f"{mode}: gloo over host memory/TCP on CPU: no GPU link involved, NCCL variables have no effect"
        )
        return None, notes
    pairs = [topo.pair(a, b) for i, a in enumerate(devices or ()) for b in (devices or ())[i + 1 :]]
    pair_nvlink = [p.link == "nvlink" for p in pairs if p is not None]
    topo_nvlink = bool(pair_nvlink) and all(pair_nvlink)
    topo_known = bool(pair_nvlink)
    p2p, wire = bool(summary.get("p2p")), summary.get("wire", "unknown")
    if not summary.get("connections"):
        if summary.get("n_ranks") == 1 or (devices is not None and len(devices) == 1):
            notes.append(f"{mode}: one rank: NCCL connected no peer, so no link was used")
        else:
            notes.append(
                f"{mode}: NCCL logged no connection lines (logging off or an old NCCL): transport unknown"
            )
        return None, notes
    used = summary.get("transport", "")
    uses_nvlink: bool | None
    if p2p and (wire == "nvlink" or (wire == "unknown" and topo_nvlink)):
        uses_nvlink = True
    elif p2p and (wire == "pcie" or (topo_known and not topo_nvlink)):
        uses_nvlink = False
    elif not p2p:
        uses_nvlink = False
    else:
        uses_nvlink = None
    if mode == "pcie":
        if uses_nvlink:
            notes.append(
                f"pcie: this run STILL used P2P over NVLink ({used}); NCCL_P2P_LEVEL does not turn NVLink off, "
                "use NCCL_P2P_DISABLE=1"
            )
        elif p2p:
            notes.append(f"pcie: GPU peer-to-peer over PCIe ({used})")
        elif summary.get("kinds", {}).get("SHM"):
            notes.append(
                f"pcie: NCCL went through host memory ({used}): GPU -> PCIe -> CPU memory -> PCIe -> GPU, "
                "not direct PCIe peer-to-peer"
            )
        else:
            notes.append(f"pcie: transport {used}")
    elif mode == "nvlink":
        if uses_nvlink:
            notes.append(f"nvlink: P2P over NVLink ({used})")
        elif p2p:
            notes.append(f"nvlink: P2P over PCIe ({used}): these GPUs have no NVLink between them")
        else:
            notes.append(f"nvlink: NCCL did not use P2P ({used})")
    else:
        notes.append(f"{mode}: transport {used}")
    if summary.get("nvls_used"):
        notes.append(f"{mode}: NVLS (NVLink multicast) was used although NCCL_NVLS_ENABLE=0 was set")
    return uses_nvlink, notes


# ---------------------------------------------------------------------------------------------
# probe curves


def _curve(rows: Sequence[dict[str, Any]], op: str, mode: str) -> list[tuple[int, float]]:
    """(bytes, busbw) for one op and mode: out-of-place where it exists, else in-place."""
    sel = [r for r in rows if r["op"] == op and r["mode"] == mode]
    forms = {bool(r["in_place"]) for r in sel}
    want = False if False in forms else True
    pts = sorted((int(r["bytes"]), float(r["busbw_gbps"])) for r in sel if bool(r["in_place"]) == want)
    return pts


def busbw_at(rows: Sequence[dict[str, Any]], op: str, mode: str, size: int) -> tuple[float, str]:
    """The probe's busbw for `op` in `mode` at `size` bytes: interpolated linearly in log2(size)
    between the two nearest probe sizes; the nearest end outside the sweep (said in the second value)."""
    pts = [(b, v) for b, v in _curve(rows, op, mode) if b > 0 and math.isfinite(v)]
    if not pts:
        return float("nan"), "no probe rows"
    if size <= pts[0][0]:
        return pts[0][1], "exact" if size == pts[0][0] else f"below the sweep: value at {pts[0][0]} B"
    if size >= pts[-1][0]:
        return pts[-1][1], "exact" if size == pts[-1][0] else f"above the sweep: value at {pts[-1][0]} B"
    for (b0, v0), (b1, v1) in zip(pts, pts[1:], strict=False):
        if b0 <= size <= b1:
            if size == b0:
                return v0, "exact"
            if size == b1:
                return v1, "exact"
            t = (math.log2(size) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return v0 + t * (v1 - v0), f"interpolated between {b0} and {b1} B"
    return pts[-1][1], "nearest"  # pragma: no cover


def side_by_side(
    rows: Sequence[dict[str, Any]], modes: Sequence[str], decode_sizes: dict[str, set[int]]
) -> list[dict[str, Any]]:
    """One entry per (op, bytes, in_place): busbw and time per mode, ratio first/second mode."""
    keyed: dict[tuple[str, int, bool], dict[str, dict[str, Any]]] = {}
    for r in rows:
        keyed.setdefault((r["op"], int(r["bytes"]), bool(r["in_place"])), {})[r["mode"]] = r
    out = []
    for (op, size, in_place), per in sorted(keyed.items()):
        busbw = {m: per[m]["busbw_gbps"] if m in per else None for m in modes}
        entry: dict[str, Any] = {
            "op": op,
            "bytes": size,
            "in_place": in_place,
            "busbw_gbps": busbw,
            "time_us": {m: per[m]["time_us"] if m in per else None for m in modes},
            "correct": {m: per[m]["correct"] if m in per else None for m in modes},
            "ratio": None,
            "decode": size in decode_sizes.get(op, set()),
        }
        if len(modes) >= 2:
            a, b = busbw.get(modes[0]), busbw.get(modes[1])
            if a is not None and b is not None and b > 0 and math.isfinite(a) and math.isfinite(b):
                entry["ratio"] = a / b
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------
# the decode trace


def trace_collectives(trace_dir: str | Path) -> dict[str, Any]:
    """Message sizes a decode run used and the busbw it realised, per (op, size).

    Reads the run with `tracekit.read.read_run`; transfer times from
    `tracekit.analyse.collectives.match_collectives` (wait removed). When ranks cannot be matched
    (a run with some ranks only), each collective's own duration is used and `source` says so."""
    from tracekit.read import read_run

    run = read_run(trace_dir)
    ev = run.events
    notes: list[str] = []
    source = "transfer"
    try:
        from tracekit.analyse.collectives import match_collectives

        try:
            ci = match_collectives(ev, ranks=run.ranks, rank_info=run.rank_info, manifest=run.manifest)
        except MatchError as exc:
            ci = match_collectives(
                ev, ranks=run.ranks, rank_info=run.rank_info, manifest=run.manifest, allow_partial=True
            )
            source = "duration"
            notes.append(
                f"ranks could not be matched ({exc}); the time of each collective is its duration on the ranks "
                "present, which includes waiting: realised busbw is a lower bound"
            )
        inst = ci.instances
        # the group's size from the trace (Group size / process-group ranks) when it says more
        # ranks than the run holds (a run with some ranks only)
        group_size: dict[int, int] = {}
        if len(ci.per_rank) and "coll_group_size" in ev.columns:
            gs = ev["coll_group_size"].reindex(ci.per_rank["event_index"].to_numpy()).fillna(-1).to_numpy()
            for inst_id, g in zip(ci.per_rank["instance"].to_numpy(), gs, strict=True):
                group_size[int(inst_id)] = max(group_size.get(int(inst_id), -1), int(g))
        per: list[dict[str, Any]] = [
            {
                "op": str(r.op),
                "bytes": int(r.size_bytes),
                "n_ranks": max(int(r.n_ranks), group_size.get(int(r.instance), -1)),
                "time_ns": float(r.transfer_ns_mean),
                "bytes_source": str(getattr(r, "bytes_source", "trace")),  # "trace" | "manifest"
            }
            for r in inst.itertuples(index=False)
        ]
        level = ci.level
    except ImportError:
        source, level = "duration", "gpu_kernel"
        notes.append(
            "tracekit.analyse.collectives is not available: realised busbw from kernel durations (includes wait)"
        )
        from tracekit.analyse.bandwidth import nccl_tests_size

        sel = ev[(ev["kind"] == "kernel") & (ev["coll_op"].astype(str) != "")]
        per = [
            {
                "op": str(r.coll_op),
                "bytes": nccl_tests_size(str(r.coll_op), int(r.coll_in_bytes), int(r.coll_out_bytes)),
                "n_ranks": int(r.coll_group_size),
                "time_ns": float(r.end_ns - r.start_ns),
            }
            for r in sel.itertuples(index=False)
        ]
    n_steps = None
    try:
        from tracekit.analyse.steps import find_steps

        steps = find_steps(ev)
        n_steps = int(steps.groupby("rank").size().max()) if len(steps) else None
    except (ImportError, StepError):
        notes.append("no step annotations: per-token transfer is not known, totals are over the whole trace")
    from tracekit.analyse.bandwidth import algbw_gbps, bus_factor

    groups: dict[tuple[str, int, int], list[float]] = {}
    sources: dict[tuple[str, int, int], set[str]] = {}
    for p in per:
        if p["op"] not in spec.PROBE_OP or p["bytes"] <= 0:
            continue
        groups.setdefault((p["op"], p["bytes"], p["n_ranks"]), []).append(p["time_ns"])
        sources.setdefault((p["op"], p["bytes"], p["n_ranks"]), set()).add(p.get("bytes_source", "trace"))
    sizes = []
    total_ns = 0.0
    for (op, size, n), times in sorted(groups.items()):
        times_sorted = sorted(times)
        med = times_sorted[len(times_sorted) // 2]
        total_ns += sum(times)
        try:
            factor = bus_factor(op, max(n, 1))
        except ValueError:
            factor = float("nan")
        sizes.append(
            {
                "op": spec.PROBE_OP[op],
                "coll_op": op,
                "bytes": size,
                "n_ranks": n,
                "count": len(times),
                "per_token": len(times) / n_steps if n_steps else None,
                "time_ns_median": med,
                "busbw_gbps": algbw_gbps(size, med) * factor if n > 1 else float("nan"),
                "bytes_source": "/".join(sorted(sources.get((op, size, n), {"trace"}))),
            }
        )
    skipped = sum(1 for p in per if p["op"] not in spec.PROBE_OP)
    if skipped:
        notes.append(f"{skipped} collective instances of ops the probe does not sweep were left out")
    if not sizes:
        notes.append("the trace has no collective with a message size the probe can compare")
    return {
        "path": str(trace_dir),
        "ranks": run.ranks,
        "level": level,
        "source": source,  # "transfer" (wait removed) or "duration" (includes wait)
        "steps": n_steps,
        "sizes": sizes,
        "transfer_ns_total": total_ns,
        "transfer_ns_per_token": total_ns / n_steps if n_steps else None,
        "notes": notes,
    }


# ---------------------------------------------------------------------------------------------
# verdict


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n} B"


def verdict(
    rows: Sequence[dict[str, Any]], modes: Sequence[str], trace: dict[str, Any] | None, cpu_only: bool
) -> tuple[str, dict[str, Any]]:
    """The METHOD.md section 7 verdict, and the numbers behind it."""
    details: dict[str, Any] = {"per_size": []}
    if cpu_only:
        prefix = "CPU only (gloo): there are no GPU links to compare; "
    else:
        prefix = ""
    ops = sorted({r["op"] for r in rows})
    if not trace or not trace.get("sizes"):
        # probe-only verdict: the ratio of the first two modes at the largest and smallest sizes
        parts = []
        for op in ops:
            if len(modes) < 2:
                break
            a, b = _curve(rows, op, modes[0]), _curve(rows, op, modes[1])
            if not a or not b:
                continue
            big, small = a[-1][0], a[0][0]
            va, vb = busbw_at(rows, op, modes[0], big)[0], busbw_at(rows, op, modes[1], big)[0]
            la = next(
                (
                    r["time_us"]
                    for r in rows
                    if r["op"] == op and r["mode"] == modes[0] and r["bytes"] == small
                ),
                None,
            )
            lb = next(
                (
                    r["time_us"]
                    for r in rows
                    if r["op"] == op and r["mode"] == modes[1] and r["bytes"] == small
                ),
                None,
            )
            ratio = va / vb if vb and math.isfinite(vb) and vb > 0 else float("nan")
            lat = (
                f"; latency at {_fmt_bytes(small)}: {la:.1f} vs {lb:.1f} us"
                if la is not None and lb is not None
                else ""
            )
            parts.append(
                f"{op} busbw at {_fmt_bytes(big)}: {modes[0]} {va:.2f} GB/s vs {modes[1]} {vb:.2f} GB/s "
                f"(x{ratio:.2f}){lat}"
            )
            details["per_size"].append(
                {"op": op, "bytes": big, "busbw_gbps": {modes[0]: va, modes[1]: vb}, "ratio": ratio}
            )
        body = "; ".join(parts) if parts else "no two modes to compare"
        return (
            prefix
            + body
            + ". Without a decode trace (--trace) the probe cannot say whether the link explains a decode's transfer time.",
            details,
        )

    fast_mode, slow_mode = (modes[0], modes[1]) if len(modes) >= 2 else (modes[0], None)
    per_size = []
    for s in trace["sizes"]:
        op, size = s["op"], int(s["bytes"])
        if op not in ops:
            continue
        probe = {m: busbw_at(rows, op, m, size) for m in modes}
        fast = probe[fast_mode][0]
        slow = probe[slow_mode][0] if slow_mode else float("nan")
        if slow_mode and math.isfinite(slow) and math.isfinite(fast) and slow > fast:
            fast, slow = slow, fast
        realised = s["busbw_gbps"]
        share = (
            realised / fast
            if fast and math.isfinite(fast) and fast > 0 and math.isfinite(realised)
            else float("nan")
        )
        k = fast / slow if slow and math.isfinite(slow) and slow > 0 else float("nan")
        per_size.append(
            {
                "op": op,
                "bytes": size,
                "count": s["count"],
                "per_token": s["per_token"],
                "probe_busbw_gbps": {m: v for m, (v, _) in probe.items()},
                "probe_how": {m: how for m, (_, how) in probe.items()},
                "realised_busbw_gbps": realised,
                "realised_share": share,
                "k": k,
            }
        )
    details["per_size"] = per_size
    if not per_size:
        return prefix + "the decode trace used no op the probe swept; sweep its ops (--op).", details
    xn = trace.get("transfer_ns_per_token")
    ks = [p["k"] for p in per_size if math.isfinite(p["k"])]
    # weight k by how often each size occurs
    k_eff = (
        (
            sum(p["k"] * p["count"] for p in per_size if math.isfinite(p["k"]))
            / sum(p["count"] for p in per_size if math.isfinite(p["k"]))
        )
        if ks
        else float("nan")
    )
    bound_ns = xn * (1 - 1 / k_eff) if xn is not None and math.isfinite(k_eff) and k_eff > 0 else None
    details.update(k=k_eff, transfer_ns_per_token=xn, bound_ns_per_token=bound_ns, source=trace["source"])
    shares = [p["realised_share"] for p in per_size if math.isfinite(p["realised_share"])]
    main = max(per_size, key=lambda p: p["count"])
    size_text = ", ".join(f"{p['op']} {_fmt_bytes(p['bytes'])} x{p['count']}" for p in per_size[:4])
    if len(per_size) > 4:
        size_text += f" and {len(per_size) - 4} more"
    probe_text = ", ".join(f"{m} {main['probe_busbw_gbps'][m]:.2f}" for m in modes)
    realised_text = (
        f"{main['realised_busbw_gbps']:.2f}" if math.isfinite(main["realised_busbw_gbps"]) else "n/a"
    )
    how = (
        "transfer time (wait removed)"
        if trace["source"] == "transfer"
        else "kernel duration (includes wait: a lower bound)"
    )
    if shares:
        link_bound = max(shares) >= LINK_BOUND_SHARE
        lead = (
            "Link bandwidth can explain the transfer time"
            if link_bound
            else "Link bandwidth does not explain the transfer time"
        )
        why = (
            f"the decode's collectives realise {max(shares) * 100:.0f}% of the busbw the probe reaches at the same sizes"
            if link_bound
            else f"at the decode's message sizes the collectives realise only {max(shares) * 100:.0f}% of the busbw the "
            "probe reaches at the same sizes, so latency, launch and synchronisation, not the link's bandwidth, set it"
        )
    else:
        lead, why = "The realised busbw is unknown", "the trace gave no usable transfer time"
    text = (
        f"{prefix}{lead}: {why}. Sizes used: {size_text}. At {main['op']} {_fmt_bytes(main['bytes'])} the probe's busbw is "
        f"{probe_text} GB/s; the trace realised {realised_text} GB/s ({how})."
    )
    if bound_ns is not None and xn is not None:
        text += (
            f" A {k_eff:.2f}x faster link could remove at most {bound_ns / 1e3:.1f} us per token "
            f"(XN {xn / 1e3:.1f} us x (1 - 1/k))."
        )
    elif math.isfinite(k_eff):
        text += f" The faster mode is {k_eff:.2f}x the slower at these sizes; per-token transfer is unknown (no steps)."
    if math.isfinite(k_eff) and k_eff < 1.2:
        text += " At these sizes the two modes realise similar bandwidth."
    outside = sorted({p["bytes"] for p in per_size for how in p["probe_how"].values() if "sweep" in how})
    if outside:
        text += (
            f" ({len(outside)} decode size(s) lie outside the probe's sweep; the nearest probe size stands in: "
            "widen --min/--max.)"
        )
    return text, details


# ---------------------------------------------------------------------------------------------
# the whole comparison


def compare_links(config: CompareConfig, *, topology: Topology | None = None) -> dict[str, Any]:
    """Run the sweep once per mode and put the results side by side (see module doc)."""
    from tracekit.probe.sweep import resolve_device

    where = resolve_device(config.device, None)
    cpu_only = where == "cpu"
    topo = topology if topology is not None else detect_topology()
    max_bytes = config.max_bytes if config.max_bytes is not None else (1024**3 if not cpu_only else 1024**2)
    notes: list[str] = []
    if cpu_only:
        notes.append(
            "CPU only: each mode runs the same gloo sweep (no GPU links to compare; NCCL variables have no effect)"
        )
    elif not topo.has_nvlink():
        notes.append(
            "this machine reports no NVLink between its GPUs: the 'nvlink' mode is whatever NCCL picks by default"
        )
    base = SweepConfig(
        ops=config.ops,
        min_bytes=config.min_bytes,
        max_bytes=max_bytes,
        factor=config.factor,
        iters=config.iters,
        warmup=config.warmup,
        dtype=config.dtype,
        device=where,
        ranks=config.ranks if cpu_only else (len(config.gpus) if config.gpus else None),
        devices=None if cpu_only else config.gpus,
        nccl_debug=config.nccl_debug,
        progress=config.progress,
    )
    rows: list[dict[str, Any]] = []
    modes_out = []
    transports: dict[str, Any] = {}
    results: dict[str, SweepResult] = {}
    for mode in config.modes:
        env = mode_env(mode, config.pcie_p2p_level)
        log_dir = str(Path(config.log_dir) / mode) if config.log_dir else None
        cfg = replace(base, mode=mode, env=env, log_dir=log_dir)
        res = run_sweep_detailed(cfg)
        results[mode] = res
        rows.extend(res.rows)
        devices = res.config.get("devices")
        uses_nvlink, tnotes = judge_transport(mode, res.transport, topo, devices, res.config["backend"])
        transports[mode] = {
            **res.transport,
            "uses_nvlink": uses_nvlink,
            "notes": tnotes,
            "log_dir": res.log_dir,
        }
        modes_out.append(
            {
                "mode": mode,
                "env": {**env, "NCCL_NVLS_ENABLE": "0"},
                "backend": res.config["backend"],
                "device": res.config["device"],
                "devices": devices,
                "ranks": res.config["ranks"],
                "notes": tnotes,
            }
        )
        notes.extend(tnotes)
    trace = None
    if config.trace_dir:
        trace = trace_collectives(config.trace_dir)
        notes.extend(trace["notes"])
    decode_sizes: dict[str, set[int]] = {}
    for s in (trace or {}).get("sizes", []):
        decode_sizes.setdefault(s["op"], set()).add(int(s["bytes"]))
    text, details = verdict(rows, list(config.modes), trace, cpu_only)
    first = next(iter(results.values()), None)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "tracekit.compare_links",
        "modes": modes_out,
        "rows": rows,
        "transports": transports,
        "side_by_side": side_by_side(rows, list(config.modes), decode_sizes),
        "links": topo.to_dict(),
        "trace": trace,
        "verdict": text,
        "verdict_details": details,
        "notes": notes,
        "meta": first.meta if first else {},
    }


def format_compare(result: dict[str, Any]) -> str:
    """Side-by-side table: busbw per mode and the ratio per size; decode sizes marked with *."""
    modes = [m["mode"] for m in result["modes"]]
    out = ["# tracekit compare-links"]
    for m in result["modes"]:
        env = " ".join(f"{k}={v}" for k, v in m["env"].items())
        out.append(
            f"# mode {m['mode']}: {m['backend']} on {m['device']} {m['devices'] or ''} ranks {m['ranks']}; env {env}"
        )
    for note in result["notes"]:
        out.append(f"# note: {note}")
    head = f"# {'op':<15} {'form':<4} {'size(B)':>12}" + "".join(
        f" {m + ' busbw':>14} {m + ' us':>11}" for m in modes
    )
    head += f" {'ratio':>7}  decode"
    out.append(head)
    for e in result["side_by_side"]:
        line = f"  {e['op']:<15} {'in' if e['in_place'] else 'out':<4} {e['bytes']:>12}"
        for m in modes:
            bw, t = e["busbw_gbps"].get(m), e["time_us"].get(m)
            line += f" {bw:>14.2f}" if bw is not None and math.isfinite(bw) else f" {'-':>14}"
            line += f" {t:>11.2f}" if t is not None else f" {'-':>11}"
        line += f" {e['ratio']:>7.2f}" if e["ratio"] is not None else f" {'-':>7}"
        line += "  *" if e["decode"] else ""
        out.append(line)
    tr = result.get("trace")
    if tr:
        out.append(
            f"# decode trace {tr['path']}: ranks {tr['ranks']}, steps {tr['steps']}, source {tr['source']}"
        )
        for s in tr["sizes"]:
            bw = s["busbw_gbps"]
            out.append(
                f"#   {s['op']:<15} {s['bytes']:>12} B x{s['count']}: realised busbw {bw:.2f} GB/s"
                if math.isfinite(bw)
                else f"#   {s['op']:<15} {s['bytes']:>12} B x{s['count']}"
            )
    out.append(f"# verdict: {result['verdict']}")
    return "\n".join(out) + "\n"
