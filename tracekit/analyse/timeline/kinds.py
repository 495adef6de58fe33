"""Step kinds of serving engines (docs/METHOD.md section Serving engines: custom all-reduce and step kinds).

`step_kind(name)` reads a serving engine's step kind, batch and tokens from its range name
(SGLang `step[EXTEND bs=1 toks=128]`, vLLM `execute_<n>_context_<c>(...)_generation_<g>(...)`);
`token_steps` picks the per-token steps (the decode steps of one batch size), `kinds_summary`
reports the steps per kind.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracekit.model.documents.breakdown import BreakdownStepKind, BreakdownStepsUsed
from tracekit.model.parts import PARTS

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

    def document(self) -> BreakdownStepsUsed:
        return BreakdownStepsUsed(
            kind=self.kind, batch=self.batch, steps=len(self.steps), rule=self.statement
        )


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


def kinds_summary(table: pd.DataFrame) -> list[BreakdownStepKind]:
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
    out: list[BreakdownStepKind] = []
    for (kind, batch), g in kinds.groupby(["kind", "batch"], sort=True):
        ids = g.index.to_numpy(np.int64)
        times = step_ns.reindex(ids).to_numpy(np.float64)
        toks = sorted(set(int(t) for t in g["tokens"]))
        out.append(
            BreakdownStepKind(
                kind=str(kind) or "unnamed",
                batch=int(batch),
                tokens=toks[0] if len(toks) == 1 else None,
                steps=int(len(ids)),
                step_ns_mean=int(round(float(times.mean()))),
                step_ns_median=int(round(float(np.median(times)))),
                parts_ns_mean={p: int(round(float(parts.loc[ids, f"{p}_ns"].mean()))) for p in PARTS},
            )
        )
    return out
