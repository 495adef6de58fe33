"""Step and region ranges for decode loops: one NVTX range and one `record_function` together.

    from tracekit import annotate

    for i in range(tokens):
        with annotate.step(i):              # "decode_step#<i>": the analysis' default step pattern
            with annotate.region("attention"):
                ...

    @annotate.region("mlp")                 # as a decorator: a fresh range on every call
    def mlp(x): ...

Cost (benchmarks/bench_annotate.py): with no profiler attached a range is an NVTX push/pop (a few
hundred ns; nothing at all when neither the `nvtx` package nor a CUDA build of torch is present)
plus one check of the profiler state. `torch.profiler.record_function` is entered only while a
torch profiler is active, because it alone costs several microseconds per range even when nothing
records it (ISSUE 9: 9-12 us on the H200 host).

Under a `tracekit.profile()` session, `step(i)` also tells the session where each step begins and
ends (host wall time per token, and the profiler schedule's step boundary). Under
`tracekit capture --nsys -- SCRIPT` ranges open only inside the block being recorded (`_muted`).

Ranges import no torch: a loop that does not use torch (timed under `tracekit.profile()`, or NVTX
ranges under nsys) never pays torch's import (~3 CPU-s). torch's `record_function` and profiler
state are looked up once torch is imported (by the script, or by a profiled block's tracer): a
torch profiler cannot be active before that.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

#: Prefix of step range names; `step(i)` opens "decode_step#<i>".
STEP_PREFIX = "decode_step"

F = TypeVar("F", bound=Callable[..., Any])


class _Backend:
    """Resolved once, on first use: keeps `import tracekit.annotate` free of torch."""

    resolved = False
    push: Callable[[str], Any] | None = None
    pop: Callable[[], Any] | None = None
    profiler_enabled: Callable[[], bool] = staticmethod(lambda: False)  # type: ignore[assignment]
    record_function: Any = None
    nvtx_source = "none"


#: The active tracekit.profile() session (set by tracekit.capture.profile), or None.
_session: Any = None

#: Set by a `kernels`-mode tracer (tracekit.capture.profile): called when a step range opens and
#: when it closes (a CUDA runtime call that the CUDA-only trace keeps), or None.
_step_marker: Callable[[str, bool], None] | None = None
#: Set by `tracekit capture --nsys -- SCRIPT` (see tracekit.capture.profile.profile): which
#: tracekit.profile() blocks record ("unprofiled" or "traced"; unset: all).
ENV_PASSES = "TRACEKIT_CAPTURE_PASSES"
#: While the capture picks the passes, ranges open only inside a recording tracekit.profile()
#: block: a script's own warm-up loop, also annotated, would otherwise land in the nsys report.
_muted_outside = os.environ.get(ENV_PASSES) in ("unprofiled", "traced")
#: True while ranges must not open at all (no NVTX push, no record_function): outside a recording
#: block as above, inside a block the capture told this process not to record, or during an
#: `nvtx`-mode warm-up step. Under nsys every NVTX range a process pushes lands in the report.
_muted = _muted_outside
#: False while a tracer records no host ranges (`kernels` mode): `record_function` is skipped even
#: though a torch profiler is active, since nothing would record it.
_record_ranges = True


def _resolve() -> None:
    b = _Backend
    try:
        import nvtx  # type: ignore[import-not-found]

        b.push, b.pop = nvtx.push_range, nvtx.pop_range
        b.nvtx_source = "nvtx"
    except ImportError:
        b.push = b.pop = None
    if "torch" in sys.modules:
        _resolve_torch()
    else:  # no torch here (yet): no torch profiler can be active; looked up again once there is
        b.record_function = _torch_later
        b.profiler_enabled = staticmethod(_torch_later)  # type: ignore[assignment]
    b.resolved = True


def _torch_later(*_: Any) -> bool:
    """The profiler check while torch was not imported: still not, no profiler; imported since, the
    torch part resolved now (record_function and the real check replace this) and asked."""
    if "torch" not in sys.modules:
        return False
    _resolve_torch()
    return bool(_Backend.profiler_enabled())


def _resolve_torch() -> None:
    b = _Backend
    try:
        import torch

        if b.push is None and torch.cuda.is_available():
            b.push, b.pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
            b.nvtx_source = "torch.cuda.nvtx"
        b.record_function = torch.profiler.record_function
        enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
        if enabled is None:  # older torch: the Python-level flag
            import torch.autograd.profiler as ap

            b.profiler_enabled = staticmethod(ap._is_profiler_enabled.__bool__)  # type: ignore[assignment]
        else:
            b.profiler_enabled = enabled  # type: ignore[assignment]
    except ImportError:
        b.record_function = None
        b.profiler_enabled = staticmethod(lambda: False)  # type: ignore[assignment]


class Range:
    """One open-able range. Re-entrant use of one object is not supported; decorators make a new one."""

    __slots__ = ("name", "_rf", "_step", "_pushed")

    def __init__(self, name: str, step: int | None = None):
        self.name = name
        self._rf: Any = None
        self._step = step
        self._pushed = False

    def __enter__(self) -> Range:
        b = _Backend
        if not b.resolved:
            _resolve()
        if self._step is not None:
            if _session is not None:
                _session.step_begin(self._step)
            if _step_marker is not None:
                _step_marker(self.name, True)
        if _muted:  # nothing records here (see _muted): no NVTX range, no record_function
            return self
        if b.push is not None:
            b.push(self.name)
            self._pushed = True
        if b.record_function is not None and _record_ranges and b.profiler_enabled():
            rf = b.record_function(self.name)
            rf.__enter__()
            self._rf = rf
        return self

    def __exit__(self, *exc: object) -> None:
        rf = self._rf
        if rf is not None:
            self._rf = None
            rf.__exit__(None, None, None)
        if self._pushed:
            self._pushed = False
            _Backend.pop()  # type: ignore[misc]
        if self._step is not None:
            if _step_marker is not None:
                _step_marker(self.name, False)
            if _session is not None:
                _session.step_end(self._step)

    def __call__(self, fn: F) -> F:
        name, step = self.name, self._step

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Range(name, step):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def step(i: int) -> Range:
    """The range of decode step `i`, named "decode_step#<i>" (context manager or decorator)."""
    return Range(f"{STEP_PREFIX}#{i}", i)


def region(name: str) -> Range:
    """A named range inside a step, e.g. "attention", "mlp", "all_reduce" (context manager or decorator)."""
    return Range(name)


def nvtx_source() -> str:
    """Which NVTX implementation the ranges use: "nvtx", "torch.cuda.nvtx" or "none"."""
    if not _Backend.resolved:
        _resolve()
    return _Backend.nvtx_source


__all__ = ["STEP_PREFIX", "Range", "nvtx_source", "region", "step"]
