"""The sweep options of `probe` and `compare-links`, declared once (see cli/options.py for the rest)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import click

from tracekit.cli.options import OutputPath, output_option

# -- the sweep options of `probe` and `compare-links`, declared once ---------------------------------


class OptionSettings(TypedDict, total=False):
    """The click settings of one sweep option (`click.option`'s keywords that these use)."""

    type: type | click.ParamType
    default: object
    show_default: bool
    help: str


#: option -> (its names, its click settings); `sweep_options` applies them in this order
SWEEP_OPTIONS: dict[str, tuple[tuple[str, ...], OptionSettings]] = {
    "gpus": (
        ("--gpus",),
        {"default": None, "help": "GPUs to use, one per rank, e.g. 0,1 [rank r on GPU r]."},
    ),
    "op": (
        ("--op", "op_text"),
        {"default": "all_reduce", "show_default": True, "help": "Ops to sweep (comma list or 'all')."},
    ),
    "min": (
        ("--min", "min_text"),
        {"default": "8", "show_default": True, "help": "Smallest size (K/M/G suffixes)."},
    ),
    "max": (
        ("--max", "max_text"),
        {"default": None, "help": "Largest size (K/M/G suffixes) [1G on CUDA, 16M on CPU]."},
    ),
    "factor": (
        ("--factor",),
        {"default": 2, "show_default": True, "type": int, "help": "Size multiplier between steps."},
    ),
    "iters": (
        ("--iters",),
        {"default": 20, "show_default": True, "type": int, "help": "Timed iterations per size."},
    ),
    "warmup": (
        ("--warmup",),
        {"default": 5, "show_default": True, "type": int, "help": "Warm-up iterations per size."},
    ),
    "dtype": (
        ("--dtype",),
        {
            "default": "float32",
            "show_default": True,
            "help": "float32, float16, bfloat16, float64, int32, int64, int8, uint8.",
        },
    ),
    "device": (
        ("--device",),
        {"type": click.Choice(["auto", "cuda", "cpu"]), "default": "auto", "show_default": True},
    ),
    "ranks": (
        ("--ranks",),
        {"default": None, "type": int, "help": "Ranks (processes) [GPUs visible on CUDA, 2 on CPU]."},
    ),
    "nccl_debug": (
        ("--nccl-debug",),
        {
            "type": click.Choice(["init", "tuning"]),
            "default": "init",
            "show_default": True,
            "help": "NCCL logging in the timed sweeps: init = INIT,GRAPH (the transport, nothing per call); "
            "tuning = INIT,GRAPH,TUNING (a host log line per call, which inflates small-size times).",
        },
    ),
    "algo_pass": (
        ("--algo-pass/--no-algo-pass",),
        {
            "default": True,
            "show_default": True,
            "help": "NCCL: read algorithm/protocol per size from a separate un-timed TUNING pass (one call per "
            "size).",
        },
    ),
    "graph": (
        ("--graph/--no-graph",),
        {
            "default": False,
            "show_default": True,
            "help": "CUDA/NCCL: capture the timed iterations in a CUDA graph and time its replay (nccl-tests "
            "-G): no host launch per call, so small sizes show the link's latency, not Python's launch rate "
            "(~35-45 us per Python call).",
        },
    ),
    "log_dir": (
        ("--log-dir",),
        {
            "type": click.Path(file_okay=False, path_type=Path),
            "default": None,
            "help": "Keep NCCL's logs here (one subfolder per mode) [a temporary folder].",
        },
    ),
    "progress": (
        ("--progress/--no-progress",),
        {"default": None, "help": "Progress bar over sizes [on when stderr is a terminal]."},
    ),
}


sweep_output_option = output_option(
    "out",
    type=OutputPath(path_type=Path),
    default=None,
    metavar="FILE",
    help="Write the result to FILE (the table then goes to stderr).",
)


def sweep_options(**overrides: OptionSettings) -> Callable[[Any], Any]:
    """The options `probe` and `compare-links` share (the sweep: sizes, iterations, dtype, device,
    ranks, NCCL logging, CUDA-graph timing, progress), declared once here; `overrides` maps an
    option (a key of the table above) to the settings that differ for one command (its default,
    its help, the choices it takes)."""
    unknown = set(overrides) - set(SWEEP_OPTIONS)
    assert not unknown, unknown

    def apply(func: Any) -> Any:
        for key, (names, settings) in reversed(list(SWEEP_OPTIONS.items())):
            merged: OptionSettings = {**settings, **overrides.get(key, {})}
            func = click.option(*names, **merged)(func)
        return func

    return apply


def fork_cpu_ranks() -> None:
    """A CPU sweep's ranks forked from the capture's fork server (torch imported once per process,
    tracekit.capture.starter) rather than spawned, as a CPU capture's ranks are; where the capture
    spawns ($TRACEKIT_CAPTURE_START=spawn, or no fork server on this OS) the sweep spawns too."""
    import os

    from tracekit.capture.runner import ENV_START
    from tracekit.probe import sweep

    if os.environ.get(ENV_START, "fork-server") == "spawn":
        sweep.cpu_rank_starter = None
        return
    try:
        from tracekit.capture.starter import Starter
    except ImportError:  # no fork server where fds cannot be passed between processes (Windows)
        sweep.cpu_rank_starter = None
    else:
        sweep.cpu_rank_starter = Starter
