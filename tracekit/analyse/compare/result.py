"""The result of a diff (docs/METHOD.md section Comparing two runs): `Diff`, its exact integer
figures (the change by part, per rank, on the critical path), the cause and the verdict in words,
the CI gate, and `to_json()` per docs/JSON.md#diff. Built by `tracekit.analyse.compare.diff`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from tracekit.analyse.compare.sides import BOOTSTRAP_LEVEL, BOOTSTRAP_RESAMPLES, DIFF_PARTS, Side
from tracekit.analyse.exact import round_half_up, round_to_sum
from tracekit.model import units
from tracekit.model.documents import diff as dd
from tracekit.model.documents.base import Documented
from tracekit.model.events import DataQuality
from tracekit.model.parts import COORDINATION, PATH_PARTS

T = TypeVar("T")

_pct_signed = functools.partial(units.pct, sign=True, missing="?")

SCHEMA_VERSION = "1.0"
#: a dilation ratio (after / before) beyond 1 +- this counts as "differs", even with overlapping intervals
DILATION_WARN = 0.05
#: rows of the kernel and collective tables kept in the result (by |time change|)
TOP = 10
#: fewest tokens (steady steps, or unprofiled tokens) a run needs for an interval and a verdict. With
#: n samples the bootstrap draws the all-smallest resample with probability n^-(n-1): 0.5 at n = 2,
#: 0.11 at n = 3, above the 2.5% tail, so the "95%" interval is the samples' range; 0.016 at n = 4.
MIN_TOKENS_TO_JUDGE = 4
#: the verdict word when there is no interval
CANNOT_JUDGE = "cannot judge"
#: How the summary names the per-token source.
_SOURCE_WORDS = {
    "unprofiled": "per-token times corrected for the profiler: traced / dilation",
    "trace": "traced per-token times, not corrected for the profiler",
}
#: Groups of leaf parts shown as one term.
GROUPS: dict[str, tuple[str, ...]] = {
    "compute": ("matrix", "vector"),
    "memory": ("memory",),
    "transfer": ("transfer",),
    "coordination": COORDINATION,
    "unknown": ("unknown",),
}


# ------------------------------------------------------------------------------------------
# the result


@dataclass
class Diff(Documented):
    """Two runs compared; `to_json()` per docs/JSON.md#diff."""

    before: Side
    after: Side
    per_token_source: str
    source_reason: str
    change_interval_ns: tuple[float, float]
    relative_interval: tuple[float, float]
    part_intervals_ns: dict[str, tuple[float, float]]
    #: each run's own per-token mean, 95% bootstrap interval (the same resamples as the change's)
    per_token_intervals_ns: dict[str, tuple[float, float]]
    data_quality: DataQuality
    top: int = TOP
    #: why there is no interval (too few tokens, steps not alike), "" when there is one
    cannot_judge: str = ""

    # ---- figures

    @property
    def change_ns(self) -> Fraction:
        return self.after.per_token_ns - self.before.per_token_ns

    @property
    def relative(self) -> float | None:
        b = self.before.per_token_ns
        return float(self.change_ns / b) if b else None

    @property
    def matrix_available(self) -> bool:
        return self.before.parts.timeline == "gpu" and self.after.parts.timeline == "gpu"

    def verdict_word(self) -> str:
        lo, hi = self.relative_interval
        if self.cannot_judge or not (math.isfinite(lo) and math.isfinite(hi)):
            return CANNOT_JUDGE
        if lo > 0:
            return "slower"
        if hi < 0:
            return "faster"
        return "no significant change"

    def integers(self) -> DiffIntegers:
        """Per-token ns as ints: before, after, change = after - before, the leaf changes by largest
        remainder summing to the change; the groups are sums of leaves."""
        b = round_half_up(self.before.per_token_ns)
        a = round_half_up(self.after.per_token_ns)
        change = a - b
        leaf_d = {p: self.after.leaf[p] - self.before.leaf[p] for p in DIFF_PARTS}
        leaf = round_to_sum(leaf_d, change)
        assert sum(leaf.values()) == change
        return DiffIntegers(before=b, after=a, change=change, leaf=leaf)

    def _parts_json(self, leaf: Mapping[str, int]) -> dict[str, int]:
        out: dict[str, int] = {}
        for g, keys in GROUPS.items():
            if g == "unknown" and not any(leaf[k] for k in keys):
                continue
            out[g] = sum(leaf[k] for k in keys)
        return out

    def by_part(self) -> dd.DiffByPart:
        ints = self.integers()
        leaf = ints.leaf
        terms = self._parts_json(leaf)
        before = {p: round_half_up(self.before.leaf[p]) for p in DIFF_PARTS}
        after = {p: round_half_up(self.after.leaf[p]) for p in DIFF_PARTS}
        iv = self.part_intervals_ns
        rows = {}
        for g, keys in GROUPS.items():
            if g not in terms:
                continue
            rows[g] = dd.DiffCompute(
                before_ns=sum(before[k] for k in keys),
                after_ns=sum(after[k] for k in keys),
                change_ns=terms[g],
                interval_ns=[int(round(x)) for x in iv[g]] if g in iv else None,
            )
        subs = {}
        for k in DIFF_PARTS:
            if k in ("matrix", "vector") and not self.matrix_available:
                continue
            if k in ("memory", "transfer", "unknown"):
                continue
            subs[k] = dd.DiffCompute(
                before_ns=before[k],
                after_ns=after[k],
                change_ns=leaf[k],
                interval_ns=[int(round(x)) for x in iv[k]] if k in iv else None,
            )
        return dd.DiffByPart(terms=rows, leaves=subs)

    def per_rank(self) -> list[dd.DiffPerRankItem]:
        """Per rank present in both runs: its own parts' change (sums to its own rounding of the change)."""
        out = []
        common = sorted(set(self.before.per_rank) & set(self.after.per_rank))
        ints = self.integers()
        for r in common:
            d = {p: self.after.per_rank[r][p] - self.before.per_rank[r][p] for p in DIFF_PARTS}
            leaf = round_to_sum(d, ints.change)
            out.append(
                dd.DiffPerRankItem(
                    rank=int(r),
                    change_ns={g: sum(leaf[k] for k in keys) for g, keys in GROUPS.items()},
                    coordination_ns={k: leaf[k] for k in COORDINATION},
                    before_ns={
                        g: round_half_up(sum((self.before.per_rank[r][k] for k in keys), Fraction(0)))
                        for g, keys in GROUPS.items()
                    },
                    after_ns={
                        g: round_half_up(sum((self.after.per_rank[r][k] for k in keys), Fraction(0)))
                        for g, keys in GROUPS.items()
                    },
                )
            )
        return out

    def path_change(self) -> dd.DiffCriticalPath:
        """The critical path per token, before, after and the change, per (rank, component) and
        the offset, as ints that sum to the per-token figures exactly."""

        def ints(path: Mapping[str, Any]) -> dict[str, int]:
            flat: dict[str, Fraction] = {"offset": Fraction(path["offset"])}
            for r, d in path["by_rank"].items():
                for p in PATH_PARTS:
                    flat[f"{r}:{p}"] = Fraction(d[p])
            return round_to_sum(flat, round_half_up(Fraction(path["step"])))

        b, a = ints(self.before.path_token), ints(self.after.path_token)
        keys = sorted(set(b) | set(a))
        flat_d = {k: Fraction(a.get(k, 0) - b.get(k, 0)) for k in keys}
        ranks = sorted({int(k.split(":")[0]) for k in keys if k != "offset"})

        def nest(x: Mapping[str, int | Fraction]) -> dict[str, dd.DiffByRankValue]:
            return {
                str(r): dd.DiffByRankValue(**{f"{p}_ns": int(x.get(f"{r}:{p}", 0)) for p in PATH_PARTS})
                for r in ranks
            }

        by_comp = {p: sum(int(flat_d[f"{r}:{p}"]) for r in ranks if f"{r}:{p}" in flat_d) for p in PATH_PARTS}
        return dd.DiffCriticalPath(
            before=dd.DiffCriticalPathBefore(by_rank=nest(b), offset_ns=b["offset"], step_ns=sum(b.values())),
            after=dd.DiffCriticalPathBefore(by_rank=nest(a), offset_ns=a["offset"], step_ns=sum(a.values())),
            change=dd.DiffChange(
                by_rank=nest(flat_d),
                offset_ns=int(flat_d["offset"]),
                by_component_ns=by_comp,
                step_ns=int(sum(flat_d.values())),
            ),
        )

    def cause(self) -> dd.DiffCause:
        """The part of the critical path that moved most in the direction of the change: one of
        the path components (with the rank it moved on) or the path offset (the step time outside
        every rank's path: ranks opening their step windows at different times; no rank), and the
        ranks whose wait moved with it. `component` is None when nothing on the path moved in the
        direction of the change."""
        ch = self.path_change().change
        sign = 1 if self.change_ns >= 0 else -1
        moved = {**ch.by_component_ns, "offset": ch.offset_ns}
        # the offset competes with the components: a change that sits in it is not a component's
        best = max((*PATH_PARTS, "offset"), key=lambda p: sign * moved[p])
        comp: str | None = best if sign * moved[best] > 0 else None
        per_rank = (
            {int(r): getattr(d, f"{comp}_ns") for r, d in ch.by_rank.items()} if comp in PATH_PARTS else {}
        )
        rank = max(per_rank, key=lambda r: sign * per_rank[r]) if per_rank else None
        waits = {
            int(r.rank): r.coordination_ns["wait"] for r in self.per_rank() if rank is None or r.rank != rank
        }
        return dd.DiffCause(
            component=comp,
            component_change_ns=moved[comp] if comp is not None else 0,
            rank=rank,
            rank_change_ns=per_rank.get(rank, 0) if rank is not None else 0,
            by_rank_ns={str(r): v for r, v in sorted(per_rank.items())},
            offset_change_ns=int(ch.offset_ns),
            wait_change_ns={str(r): v for r, v in sorted(waits.items())},
            sentence=None,
        )

    def _component_words(self, comp: str) -> str:
        gpu = self.after.parts.timeline == "gpu"
        return {
            "host": "host time (launch gaps and host work before its collectives)"
            if gpu
            else "host time (time between its ops: Python, sleeps, scheduling)",
            "compute": "compute",
            "memory": "memory copies",
            "transfer": "collective transfer" if gpu else "gloo exchange",
            "sync": "host-device synchronisation",
            "unknown": "unclassified kernels",
        }[comp]

    def moved(self) -> str:
        """What moved, one clause: the dominant term and its coordination split."""
        terms = self.by_part().terms
        sign = 1 if self.change_ns >= 0 else -1
        top = max(terms, key=lambda g: sign * terms[g].change_ns)
        text = f"{top} {units.ms_or_us_signed(terms[top].change_ns)}"
        if top == "coordination":
            leaves = self.integers().leaf
            text += " (" + ", ".join(f"{k} {units.ms_or_us_signed(leaves[k])}" for k in COORDINATION) + ")"
        if top == "compute" and self.matrix_available:
            leaves = self.integers().leaf
            text += f" (matrix {units.ms_or_us_signed(leaves['matrix'])}, vector {units.ms_or_us_signed(leaves['vector'])})"
        return text

    def cause_sentence(self) -> str:
        c = self.cause()
        if c.component == "offset":
            return (
                f"On the critical path, nothing moved: the change sits in the path offset "
                f"({units.ms_or_us_signed(c.component_change_ns)} per token), the step time outside every rank's path "
                "(the ranks' step windows open at different times)."
            )
        if c.rank is None or c.component is None or c.component_change_ns == 0:
            return ""
        text = (
            f"On the critical path, {self._component_words(c.component)} "
            f"{units.ms_or_us_signed(c.component_change_ns)} per token, on rank {c.rank} "
            f"({units.ms_or_us_signed(c.rank_change_ns)}"
        )
        others = [
            f"rank {r} {units.ms_or_us_signed(v)}" for r, v in c.by_rank_ns.items() if int(r) != c.rank and v
        ]
        text += ("; " + ", ".join(others) if others else "") + ")"
        sign = 1 if self.change_ns >= 0 else -1
        waits = [(r, v) for r, v in c.wait_change_ns.items() if sign * v > 0.1 * abs(float(self.change_ns))]
        if waits:
            verb = "waits" if sign > 0 else "waits less:"
            text += "; the consequence: " + ", ".join(
                f"rank {r} {verb} {units.ms_or_us_signed(v)}" for r, v in waits
            )
            text += " per token at the collectives"
        return text + "."

    def verdict(self) -> str:
        ints = self.integers()
        word = self.verdict_word()
        rel = self.relative
        lo, hi = self.relative_interval
        if word == CANNOT_JUDGE:
            why = self.cannot_judge or "no interval could be computed"
            return (
                f"Cannot judge: the runs have too few comparable steps ({why}): {units.ms_or_us(ints.after)} per token "
                f"after vs {units.ms_or_us(ints.before)} before ({units.ms_or_us_signed(ints.change)}, {_pct_signed(rel)}), "
                "no interval; capture more steps of the same kind and batch size."
            )
        head = (
            f"{word.capitalize()}: {units.ms_or_us(ints.after)} per token after vs {units.ms_or_us(ints.before)} before "
            f"({units.ms_or_us_signed(ints.change)}, {_pct_signed(rel)}; 95% interval {_pct_signed(lo)} to {_pct_signed(hi)}; "
            f"{_SOURCE_WORDS[self.per_token_source]})."
        )
        if word == "no significant change":
            return head
        tail = f" What moved: {self.moved()}."
        cause = self.cause_sentence()
        return head + tail + (f" {cause}" if cause else "")

    def gate_line(self, pct: float) -> str:
        """The one line `--fail-if-slower` prints."""
        lo = self.relative_interval[0]
        cause = self.cause()
        where = ""
        if cause.component == "offset":
            where = f"; critical path: the path offset {units.ms_or_us_signed(cause.component_change_ns)}"
        elif cause.rank is not None and cause.component_change_ns:
            where = (
                f"; critical path: {cause.component} time on rank {cause.rank} "
                f"{units.ms_or_us_signed(cause.rank_change_ns)}"
            )
        return (
            f"slower by {_pct_signed(self.relative)} per token ({units.ms_or_us(self.integers().before)} -> "
            f"{units.ms_or_us(self.integers().after)}; 95% lower bound {_pct_signed(lo)} > {pct:g}%): {self.moved()}{where}"
        )

    def fails(self, pct: float) -> bool:
        return self.relative_interval[0] * 100.0 > pct

    # ---- dilation

    def dilation(self) -> dd.DiffDilation:
        ab, aa = self.before.applied, self.after.applied
        out = dd.DiffDilation(
            definition="profiled / unprofiled per-token time as the capture's alternating rounds measured it "
            "(the shortfall's applied factor D; the corrected per-token time is the traced one / D)",
            before=ab.document(),
            after=aa.document(),
            ratio=None,
            traced_change=None,
            unprofiled_change=None,
            warning=None,
        )
        if ab.unprofiled_mean_ns and aa.unprofiled_mean_ns:
            # the unprofiled passes' own means: a cross-check of the corrected change
            out.unprofiled_change = float(aa.unprofiled_mean_ns / ab.unprofiled_mean_ns) - 1.0
        tb, ta = self.before.parts.per_token["window"], self.after.parts.per_token["window"]
        traced_change = float(ta / tb - 1) if tb else None
        out.traced_change = traced_change
        if ab.factor is None or aa.factor is None:
            missing = [s.label for s, a in ((self.before, ab), (self.after, aa)) if a.factor is None]
            out.warning = (
                f"dilation unknown for the {' and '.join(missing)} run (no unprofiled timing): whether the "
                "profiler's cost differs between the runs cannot be checked"
            )
            return out
        ratio = aa.factor / ab.factor
        out.ratio = ratio
        effect = ratio - 1.0
        apart = False
        if ab.interval and aa.interval:
            apart = ab.interval[1] < aa.interval[0] or aa.interval[1] < ab.interval[0]
        differs = apart or abs(effect) > DILATION_WARN
        if differs and traced_change is not None and abs(effect) >= 0.5 * abs(traced_change):
            if self.per_token_source == "trace":
                consequence = (
                    "the per-token times here are the traced ones, so the change may be the profiler's"
                )
            else:
                consequence = (
                    "each run's per-token time is its traced time divided by its own dilation, so the change "
                    "rests on the two corrections (and the split by part on the reconciliation)"
                )
                ub, ua = ab.unprofiled_mean_ns, aa.unprofiled_mean_ns
                if ub and ua:
                    consequence += (
                        f"; cross-check: the unprofiled passes' own means change by {_pct_signed(float(ua / ub) - 1)} "
                        f"against {_pct_signed(self.relative)} reported"
                    )
            out.warning = (
                f"profiler dilation differs: before {ab.factor:.2f}x, after {aa.factor:.2f}x; the profiler "
                f"alone changes the traced per-token time by {_pct_signed(effect)}, against a traced change "
                f"of {_pct_signed(traced_change)}: {consequence}"
            )
        return out

    # ---- tables

    def kernels(self) -> list[dd.DiffKernel]:
        return self._moved(dd.DiffKernel, "kernels", ["kind", "name"], ["count", "time_ns"], extra=["cls"])

    def collectives(self) -> list[dd.DiffCollective]:
        return self._moved(
            dd.DiffCollective, "collectives", ["op", "bytes"], ["count", "wait_ns", "transfer_ns", "time_ns"]
        )

    def _moved(
        self, row_type: type[T], table: str, keys: list[str], values: list[str], extra: Sequence[str] = ()
    ) -> list[T]:
        """`_moved_table` of the two sides' table `table` (a Side attribute), the top `self.top`."""
        before, after = getattr(self.before, table), getattr(self.after, table)
        return _moved_table(row_type, before, after, keys, values, self.top, extra=extra)

    def document(self) -> dd.Diff:
        """The document of docs/JSON.md#diff."""
        ints = self.integers()
        lo, hi = self.change_interval_ns
        rlo, rhi = self.relative_interval
        side = {
            s.label: dd.DiffBefore(
                path=s.path,
                n_ranks=s.parts.n_ranks,
                timeline=s.parts.timeline,
                steady_steps=int(len(s.parts.steady)),
                tokens=sum(len(r) for r in s.samples),
                rounds=len(s.samples),
                reconciliation=s.reconciliation,
            )
            for s in (self.before, self.after)
        }
        cause = self.cause()
        cause.sentence = self.cause_sentence()
        return dd.Diff(
            schema_version=SCHEMA_VERSION,
            kind="tracekit.diff",
            runs=dd.DiffRuns(**side),
            per_token_source=self.per_token_source,
            per_token_source_reason=self.source_reason,
            per_token_ns=dd.DiffPerTokenNs(before=ints.before, after=ints.after),
            per_token_interval_ns=dd.DiffPerTokenIntervalNs(
                **{k: [int(round(v[0])), int(round(v[1]))] for k, v in self.per_token_intervals_ns.items()}
            ),
            change_ns=ints.change,
            relative_change=self.relative,
            interval=dd.DiffInterval(
                level=BOOTSTRAP_LEVEL,
                resamples=BOOTSTRAP_RESAMPLES,
                change_ns=[int(round(lo)), int(round(hi))] if math.isfinite(lo) else None,
                relative=[rlo, rhi] if math.isfinite(rlo) else None,
            ),
            verdict=self.verdict_word(),
            summary=self.verdict(),
            matrix_vector=self.matrix_available,
            by_part=self.by_part(),
            per_rank=self.per_rank(),
            critical_path=self.path_change(),
            cause=cause,
            kernels=self.kernels(),
            collectives=self.collectives(),
            dilation=self.dilation(),
            data_quality=self.data_quality.document(),
        )


@dataclass(frozen=True)
class DiffIntegers:
    """A diff's per-token figures in integer ns: before, after, the change and its leaves (which
    sum to the change exactly)."""

    before: int
    after: int
    change: int
    leaf: dict[str, int]


def _moved_table(
    row_type: type[T],
    before: pd.DataFrame,
    after: pd.DataFrame,
    keys: list[str],
    values: list[str],
    top: int,
    extra: Sequence[str] = (),
) -> list[T]:
    """Rows matched by `keys`, with before / after / change of each value, status new / vanished /
    both, the `top` with the largest |change| of the last value (time)."""
    b = before.set_index(keys) if len(before) else pd.DataFrame(columns=[*extra, *values])
    a = after.set_index(keys) if len(after) else pd.DataFrame(columns=[*extra, *values])
    idx = list(dict.fromkeys([*b.index.tolist(), *a.index.tolist()]))
    rows = []
    main = values[-1]
    for k in idx:
        kt = k if isinstance(k, tuple) else (k,)
        in_b, in_a = k in b.index, k in a.index
        row: dict[str, str | int | float] = {
            key: (int(v) if isinstance(v, int | np.integer) else v) for key, v in zip(keys, kt, strict=True)
        }
        for e in extra:
            row[e] = str((a if in_a else b).loc[k, e])
        row["status"] = "both" if in_b and in_a else ("new" if in_a else "vanished")
        for v in values:
            vb = float(b.loc[k, v]) if in_b else 0.0
            va = float(a.loc[k, v]) if in_a else 0.0
            suffix = "" if v == "count" else ""
            row[f"{v}{suffix}_before"] = vb if v == "count" else int(round(vb))
            row[f"{v}{suffix}_after"] = va if v == "count" else int(round(va))
            row[f"{v}{suffix}_change"] = (va - vb) if v == "count" else int(round(va)) - int(round(vb))
        rows.append(row)
    rows.sort(key=lambda r: (-abs(float(r[f"{main}_change"])), -abs(float(r.get("count_change", 0)))))
    return [row_type(**r) for r in rows[:top]]
