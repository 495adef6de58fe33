"""Step windows of a run (docs/METHOD.md section Steps and the partition).

`find_steps(events, pattern)` finds the step windows. `pattern` is `auto` (the default, also None),
`whole`, or a regex of host annotations. `auto` tries, in order (`STEP_RULES`), and says which
rule chose the steps (`StepsResult.rule`, a data-quality note):

1. `decode_step` annotations (tracekit's own captures);
2. `ProfilerStep#N` (torch.profiler's `schedule`);
3. a serving engine's per-iteration range (`SERVING_ENGINE_PATTERN`): vLLM `execute_model` and its
   per-batch `execute_<n>_context_<n>(...)_generation_<n>(...)` range, SGLang `step[DECODE bs=N]`,
   TensorRT-LLM's PyExecutor `_forward_step`;
4. one CUDA-graph launch per iteration: `cudaGraphLaunch` / `hipGraphLaunch` calls, grouped by their
   period (the number of GPU operations each launch ran repeats every p launches -> p launches
   per step), each step from its first launch to the next step's first launch;
5. NVTX / user ranges that repeat: names equal up to their numbers (`Step 0 to 10`, `Step 10 to 20`),
   the group that covers the most time (so the outermost repeating range);
6. else the whole trace as one window per rank (its first to its last GPU operation, or host event
   on a rank without GPU activity).

`whole` skips to rule 6. A regex that matches nothing is a StepError (the user asked for it).

The windows of each rule: `tracekit.analyse.timeline.windows`; the rules' per-rank evidence and the
run's choice: `tracekit.analyse.timeline.rules`; the partition of each window:
`tracekit.analyse.timeline.partition`; step kinds: `tracekit.analyse.timeline.kinds`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracekit.analyse.timeline.partition import rank_selectors
from tracekit.analyse.timeline.rules import StepChoice, choose_step_rule, rank_step_summary, rule_note
from tracekit.analyse.timeline.windows import RankWindows, empty_step_rows, rank_step_windows
from tracekit.errors import StepError
from tracekit.model.events import DataQuality


@dataclass
class StepsResult:
    """find_steps' table plus what it noticed (for Breakdown.data_quality)."""

    steps: pd.DataFrame
    pattern: str
    data_quality: DataQuality = field(default_factory=DataQuality)
    rule: str = "pattern"  # which rule chose the steps: one of STEP_RULES, or "pattern" (a given regex)


def find_steps(events: pd.DataFrame, pattern: str | None = None) -> pd.DataFrame:
    """Step windows: columns STEP_COLUMNS (one row per rank and step, sorted by rank then start).
    `end_ns` is the window's end; `annotation_end_ns` the annotation's; `gpu_end_ns` the later of
    that and the end of the GPU work launched inside the annotation, before the clip at the next
    step's start. Raises StepError when no annotation matches."""
    return find_steps_detailed(events, pattern).steps


def find_steps_detailed(events: pd.DataFrame, pattern: str | None = None) -> StepsResult:
    """find_steps plus the pattern used, the rule that chose it and data-quality counts.

    `pattern`: None or "auto" (the rules of STEP_RULES in order), "whole" (one window per rank),
    or a regex of step annotations (StepError when nothing matches).

    Computed in three pieces, the ones the Dask engine runs where the events are: per rank a small
    summary of which rules it matches (`rank_step_summary`); the run's rule from those summaries
    (`choose_step_rule`: the first rule any rank matches); per rank its windows under that rule
    (`rank_step_windows`); then the run's table and notes from the ranks' windows (`assemble_steps`)."""
    parts = [
        (int(r), events.iloc[sel])
        for r, sel in sorted(rank_selectors(events["rank"].to_numpy(np.int64)).items())
    ]
    choice = choose_step_rule([rank_step_summary(ev, pattern) for _r, ev in parts], pattern)
    return assemble_steps(choice, [rank_step_windows(ev, choice) for _r, ev in parts])


def assemble_steps(choice: StepChoice, ranks: Iterable[RankWindows]) -> StepsResult:
    """The run's step table and notes from its ranks' windows under `choice` (small inputs)."""
    ranks = sorted(ranks, key=lambda w: w.rank)
    frames = [w.rows for w in ranks if len(w.rows)]
    steps = pd.concat(frames, ignore_index=True) if frames else empty_step_rows()
    dq = DataQuality()
    if choice.rule == "whole_trace":
        if not len(steps):
            raise StepError("the trace holds no timed events: there is no window to break down")
        dq.add("steps_rule", 0, f"{choice.why}; " + rule_note("whole_trace", "whole", steps))
        return StepsResult(steps, "whole", dq, "whole_trace")
    chosen = choice.pattern
    if not len(steps):  # never 0 steps silently: every later stage needs at least one window
        raise StepError(
            f"steps chosen by rule {choice.rule!r} (pattern {chosen!r}) but no rank has a window under it "
            "(pass --steps whole, or another --steps REGEX)"
        )
    nested = sum(w.nested for w in ranks)
    if nested:
        dq.add(
            "nested_step_annotations",
            nested,
            f"{nested} step annotations matching {chosen!r} lie inside another one on the same rank; "
            "the outermost were kept",
        )
    have = [w for w in ranks if len(w.rows)]
    numbered = bool(len(steps)) and all(w.numbered for w in ranks)
    duplicates = sum(w.duplicates for w in ranks) if numbered else 0
    if duplicates:
        per_rank = ", ".join(
            f"rank {w.rank}: {len(w.rows)} steps, {w.distinct_names} distinct names" for w in have
        )
        dq.add(
            "duplicate_step_numbers",
            duplicates,
            f"{duplicates} step annotations matching {chosen!r} repeat a step number already seen on the "
            f"same rank ({per_rank}); they are kept as separate steps, numbered in time order on each "
            "rank. The trace probably holds more than one pass (e.g. an nsys report from a capture "
            "before the --nsys fix, which recorded the unprofiled and the traced pass): its steps mix "
            "passes and its dilation is not meaningful; re-capture, or choose steps with --steps",
        )
    if numbered and not duplicates:
        steps["step"] = np.concatenate([w.number for w in have]).astype(np.int64)
    paced = [w for w in ranks if w.device_paced]
    if paced:
        n_paced = sum(len(w.rows) for w in paced)
        behind = sum(w.clipped for w in paced)
        behind_ns = sum(w.spill_ns for w in paced)
        dq.add(
            "step_windows_device_paced",
            n_paced,
            f"the GPU ran behind the host's step annotations on rank(s) {', '.join(str(w.rank) for w in paced)} "
            f"({behind} windows would have been clipped at the next annotation, {behind_ns} ns of a step's work ran "
            "after the next step's annotation began: an engine's overlap scheduler runs the host a step ahead): "
            "their step windows are taken from the device side, each from the first GPU operation its step "
            "launched to the first one the next step launched (the last: to the end of its own work), so a "
            "window holds the work its step launched (docs/METHOD.md, Serving engines)",
        )
    clipped = sum(w.clipped for w in ranks if not w.device_paced)
    spill_ns = sum(w.spill_ns for w in ranks if not w.device_paced)
    if clipped:
        dq.add("step_window_spill_ns", spill_ns)
        dq.add(
            "step_windows_clipped",
            clipped,
            f"{clipped} step windows were clipped at the next step's start on the same rank: the GPU "
            f"ran behind the host, and {spill_ns} ns of work launched in a step ran after the next step's "
            "annotation began. That time is counted in the window where it ran (windows of a rank never "
            "overlap), so a step window follows the host's annotations and the last step carries the "
            "backlog; per-token figures from such windows describe the host's pace, not the device's",
        )
    counts = steps.groupby("rank").size()
    if counts.nunique() > 1:
        dq.add(
            "ranks_with_different_step_counts",
            int(counts.nunique()),
            "ranks have different step counts: " + ", ".join(f"rank {r}: {c}" for r, c in counts.items()),
        )
    steps = steps.reset_index(drop=True)
    dq.add("steps_rule", 0, rule_note(choice.rule, chosen, steps))
    if choice.rule == "cuda_graph_launch":
        dq.add(
            "graph_launch_period",
            0,
            "CUDA-graph launches per step (the period of GPU operations per launch): "
            + ", ".join(f"rank {w.rank}: {w.period}" for w in have),
        )
    return StepsResult(steps, chosen, dq, choice.rule)
