"""Profiler modes, the per-rank tracer, and `tracekit.profile()` for users' own decode loops.

Modes (the `--mode` of `tracekit capture`; docs in MODES):

| mode     | torch.profiler activities            | host ops traced     | steps visible as |
| -------- | ------------------------------------ | ------------------- | ---------------- |
| `full`   | CPU + CUDA, record_shapes, cuda_sync | every aten/c10d op  | user_annotation + gpu_user_annotation |
| `cuda`   | CUDA + user ranges only              | none (USER_SCOPE)   | user_annotation + gpu_user_annotation |
| `kernels`| CUDA only (kernels, memcpy, runtime) | none, no ranges     | user_annotation rebuilt from marker runtime calls |
| `cpu`    | CPU, record_shapes                   | every op            | user_annotation |
| `ranges` | user ranges only                     | none (USER_SCOPE)   | user_annotation (gloo:/nccl: comm ranges too) |
| `nvtx`   | no torch.profiler (NVTX only, for nsys) | -                | NVTX ranges |

Why `cuda` keeps the user ranges: with `activities=[CUDA]` alone, torch registers no
RecordFunction callbacks at all (profiler_kineto.cpp `enableProfiler`: callbacks only
`if (activities.count(ActivityType::CPU))`), so `record_function` ranges, `ProfilerStep#N` and
their `gpu_user_annotation` projections are all missing and the steps cannot be found. tracekit
instead enables CPU activity restricted to the USER_SCOPE RecordFunction scope (the `scopes`
argument of `torch._C._autograd._enable_profiler`): the per-op callbacks that dilate an eager,
host-bound decode step never fire, while the step/region ranges and the process-group comm
ranges (`gloo:all_reduce`, `nccl:all_reduce`) are kept.

`kernels` is torch.profiler with `activities=[CUDA]` and nothing else: no RecordFunction callback
is registered, so no host range survives. Steps are marked instead by one cheap CUDA runtime call
at each step range's open and close (`cudaStreamQuery` on the current stream, see `MARKER_API`),
which the CUDA activity keeps as a `cuda_runtime` event on the host thread's clock (Kineto
filters only cudaGetDevice/SetDevice/GetLastError/EventCreate*/EventDestroy). After export,
`inject_marker_steps` turns each (open, close) pair into a `user_annotation` "decode_step#<i>"
event with the same pid/tid/ts, so every reader (tracekit, HTA, Perfetto) sees ordinary steps;
the analysis extends each window to the end of the last kernel launched inside it, as in `cuda`.
While such a tracer runs, `record_function` is not entered at all (nothing would record it).

`auto` picks the lowest-dilation mode that still marks steps: `cuda` on a CUDA device, `cpu` on a
CPU-only run (there the collectives are the gloo/c10d CPU ops, which only `cpu`/`full` record).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.capture import annotate as _annotate
from tracekit.capture.environment import file_entry, gzip_file_atomic, trace_name
from tracekit.capture.rank_result import RankError, RankResult, write_result
from tracekit.errors import CaptureError, TracekitError

if TYPE_CHECKING:  # a rank imports no pandas (tracekit.model's): ~0.9 CPU-s per rank process
    from tracekit.model.documents.chrome import KinetoEvent, KinetoTrace

MODES: dict[str, str] = {
    "auto": "cuda on a CUDA device, cpu on a CPU-only run (lowest dilation that still marks steps)",
    "full": "CPU+CUDA activities, every op, record_shapes, cuda sync events (structure pass; dilates)",
    "cuda": "CUDA kernels/runtime + user ranges only: low dilation (needs --device cuda)",
    "kernels": "CUDA kernels/runtime only; steps from marker runtime calls: lowest dilation (needs --device cuda)",
    "cpu": "CPU activity only, every op, record_shapes (the mode for CPU/gloo runs)",
    "ranges": "user ranges only (steps, regions, comm ranges): no op tracing",
    "nvtx": "no torch.profiler, NVTX ranges only (used under nsys)",
}

#: Environment variables tracekit sets for `tracekit capture -- python my_decode.py`.
ENV_DIR = "TRACEKIT_CAPTURE_DIR"
ENV_MODE = "TRACEKIT_CAPTURE_MODE"
ENV_WARMUP = "TRACEKIT_CAPTURE_WARMUP"
#: Which `tracekit.profile()` blocks record: "unprofiled" (only `profiled=False` blocks), "traced"
#: (only profiled blocks), unset or "both" (all). `tracekit capture --nsys -- SCRIPT` runs the script
#: twice: a plain run with "unprofiled", then the run under nsys with "traced" (see runner.capture_script).
#: While it is set, annotate ranges outside a recording block open nothing.
ENV_PASSES = _annotate.ENV_PASSES
PASSES = ("both", "unprofiled", "traced")


def resolve_mode(mode: str, device_type: str) -> str:
    """The concrete mode for `mode` on a `device_type` ("cpu" or "cuda") run."""
    if mode not in MODES:
        raise CaptureError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "auto":
        return "cuda" if device_type == "cuda" else "cpu"
    if mode in ("cuda", "kernels") and device_type != "cuda":
        raise CaptureError(
            f"mode {mode!r} traces CUDA activity and needs a CUDA device (use --mode cpu or ranges)"
        )
    return mode


#: The runtime call a `kernels`-mode step marker makes, as its name appears in the trace.
MARKER_API = "cudaStreamQuery"
#: args of the step annotations `inject_marker_steps` adds.
MARKER_SOURCE = "tracekit step markers (cudaStreamQuery at step open/close)"


def inject_marker_steps(doc: KinetoTrace, names: list[str], marker: str = MARKER_API) -> int:
    """Add a `user_annotation` event per step to a Kineto trace document `doc` (in place).

    `names` are the step names in the order their markers were made (each step: one marker call
    when its range opened, one when it closed). The trace holds the marker calls as `cuda_runtime`
    events named `marker`; on the thread with the most of them, consecutive pairs (open, close)
    become step annotations from the open's `ts` to the close's end. Pairs are matched from the
    end, so markers lost at the start of the recording (the profiler's warm-up) drop whole steps,
    never shift names. Returns the number of steps added.
    """
    events = doc.get("traceEvents") or []
    marks = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and e.get("name") == marker and "ts" in e
    ]
    if not marks or not names:
        return 0
    by_tid: dict[tuple[int | str | None, int | str | None], list[KinetoEvent]] = {}
    for e in marks:
        by_tid.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    thread = max(by_tid.values(), key=len)
    thread.sort(key=lambda e: float(e["ts"]))
    if len(thread) % 2:
        thread = thread[1:]  # a close whose open fell before the recording started
    pairs = [(thread[i], thread[i + 1]) for i in range(0, len(thread), 2)]
    n = min(len(pairs), len(names))
    added: list[KinetoEvent] = []
    for (a, b), name in zip(pairs[len(pairs) - n :], names[len(names) - n :], strict=True):
        ts = float(a["ts"])
        end = float(b["ts"]) + float(b.get("dur", 0))
        added.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": a["pid"],
                "tid": a["tid"],
                "ts": a["ts"],
                "dur": round(end - ts, 3),
                "args": {"source": MARKER_SOURCE},
            }
        )
    events.extend(added)
    doc["traceEvents"] = events
    return len(added)


@contextlib.contextmanager
def _user_scope_only() -> Iterator[None]:
    """While active, torch profilers enabled from Python record only USER_SCOPE RecordFunctions."""
    import torch.autograd.profiler as ap
    from torch._C._profiler import RecordScope

    orig = ap._enable_profiler

    def enable(config: Any, activities: Any, scopes: Any = None) -> Any:
        return orig(config, activities, {RecordScope.USER_SCOPE})  # type: ignore[call-arg]

    ap._enable_profiler = enable  # type: ignore[assignment]
    try:
        yield
    finally:
        ap._enable_profiler = orig


class Tracer:
    """torch.profiler for one rank: `warmup` steps not recorded, then the rest until `stop()`.

    Call `start()` before the first step, `step()` at the start of every later step, and `stop()`
    after the last; the trace lands at out_dir/rank-<r>.pt.trace.json.gz (temporary name, then
    rename). Mode "nvtx" makes every call a no-op.

    `keep=False` (the profiled rounds of `tracekit capture --rounds K` before the traced one):
    the profiler runs exactly as for a kept trace (same mode, schedule, ranges), so its steps are
    timed under the same conditions, but the recording is dropped instead of exported: no file is
    written and `stop()` returns None. The export is skipped at the schedule step that ends the
    recording, which runs between steps, outside every timed step.
    """

    def __init__(
        self,
        mode: str,
        device_type: str,
        out_dir: Path,
        rank: int,
        warmup: int = 1,
        active: int = 0,
        keep: bool = True,
    ):
        self.mode = resolve_mode(mode, device_type)
        self.device_type, self.out_dir, self.rank = device_type, Path(out_dir), rank
        self.warmup, self.active = max(int(warmup), 0), int(active)
        self.keep = keep
        self.recorded = False  # the schedule ended a recording (kept or dropped)
        self.prof: Any = None
        self.trace_path: Path | None = None
        self._user_scope = self.mode in ("cuda", "ranges")
        self.marked_steps: list[str] = []  # kernels mode: step names in marker order
        self.injected_steps = 0
        self._marker_fn: Callable[[], Any] | None = None

    def _scope(self) -> contextlib.AbstractContextManager[None]:
        return _user_scope_only() if self._user_scope else contextlib.nullcontext()

    def _on_ready(self, prof: Any) -> None:
        self.recorded = True
        if not self.keep:  # a timing-only round: nothing exported
            if self.mode == "kernels":
                self._unhook()
            return
        final = self.out_dir / trace_name(self.rank)
        tmp = self.out_dir / f".rank-{self.rank}.{os.getpid()}.pt.trace.json"
        try:
            prof.export_chrome_trace(str(tmp))
            _check_export_whole(tmp, self.rank)
            if self.mode == "kernels":
                self._unhook()
                doc = json.loads(tmp.read_text())
                self.injected_steps = inject_marker_steps(doc, self.marked_steps)
                tmp.write_text(json.dumps(doc))
            gzip_file_atomic(tmp, final)
        except BaseException:  # a full disk: the raw export goes too; the trace name never existed
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self.trace_path = final

    def _mark(self, name: str, opening: bool) -> None:
        if opening:
            self.marked_steps.append(name)
        if self._marker_fn is not None:
            self._marker_fn()

    def _hook(self) -> None:
        """kernels mode: step ranges make marker calls; record_function is skipped."""
        import torch

        stream = torch.cuda.current_stream()
        self._marker_fn = stream.query
        _annotate._step_marker = self._mark
        _annotate._record_ranges = False

    def _unhook(self) -> None:
        if _annotate._step_marker == self._mark:
            _annotate._step_marker = None
            _annotate._record_ranges = True

    def start(self) -> None:
        if self.mode == "nvtx":
            return
        import torch
        from torch.profiler import ProfilerActivity

        cuda = self.device_type == "cuda"
        acts = []
        if self.mode in ("full", "cpu", "ranges", "cuda"):
            acts.append(ProfilerActivity.CPU)  # in "cuda"/"ranges": user ranges only (see _user_scope_only)
        if cuda and self.mode in ("full", "cuda", "kernels"):
            acts.append(ProfilerActivity.CUDA)
        experimental = None  # torch.profiler.profile's defaults where these are None
        if self.mode == "full" and cuda and hasattr(torch.profiler, "_ExperimentalConfig"):
            with contextlib.suppress(TypeError):
                experimental = torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        schedule = None
        if self.warmup > 0:
            active = self.active if self.active > 0 else 1 << 30
            schedule = torch.profiler.schedule(wait=0, warmup=self.warmup, active=active, repeat=1)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prof = torch.profiler.profile(
            activities=acts,
            record_shapes=self.mode in ("full", "cpu"),
            experimental_config=experimental,
            schedule=schedule,
            on_trace_ready=self._on_ready,
        )
        if self.mode == "kernels":
            self._hook()
        with self._scope(), _inductor_not_imported_to_start():
            self.prof.start()

    def step(self) -> None:
        if self.prof is not None:
            with self._scope():
                self.prof.step()

    def stop(self) -> Path | None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            try:
                with self._scope():
                    prof.stop()
            finally:
                self._unhook()
            if self.trace_path is None and not (self.recorded and not self.keep):
                # stopped before any recorded step: nothing was saved
                raise CaptureError(
                    f"rank {self.rank}: the profiler recorded no step (warm-up {self.warmup} steps "
                    "covered the whole loop); run more steps or lower the warm-up"
                )
        return self.trace_path


def _check_export_whole(path: Path, rank: int) -> None:
    """The profiler's C++ writer does not raise on a full disk: it logs "Failed to write to log
    file!", leaves its own `<path>.tmp` and writes no `path` (or, elsewhere, stops short). A
    missing export, or a JSON document that does not end in `}`, is not kept (gzipped and
    checksummed it would look complete): both names are removed and CaptureError says why."""
    tail = b""
    with contextlib.suppress(OSError):
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 256))
            tail = f.read().rstrip()
    if tail.endswith(b"}"):
        return
    for p in (path, path.with_name(path.name + ".tmp")):
        with contextlib.suppress(OSError):
            p.unlink()
    raise CaptureError(f"rank {rank}: the profiler could not write its trace{space_hint(path.parent)}")


@contextlib.contextmanager
def _inductor_not_imported_to_start() -> Iterator[None]:
    """Around `torch.profiler.profile.start()`: its `prepare_trace` asks `hasattr(torch, "_inductor")`
    to read inductor's `triton.cudagraphs` flag, and torch's lazy module attribute answers that by
    importing inductor and TorchDynamo: ~4.5 CPU-s in every rank process of every capture (on a
    2-core host most of a tiny CPU capture's cost), for a flag that only compiled code can use.
    Where inductor is not loaded in this process and TORCHINDUCTOR_CUDAGRAPHS (the flag's default,
    read when inductor's config is imported) is not "1", the flag would read False: the question
    is answered "not loaded" without the import, and the profiler keeps its `has_cudagraphs=False`.
    Otherwise (a compiled decoder has loaded inductor, or the variable is set) torch asks as it
    always does. Only `hasattr` as seen by torch.profiler's own module changes, for this call."""
    import builtins
    import sys

    import torch
    import torch.profiler.profiler as tpp

    if "torch._inductor" in sys.modules or os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1":
        yield
        return
    real = builtins.hasattr

    def hasattr_without_lazy_inductor(obj: object, name: str) -> bool:
        if obj is torch and name == "_inductor" and "torch._inductor" not in sys.modules:
            return False
        return real(obj, name)

    shadowed = "hasattr" in vars(tpp)
    before = vars(tpp).get("hasattr")
    tpp.hasattr = hasattr_without_lazy_inductor  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if shadowed:
            tpp.hasattr = before  # type: ignore[attr-defined]
        else:
            del tpp.hasattr  # type: ignore[attr-defined]


def space_hint(folder: Path) -> str:
    """ " (no space left on DEVICE of FOLDER: N bytes free)" when the folder's disk is (nearly) full."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free < (1 << 20):
        return f" (no space left in {folder}: {free} bytes free)"
    return " (its export is missing or cut short)"


# -- per-rank result files (tracekit.capture.rank_result) -----------------------------------------
def error_result(rank: int, exc: BaseException) -> RankResult:
    """A rank's error for its result file: tracekit's own errors in their words (they name the
    rank already), others as `Type: message`; a full disk says so."""
    if isinstance(exc, TracekitError):
        message = " ".join(str(exc).split())
        message = message.removeprefix(f"rank {_current_rank()}: ")  # the manifest names the rank
    else:
        lines = [ln for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
        message = lines[-1].strip() if lines else repr(exc)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        message = f"no space left on the device writing {exc.filename or 'a file'}"
    return RankResult(rank=rank, error=RankError(message=message, traceback=traceback.format_exc()))


def _current_rank() -> int:
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    if "torch" not in sys.modules:  # no process group without torch (and no import of it for this)
        return 0
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    return 0


class Session:
    """One `tracekit.profile()` block: times each `annotate.step` and drives the tracer's schedule.

    `recording` is False for a block the capture told this process to skip (TRACEKIT_CAPTURE_PASSES):
    its body still runs (a with-block cannot be skipped) but opens no ranges, times nothing and
    writes nothing; a script may test `session.recording` to skip the work itself.
    """

    def __init__(
        self,
        out_dir: Path,
        rank: int,
        mode: str,
        warmup: int,
        profiled: bool,
        sync: bool,
        recording: bool = True,
    ):
        # torch as the script has it: a loop without torch does not import it (~3 CPU-s), and CUDA
        # is initialised only where torch was imported; a profiled block's tracer imports it itself
        torch: Any = sys.modules.get("torch")

        self.out_dir, self.rank, self.profiled, self.sync = out_dir, rank, profiled, sync
        self.recording = recording
        self.cuda = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
        self._synchronize: Callable[[], None] | None = (
            torch.cuda.synchronize if (sync and self.cuda and recording) else None
        )
        self.tracer = (
            Tracer(mode, "cuda" if self.cuda else "cpu", out_dir, rank, warmup=warmup)
            if profiled and recording
            else None
        )
        self.mode = self.tracer.mode if self.tracer else "unprofiled"
        self.warmup = warmup if profiled else 0
        # nvtx mode (under nsys): no profiler schedule hides the warm-up steps, so they open no
        # range; the report then holds exactly the steps whose times are in `profiled_ns`
        self._mute_warmup = self.mode == "nvtx"
        self.steps_seen = 0
        self.step_ns: list[int] = []
        self._t0 = 0

    def step_begin(self, i: int) -> None:
        if not self.recording:
            return
        if self.steps_seen > 0 and self.tracer is not None:
            self.tracer.step()
        if self._mute_warmup:
            _annotate._muted = self.steps_seen < self.warmup
        self.steps_seen += 1
        self._t0 = time.perf_counter_ns()

    def step_end(self, i: int) -> None:
        if not self.recording:
            return
        if self._synchronize is not None:
            self._synchronize()
        self.step_ns.append(time.perf_counter_ns() - self._t0)
        if self._mute_warmup:
            _annotate._muted = False  # inside a recording block


def passes_from_env() -> str:
    """TRACEKIT_CAPTURE_PASSES: "both" when unset. CaptureError for another value."""
    passes = os.environ.get(ENV_PASSES) or "both"
    if passes not in PASSES:
        raise CaptureError(f"{ENV_PASSES}={passes!r}: expected one of {', '.join(PASSES)}")
    return passes


@contextlib.contextmanager
def profile(
    out_dir: str | Path | None = None,
    *,
    mode: str | None = None,
    warmup: int | None = None,
    profiled: bool = True,
    rank: int | None = None,
    sync: bool = True,
) -> Iterator[Session]:
    """Profile a decode loop whose steps are marked with `tracekit.annotate.step(i)`.

        import tracekit
        from tracekit import annotate
        with tracekit.profile(profiled=False):      # per-token times, no profiler
            for i in range(32):
                with annotate.step(i): decode_one()
        with tracekit.profile():                    # the trace (first `warmup` steps not recorded)
            for i in range(32):
                with annotate.step(i): decode_one()

    Under `tracekit capture --out DIR -- python script.py`, the folder, mode and warm-up come from
    the environment tracekit sets (TRACEKIT_CAPTURE_DIR/MODE/WARMUP); otherwise from the arguments
    (defaults: ./tracekit-trace, auto, 1). Each rank (RANK, or torch.distributed's rank) writes
    rank-<r>.pt.trace.json.gz and a result file that `tracekit capture` turns into manifest.json.
    `sync=True` synchronises the CUDA device at the end of each step so step times are real.

    TRACEKIT_CAPTURE_PASSES (set by `tracekit capture --nsys -- SCRIPT`) makes the blocks of the
    other kind inert: "unprofiled" (the plain run) records only `profiled=False` blocks, "traced"
    (the run under nsys) only profiled ones, so nsys sees no range of the unprofiled pass. An inert
    block's body still runs but opens no range and writes nothing (`session.recording` is False).
    """
    out = Path(out_dir or os.environ.get(ENV_DIR) or "tracekit-trace")
    out.mkdir(parents=True, exist_ok=True)
    mode = mode or os.environ.get(ENV_MODE) or "auto"
    warm = int(warmup if warmup is not None else os.environ.get(ENV_WARMUP, "1"))
    r = _current_rank() if rank is None else rank
    if _annotate._session is not None:
        raise CaptureError("tracekit.profile() blocks cannot be nested")
    passes = passes_from_env()
    recording = passes == "both" or (passes == "traced") == profiled
    session = Session(out, r, mode, warm, profiled, sync, recording=recording)
    if session.tracer is not None:
        session.tracer.start()
    _annotate._session = session
    _annotate._muted = not recording
    try:
        yield session
    except BaseException as exc:
        write_result(out, error_result(r, exc))
        if session.tracer is not None:
            with contextlib.suppress(Exception):
                session.tracer.stop()
        raise
    finally:
        _annotate._session = None
        _annotate._muted = _annotate._muted_outside
    if not recording:
        return
    if session.tracer is not None:
        path = session.tracer.stop()
        entry = file_entry(path, r) if path is not None else None
        write_result(
            out,
            RankResult(
                rank=r,
                profiled_ns=session.step_ns[session.warmup :],
                mode=session.mode,
                trace=path.name if path else None,
                file=entry,
                device="cuda" if session.cuda else "cpu",
                pid=os.getpid(),
            ),
        )
    else:
        write_result(out, RankResult(rank=r, unprofiled_ns=session.step_ns, pid=os.getpid()))


__all__ = [
    "MARKER_API",
    "MODES",
    "PASSES",
    "Session",
    "Tracer",
    "inject_marker_steps",
    "profile",
    "resolve_mode",
    "write_result",
]
