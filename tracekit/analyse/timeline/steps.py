"""Step windows and the exact partition of each step (docs/METHOD.md section Steps and the partition).

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

For annotation rules, one window per annotation and rank. A
window starts at its annotation and ends at the later of the annotation's end and the end of the
last GPU operation launched inside it (runtime calls within the annotation joined to GPU activity
by `correlation`), but never after the next step's annotation starts on the same rank: the windows
of a rank do not overlap, so no nanosecond is counted in two steps. When the GPU runs behind the
host, the work of a step that spills past the next annotation's start is counted in the next
window (it occupies the device then); data quality counts the clipped windows
(`step_windows_clipped`) and the spilled time (`step_window_spill_ns`). Where at least half of a
rank's windows would be clipped (`DEVICE_PACED_MIN_SHARE`) and every step launched GPU work, in
step order (an engine's overlap scheduler runs the host a step ahead), the rank's windows come from the device side instead: step k from the
first GPU operation it launched to the first one step k+1 launched, the last to the end of its own
work (`_device_paced`, `step_windows_device_paced`; docs/METHOD.md, Serving engines).

`step_kind(name)` reads a serving engine's step kind, batch and tokens from its range name
(SGLang `step[EXTEND bs=1 toks=128]`, vLLM `execute_<n>_context_<c>(...)_generation_<g>(...)`);
`token_steps` picks the per-token steps (the decode steps of one batch size), `kinds_summary`
reports the steps per kind.

`partition_steps(classified_events, steps)` splits every window, nanosecond by nanosecond, into
compute / memory / collective / unknown / sync / idle by priority
compute > memory > collective > unknown > sync > idle, and reports `overlapped_collective_ns`
(collective time hidden under compute or memory). Parts sum to the window exactly (asserted).

The activity timeline of a rank is its GPU activity (kernels, memcpy, memset; all streams), plus
the host's blocking sync calls for `sync`. A rank without any GPU activity (a CPU / gloo run) uses
its host timeline instead: CPU ops are compute, gloo / c10d collective ops are collective (and the
CPU ops nested inside a collective op on the same thread are part of it), blocking calls are sync.

Cost: one sort of the rank's intervals, a linear merge per priority level, and a binary search per
window edge: O(n log n + steps log n), never events x steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse import intervals
from tracekit.classify.rules import GPU_KINDS
from tracekit.errors import StepError
from tracekit.model.events import DataQuality
from tracekit.model.parts import PARTS

#: Patterns tried in order when none is given (the first two rules of `auto`).
DEFAULT_STEP_PATTERNS: tuple[str, ...] = (r"decode_step", r"ProfilerStep#\d+")
#: Serving engines' per-iteration ranges (rule 3 of `auto`). Names from the engines' sources and
#: traces: vLLM's worker `execute_model` and the v1 model runner's per-batch annotation
#: (`execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(...)`, seen in the TraceLens SGLang
#: trace), SGLang's `step[DECODE bs=32]` (the same trace), TensorRT-LLM's PyExecutor
#: `@nvtx_range("_forward_step")` (tensorrt_llm/_torch/pyexecutor/model_engine.py).
SERVING_ENGINE_PATTERN = (
    r"^execute_(?:model\b|\w)|^step\[(?:DECODE|EXTEND|PREFILL|MIXED|IDLE|TARGET_VERIFY)\b|^_forward_step\b"
)
#: Runtime calls that launch a CUDA / HIP graph (rule 4 of `auto`).
GRAPH_LAUNCH_PATTERN = r"^(?:cuda|hip|cu)GraphLaunch(?:_v\d+|_ptsz)?$"
#: The rules of `auto`, in order; `pattern` for an explicit regex.
STEP_RULES: tuple[str, ...] = (
    "decode_step",
    "profiler_step",
    "serving_engine",
    "cuda_graph_launch",
    "repeated_range",
    "whole_trace",
)
_RULE_WORDS: dict[str, str] = {
    "decode_step": "the `decode_step` annotations",
    "profiler_step": "torch.profiler's `ProfilerStep#N` ranges",
    "serving_engine": "the serving engine's per-iteration ranges",
    "cuda_graph_launch": "one CUDA-graph launch period per iteration",
    "repeated_range": "the NVTX / user ranges that repeat",
    "whole_trace": "no step markers: the whole trace as one window per rank",
    # a regex: from --steps, or (no --steps) the capture's manifest.json workload.step_pattern
    "pattern": "the step pattern asked for: --steps, else the run's manifest.json workload.step_pattern",
}
#: Host ranges that are never steps when looking for repeated ranges (collectives' own ranges).
_NOT_STEP_RANGES = re.compile(r"^(?:nccl|rccl|gloo|mpi|ucc|xccl|c10d|record_param_comms|ProfilerStep)", re.I)

#: The columns of partition_steps' table, in order (also the breakdown's CSV columns).
PARTITION_COLUMNS: tuple[str, ...] = (
    "rank",
    "step",
    "name",
    "start_ns",
    "end_ns",
    "window_ns",
    *(f"{p}_ns" for p in PARTS),
    "overlapped_collective_ns",
    "timeline",
)
_LAYERS: tuple[str, ...] = PARTS[:-1]

_STEP_NUMBER = re.compile(r"(\d+)\s*$")

STEP_COLUMNS: tuple[str, ...] = (
    "rank",
    "step",
    "name",
    "start_ns",
    "end_ns",
    "annotation_end_ns",
    "gpu_end_ns",
)


def cat_mask(col: pd.Series, values: frozenset[str] | set[str] | tuple[str, ...]) -> np.ndarray:
    """Boolean array: `col` is one of `values`; for a categorical, computed on the codes (no
    per-event strings or hashing)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        hit = np.zeros(len(cats) + 1, dtype=bool)  # the extra last entry: code -1 (missing) -> False
        hit[: len(cats)] = [str(c) in values for c in cats]
        return hit[col.cat.codes.to_numpy()]
    return col.isin(list(values)).to_numpy()


def rank_selectors(ev_rank: np.ndarray) -> dict[int, slice | np.ndarray]:
    """rank -> the rows of that rank: a slice when the table is grouped by rank (readers and
    concat_runs write it so), else an index array (one stable argsort). O(n), not O(n x ranks)."""
    if not len(ev_rank):
        return {}
    if bool((ev_rank[1:] >= ev_rank[:-1]).all()):
        ranks = np.unique(ev_rank)
        lo = np.searchsorted(ev_rank, ranks, side="left")
        hi = np.searchsorted(ev_rank, ranks, side="right")
        return {int(r): slice(int(a), int(b)) for r, a, b in zip(ranks, lo, hi, strict=True)}
    order = np.argsort(ev_rank, kind="stable")
    sr = ev_rank[order]
    ranks = np.unique(sr)
    lo = np.searchsorted(sr, ranks, side="left")
    hi = np.searchsorted(sr, ranks, side="right")
    return {int(r): order[a:b] for r, a, b in zip(ranks, lo, hi, strict=True)}


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


def _mode(pattern: str | None) -> str:
    return "auto" if pattern is None or pattern.strip() in ("", "auto") else pattern


#: The annotation rules of `auto`, in order: (rule, pattern).
_ANNOTATION_RULES: tuple[tuple[str, str], ...] = (
    ("decode_step", DEFAULT_STEP_PATTERNS[0]),
    ("profiler_step", DEFAULT_STEP_PATTERNS[1]),
    ("serving_engine", SERVING_ENGINE_PATTERN),
)
_WHOLE_WHY = (
    "no step markers (no decode_step, ProfilerStep#N, serving-engine iteration range, repeated CUDA-graph "
    "launch or repeated NVTX range): the whole trace is one window per rank"
)


@dataclass
class RankStepSummary:
    """What one rank says about the step rules (small; `choose_step_rule` reads these).

    `matched`: the patterns tried on this rank that match one of its annotations (auto stops at
    the first rule the rank matches: a later rule can only be chosen when no rank matches an
    earlier one); `launches`: the rank has two or more CUDA-graph launches; `ranges`: per key of
    repeating host ranges (`range_key`: the escaped name, its numbers as `\\d+`), (time covered
    where it repeats, rows, repeats on this rank); `annotations`: annotation name -> count (only
    for an explicit pattern that matches nothing here, for the StepError's message)."""

    matched: list[str] = field(default_factory=list)
    launches: bool = False
    ranges: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    annotations: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepChoice:
    """The run's step rule (`choose_step_rule`): the rule, its pattern, and for `whole_trace` why."""

    rule: str
    pattern: str
    why: str = ""


def _annotations(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["kind"] == "annotation"]


def _compile(pat: str) -> re.Pattern[str]:
    try:
        return re.compile(pat)
    except re.error as exc:
        raise StepError(f"invalid step pattern {pat!r}: {exc}") from None


def _match_mask(ann: pd.DataFrame, rx: re.Pattern[str]) -> np.ndarray:
    """Which annotations' names `rx` finds (once per category)."""
    names = ann["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        names = names.astype("category")
    cats = [str(c) for c in names.cat.categories]
    codes = names.cat.codes.to_numpy()
    hit_cats = np.fromiter((bool(rx.search(c)) for c in cats), dtype=bool, count=len(cats))
    mask = np.zeros(len(ann), dtype=bool)
    if hit_cats.any():
        valid = codes >= 0
        mask[valid] = hit_cats[codes[valid]]
    return mask


def _graph_launch_mask(events: pd.DataFrame) -> np.ndarray:
    is_rt = cat_mask(events["kind"], ("runtime",))
    if not is_rt.any():
        return is_rt
    names = events["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        names = names.astype("category")
    rx = re.compile(GRAPH_LAUNCH_PATTERN)
    hit = np.array([bool(rx.search(str(c))) for c in names.cat.categories] + [False], dtype=bool)
    return is_rt & hit[names.cat.codes.to_numpy()]


def rank_step_summary(events: pd.DataFrame, pattern: str | None = None) -> RankStepSummary:
    """One rank's events: which of the rules `pattern` asks for it matches (`RankStepSummary`)."""
    mode = _mode(pattern)
    out = RankStepSummary()
    if mode == "whole":
        return out
    ann = _annotations(events)
    if mode != "auto":
        if _match_mask(ann, _compile(mode)).any():
            out.matched.append(mode)
        else:
            counts = ann["name"].astype(str).value_counts(sort=False)
            out.annotations = {str(k): int(v) for k, v in counts.items() if v > 0}
        return out
    for _rule, pat in _ANNOTATION_RULES:
        if _match_mask(ann, re.compile(pat)).any():
            out.matched.append(pat)
            return out
    if int(_graph_launch_mask(events).sum()) >= 2:
        out.launches = True
        return out
    out.ranges = _range_groups(ann)
    return out


def choose_step_rule(summaries: Iterable[RankStepSummary], pattern: str | None = None) -> StepChoice:
    """The run's step rule from its ranks' summaries: the first rule of `auto` any rank matches
    (or `pattern`; StepError when a given regex matches no rank's annotations)."""
    summaries = list(summaries)
    mode = _mode(pattern)
    if mode == "whole":
        return StepChoice("whole_trace", "whole", "whole trace (--steps whole)")
    if mode != "auto":
        _compile(mode)
        if any(mode in s.matched for s in summaries):
            return StepChoice("pattern", mode)
        counts: dict[str, int] = {}
        for s in summaries:
            for k, v in s.annotations.items():
                counts[k] = counts.get(k, 0) + v
        raise StepError(_no_match_message(counts, (mode,)))
    for rule, pat in _ANNOTATION_RULES:
        if any(pat in s.matched for s in summaries):
            return StepChoice(rule, pat)
    if any(s.launches for s in summaries):
        return StepChoice("cuda_graph_launch", GRAPH_LAUNCH_PATTERN)
    repeated = _repeated_range_pattern([s.ranges for s in summaries])
    if repeated is not None:
        return StepChoice("repeated_range", repeated)
    return StepChoice("whole_trace", "whole", _WHOLE_WHY)


@dataclass
class RankWindows:
    """One rank's step windows under the run's rule (`rank_step_windows`), before the run-level
    numbering: `rows` has STEP_COLUMNS but `step` is the order on the rank, `number` the number at
    the end of the name (-1 when none); and what the run's notes count."""

    rank: int
    rows: pd.DataFrame
    number: np.ndarray
    numbered: bool = True  # every name on the rank ends in a number (of at most 18 digits)
    duplicates: int = 0  # names repeating a number already seen on the rank (when numbered)
    distinct_names: int = 0
    nested: int = 0
    clipped: int = 0
    spill_ns: int = 0
    period: int | None = None  # CUDA-graph launches per step (rule cuda_graph_launch)
    device_paced: bool = False  # windows from the device side (the GPU ran behind the host)


def _empty_rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "rank": np.zeros(0, dtype=np.int32),
            "step": np.zeros(0, dtype=np.int64),
            "name": np.zeros(0, dtype=object),
            **{c: np.zeros(0, dtype=np.int64) for c in STEP_COLUMNS[3:]},
        }
    )


def rank_step_windows(events: pd.DataFrame, choice: StepChoice) -> RankWindows:
    """One rank's step windows under the run's rule (its events only; `rank` from them)."""
    ranks = np.unique(events["rank"].to_numpy(np.int64))
    if len(ranks) > 1:
        raise ValueError(f"rank_step_windows takes one rank's events, not ranks {ranks.tolist()}")
    r = int(ranks[0]) if len(ranks) else -1
    if choice.rule == "whole_trace":
        start = events["start_ns"].to_numpy(np.int64)
        end = events["end_ns"].to_numpy(np.int64)
        gpu = cat_mask(events["kind"], GPU_KINDS)
        if gpu.any():
            start, end = start[gpu], end[gpu]
        if not len(start):
            return RankWindows(r, _empty_rows(), np.zeros(0, dtype=np.int64))
        a, b = int(start.min()), int(max(end.max(), start.min()))
        rows = pd.DataFrame(
            {
                "rank": np.asarray([r], dtype=np.int32),
                "step": np.asarray([0], dtype=np.int64),
                "name": np.asarray(["whole trace"], dtype=object),
                **{
                    c: np.asarray([v], dtype=np.int64)
                    for c, v in zip(STEP_COLUMNS[3:], (a, b, b, b), strict=True)
                },
            }
        )
        return RankWindows(r, rows, np.asarray([0], dtype=np.int64))
    if choice.rule == "cuda_graph_launch":
        return _rank_graph_windows(events, r)
    ann = _annotations(events)
    sel = ann[_match_mask(ann, _compile(choice.pattern))]
    return _rank_ranges(
        events,
        r,
        sel["start_ns"].to_numpy(np.int64),
        sel["end_ns"].to_numpy(np.int64),
        sel["name"].astype(str).to_numpy(dtype=object),
    )


def _rank_ranges(
    events: pd.DataFrame, r: int, start: np.ndarray, end: np.ndarray, name: np.ndarray
) -> RankWindows:
    """One rank's step windows from its host ranges: nested ranges dropped, extended by the GPU
    work launched inside, clipped at the next step's start."""
    order = np.lexsort((-end, start))
    start, end, name = start[order], end[order], name[order]
    # keep the outermost of nested matches (a step annotation inside another one on the same rank)
    prev_max = (
        np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1])) if len(end) else end
    )
    keep = start >= prev_max
    nested = int((~keep).sum())
    start, end, name = start[keep], end[keep], name[keep]
    numbers = np.full(len(name), -1, dtype=np.int64)
    numbered = True
    for i, n in enumerate(name):
        m = _STEP_NUMBER.search(n)
        if m is None or len(m.group(1)) > 18:  # a 40-digit "step number" does not fit int64: use the order
            numbered = False
            break
        numbers[i] = int(m.group(1))
    duplicates = len(name) - len(np.unique(numbers)) if numbered else 0
    rank = np.full(len(start), r, dtype=np.int64)
    first_gpu, gpu_end = _gpu_work_of_steps(events, rank, start, end)
    window_end, clipped, spill_ns = _clip_at_next_step(rank, start, gpu_end)
    window_start = start
    # only a GPU that ran behind the host in most steps paces them: a few windows clipped by a few
    # us (a host that opened the next annotation a little early) stay clipped
    behind = clipped > 0 and clipped >= DEVICE_PACED_MIN_SHARE * max(len(start) - 1, 1)
    paced = _device_paced(first_gpu, gpu_end) if behind else None
    if paced is not None:
        # the GPU ran behind the host's annotations (an engine's overlap scheduler runs the host a
        # step ahead): each window is the device's time for the work its step launched
        window_start, window_end = paced
    rows = pd.DataFrame(
        {
            "rank": rank.astype(np.int32),
            "step": np.arange(len(start), dtype=np.int64),
            "name": name,
            "start_ns": window_start,
            "end_ns": window_end,
            "annotation_end_ns": end,
            "gpu_end_ns": gpu_end,
        }
    )
    return RankWindows(
        r,
        rows,
        numbers,
        numbered=numbered,
        duplicates=duplicates,
        distinct_names=len(np.unique(name)) if len(name) else 0,
        nested=nested,
        clipped=clipped,
        spill_ns=spill_ns,
        device_paced=paced is not None,
    )


def _rank_graph_windows(events: pd.DataFrame, r: int) -> RankWindows:
    """Rule 4 on one rank: each iteration is one period of CUDA-graph launches. The period p is the
    smallest that repeats the sequence of GPU-operation counts per launch (1 when nothing repeats);
    a step runs from its first launch to the next step's first launch (the last: to its own GPU
    work's end). No windows when the rank has fewer than two launches."""
    is_launch = _graph_launch_mask(events)
    li = np.flatnonzero(is_launch)
    if len(li) < 2:
        return RankWindows(r, _empty_rows(), np.zeros(0, dtype=np.int64))
    start = events["start_ns"].to_numpy(np.int64)
    end = events["end_ns"].to_numpy(np.int64)
    corr = events["correlation"].to_numpy(np.int64)
    gpu = cat_mask(events["kind"], GPU_KINDS) & (corr >= 0)
    li = li[np.argsort(start[li], kind="stable")]
    g_corr = np.sort(corr[gpu])
    l_corr = corr[li]
    n_ops = np.searchsorted(g_corr, l_corr, side="right") - np.searchsorted(g_corr, l_corr, side="left")
    p = _period(n_ops)
    first = li[::p]
    s_ = start[first]
    e_ = np.empty(len(first), dtype=np.int64)
    e_[:-1] = s_[1:]
    e_[-1] = end[li].max()
    names = np.array([f"graph launch period {i}" for i in range(len(first))], dtype=object)
    # the GPU work of every launch in a period extends its step: the step window [first launch,
    # next period) holds the launches of the period
    out = _rank_ranges(events, r, s_, e_, names)
    out.period = p
    return out


def assemble_steps(choice: StepChoice, ranks: Iterable[RankWindows]) -> StepsResult:
    """The run's step table and notes from its ranks' windows under `choice` (small inputs)."""
    ranks = sorted(ranks, key=lambda w: w.rank)
    frames = [w.rows for w in ranks if len(w.rows)]
    steps = pd.concat(frames, ignore_index=True) if frames else _empty_rows()
    dq = DataQuality()
    if choice.rule == "whole_trace":
        if not len(steps):
            raise StepError("the trace holds no timed events: there is no window to break down")
        dq.add("steps_rule", 0, f"{choice.why}; " + _rule_note("whole_trace", "whole", steps))
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
    dq.add("steps_rule", 0, _rule_note(choice.rule, chosen, steps))
    if choice.rule == "cuda_graph_launch":
        dq.add(
            "graph_launch_period",
            0,
            "CUDA-graph launches per step (the period of GPU operations per launch): "
            + ", ".join(f"rank {w.rank}: {w.period}" for w in have),
        )
    return StepsResult(steps, chosen, dq, choice.rule)


def _no_match_message(counts: Mapping[str, int], patterns: tuple[str, ...]) -> str:
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties in order of first appearance
    top = [f"{n!r} x{c}" for n, c in ordered if c > 0][:8]
    tried = " or ".join(repr(p) for p in patterns)
    have = ", ".join(top) if top else "none"
    return (
        f"no step annotations match {tried}; annotations in the trace: {have} "
        "(pass --steps auto, --steps whole, or another --steps REGEX)"
    )


def _rule_note(rule: str, pattern: str, steps: pd.DataFrame) -> str:
    per_rank = steps.groupby("rank").size()
    counts = ", ".join(f"rank {r}: {c}" for r, c in per_rank.items()) or "none"
    return f"steps chosen by rule {rule!r} ({_RULE_WORDS.get(rule, rule)}; pattern {pattern!r}): {counts}"


def _period(counts: np.ndarray) -> int:
    """The smallest p (<= n/2) with counts[i] == counts[i + p] for every i, and the sequence made of
    whole periods; 1 when there is none."""
    n = len(counts)
    for p in range(1, n // 2 + 1):
        if n % p == 0 and np.array_equal(counts[p:], counts[:-p]):
            return p
    return 1


_DIGITS = re.compile(r"\d+")


def range_key(name: str) -> str:
    """The group key of a host range for rule 5: a regex of the name with its numbers generalised.
    The name is escaped first, then each run of digits becomes `\\d+` (digits are never escaped, so
    no character of the name can be taken for the placeholder: `## Call CompiledFxGraph <hash> ##`
    keeps its `#`s literal); spaces and `#` are left unescaped, which means the same outside a
    verbose regex, for a readable pattern."""
    escaped = re.escape(name).replace("\\ ", " ").replace("\\#", "#")
    return _DIGITS.sub(lambda _m: r"\d+", escaped)


def _range_groups(ann: pd.DataFrame) -> dict[str, tuple[int, int, bool]]:
    """Rule 5 on one rank: per group of host ranges equal up to their numbers (key: `range_key`,
    the escaped name with `\\d+` for its numbers), (time covered when the group repeats on the
    rank, rows, repeats): a group repeats when it has two or more ranges on the rank, none inside
    another."""
    if not len(ann):
        return {}
    names = ann["name"].astype(str).to_numpy(dtype=object)
    cache: dict[str, str | None] = {}
    for n in set(names.tolist()):  # once per distinct name; collectives' own ranges and blanks: none
        cache[n] = None if (_NOT_STEP_RANGES.search(n) or not n.strip()) else range_key(n)
    keys = np.array([cache[n] for n in names], dtype=object)
    use = np.array([k is not None for k in keys], dtype=bool)
    frame = pd.DataFrame(
        {
            "key": keys[use],
            "start": ann["start_ns"].to_numpy(np.int64)[use],
            "end": ann["end_ns"].to_numpy(np.int64)[use],
        }
    )
    out: dict[str, tuple[int, int, bool]] = {}
    for key, g in frame.groupby("key", sort=True):
        key_s = str(key)
        repeats, covered = False, 0
        if len(g) >= 2:
            o = np.argsort(g["start"].to_numpy(), kind="stable")
            s_ = g["start"].to_numpy()[o]
            e_ = g["end"].to_numpy()[o]
            if not (s_[1:] < e_[:-1]).any():  # ranges of one name nested in each other: not iterations
                repeats, covered = True, int((e_ - s_).sum())
        out[key_s] = (covered, len(g), repeats)
    return out


def _repeated_range_pattern(ranks: Iterable[Mapping[str, tuple[int, int, bool]]]) -> str | None:
    """Rule 5: a regex for the group of host ranges, equal up to their numbers, that repeats (two or
    more on a rank, not overlapping one another) and covers the most time over the ranks; None when
    none repeats. `ranks`: each rank's `_range_groups`."""
    total: dict[str, list[Any]] = {}
    for groups in ranks:
        for key, (covered, n, repeats) in groups.items():
            t = total.setdefault(key, [0, 0, False])
            t[0] += covered
            t[1] += n
            t[2] = t[2] or repeats
    best: tuple[int, int, str] | None = None
    for key in sorted(total):
        covered, n, repeats = total[key]
        if repeats and (best is None or (covered, n) > (best[0], best[1])):
            best = (covered, n, key)
    if best is None:
        return None
    return "^" + best[2] + "$"


def _extend_by_gpu_work(
    events: pd.DataFrame, rank: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Window end = max(annotation end, end of the last GPU op launched inside the annotation)."""
    return _gpu_work_of_steps(events, rank, start, end)[1]


def _gpu_work_of_steps(
    events: pd.DataFrame, rank: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per annotation: (start of the first GPU op launched inside it, or -1 when none;
    max(annotation end, end of the last GPU op launched inside it))."""
    window_end = end.copy()
    first_start = np.full(len(start), -1, dtype=np.int64)
    if not len(rank):
        return first_start, window_end
    corr = events["correlation"].to_numpy(np.int64)
    is_launch = cat_mask(events["kind"], ("runtime",)) & (corr >= 0)
    is_gpu = cat_mask(events["kind"], GPU_KINDS) & (corr >= 0)
    if not is_launch.any() or not is_gpu.any():
        return first_start, window_end
    ev_start = events["start_ns"].to_numpy(np.int64)
    ev_end = events["end_ns"].to_numpy(np.int64)
    selectors = rank_selectors(events["rank"].to_numpy(np.int64))
    for r in np.unique(rank):
        sel = selectors.get(int(r))
        if sel is None:
            continue
        s_idx = np.flatnonzero(rank == r)  # sorted by start within the rank
        s_start, s_end = start[s_idx], end[s_idx]
        r_launch, r_gpu = is_launch[sel], is_gpu[sel]
        if not r_launch.any() or not r_gpu.any():
            continue
        r_start, r_end, r_corr = ev_start[sel], ev_end[sel], corr[sel]
        l_start, l_corr = r_start[r_launch], r_corr[r_launch]
        k = np.searchsorted(s_start, l_start, side="right") - 1
        inside = k >= 0
        inside[inside] = l_start[inside] < s_end[k[inside]]
        if not inside.any():
            continue
        l_corr, k = l_corr[inside], k[inside]
        o = np.argsort(l_corr, kind="stable")
        l_corr, k = l_corr[o], k[o]
        g_corr, g_end, g_start = r_corr[r_gpu], r_end[r_gpu], r_start[r_gpu]
        pos = np.searchsorted(l_corr, g_corr)
        pos_ok = pos < len(l_corr)
        pos_ok[pos_ok] = l_corr[pos[pos_ok]] == g_corr[pos_ok]
        if not pos_ok.any():
            continue
        step_of_gpu = k[pos[pos_ok]]
        last_end = np.full(len(s_idx), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last_end, step_of_gpu, g_end[pos_ok])
        window_end[s_idx] = np.maximum(s_end, last_end)
        first = np.full(len(s_idx), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, step_of_gpu, g_start[pos_ok])
        first_start[s_idx] = np.where(first == np.iinfo(np.int64).max, -1, first)
    return first_start, window_end


#: The share of a rank's windows (of those a next step can clip) that must be clipped for its
#: windows to come from the device side (`_device_paced`): the GPU ran behind the host in most steps.
DEVICE_PACED_MIN_SHARE = 0.5


def _device_paced(first_start: np.ndarray, gpu_end: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Step windows from the device side (one rank, steps in order): step k from the first GPU
    operation it launched to the first one step k+1 launched (the last step: to the end of its
    own work), so the windows tile the device's timeline in launch order. None when a step
    launched no GPU work or the first operations are not in step order (the device cannot pace
    those windows)."""
    if not len(first_start) or (first_start < 0).any() or (np.diff(first_start) <= 0).any():
        return None
    end = np.empty(len(first_start), dtype=np.int64)
    end[:-1] = first_start[1:]
    end[-1] = max(int(gpu_end[-1]), int(first_start[-1]))
    return first_start.copy(), end


def _clip_at_next_step(
    rank: np.ndarray, start: np.ndarray, window_end: np.ndarray
) -> tuple[np.ndarray, int, int]:
    """Clip each window's end at the start of the next step on the same rank (rows sorted by rank
    then start, nested steps already dropped, so the next start is never before this annotation's
    end). Returns (clipped ends, how many windows were clipped, total ns cut off)."""
    out = window_end.copy()
    if len(rank) < 2:
        return out, 0, 0
    same_rank = rank[1:] == rank[:-1]
    limit = np.where(same_rank, start[1:], np.iinfo(np.int64).max)
    cut = np.flatnonzero(out[:-1] > limit)
    spill = int((out[:-1][cut] - limit[cut]).sum())
    out[cut] = limit[cut]
    return out, len(cut), spill


# ----------------------------------------------------------------------------- the partition


def _union_sorted(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The partition's union: intervals already sorted by start, empty ones kept."""
    return intervals.union(starts, ends, drop_empty=False, presorted=True)


def _rank_layers(ev: pd.DataFrame) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(timeline, start, end, layer) of one rank's activity; layer indexes _LAYERS."""
    is_gpu = cat_mask(ev["kind"], GPU_KINDS)
    cls = ev["cls"]
    layer_of = {c: i for i, c in enumerate(_LAYERS)}
    cls_codes = cls.cat.codes.to_numpy()
    cat_layer = np.array([layer_of.get(str(c), -1) for c in cls.cat.categories], dtype=np.int64)
    layer = np.where(cls_codes >= 0, cat_layer[np.maximum(cls_codes, 0)], -1)
    start = ev["start_ns"].to_numpy(np.int64)
    end = ev["end_ns"].to_numpy(np.int64)
    sync = layer == layer_of["sync"]
    if is_gpu.any():
        use = is_gpu | sync
        return "gpu", start[use], end[use], layer[use]

    # host timeline (no GPU activity on this rank)
    kinds = ev["kind"].astype(str).to_numpy()
    stream = ev["stream"].to_numpy(np.int64)
    cls_s = np.asarray(cls.astype(str))
    coll = (cls_s == "collective") & np.isin(kinds, ["cpu_op", "annotation", "other"])
    # a CPU op is host work; `aten::item` on a CPU tensor does not wait for any device
    cpu = (kinds == "cpu_op") & np.isin(cls_s, ["host", "sync"])
    host_layer = np.full(len(ev), -1, dtype=np.int64)
    host_layer[cpu] = layer_of["compute"]
    host_layer[coll] = layer_of["collective"]
    host_layer[sync & (kinds != "cpu_op")] = layer_of["sync"]
    # CPU ops nested inside a collective op on the same thread are part of the collective
    for t in np.unique(stream[coll]):
        on_t = coll & (stream == t)
        o = np.argsort(start[on_t], kind="stable")
        cs, ce = _union_sorted(start[on_t][o], end[on_t][o])
        cand = np.flatnonzero(cpu & (stream == t))
        if not len(cand):
            continue
        j = np.searchsorted(cs, start[cand], side="right") - 1
        ok = j >= 0
        ok[ok] = end[cand[ok]] <= ce[j[ok]]
        host_layer[cand[ok]] = layer_of["collective"]
    use = host_layer >= 0
    return "host", start[use], end[use], host_layer[use]


@dataclass
class LayerUnions:
    """One rank's cumulative layer unions: the partition's layers measured with its priority.

    `cum[k]`: the merged union of layers <= k (_LAYERS order) as sorted (starts, ends) arrays and
    the prefix sums of their lengths, so the covered time before any t is one binary search;
    `collective`: the merged union of the collective layer alone (for the overlapped collective).
    `partition_steps` measures step windows with it and `critical_path` any interval of the path:
    one build per rank serves both (`tracekit.analyse.analysed.AnalysedRun.layer_unions`)."""

    timeline: str
    cum: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (starts, ends, prefix lengths)
    collective: tuple[np.ndarray, np.ndarray]
    span: tuple[int, int] | None = None  # clipped to [lo, hi] (`clipped`): measures inside it only

    def clipped(self, lo: int, hi: int) -> LayerUnions:
        """These unions cut to [lo, hi]: `measure(a, b)` for lo <= a <= b <= hi is the same
        integers (every covered length before t in [lo, hi] drops by the same covered length
        before lo); outside the span `measure` raises. What the Dask engine's per-rank tasks send
        the critical path's step-bucket tasks (one step of one rank: a few KB)."""

        def cut(ms: np.ndarray, me: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            keep = (me > lo) & (ms < hi)
            return np.maximum(ms[keep], lo), np.minimum(me[keep], hi)

        cum = []
        for ms, me, _pre in self.cum:
            cs, ce = cut(ms, me)
            pre = np.concatenate(([0], np.cumsum(ce - cs)[:-1])) if len(cs) else np.zeros(0, dtype=np.int64)
            cum.append((cs, ce, pre.astype(np.int64)))
        return LayerUnions(self.timeline, cum, cut(*self.collective), (int(lo), int(hi)))

    def _covered(self, k: int, t: int) -> int:
        ms, me, pre = self.cum[k]
        i = int(np.searchsorted(ms, t, side="right")) - 1
        if i < 0:
            return 0
        return int(pre[i]) + min(max(t - int(ms[i]), 0), int(me[i] - ms[i]))

    def measure(self, a: int, b: int) -> dict[str, int]:
        """Exclusive per-layer time inside [a, b), by priority; the rest is idle."""
        out: dict[str, int] = {}
        if b <= a:
            return {p: 0 for p in (*_LAYERS, "idle")}
        if self.span is not None and not (self.span[0] <= a and b <= self.span[1]):
            raise AssertionError(f"measure({a}, {b}) outside the clipped unions' span {self.span}")
        prev = 0
        for k, name in enumerate(_LAYERS):
            c = self._covered(k, b) - self._covered(k, a)
            out[name] = c - prev
            prev = c
        out["idle"] = (b - a) - prev
        return out


def layer_unions(ev: pd.DataFrame) -> LayerUnions:
    """The LayerUnions of one rank's classified events (columns kind, cls, start_ns, end_ns, stream)."""
    timeline, s, e, layer = _rank_layers(ev)
    order = np.argsort(s, kind="stable")
    s, e, layer = s[order], e[order], layer[order]
    cum = []
    for k in range(len(_LAYERS)):
        sel = layer <= k
        ms, me = _union_sorted(s[sel], e[sel])
        pre = np.concatenate(([0], np.cumsum(me - ms)[:-1])) if len(ms) else np.zeros(0, dtype=np.int64)
        cum.append((ms, me, pre.astype(np.int64)))
    k_coll = _LAYERS.index("collective")
    return LayerUnions(timeline, cum, _union_sorted(s[layer == k_coll], e[layer == k_coll]))


def rank_layer_unions(events: pd.DataFrame, ranks: Iterable[int]) -> dict[int, LayerUnions]:
    """LayerUnions per rank of a classified event table (each rank's rows as a slice, no copy)."""
    cols = events[["kind", "cls", "start_ns", "end_ns", "stream"]]
    selectors = rank_selectors(events["rank"].to_numpy(np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return {int(r): layer_unions(cols.iloc[selectors.get(int(r), empty)]) for r in ranks}


def partition_steps(
    events: pd.DataFrame, steps: pd.DataFrame, unions: Mapping[int, LayerUnions] | None = None
) -> pd.DataFrame:
    """Per (rank, step): window_ns and the parts `<part>_ns` for PARTS, plus
    overlapped_collective_ns and timeline ("gpu" or "host"). `events` must be classified.
    `unions`: each rank's LayerUnions when already built (else built here)."""
    if "cls" not in events.columns:
        raise ValueError("partition_steps needs a classified event table (tracekit.classify.classify)")
    rows: list[pd.DataFrame] = []
    step_ranks = sorted(int(x) for x in pd.unique(steps["rank"]))
    if unions is None or any(r not in unions for r in step_ranks):
        unions = rank_layer_unions(events, step_ranks)
    for r in step_ranks:
        st = steps[steps["rank"] == r]
        a = st["start_ns"].to_numpy(np.int64)
        b = st["end_ns"].to_numpy(np.int64)
        window = b - a
        lay = unions[r]
        timeline = lay.timeline
        parts: dict[str, np.ndarray] = {}
        prev = np.zeros(len(st), dtype=np.int64)
        for k, part in enumerate(_LAYERS):
            ms, me, _pre = lay.cum[k]
            cum = intervals.covered(ms, me, a, b)
            parts[part] = cum - prev
            prev = cum
        parts["idle"] = window - prev
        cs, ce = lay.collective
        overlapped = intervals.covered(cs, ce, a, b) - parts["collective"]
        out = pd.DataFrame(
            {
                "rank": st["rank"].to_numpy(np.int32),
                "step": st["step"].to_numpy(np.int64),
                "name": st["name"].to_numpy(dtype=object),
                "start_ns": a,
                "end_ns": b,
                "window_ns": window,
                **{f"{p}_ns": parts[p] for p in PARTS},
                "overlapped_collective_ns": overlapped,
                "timeline": timeline,
            }
        )
        rows.append(out)
    if not rows:
        table = pd.DataFrame(columns=list(PARTITION_COLUMNS))
        return table
    table = pd.concat(rows, ignore_index=True)
    check_partition(table)
    return table


def check_partition(table: pd.DataFrame) -> None:
    """Assert the invariants: every part >= 0 and the parts sum to the window exactly."""
    part_cols = [f"{p}_ns" for p in PARTS]
    values = table[part_cols].to_numpy(np.int64)
    total = values.sum(axis=1)
    window = table["window_ns"].to_numpy(np.int64)
    if (values < 0).any():
        bad = int(np.flatnonzero((values < 0).any(axis=1))[0])
        raise AssertionError(f"negative part in step row {bad}: {table.iloc[bad].to_dict()}")
    if not np.array_equal(total, window):
        bad = int(np.flatnonzero(total != window)[0])
        raise AssertionError(f"parts do not sum to the window in step row {bad}: {table.iloc[bad].to_dict()}")
    ov = table["overlapped_collective_ns"].to_numpy(np.int64)
    if (ov < 0).any():
        raise AssertionError("negative overlapped_collective_ns")


# ----------------------------------------------------------------------------- step kinds

#: SGLang's per-iteration range: `step[DECODE bs=1]`, `step[EXTEND bs=1 toks=128]` (forward mode,
#: batch size, and for extend / prefill the tokens of the batch).
_SGLANG_STEP = re.compile(r"^step\[(?P<kind>[A-Z_]+)(?:\s+bs=(?P<bs>\d+))?(?:\s+toks=(?P<toks>\d+))?")
#: vLLM v1's per-batch range: `execute_<tokens>_context_<prefill reqs>(...)_generation_<decode reqs>(...)`.
_VLLM_STEP = re.compile(r"^execute_(?P<toks>\d+)_context_(?P<ctx>\d+)\(.*\)_generation_(?P<gen>\d+)\(")
#: SGLang forward modes -> step kinds.
_SGLANG_KINDS = {
    "DECODE": "decode",
    "EXTEND": "prefill",
    "PREFILL": "prefill",
    "MIXED": "mixed",
    "IDLE": "idle",
    "TARGET_VERIFY": "verify",
    "DRAFT_EXTEND": "prefill",
}
#: Columns of `step_kinds`.
STEP_KIND_COLUMNS: tuple[str, ...] = ("kind", "batch", "tokens")


def step_kind(name: str) -> tuple[str, int, int]:
    """(kind, batch, tokens) a serving engine's step range says ("" / -1 when it says nothing):
    SGLang `step[DECODE bs=2]` -> ("decode", 2, -1), `step[EXTEND bs=1 toks=128]` ->
    ("prefill", 1, 128); vLLM `execute_8_context_0(...)_generation_8(...)` -> ("decode", 8, 8)
    (context requests only: "prefill", both: "mixed")."""
    m = _SGLANG_STEP.match(name)
    if m:
        kind = _SGLANG_KINDS.get(m.group("kind"), m.group("kind").lower())
        bs = int(m.group("bs")) if m.group("bs") else -1
        toks = int(m.group("toks")) if m.group("toks") else (bs if kind == "decode" else -1)
        return kind, bs, toks
    m = _VLLM_STEP.match(name)
    if m:
        ctx, gen = int(m.group("ctx")), int(m.group("gen"))
        kind = "decode" if ctx == 0 and gen > 0 else ("prefill" if gen == 0 else "mixed")
        return kind, ctx + gen, int(m.group("toks"))
    return "", -1, -1


def step_kinds(names: Iterable[str]) -> pd.DataFrame:
    """`step_kind` of each name, a frame with STEP_KIND_COLUMNS (one parse per distinct name)."""
    names = [str(n) for n in names]
    cache = {n: step_kind(n) for n in dict.fromkeys(names)}
    rows = [cache[n] for n in names]
    return pd.DataFrame(
        {
            "kind": [r[0] for r in rows],
            "batch": np.asarray([r[1] for r in rows], dtype=np.int64),
            "tokens": np.asarray([r[2] for r in rows], dtype=np.int64),
        }
    )


@dataclass(frozen=True)
class TokenSteps:
    """Which steps the per-token figures use when the step names carry kinds (`token_steps`)."""

    steps: frozenset[int]  # step indices used for per-token figures
    kind: str  # "decode" (or "" when no decode step: every step is used)
    batch: int  # the decode batch size used (-1 when none)
    statement: str  # one sentence for the data-quality note and the report

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "batch": self.batch, "steps": len(self.steps), "rule": self.statement}


def token_steps(steps: pd.DataFrame) -> TokenSteps | None:
    """Per-token steps of a run whose step names say their kind (`step_kind`), from a frame with
    `step` and `name` (one row per rank and step; a step's kind is read from its lowest rank):
    the decode steps of one batch size, the size with the most decode steps (ties: the smaller);
    None when no step name says a kind (tracekit's `decode_step`, ProfilerStep#N: every step is
    a token). A run without decode steps uses every step, and says so."""
    if not len(steps):
        return None
    first = steps.sort_values(["step", "rank"] if "rank" in steps.columns else ["step"]).drop_duplicates(
        "step"
    )
    kinds = step_kinds(first["name"])
    if not (kinds["kind"] != "").any():
        return None
    ids = first["step"].to_numpy(np.int64)
    decode = (kinds["kind"] == "decode").to_numpy()
    summary = ", ".join(
        f"{n} {k or 'unnamed'}{f' bs={b}' if b >= 0 else ''}"
        for (k, b), n in kinds.groupby(["kind", "batch"]).size().items()
    )
    if not decode.any():
        return TokenSteps(
            frozenset(int(x) for x in ids),
            "",
            -1,
            f"no decode steps ({summary}): per-token figures from every step, which are not tokens of one "
            "kind",
        )
    sizes = pd.Series(kinds.loc[decode, "batch"].to_numpy(np.int64)).value_counts()
    best = int(min(b for b, c in sizes.items() if c == sizes.max()))
    use = decode & (kinds["batch"].to_numpy(np.int64) == best)
    return TokenSteps(
        frozenset(int(x) for x in ids[use]),
        "decode",
        best,
        f"per-token figures from the {int(use.sum())} decode steps of batch size {best} (the size with the most "
        f"decode steps; steps by kind: {summary})",
    )


def kinds_summary(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per step kind and batch size of a partition table (rank, step, name, window_ns, parts):
    how many steps, their step time (the longest window over ranks) and each part's mean over
    ranks (a rank's window padded to the step time with idle, as the per-token figures are), in
    integer ns; [] when no step name says a kind."""
    if not len(table):
        return []
    step_ns = table.groupby("step")["window_ns"].max()
    first = table.sort_values(["step", "rank"]).drop_duplicates("step")
    kinds = step_kinds(first["name"])
    if not (kinds["kind"] != "").any():
        return []
    kinds.index = first["step"].to_numpy(np.int64)
    pad = table["step"].map(step_ns).to_numpy(np.int64) - table["window_ns"].to_numpy(np.int64)
    padded = table.assign(idle_ns=table["idle_ns"].to_numpy(np.int64) + pad)
    cols = [f"{p}_ns" for p in PARTS]
    parts = padded.groupby("step")[cols].mean()
    out: list[dict[str, Any]] = []
    for (kind, batch), g in kinds.groupby(["kind", "batch"], sort=True):
        ids = g.index.to_numpy(np.int64)
        times = step_ns.reindex(ids).to_numpy(np.float64)
        toks = sorted(set(int(t) for t in g["tokens"]))
        out.append(
            {
                "kind": str(kind) or "unnamed",
                "batch": int(batch),
                "tokens": toks[0] if len(toks) == 1 else None,
                "steps": int(len(ids)),
                "step_ns_mean": int(round(float(times.mean()))),
                "step_ns_median": int(round(float(np.median(times)))),
                "parts_ns_mean": {p: int(round(float(parts.loc[ids, f"{p}_ns"].mean()))) for p in PARTS},
            }
        )
    return out
