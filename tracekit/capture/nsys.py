"""Nsight Systems for `tracekit capture --nsys`: the binary (`find_nsys`), the `nsys profile` command
line (`nsys_profile`, `run_nsys`), and the plain runs' unprofiled rounds merged into the nsys run's
manifest (`merge_plain_runs`, `workload.nsys`). The order of the runs: `tracekit.capture.runner`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tracekit.capture import environment as env
from tracekit.capture.config import ENV_NSYS
from tracekit.capture.manifest import per_token_of, set_unprofiled, workload_of
from tracekit.errors import CaptureError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import Manifest, ManifestFilesValue, ManifestNsys


def find_nsys() -> str:
    """The nsys executable: $NSYS, else `nsys` on PATH. CaptureError when neither exists."""
    cand = os.environ.get(ENV_NSYS)
    if cand:
        if Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
        raise CaptureError(f"NSYS={cand} is not an executable file")
    found = shutil.which("nsys")
    if found is None:
        raise CaptureError(
            "nsys (Nsight Systems) not found: put it on PATH or set NSYS=/path/to/nsys "
            "(docs/NSYS.md says what it needs)"
        )
    return found


def run_nsys(argv: list[str], out_dir: Path, child_env: dict[str, str]) -> dict[str, ManifestFilesValue]:
    """Run argv under `nsys profile -t cuda,nvtx`, export SQLite; returns their manifest file entries.
    CaptureError when the command under nsys failed (the nsys files are kept)."""
    files, rc = nsys_profile(argv, out_dir, child_env)
    if rc != 0:
        raise CaptureError(f"the command under nsys exited with {rc}; nsys files kept in {out_dir}")
    return files


def nsys_profile(
    argv: list[str], out_dir: Path, child_env: dict[str, str]
) -> tuple[dict[str, ManifestFilesValue], int]:
    """`nsys profile -t cuda,nvtx` of argv into out_dir/nsys.nsys-rep, then its SQLite export.
    Returns (manifest file entries of both, the command's exit code). CaptureError when nsys wrote
    no report or the export failed."""
    nsys = find_nsys()
    rep = out_dir / "nsys"
    cmd = [
        nsys,
        "profile",
        "-t",
        "cuda,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "-o",
        str(rep),
        "-f",
        "true",
        *argv,
    ]
    try:
        r = subprocess.run(cmd, env=child_env)
    except OSError as exc:
        raise CaptureError(f"cannot run {nsys!r}: {exc}") from exc
    rep_file = out_dir / "nsys.nsys-rep"
    if not rep_file.exists():
        hint = ""
        if (out_dir / "nsys.qdstrm").exists():
            hint = " (only nsys.qdstrm was left: the nsys importer is missing a library, see docs/NSYS.md)"
        raise CaptureError(f"nsys profile exited with {r.returncode} and wrote no {rep_file}{hint}")
    sqlite = out_dir / "nsys.sqlite"
    e = subprocess.run(
        [nsys, "export", "--type", "sqlite", "-f", "true", "-o", str(sqlite), str(rep_file)],
        capture_output=True,
        text=True,
    )
    if e.returncode != 0 or not sqlite.exists():
        raise CaptureError(
            f"nsys export --type sqlite failed ({e.returncode}): {(e.stderr or e.stdout).strip()[-300:]}"
        )
    return {p.name: env.file_entry(p, None) for p in (rep_file, sqlite)}, r.returncode


#: manifest workload.nsys: how a --nsys capture was made (docs/JSON.md#manifest)
NSYS_UNPROFILED = "separate runs without nsys, one before and one after the run under nsys"
NSYS_TRACED = "run under nsys: warm-up and the traced pass only; only its kept steps open decode_step ranges"
#: the second plain run of --nsys goes here, then into the manifest, then is removed
PLAIN_AFTER = ".plain-after"


def merge_plain_runs(manifest: Manifest, plains: list[Manifest]) -> None:
    """Put the plain runs' unprofiled times into the nsys run's manifest (in place): one
    unprofiled round per plain run, in run order (before, after the run under nsys)."""
    set_unprofiled(manifest, [per_token_of(p) for p in plains])
    traced_tokens = given(manifest.tokens_generated)
    wl = workload_of(manifest)
    wl.pass_order = "UPU" if len(plains) > 1 else "UP"
    wl.nsys = ManifestNsys(
        unprofiled=NSYS_UNPROFILED,
        traced=NSYS_TRACED,
        unprofiled_rank_pids=given(plains[0].rank_pids) or {},
        unprofiled_rank_pids_rounds=[given(p.rank_pids) or {} for p in plains],
        # greedy tokens of the plain runs equal to the traced run's (same weights, prompt, layout)
        tokens_match=None
        if traced_tokens is None
        else all(given(p.tokens_generated) == traced_tokens for p in plains),
    )
