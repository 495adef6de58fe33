"""What the decode trace sent and realised, for the link verdict (docs/METHOD.md section Bandwidth and
the link verdict): its collectives by (op, bytes) with calls per token and the busbw realised over
the transfer time (`trace_collectives`: wait removed where the ranks match; kernel duration, said
so, where they do not), which link mode it ran on (`trace_mode`), and the shortfall S and its
transfer term against a baseline run (`shortfall_context`).
"""

from __future__ import annotations

from pathlib import Path

from tracekit.analyse.attribution.pair import shortfall
from tracekit.analyse.collectives.bandwidth import PROBE_OP, algbw_gbps, safe_bus_factor
from tracekit.analyse.collectives.matching import match_collectives
from tracekit.analyse.timeline.steps import find_steps
from tracekit.errors import MatchError, StepError
from tracekit.model.documents import convert
from tracekit.model.documents.base import given
from tracekit.model.documents.links import LinksPerTokenNs, LinksShortfall, LinksSize, LinksTrace
from tracekit.model.documents.manifest import Manifest
from tracekit.read import read_run

# ---------------------------------------------------------------------------------------------
# the decode trace


def trace_collectives(trace_dir: str | Path) -> LinksTrace:
    """Message sizes a decode run used and the busbw it realised, per (op, size).

    Reads the run with `tracekit.read.read_run`; transfer times from
    `tracekit.analyse.collectives.matching.match_collectives` (wait removed). When ranks cannot be matched
    (a run with some ranks only), each collective's own duration is used and `source` says so."""

    run = read_run(trace_dir)
    ev = run.events
    notes: list[str] = []
    source = "transfer"
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
    # per instance: (op, bytes, ranks, transfer time, where the size came from: "trace" | "manifest")
    per: list[tuple[str, int, int, float, str]] = [
        (
            str(r.op),
            int(r.size_bytes),
            max(int(r.n_ranks), group_size.get(int(r.instance), -1)),
            float(r.transfer_ns_mean),
            str(getattr(r, "bytes_source", "trace")),
        )
        for r in inst.itertuples(index=False)
    ]
    level = ci.level
    n_steps = None
    try:
        steps = find_steps(ev)
        n_steps = int(steps.groupby("rank").size().max()) if len(steps) else None
    except StepError:
        notes.append("no step annotations: per-token transfer is not known, totals are over the whole trace")

    groups: dict[tuple[str, int, int], list[float]] = {}
    sources: dict[tuple[str, int, int], set[str]] = {}
    for op, size, n, time_ns, bytes_source in per:
        if op not in PROBE_OP or size <= 0:
            continue
        groups.setdefault((op, size, n), []).append(time_ns)
        sources.setdefault((op, size, n), set()).add(bytes_source)
    sizes = []
    total_ns = 0.0
    for (op, size, n), times in sorted(groups.items()):
        times_sorted = sorted(times)
        med = times_sorted[len(times_sorted) // 2]
        total_ns += sum(times)
        factor = safe_bus_factor(op, max(n, 1))
        sizes.append(
            LinksSize(
                op=PROBE_OP[op],
                coll_op=op,
                bytes=size,
                n_ranks=n,
                count=len(times),
                per_token=len(times) / n_steps if n_steps else None,
                time_ns_median=med,
                time_ns_total=float(sum(times)),  # transfer (or duration) summed over instances
                transfer_ns_per_token=float(sum(times)) / n_steps if n_steps else None,
                busbw_gbps=algbw_gbps(size, med) * factor if n > 1 else float("nan"),
                bytes_source="/".join(sorted(sources.get((op, size, n), {"trace"}))),
            )
        )
    skipped = sum(1 for p in per if p[0] not in PROBE_OP)
    if skipped:
        notes.append(f"{skipped} collective instances of ops the probe does not sweep were left out")
    if not sizes:
        notes.append("the trace has no collective with a message size the probe can compare")
    mode, mode_source = trace_mode(run.manifest)
    return LinksTrace(
        path=str(trace_dir),
        ranks=run.ranks,
        mode=mode,  # the compare-links mode the decode ran in, from its manifest's NCCL variables
        mode_source=mode_source,
        level=level,
        source=source,  # "transfer" (wait removed) or "duration" (includes wait)
        steps=n_steps,
        sizes=sizes,
        transfer_ns_total=total_ns,
        transfer_ns_per_token=total_ns / n_steps if n_steps else None,
        notes=notes,
    )


def trace_mode(manifest: Manifest | None) -> tuple[str | None, str]:
    """The compare-links mode a captured run's NCCL ran in, from its manifest (`nccl_env`):
    "pcie" when P2P was disabled or limited, "nvlink" (NCCL's default) otherwise; None for a
    non-NCCL run or without a manifest. The second value says how it was decided."""
    if manifest is None:
        return None, "no manifest"
    wl = given(manifest.workload)
    backend = (given(wl.backend) if wl is not None else None) or ""
    if backend and backend != "nccl":
        return None, f"backend {backend}: no GPU link"
    env = given(manifest.nccl_env)
    if env is None:
        return None, "the manifest records no NCCL variables"
    if str(env.get("NCCL_P2P_DISABLE", "0")).strip() not in ("", "0"):
        return "pcie", "manifest nccl_env NCCL_P2P_DISABLE"
    if env.get("NCCL_P2P_LEVEL"):
        return "pcie", f"manifest nccl_env NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']}"
    return "nvlink", "manifest nccl_env: NCCL's default (P2P allowed)"


# ---------------------------------------------------------------------------------------------
# the shortfall of the decode (with its baseline)


def shortfall_context(baseline_dir: str | Path, sharded_dir: str | Path) -> LinksShortfall:
    """S and its transfer term for the decode trace against its baseline run
    (`tracekit.analyse.attribution.pair.shortfall`): the figures the verdict sets the link bound against."""

    doc = shortfall(read_run(baseline_dir), read_run(sharded_dir)).document()
    return LinksShortfall(
        baseline=str(baseline_dir),
        sharded=str(sharded_dir),
        n_ranks=doc.n_ranks,
        per_token_ns=convert(doc.per_token_ns.to_json(), LinksPerTokenNs),
        per_token_source=doc.per_token_source,
        shortfall_ns=doc.shortfall_ns,
        terms_ns=dict(doc.terms_ns),
        transfer_ns=doc.terms_ns["transfer"],  # XN - f X1: what the link's speed acts on
        shares=dict(doc.shares),
        verdict=doc.verdict,
    )
