"""The step rules (`STEP_RULES`, docs/METHOD.md section Steps and the partition): per rank what each
rule finds (`rank_step_summary`), the run's choice (`choose_step_rule`), and the repeating host
ranges of the NVTX rule (`range_key`). The order of the rules: `tracekit.analyse.timeline.steps`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.timeline.partition import cat_mask
from tracekit.errors import StepError

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

STEP_NUMBER = re.compile(r"(\d+)\s*$")

STEP_COLUMNS: tuple[str, ...] = (
    "rank",
    "step",
    "name",
    "start_ns",
    "end_ns",
    "annotation_end_ns",
    "gpu_end_ns",
)


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


def annotation_rows(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["kind"] == "annotation"]


def compile_step_pattern(pat: str) -> re.Pattern[str]:
    try:
        return re.compile(pat)
    except re.error as exc:
        raise StepError(f"invalid step pattern {pat!r}: {exc}") from None


def name_match_mask(ann: pd.DataFrame, rx: re.Pattern[str]) -> np.ndarray:
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


def graph_launch_mask(events: pd.DataFrame) -> np.ndarray:
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
    ann = annotation_rows(events)
    if mode != "auto":
        if name_match_mask(ann, compile_step_pattern(mode)).any():
            out.matched.append(mode)
        else:
            counts = ann["name"].astype(str).value_counts(sort=False)
            out.annotations = {str(k): int(v) for k, v in counts.items() if v > 0}
        return out
    for _rule, pat in _ANNOTATION_RULES:
        if name_match_mask(ann, re.compile(pat)).any():
            out.matched.append(pat)
            return out
    if int(graph_launch_mask(events).sum()) >= 2:
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
        compile_step_pattern(mode)
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


def _no_match_message(counts: Mapping[str, int], patterns: tuple[str, ...]) -> str:
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: ties in order of first appearance
    top = [f"{n!r} x{c}" for n, c in ordered if c > 0][:8]
    tried = " or ".join(repr(p) for p in patterns)
    have = ", ".join(top) if top else "none"
    return (
        f"no step annotations match {tried}; annotations in the trace: {have} "
        "(pass --steps auto, --steps whole, or another --steps REGEX)"
    )


def rule_note(rule: str, pattern: str, steps: pd.DataFrame) -> str:
    per_rank = steps.groupby("rank").size()
    counts = ", ".join(f"rank {r}: {c}" for r, c in per_rank.items()) or "none"
    return f"steps chosen by rule {rule!r} ({_RULE_WORDS.get(rule, rule)}; pattern {pattern!r}): {counts}"


def repeat_period(counts: np.ndarray) -> int:
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
