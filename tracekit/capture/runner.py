"""`tracekit capture`: run the reference decoder over N ranks and write traces + manifest.json.

    from pathlib import Path
    from tracekit.capture.runner import CaptureConfig, capture
    run_dir = capture(CaptureConfig(tp=2, preset="tiny", tokens=8), Path("traces/cpu-tp2"))

Per rank: build the shard (weights from the seed), a warm-up pass, then `rounds` (K, `--rounds`,
default 3) alternating pairs of measured passes, U P U P ...: an unprofiled pass (host wall ns per
token, a device sync per token on CUDA) and a profiled pass (torch.profiler in the chosen mode,
its schedule skipping one warm-up step, then `tokens` recorded steps, timed the same way). The
host's speed drifts (the same H200 command gave dilation 1.59x and 3.13x minutes apart), so one
unprofiled pass against one profiled pass measures the drift as much as the profiler; alternating
rounds put both kinds under the same drift, and the manifest keeps every round
(`unprofiled.rounds`, `profiled.rounds`) for the pooled dilation and its interval
(tracekit.analyse.dilation). Every profiled round runs under the profiler in the same mode and
opens the same ranges, so all are timed under the same conditions, but only the last one (the
traced round) exports its trace: the others' recordings are dropped (`Tracer(keep=False)`), so
the written trace holds exactly `tokens` decode_step ranges per rank.

Every measured pass runs `LEAD + tokens + TAIL` steps at the same positions and keep the middle
`tokens`: the lead step is the profiler schedule's warm-up, and the tail step is where the
profiler stops and exports (its `step()` runs between steps, outside every timed step and every
`decode_step` range). The warm-up pass covers at least every position the measured passes use:
on the H200 smoke run, a decode step at a KV length never seen before took ~65 ms instead of ~3
(cuDNN attention builds a plan per new shape, then lazy-loads its kernel), which made the last
profiled step (one position further than the warm-up had gone) a 20x outlier. Only the kept
steps of a pass open a `decode_step` range (warm-up, lead and tail steps open none).

`--nsys`: nsys records every pass of the processes it starts, so the unprofiled pass must not run
under it (the first H200 nsys reports held 2T steps per rank, and a "dilation" between two passes
that both ran under nsys). A plain run without nsys (same workload and ranks, `passes="unprofiled"`)
records the unprofiled times; then the run under nsys (`passes="traced"`) warms up and runs only
the traced pass, so its report holds exactly `tokens` decode_step ranges per rank; then a second
plain run, so two unprofiled rounds bracket the traced one (`workload.pass_order` "UPU"; `--rounds`
does not apply: a second profiled round under nsys would put its ranges in the report). The
manifest is the nsys run's, with the plain runs' `unprofiled` rounds, and says so in
`workload.nsys`. A user's script under `--nsys` runs the same way (plain, nsys, plain).
Ranks run as processes on this host (on a CPU forked from a server that imported torch once,
tracekit.capture.starter; on CUDA spawned), or in-process when launched by torchrun (RANK and
WORLD_SIZE set). Each rank writes rank-<r>.pt.trace.json.gz and a small result file; the
manifest (docs/JSON.md#manifest) is assembled from those. A failing rank: the others' traces are
kept, the manifest says `complete: false` with the errors, and CaptureError names the rank.

Importing this module is cheap: torch is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import msgspec

from tracekit.capture import environment as env
from tracekit.capture.config import (
    ENV_CONFIG,
    ENV_RESOLVED,
    ENV_TEARDOWN_CUPTI,
    CaptureConfig,
    Progress,
    Resolved,
    parse_inject_delay,
    phase_kind,
    resolve,
    workload,
)
from tracekit.capture.manifest import build_manifest, finish_run, workload_of
from tracekit.capture.nsys import PLAIN_AFTER, find_nsys, merge_plain_runs, run_nsys
from tracekit.capture.outputs import check_out_dir, clear_outputs, free_port, prepare_out_dir, rank_command
from tracekit.capture.rank import rank_main, spawned_rank
from tracekit.capture.rank_result import RankError, RankResult, read_results, write_result
from tracekit.capture.script import capture_script
from tracekit.errors import CaptureError
from tracekit.model.documents.base import given
from tracekit.model.documents.manifest import ManifestError
from tracekit.read.manifests import read_manifest


# -- entry points ----------------------------------------------------------------------------------
def capture(config: CaptureConfig, out_dir: Path, progress: Progress | None = None) -> Path:
    """Run the capture described by `config` into `out_dir` (created); returns `out_dir`.

    Under torchrun (RANK and WORLD_SIZE in the environment) every process runs its own rank and
    rank 0 writes the manifest. Raises CaptureError on bad options or a failed rank (after writing
    the manifest with `complete: false`).
    """
    out_dir = Path(out_dir)
    if config.nsys and os.environ.get("TRACEKIT_UNDER_NSYS") != "1":
        return _capture_under_nsys(config, out_dir, progress)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and os.environ.get("TRACEKIT_SPAWNED") != "1":
        return _capture_torchrun(config, out_dir)
    res = resolve(config)
    world = config.tp
    prepare_out_dir(out_dir)
    clear_outputs(out_dir)
    ctx = rank_starter(res.device)
    queue = ctx.Queue() if progress is not None else None
    said = ctx.SimpleQueue()  # each failing rank's error, whether or not its result file was written
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    old = os.environ.get("TRACEKIT_SPAWNED")
    os.environ["TRACEKIT_SPAWNED"] = "1"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    teardown_set = res.device == "cuda" and ENV_TEARDOWN_CUPTI not in os.environ
    if teardown_set:  # for the spawned ranks only (see ENV_TEARDOWN_CUPTI)
        os.environ[ENV_TEARDOWN_CUPTI] = "1"
    # Ctrl-C while the ranks are being started (spawning one takes seconds on a loaded host) must
    # end the started ones too: left running, a rank waits at the rendezvous for one never started
    # and the interpreter's exit joins it (a hang, not an exit)
    interrupted = False
    try:
        for r in range(world):
            p = ctx.Process(
                target=spawned_rank,
                args=(r, world, config, res, str(out_dir), init, queue, said),
                daemon=False,
            )
            p.start()
            procs.append(p)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if teardown_set:
            os.environ.pop(ENV_TEARDOWN_CUPTI, None)
        if old is None:
            os.environ.pop("TRACEKIT_SPAWNED", None)
        else:
            os.environ["TRACEKIT_SPAWNED"] = old
    errors: list[ManifestError] = []
    stuck: list[int] = []  # ranks that finished their work but did not exit (ended by us)
    try:
        if interrupted:
            raise KeyboardInterrupt
        _wait_for_ranks(procs, queue, progress, config, errors, out_dir=out_dir, stuck=stuck)
    except KeyboardInterrupt:  # Ctrl-C: stop the ranks, keep what they finished, say so in the manifest
        for r in range(world):
            q = procs[r] if r < len(procs) else None  # None: never started
            if q is None or q.is_alive():
                if q is not None:
                    q.terminate()
                errors.append(
                    ManifestError(
                        rank=r, message="interrupted (Ctrl-C) before it finished", how="interrupted"
                    )
                )
    for p in procs:
        p.join(timeout=10)
    if queue is not None:
        with contextlib.suppress(Exception):
            while True:
                progress(*queue.get_nowait())  # type: ignore[misc]
    for p in procs:
        if p.is_alive():  # did not end within the join: never leave a rank behind
            p.kill()
            p.join(timeout=5)
    messages: dict[int, str] = {}
    with contextlib.suppress(Exception):
        while not said.empty():
            r, msg = said.get()
            messages[int(r)] = str(msg)
    results = read_results(out_dir)
    for r, msg in messages.items():  # a rank whose result file could not say it (a full disk)
        if r not in results or given(results[r].error) is None:
            results.setdefault(r, RankResult(rank=r)).error = RankError(message=msg)
    _blame_timeouts(results, errors)
    for r, p in enumerate(procs):
        if (
            p.exitcode not in (0, None)
            and r not in stuck
            and (r not in results or given(results[r].error) is None)
            and not any(given(e.rank) == r for e in errors)
        ):
            errors.append(
                ManifestError(
                    rank=r, message=exit_words(p.exitcode), how="killed" if p.exitcode < 0 else "exited"
                )
            )
    manifest = build_manifest(
        world=world,
        results=results,
        workload=workload(config, res, world),
        command=rank_command(config),
        errors=errors,
        needs_traces=res.mode != "nvtx",
    )
    if stuck:
        manifest.notes = [
            f"rank {r} wrote all its files but did not exit within {TEARDOWN_GRACE_S:g} s (stuck in "
            "process-group teardown); ended by tracekit, its files are complete"
            for r in stuck
        ]
    return finish_run(out_dir, manifest)


#: `spawn`: a CPU capture spawns its ranks as a CUDA one does, instead of forking them from the
#: fork server (tracekit.capture.starter)
ENV_START = "TRACEKIT_CAPTURE_START"


def rank_starter(device: str) -> Any:
    """What starts the ranks: the fork server on a CPU (torch imported once, tracekit.capture.starter),
    spawn on CUDA (and where $TRACEKIT_CAPTURE_START is `spawn`)."""
    if device == "cpu" and os.environ.get(ENV_START, "fork-server") != "spawn":
        try:
            from tracekit.capture.starter import Starter
        except ImportError:  # no fork server where fds cannot be passed between processes (Windows)
            pass
        else:
            return Starter()
    import torch.multiprocessing as mp

    return mp.get_context("spawn")


def exit_words(code: int) -> str:
    """A rank process's exit code in words: a negative code is the signal that ended it."""
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory? the kernel's OOM killer sends it)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"process exited with code {code}"


#: Seconds a rank may take to exit after writing its last result (`finished`): NCCL teardown after
#: CUDA graphs can block forever (pytorch/pytorch#115388; both ranks at TP=2 on two H200s).
TEARDOWN_GRACE_S = 20.0


def _finished_ranks(out_dir: Path | None) -> set[int]:
    if out_dir is None:
        return set()
    return {r for r, res in read_results(out_dir).items() if given(res.finished) and given(res.error) is None}


def _wait_for_ranks(
    procs: list[Any],
    queue: Any,
    progress: Progress | None,
    config: CaptureConfig,
    errors: list[ManifestError],
    out_dir: Path | None = None,
    stuck: list[int] | None = None,
) -> None:
    """Until every rank ends. Once one rank has ended, the others get a grace period: min(timeout_s,
    60) s after a failure, timeout_s (the collective timeout, `--timeout`) after a rank finished
    normally. A rank still running then is hung (a rank that finished has no collective left to
    wait on, so only this ends it): terminated, killed if SIGTERM does not end it, and named."""
    ended: tuple[float, int, bool] | None = None  # (when, rank, failed)
    finished_at: dict[int, float] = {}  # rank -> when its result first said `finished`
    last_look = 0.0
    while any(p.is_alive() for p in procs):
        if queue is not None:
            with contextlib.suppress(Exception):
                while True:
                    phase, done, total = queue.get(timeout=0.05)
                    progress(phase, done, total)  # type: ignore[misc]
        else:
            time.sleep(0.05)
        now = time.monotonic()
        if stuck is not None and now - last_look >= 0.5:
            last_look = now
            for r in _finished_ranks(out_dir):
                finished_at.setdefault(r, now)
            for r, t in finished_at.items():
                p = procs[r]
                if p.is_alive() and now - t > TEARDOWN_GRACE_S:
                    p.terminate()
                    p.join(timeout=5)
                    if p.is_alive():
                        p.kill()
                        p.join(timeout=5)
                    stuck.append(r)
        for r, p in enumerate(procs):
            code = p.exitcode
            if code is None or r in (stuck or ()) or (ended is not None and (ended[2] or code == 0)):
                continue
            ended = (now, r, code != 0)  # the first rank to end; a later failure shortens the wait
            break
        if ended is None:
            continue
        since, who, failed = ended
        grace = min(config.timeout_s, 60.0) if failed else config.timeout_s
        if now - since <= grace:
            continue
        hung = [(r, p) for r, p in enumerate(procs) if p.is_alive()]
        for r, p in hung:
            p.terminate()
            errors.append(
                ManifestError(
                    rank=r,
                    message=f"hung: still running {grace:g} s after rank {who} "
                    f"{'failed' if failed else 'finished'} (--timeout {config.timeout_s:g}); terminated",
                    how="hung",
                )
            )
        for _, p in hung:
            p.join(timeout=5)
            if p.is_alive():  # SIGTERM ignored or blocked in a driver call
                p.kill()
        break


def _blame_timeouts(results: dict[int, RankResult], errors: list[ManifestError]) -> None:
    """A rank whose collective timed out was waiting for a rank that hung: say so (in place), so
    the manifest and the message name the rank that hung, not only the one that gave up."""
    hung = sorted(r for e in errors if given(e.how) == "hung" and (r := given(e.rank)) is not None)
    if not hung:
        return
    named = {given(e.rank) for e in errors}
    for r, res in sorted(results.items()):
        err = given(res.error)
        msg = err.message if err is not None else ""
        if r in named or not msg or "timed out" not in msg.lower() and "timeout" not in msg.lower():
            continue
        who = ", ".join(map(str, hung))
        said = re.sub(r"\[[^\]]*\]\s*", "", msg)[:200]  # without gloo's [source/file.cc:78]
        errors.append(
            ManifestError(
                rank=r,
                message=f"collective timed out waiting for rank {who}, which hung ({said})",
                how="collective_timeout",
            )
        )


def _capture_torchrun(config: CaptureConfig, out_dir: Path) -> Path:
    """One rank of a torchrun launch; rank 0 gathers the results and writes the manifest."""
    from tracekit.capture.profile import error_result

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if config.tp not in (1, world):
        raise CaptureError(f"--tp {config.tp} but torchrun started WORLD_SIZE={world} ranks")
    res = resolve(config, world)
    prepare_out_dir(out_dir)
    try:
        mine = rank_main(
            rank, world, local_rank, config, res, out_dir, "env://" if world > 1 else None, destroy=False
        )
    except BaseException as exc:
        failed = error_result(rank, exc)
        write_result(out_dir, failed)
        err = given(failed.error)
        raise CaptureError(f"rank {rank} failed: {err.message if err is not None else exc}") from exc
    if world > 1:  # the result files may live on other hosts: gather them to rank 0
        import torch.distributed as dist

        gathered: list[bytes | None] = [None] * world if rank == 0 else []
        dist.gather_object(msgspec.json.encode(mine), gathered if rank == 0 else None, dst=0)
        dist.destroy_process_group()
        if rank != 0:
            return out_dir
        got = [msgspec.json.decode(g, type=RankResult) for g in gathered if g]
        results = {g.rank: g for g in got}
    else:
        results = read_results(out_dir)
    manifest = build_manifest(
        world=world,
        results=results,
        workload=workload(config, res, world),
        command=rank_command(config),
        needs_traces=res.mode != "nvtx",
    )
    return finish_run(out_dir, manifest)


def _capture_under_nsys(config: CaptureConfig, out_dir: Path, progress: Progress | None) -> Path:
    """--nsys: three runs of the same workload and process layout. A plain run (no nsys) records
    one unprofiled round; then the run under nsys, whose ranks warm up and run only the traced
    pass, so the report holds exactly `tokens` decode_step ranges per rank; then a second plain
    run, another unprofiled round, so the unprofiled rounds bracket the traced one (pass order
    U P U). The manifest is the nsys run's, with the plain runs' `unprofiled` rounds and the
    dilation from them. A failed second plain run leaves one unprofiled round and says why in
    `workload.nsys.unprofiled_after_error`.
    """
    res = resolve(config)  # check options before starting anything
    find_nsys()
    prepare_out_dir(out_dir)
    cmd = rank_command(config)
    plain_cfg = replace(
        config, nsys=False, mode=res.mode, passes="unprofiled", fail_rank=None, command=cmd, rounds=1
    )
    capture(plain_cfg, out_dir, progress)  # raises CaptureError (its manifest kept) when a rank fails
    manifest_path = out_dir / env.MANIFEST_NAME
    plain = read_manifest(manifest_path).manifest
    clear_outputs(out_dir)

    child_env = dict(
        os.environ, TRACEKIT_UNDER_NSYS="1", NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0")
    )
    cfg = replace(config, command=cmd, passes="traced", rounds=1)
    child_env[ENV_CONFIG] = json.dumps(asdict(cfg))
    # the process nsys starts is not a rank: it must make no CUDA call, or a multi-process report
    # holds one more CUDA process than there are ranks (the H200 smoke run: 3 processes for tp=2)
    child_env[ENV_RESOLVED] = json.dumps(asdict(res))
    argv = [sys.executable, "-m", "tracekit.capture.runner", str(out_dir)]
    try:
        files = run_nsys(argv, out_dir, child_env)
    finally:  # also when the run under nsys failed: its manifest gets the plain run's times
        if manifest_path.exists():
            manifest = read_manifest(manifest_path).manifest
            merge_plain_runs(manifest, [plain])
            env.atomic_write_json(manifest_path, manifest.to_json())
    if not manifest_path.exists():
        raise CaptureError(f"the capture under nsys wrote no manifest in {out_dir}")
    manifest.files = {
        **(given(manifest.files) or {}),
        **files,
    }
    after_dir = out_dir / PLAIN_AFTER
    try:
        capture(plain_cfg, after_dir, progress)
        merge_plain_runs(manifest, [plain, read_manifest(after_dir / env.MANIFEST_NAME).manifest])
    except (CaptureError, OSError, ValueError) as exc:
        nsys = given(workload_of(manifest).nsys)
        if nsys is not None:
            nsys.unprofiled_after_error = str(exc)
    finally:
        shutil.rmtree(after_dir, ignore_errors=True)
    env.atomic_write_json(manifest_path, manifest.to_json())
    return out_dir


def _main_under_nsys(argv: list[str]) -> int:
    """`python -m tracekit.capture.runner OUT_DIR` with the config in $TRACEKIT_CAPTURE_CONFIG."""
    doc = json.loads(os.environ[ENV_CONFIG])
    if doc.get("inject_delay") is not None:
        doc["inject_delay"] = tuple(doc["inject_delay"])
    config = CaptureConfig(**doc)
    try:
        capture(config, Path(argv[0]))
    except CaptureError as exc:
        print(f"tracekit: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main_under_nsys(sys.argv[1:]))


#: the capture's public API (the entry points and what `tracekit capture` asks of a capture before
#: it runs), whichever module of tracekit.capture holds each
__all__ = [
    "CaptureConfig",
    "Resolved",
    "capture",
    "capture_script",
    "check_out_dir",
    "find_nsys",
    "parse_inject_delay",
    "phase_kind",
    "resolve",
]
