"""`tracekit capture --script`: a user's own script run as the ranks (torch.profiler inside it), its
result files checked and the manifest assembled (`capture_script`); under `--nsys` the same plain,
nsys, plain order as the reference decoder.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from msgspec import UNSET

from tracekit.capture.manifest import (
    build_manifest,
    finish_run,
    pids_of,
    set_unprofiled,
    unprofiled_of,
    workload_of,
)
from tracekit.capture.nsys import find_nsys, nsys_profile
from tracekit.capture.outputs import clear_outputs, prepare_out_dir
from tracekit.capture.profile import ENV_DIR, ENV_MODE, ENV_PASSES, ENV_WARMUP, MODES
from tracekit.capture.rank_result import RankResult, read_results
from tracekit.errors import CaptureError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import (
    Manifest,
    ManifestError,
    ManifestFilesValue,
    ManifestNsys,
    ManifestWorkload,
)


def capture_script(
    argv: Sequence[str],
    out_dir: Path,
    *,
    mode: str = "auto",
    warmup: int = 1,
    nsys: bool = False,
    command: str | None = None,
) -> Path:
    """Run a user's script (`python my_decode.py ...`, or `torchrun ... my_decode.py`) that uses
    `tracekit.profile()`; assemble manifest.json from what its ranks wrote. Returns `out_dir`.

    The script's own `tracekit.profile()` blocks are its passes: one unprofiled and one profiled
    round each (`--rounds` is the reference decoder's; a script alternates by itself if it wants).

    With `nsys`, as for the reference decoder: the script runs three times, plain with
    TRACEKIT_CAPTURE_PASSES=unprofiled (only its `tracekit.profile(profiled=False)` blocks record),
    then under nsys with TRACEKIT_CAPTURE_PASSES=traced (only its profiled blocks record or open
    ranges), then plain again, so the report holds no step of an unprofiled pass and two
    unprofiled rounds bracket the traced one. A script without an unprofiled pass runs only the
    first two and gets `dilation: null`.
    """
    if not argv:
        raise CaptureError(
            "no command given after `--` (e.g. tracekit capture -o DIR -- python my_decode.py)"
        )
    if mode not in MODES:
        raise CaptureError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if nsys and mode not in ("auto", "nvtx"):
        raise CaptureError("--nsys records NVTX ranges; use --mode auto or nvtx with it")
    if nsys:
        find_nsys()  # before running anything
    out_dir = Path(out_dir)
    prepare_out_dir(out_dir)
    clear_outputs(out_dir)
    command = command or "tracekit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    child_env = dict(os.environ)
    child_env.update(
        {ENV_DIR: str(out_dir.resolve()), ENV_MODE: "nvtx" if nsys else mode, ENV_WARMUP: str(warmup)}
    )
    child_env.setdefault("NCCL_NVLS_ENABLE", "0")
    if nsys:
        return _capture_script_under_nsys(list(argv), out_dir, child_env, command)
    child_env.pop(ENV_PASSES, None)
    rc = _run_script(list(argv), child_env)
    errors = [] if rc == 0 else [ManifestError(rank=None, message=f"{' '.join(argv)} exited with code {rc}")]
    results = read_results(out_dir)
    _check_script_results(results, rc)
    manifest = _script_manifest(argv, results, command, errors, needs_traces=True)
    return finish_run(out_dir, manifest)


def _run_script(argv: list[str], child_env: dict[str, str]) -> int:
    try:
        return subprocess.run(argv, env=child_env).returncode
    except OSError as exc:
        raise CaptureError(f"cannot run {argv[0]!r}: {exc}") from exc


def _check_script_results(results: dict[int, RankResult], rc: int) -> None:
    if not results and rc == 0:
        raise CaptureError(
            "the script ran but wrote no results: wrap its loop in `with tracekit.profile():` and mark steps "
            "with `tracekit.annotate.step(i)`"
        )


def _script_manifest(
    argv: Sequence[str],
    results: dict[int, RankResult],
    command: str,
    errors: list[ManifestError],
    *,
    needs_traces: bool,
    extra_files: dict[str, ManifestFilesValue] | None = None,
) -> Manifest:
    world = max(results) + 1 if results else 0
    modes = sorted({m for r in results.values() if (m := given(r.mode))})
    return build_manifest(
        world=world,
        results=results,
        workload=ManifestWorkload(
            script=list(argv),
            tp=world,
            mode=modes[0] if len(modes) == 1 else modes,
            step_pattern="decode_step",
        ),
        command=command,
        errors=errors,
        extra_files=extra_files,
        needs_traces=needs_traces and bool(modes),
    )


#: manifest workload.nsys of a user's script under --nsys (docs/JSON.md#manifest)
NSYS_SCRIPT_UNPROFILED = (
    "separate runs of the script without nsys, before and after the run under nsys "
    "(TRACEKIT_CAPTURE_PASSES=unprofiled: only its tracekit.profile(profiled=False) blocks recorded)"
)
NSYS_SCRIPT_NO_UNPROFILED = (
    "none: the script made no unprofiled pass (no tracekit.profile(profiled=False) block), so the "
    "dilation is unknown"
)
NSYS_SCRIPT_TRACED = (
    "run of the script under nsys (TRACEKIT_CAPTURE_PASSES=traced): only its profiled "
    "tracekit.profile() blocks opened ranges, warm-up steps none"
)


def _capture_script_under_nsys(
    argv: list[str], out_dir: Path, child_env: dict[str, str], command: str
) -> Path:
    """--nsys for a user's script: a plain run records the unprofiled pass, then the run under nsys
    records only the traced pass, then (when the first plain run made an unprofiled pass) a second
    plain run records another: the manifest is the nsys run's with the plain runs' unprofiled
    rounds (pass order U P U). A script's own `tracekit.profile()` blocks make one round each."""
    plain_env = dict(child_env, **{ENV_PASSES: "unprofiled"})
    rc = _run_script(argv, plain_env)
    plain = read_results(out_dir)
    if rc != 0:  # nothing runs under nsys: the manifest of the plain run says why
        errors = [
            ManifestError(
                rank=None, message=f"{' '.join(argv)} exited with code {rc} (plain run, before nsys)"
            )
        ]
        manifest = _script_manifest(argv, plain, command, errors, needs_traces=False)
        workload_of(manifest).nsys = ManifestNsys(unprofiled=NSYS_SCRIPT_UNPROFILED, traced=None)
        return finish_run(out_dir, manifest)
    clear_outputs(out_dir)

    traced_env = dict(child_env, **{ENV_PASSES: "traced"})
    files, rc = nsys_profile(argv, out_dir, traced_env)
    errors = [] if rc == 0 else [ManifestError(rank=None, message=f"the command under nsys exited with {rc}")]
    results = read_results(out_dir)
    _check_script_results(results, rc)
    manifest = _script_manifest(argv, results, command, errors, needs_traces=False, extra_files=files)
    plains = [plain]
    after_error = None
    if unprofiled_of(plain) and rc == 0:  # the second plain run, after the one under nsys
        for f in out_dir.glob(".rank-*.result.json"):
            f.unlink()
        rc2 = _run_script(argv, plain_env)
        if rc2 == 0:
            plains.append(read_results(out_dir))
        else:
            after_error = f"{' '.join(argv)} exited with code {rc2} (plain run, after nsys)"
        for f in out_dir.glob(".rank-*.result.json"):
            f.unlink()
    rounds = [u for u in (unprofiled_of(p) for p in plains) if u]
    set_unprofiled(manifest, rounds)
    wl = workload_of(manifest)
    if rounds:
        wl.pass_order = "UPU" if len(rounds) > 1 else "UP"
    wl.nsys = ManifestNsys(
        unprofiled=NSYS_SCRIPT_UNPROFILED if rounds else NSYS_SCRIPT_NO_UNPROFILED,
        traced=NSYS_SCRIPT_TRACED,
        unprofiled_rank_pids=pids_of(plain),
        unprofiled_rank_pids_rounds=[pids_of(p) for p in plains],
        unprofiled_after_error=after_error if after_error else UNSET,
    )
    return finish_run(out_dir, manifest)
