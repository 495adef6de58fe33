"""The view of `tracekit study`'s outcome (`pipeline.study.StudyResult`): what it concluded, what
to look at next, the profiler's dilation, its notes and where its reports are; on a machine
without GPUs, the committed two-H200 runs' verdicts beside the CPU's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class StudyOutcome(Protocol):
    """What the view reads of a study's result (`pipeline.study.StudyResult` has it)."""

    @property
    def verdict(self) -> str: ...
    @property
    def diagnosis(self) -> str: ...
    @property
    def dilation_sentence(self) -> str: ...
    @property
    def dilation_warning(self) -> str | None: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def reports(self) -> list[Path]: ...


def text(
    result: StudyOutcome, bundle_note: str | None = None, gpu_verdicts: Sequence[tuple[str, str]] = ()
) -> str:
    """The lines `tracekit study` prints when it is done: a blank line, the verdict, `Next:` the
    diagnosis (when there is one), the dilation sentence and its warning, `note:` each note,
    `report:` each report, `note:` the plotly bundle's note; then, with `gpu_verdicts` (label,
    verdict), the real-GPU findings under a line that says the verdict above is the CPU's."""
    lines = ["", result.verdict]
    if result.diagnosis:
        lines.append(f"Next: {result.diagnosis}")
    lines.append(result.dilation_sentence)
    if result.dilation_warning:
        lines.append(result.dilation_warning)
    lines += [f"note: {n}" for n in result.notes]
    lines += [f"report: {p}" for p in result.reports]
    if bundle_note:
        lines.append(f"note: {bundle_note}")
    if gpu_verdicts:
        lines += ["", "The verdict above is this machine's CPU (gloo) run. On real GPUs (committed traces):"]
        for label, verdict in gpu_verdicts:
            lines += [f"- {label}", f"  {verdict}"]
    return "\n".join(lines) + "\n"
