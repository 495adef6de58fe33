"""Message sizes of the collectives (docs/METHOD.md section Wait and transfer).

- bytes: from the trace where the collective interval carries them (NCCL kernel args, the gloo
  op's own shapes or its enqueue's `record_param_comms`: see `tracekit.read.kineto`); else, when
  the run's manifest lists the decoder's collectives (`workload.collectives`), from that list
  (`fill_bytes_from_manifest`); `instances.bytes_source` says which ("trace" | "manifest" |
  "unknown").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.analyse.collectives.select import KNOWN_OPS, normalise_op
from tracekit.analyse.timeline.steps import find_steps
from tracekit.analyse.timeline.windows import assign_steps
from tracekit.errors import StepError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import Manifest
from tracekit.model.events import DataQuality
from tracekit.read.manifests import workload_step_pattern

# --------------------------------------------------------------------------------------------
# message sizes from the capture manifest (the decoder's shapes) where the trace has none


@dataclass(frozen=True)
class ManifestCollective:
    """One entry of the manifest's `workload.collectives`: a collective the decoder makes
    `per_token` times per decode step, with its per-rank input / output bytes."""

    op: str
    name: str
    in_bytes: int
    out_bytes: int
    per_token: int


def manifest_collectives(manifest: Manifest | None) -> list[ManifestCollective]:
    """The `workload.collectives` list of a capture manifest ([] when absent); entries without a
    known op or with no byte count are left out."""
    wl = given(manifest.workload) if manifest is not None else None
    out: list[ManifestCollective] = []
    for e in (given(wl.collectives) if wl is not None else None) or []:
        op = given(e.op) or ""
        op = op if op in KNOWN_OPS else normalise_op(pd.Series([op])).tolist()[0]
        in_b, out_b = given(e.in_bytes), given(e.out_bytes)
        in_b, out_b = -1 if in_b is None else in_b, -1 if out_b is None else out_b
        per_token = given(e.per_token)
        per_token = 1 if per_token is None else per_token
        if (
            op and (in_b >= 0 or out_b >= 0) and 1 <= per_token <= 100_000
        ):  # 1e9 per token: not a list to build
            out.append(ManifestCollective(op, given(e.name) or "", in_b, out_b, per_token))
    return out


def step_sequence(entries: list[ManifestCollective]) -> list[ManifestCollective]:
    """The calls of one decode step, in order, for entries of one op: round by round (round i holds,
    in list order, every entry whose per_token > i), i.e. layer-major for per-layer entries
    (o_proj, down_proj, o_proj, down_proj, ...)."""
    rounds = max((e.per_token for e in entries), default=0)
    return [e for i in range(rounds) for e in entries if e.per_token > i]


def fill_bytes_from_manifest(
    per_rank: pd.DataFrame,
    manifest: Manifest | None,
    events: pd.DataFrame | None,
    steps: pd.DataFrame | None,
    dq: DataQuality,
) -> dict[int, str]:
    """Fill `in_bytes` / `out_bytes` of the per-rank rows (in place) of instances the trace left
    without a size, from the manifest's `workload.collectives`; returns instance -> bytes source.

    Only instances inside a step window are filled (the list describes one decode step; a
    prefill's collectives differ). Per op: when the list has exactly one size for it, every such
    instance takes it; otherwise the op's instances of each step, in order (on the lowest rank),
    take the sizes of `step_sequence` position by position, and a step whose count differs from
    the list is left unknown. Instances that do have trace bytes are checked against the same
    expectation (`collective_bytes_manifest_disagrees`), never overwritten.
    """
    source: dict[int, str] = {}
    if per_rank.empty:
        return source
    has = (per_rank["in_bytes"].to_numpy(np.int64) >= 0) | (per_rank["out_bytes"].to_numpy(np.int64) >= 0)
    inst_has = pd.Series(has, index=per_rank.index).groupby(per_rank["instance"]).any()
    source = {int(i): ("trace" if h else "unknown") for i, h in inst_has.items()}
    entries = manifest_collectives(manifest)
    if not entries:
        return source
    if steps is None and events is not None:
        pattern = workload_step_pattern(manifest)
        try:
            steps = find_steps(events, pattern)
        except StepError:
            steps = None
    if steps is None or steps.empty:
        dq.add(
            "collective_manifest_without_steps",
            1,
            "the manifest lists the decoder's collectives but the trace has no step windows to place "
            "them in: message sizes not filled from the manifest",
        )
        return source
    # one row per instance: its op and its step / start on the lowest rank of the instance
    first = per_rank.sort_values(["instance", "rank"]).drop_duplicates("instance")
    first = first.assign(start_ns=first["raw_start_ns"].to_numpy(np.int64))
    windows = steps[["rank", "step", "start_ns", "end_ns"]]
    first = first.assign(step=assign_steps(first, windows).to_numpy(np.int64))
    first = first.sort_values(["step", "raw_start_ns", "instance"])
    inst_max = per_rank.groupby("instance")[["in_bytes", "out_bytes"]].max()

    expected: dict[int, tuple[int, int]] = {}
    by_op: dict[str, list[ManifestCollective]] = {}
    for e in entries:
        by_op.setdefault(e.op, []).append(e)
    count_mismatch = 0
    for op, ents in by_op.items():
        rows = first[(first["op"].astype(str) == op) & (first["step"] >= 0)]
        if rows.empty:
            continue
        sizes = {(e.in_bytes, e.out_bytes) for e in ents}
        seq = step_sequence(ents)
        for _, g in rows.groupby("step", sort=True):
            same_count = len(g) == len(seq)
            count_mismatch += not same_count
            if len(sizes) == 1:
                size = next(iter(sizes))
                for i in g["instance"].tolist():
                    expected[int(i)] = size
            elif same_count:
                for i, e in zip(g["instance"].tolist(), seq, strict=True):
                    expected[int(i)] = (e.in_bytes, e.out_bytes)
    if count_mismatch:
        dq.add(
            "collective_manifest_count_mismatch",
            count_mismatch,
            "steps whose number of collectives of an op differs from the manifest's per-token list (sizes "
            "filled only where the op has one size)",
        )
    filled, disagree = [], 0
    for i, (in_b, out_b) in expected.items():
        if source.get(i) == "trace":
            t_in, t_out = (int(x) for x in inst_max.loc[i])
            if (t_in >= 0 and in_b >= 0 and t_in != in_b) or (t_out >= 0 and out_b >= 0 and t_out != out_b):
                disagree += 1
            continue
        filled.append((i, in_b, out_b))
        source[i] = "manifest"
    if disagree:
        dq.add(
            "collective_bytes_manifest_disagrees",
            disagree,
            f"{disagree} collective instance(s) carry bytes in the trace that differ from the manifest's "
            "list; the trace's are kept",
        )
    if filled:
        fill = pd.DataFrame(filled, columns=["instance", "in_b", "out_b"]).set_index("instance")
        hit = per_rank["instance"].isin(fill.index).to_numpy()
        inst = per_rank.loc[hit, "instance"]
        per_rank.loc[hit, "in_bytes"] = fill["in_b"].reindex(inst).to_numpy(np.int64)
        per_rank.loc[hit, "out_bytes"] = fill["out_b"].reindex(inst).to_numpy(np.int64)
        dq.add(
            "collective_bytes_from_manifest",
            len(filled),
            f"{len(filled)} collective instance(s) without message sizes in the trace took them from the "
            "manifest's workload.collectives (the decoder's shapes)",
        )
    return source
