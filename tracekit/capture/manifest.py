"""The capture's manifest (docs/JSON.md#manifest): the ranks' result files read back
(`read_results`), assembled into the manifest (`build_manifest`: workload, unprofiled and profiled
rounds, files with their sha256) and written whole or not at all (`finish_run`: CaptureError when a
rank failed or the disk is full, the traces kept). The manifest is its typed document
(`tracekit.model.documents.Manifest`) from assembly on, encoded once where it is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracekit.capture import environment as env
from tracekit.errors import CaptureError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import Manifest, ManifestUnprofiled, ManifestWorkload
from tracekit.read.manifests import manifest_from_json


# -- the manifest ----------------------------------------------------------------------------------
def read_results(out_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in sorted(out_dir.glob(".rank-*.result.json")):
        try:
            doc = json.loads(p.read_text())
            out[int(doc["rank"])] = doc
        except (ValueError, KeyError, OSError):
            continue
    return out


def build_manifest(
    *,
    world: int,
    results: dict[int, dict[str, Any]],
    workload_doc: dict[str, Any],
    command: str | None,
    errors: Sequence[dict[str, Any]] = (),
    extra_files: dict[str, dict[str, Any]] | None = None,
    needs_traces: bool = True,
    nccl: dict[str, str] | None = None,
) -> Manifest:
    """The manifest document (docs/JSON.md#manifest) from the per-rank results."""
    errs = [dict(e) for e in errors]
    seen = {e.get("rank") for e in errs}
    for r in range(world):
        res = results.get(r, {})
        if res.get("error") and r not in seen:
            errs.append({"rank": r, "message": res["error"]["message"], "how": "error"})
            seen.add(r)
    files: dict[str, dict[str, Any]] = {}
    for r in range(world):
        fe = results.get(r, {}).get("file")
        if fe:
            files[env.trace_name(r)] = fe
        elif needs_traces and r not in seen:
            errs.append({"rank": r, "message": "no trace written", "how": "no_trace"})
    files.update(extra_files or {})
    unprof = {str(r): results[r]["unprofiled_ns"] for r in sorted(results) if results[r].get("unprofiled_ns")}
    prof = {str(r): results[r]["profiled_ns"] for r in sorted(results) if results[r].get("profiled_ns")}
    u_rounds, p_rounds = _rounds(results, "unprofiled"), _rounds(results, "profiled")
    traced_round = next(
        (int(results[r]["traced_round"]) for r in sorted(results) if "traced_round" in results[r]),
        len(p_rounds) - 1,
    )
    order = results.get(0, {}).get("pass_order")
    if order and "rounds" in workload_doc:  # the order rank 0 really ran its passes in
        workload_doc = dict(workload_doc, pass_order=order)
    if results.get(0, {}).get("profiler_env"):
        workload_doc = dict(workload_doc, profiler_env=results[0]["profiler_env"])
    dil, interval = env.dilation(u_rounds, p_rounds)
    from tracekit.capture.calibrate import merge_ranks

    calibration = merge_ranks({r: results[r].get("profiler_calibration") or {} for r in results})
    return as_manifest(
        {
            "schema_version": env.SCHEMA_VERSION,
            "kind": "tracekit.capture",
            "complete": not errs,
            "errors": sorted(errs, key=lambda e: (e.get("rank") is None, e.get("rank") or 0)),
            "created": env.now_utc(),
            "versions": results.get(0, {}).get("versions") or env.versions(),
            "host": env.host_info(),
            "devices": results[0]["devices"] if "devices" in results.get(0, {}) else env.devices(),
            "topology": env.topology(),
            "nccl_env": nccl
            if nccl is not None
            else next(
                (results[r]["nccl_env"] for r in sorted(results) if "nccl_env" in results[r]), env.nccl_env()
            ),
            "workload": workload_doc,
            # per_token_ns: the first unprofiled round and the traced profiled round (pre-1.2 readers);
            # rounds: every round in run order (docs/JSON.md#manifest)
            "unprofiled": {"per_token_ns": unprof, "rounds": u_rounds},
            "profiled": {"per_token_ns": prof, "rounds": p_rounds, "traced_round": max(traced_round, 0)},
            "dilation": dil,
            "dilation_interval": interval,
            **({"profiler_calibration": calibration} if calibration else {}),
            "tokens_generated": results.get(0, {}).get("tokens_generated"),
            "nvtx": results.get(0, {}).get("nvtx"),
            "inject_sync_count": {
                str(r): results[r]["inject_sync_count"]
                for r in sorted(results)
                if "inject_sync_count" in results[r]
            },
            # OS process id per rank: names the ranks of a one-file multi-process nsys report
            "rank_pids": {str(r): results[r]["pid"] for r in sorted(results) if "pid" in results[r]},
            **(
                {
                    "marker_steps": {
                        str(r): results[r]["marker_steps"]
                        for r in sorted(results)
                        if "marker_steps" in results[r]
                    }
                }
                if any("marker_steps" in results[r] for r in results)
                else {}
            ),
            "files": files,
            "command": command,
        }
    )


def as_manifest(doc: dict[str, object]) -> Manifest:
    """The manifest object the capture assembled as its typed document, decoded as a reader
    decodes the file (`tracekit.read.manifests.manifest_from_json`), so what is written is what
    reads back; a value the document cannot hold (none should) is left out and said in `notes`."""
    # as the JSON it becomes: plain values (torch.__version__ is a str subclass msgspec cannot encode)
    read = manifest_from_json(json.loads(json.dumps(doc)), env.MANIFEST_NAME)
    if read.notes:
        read.manifest.notes = [*(given(read.manifest.notes) or []), *(n for _, n in read.notes)]
    return read.manifest


def workload_of(manifest: Manifest) -> ManifestWorkload:
    """The manifest's workload (a capture always has one; set empty when it has none)."""
    if not isinstance(manifest.workload, ManifestWorkload):
        manifest.workload = ManifestWorkload()
    return manifest.workload


def _rounds(results: dict[int, dict[str, Any]], kind: str) -> list[dict[str, list[int]]]:
    """Every round of one kind ("unprofiled" | "profiled") as {rank: [ns, ...]}, in run order, from
    the ranks' `<kind>_rounds_ns` (or their one `<kind>_ns`: a user's script, one round)."""
    per_rank: dict[str, list[list[int]]] = {}
    for r in sorted(results):
        lists = results[r].get(f"{kind}_rounds_ns") or (
            [results[r][f"{kind}_ns"]] if results[r].get(f"{kind}_ns") else []
        )
        if lists:
            per_rank[str(r)] = lists
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


def unprofiled_of(results: dict[int, dict[str, Any]]) -> dict[str, list[int]]:
    return {str(r): results[r]["unprofiled_ns"] for r in sorted(results) if results[r].get("unprofiled_ns")}
