"""The capture's manifest (docs/JSON.md#manifest): the ranks' results (`RankResult`, read back by
`tracekit.capture.rank_result.read_results`) assembled into the manifest (`build_manifest`: workload, unprofiled and profiled
rounds, files with their sha256) and written whole or not at all (`finish_run`: CaptureError when a
rank failed or the disk is full, the traces kept). The manifest is its typed document
(`tracekit.model.documents.Manifest`) from assembly on, encoded once where it is written.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
from msgspec import UNSET

from tracekit.capture import environment as env
from tracekit.capture.rank_result import RankResult
from tracekit.errors import CaptureError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import (
    Manifest,
    ManifestCalibration,
    ManifestError,
    ManifestFilesValue,
    ManifestProfiled,
    ManifestUnprofiled,
    ManifestWorkload,
)
from tracekit.read.manifests import manifest_from_json


# -- the manifest ----------------------------------------------------------------------------------
def build_manifest(
    *,
    world: int,
    results: Mapping[int, RankResult],
    workload: ManifestWorkload,
    command: str | None,
    errors: Sequence[ManifestError] = (),
    extra_files: Mapping[str, ManifestFilesValue] | None = None,
    needs_traces: bool = True,
    nccl: dict[str, str] | None = None,
) -> Manifest:
    """The manifest document (docs/JSON.md#manifest) from the per-rank results."""
    errs = list(errors)
    seen = {given(e.rank) for e in errs}
    for r in range(world):
        err = given(results[r].error) if r in results else None
        if err is not None and r not in seen:
            errs.append(ManifestError(rank=r, message=err.message, how="error"))
            seen.add(r)
    files: dict[str, ManifestFilesValue] = {}
    for r in range(world):
        fe = given(results[r].file) if r in results else None
        if fe:
            files[env.trace_name(r)] = fe
        elif needs_traces and r not in seen:
            errs.append(ManifestError(rank=r, message="no trace written", how="no_trace"))
    files.update(extra_files or {})
    ranks = [results[r] for r in sorted(results)]
    u_rounds, p_rounds = _rounds(ranks, "unprofiled"), _rounds(ranks, "profiled")
    traced_round = next(
        (t for t in (given(res.traced_round) for res in ranks) if t is not None), len(p_rounds) - 1
    )
    first = results.get(0, RankResult(rank=0))
    order = given(first.pass_order)
    if order and given(workload.rounds) is not None:  # the order rank 0 really ran its passes in
        workload = msgspec.structs.replace(workload, pass_order=order)
    if given(first.profiler_env):
        workload = msgspec.structs.replace(workload, profiler_env=first.profiler_env)
    dil, interval = env.dilation(u_rounds, p_rounds)
    calibration = merge_ranks({res.rank: given(res.profiler_calibration) for res in ranks})
    devices = given(first.devices)
    nccl_env = next((e for e in (given(res.nccl_env) for res in ranks) if e is not None), None)
    marker_steps = {str(res.rank): m for res in ranks if (m := given(res.marker_steps)) is not None}
    return as_manifest(
        Manifest(
            schema_version=env.SCHEMA_VERSION,
            kind="tracekit.capture",
            complete=not errs,
            errors=sorted(errs, key=lambda e: (given(e.rank) is None, given(e.rank) or 0)),
            created=env.now_utc(),
            versions=given(first.versions) or env.versions(),
            host=env.host_info(),
            devices=devices if devices is not None else env.devices(),
            topology=env.topology(),
            nccl_env=nccl if nccl is not None else nccl_env if nccl_env is not None else env.nccl_env(),
            workload=workload,
            # per_token_ns: the first unprofiled round and the traced profiled round (pre-1.2 readers);
            # rounds: every round in run order (docs/JSON.md#manifest)
            unprofiled=ManifestUnprofiled(per_token_ns=unprofiled_of(results), rounds=u_rounds),
            profiled=ManifestProfiled(
                per_token_ns={str(res.rank): ns for res in ranks if (ns := given(res.profiled_ns))},
                rounds=p_rounds,
                traced_round=max(traced_round, 0),
            ),
            dilation=dil,
            dilation_interval=interval,
            profiler_calibration=calibration if calibration is not None else UNSET,
            tokens_generated=given(first.tokens_generated),
            nvtx=given(first.nvtx),
            inject_sync_count={
                str(res.rank): n for res in ranks if (n := given(res.inject_sync_count)) is not None
            },
            # OS process id per rank: names the ranks of a one-file multi-process nsys report
            rank_pids=pids_of(results),
            marker_steps=marker_steps if marker_steps else UNSET,
            files=files,
            command=command,
        )
    )


def merge_ranks(per_rank: Mapping[int, ManifestCalibration | None]) -> ManifestCalibration | None:
    """The manifest's `profiler_calibration` from the ranks' own: per kind the median over ranks
    (integer ns), the method and call count of rank 0 (every rank runs the same), and
    `per_rank_ns`. None when no rank calibrated."""
    got = {r: per_call for r, d in per_rank.items() if d is not None and (per_call := given(d.per_call_ns))}
    if not got:
        return None
    kinds = sorted({k for d in got.values() for k in d})
    per_call = {k: int(round(statistics.median([d[k] for d in got.values() if k in d]))) for k in kinds}
    first = per_rank[min(got)]
    assert first is not None
    return ManifestCalibration(
        per_call_ns=per_call,
        method=(given(first.method) or "") + "; per kind the median over ranks",
        calls=int(given(first.calls) or 0),
        per_rank_ns={str(r): dict(d) for r, d in sorted(got.items())},
    )


def as_manifest(manifest: Manifest) -> Manifest:
    """The manifest the capture assembled, decoded as a reader decodes the file
    (`tracekit.read.manifests.manifest_from_json`), so what is written is what reads back; a value
    the document cannot hold (none should) is left out and said in `notes`."""
    read = manifest_from_json(json.loads(msgspec.json.encode(manifest)), env.MANIFEST_NAME)
    if read.notes:
        read.manifest.notes = [*(given(read.manifest.notes) or []), *(n for _, n in read.notes)]
    return read.manifest


def workload_of(manifest: Manifest) -> ManifestWorkload:
    """The manifest's workload (a capture always has one; set empty when it has none)."""
    if not isinstance(manifest.workload, ManifestWorkload):
        manifest.workload = ManifestWorkload()
    return manifest.workload


def _rounds(ranks: Sequence[RankResult], kind: str) -> list[dict[str, list[int]]]:
    """Every round of one kind ("unprofiled" | "profiled") as {rank: [ns, ...]}, in run order, from
    the ranks' `<kind>_rounds_ns` (or their one `<kind>_ns`: a user's script, one round)."""
    per_rank: dict[str, list[list[int]]] = {}
    for res in ranks:
        if kind == "unprofiled":
            lists, one = given(res.unprofiled_rounds_ns), given(res.unprofiled_ns)
        else:
            lists, one = given(res.profiled_rounds_ns), given(res.profiled_ns)
        lists = lists or ([one] if one else [])
        if lists:
            per_rank[str(res.rank)] = lists
    k = max((len(v) for v in per_rank.values()), default=0)
    return [{rk: v[i] for rk, v in per_rank.items() if i < len(v) and v[i]} for i in range(k)]


def set_unprofiled(manifest: Manifest, rounds: list[dict[str, list[int]]]) -> None:
    """--nsys: the plain runs' unprofiled rounds into the manifest of the run under nsys (in place),
    with the dilation recomputed from them."""
    rounds = [r for r in rounds if r]
    manifest.unprofiled = ManifestUnprofiled(per_token_ns=rounds[0] if rounds else {}, rounds=rounds)
    prof = given(manifest.profiled)
    p_rounds = (given(prof.rounds) if prof is not None else None) or [
        (given(prof.per_token_ns) if prof is not None else None) or {}
    ]
    manifest.dilation, manifest.dilation_interval = env.dilation(rounds, p_rounds)


def per_token_of(manifest: Manifest) -> dict[str, list[int]]:
    """The manifest's first unprofiled round (`unprofiled.per_token_ns`), {} without one."""
    up = given(manifest.unprofiled)
    return (given(up.per_token_ns) if up is not None else None) or {}


def finish_run(out_dir: Path, manifest: Manifest) -> Path:
    path = out_dir / env.MANIFEST_NAME
    try:
        env.atomic_write_json(path, manifest.to_json())
        written = None
    except OSError as exc:  # a full disk: no manifest at all (never half of one)
        written = f"no manifest written: cannot write {path} ({exc.strerror or exc})"
    if not given(manifest.complete):
        parts = "; ".join(
            f"rank {e.rank}: {given(e.message)}" if given(e.rank) is not None else str(given(e.message))
            for e in given(manifest.errors) or []
        )
        parts = " ".join(parts.split())  # one line, whatever a rank's exception said
        n = len(given(manifest.files) or {})
        kept = written or f"kept {n} whole trace file(s) and the manifest in {out_dir}"
        raise CaptureError(f"capture incomplete ({parts}); {kept}")
    if written:
        raise CaptureError(f"capture finished but {written}; the traces in {out_dir} are whole")
    for p in out_dir.glob(".rank-*.result.json"):
        p.unlink()
    return out_dir


def unprofiled_of(results: Mapping[int, RankResult]) -> dict[str, list[int]]:
    """The ranks' first unprofiled round, {rank: [ns, ...]} (ranks without one left out)."""
    return {str(r): ns for r in sorted(results) if (ns := given(results[r].unprofiled_ns))}


def pids_of(results: Mapping[int, RankResult]) -> dict[str, int]:
    """The ranks' OS process ids, {rank: pid}."""
    return {str(r): pid for r in sorted(results) if (pid := given(results[r].pid)) is not None}
