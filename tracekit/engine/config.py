"""The engine's configuration: where an analysis runs (`Engine`, what the CLI's `--engine /
--scheduler / --workers` build) and its error. A module of its own so that the executors
(`executor`, `dask_engine`) take it without importing the analyses (`tracekit.engine`)."""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.errors import TracekitError

__all__ = ["ENGINES", "Engine", "EngineError"]

ENGINES: tuple[str, ...] = ("local", "dask")


class EngineError(TracekitError):
    """The engine cannot run (Dask not installed, scheduler unreachable, a bad setting)."""


@dataclass(frozen=True)
class Engine:
    """Where the analysis runs."""

    kind: str = "local"  # "local" (this process + the reader's process pool) or "dask"
    scheduler: str | None = (
        None  # address of a running Dask scheduler (tcp://host:8786); None: a LocalCluster
    )
    workers: int | None = None  # LocalCluster workers (default: the CPU count); ignored with `scheduler`
    processes: bool = True  # LocalCluster workers as processes; False: threads of this process (tests)
    threads_per_worker: int = 1  # LocalCluster threads per worker
    retries: int = 2  # times a task is retried when it fails or its worker is lost
    progress: bool = False  # a rich progress bar on stderr over the rank files done on all workers

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise EngineError(f"unknown engine {self.kind!r} (choose from {', '.join(ENGINES)})")
        if self.workers is not None and self.workers < 1:
            raise EngineError(f"--workers must be at least 1, not {self.workers}")

    @classmethod
    def parse(
        cls,
        kind: str | None = None,
        scheduler: str | None = None,
        workers: int | None = None,
        *,
        progress: bool = False,
    ) -> Engine:
        """The engine the CLI options ask for: `--scheduler` or `--workers` without `--engine`
        mean dask; `--engine local` with either is refused (EngineError)."""
        if kind is None:
            kind = "dask" if (scheduler or workers is not None) else "local"
        if kind == "local" and (scheduler or workers is not None):
            raise EngineError("--scheduler and --workers apply to --engine dask, not --engine local")
        return cls(kind=kind, scheduler=scheduler, workers=workers, progress=progress)
