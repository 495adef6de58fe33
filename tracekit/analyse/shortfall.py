"""Shortfall attribution (METHOD.md sections 5, 6 and 9).

`shortfall(baseline, sharded)` says where the per-token shortfall S = TN - T1/N of a run sharded
over N ranks goes, against a baseline of the same model on one rank (N_base ranks in general; the
ideal is then T1 * N_base / N).

Per run (`attribute_run`):
1. classify, find the step windows, partition each (rank, step) window exactly
   (`tracekit.analyse.steps`), match the collectives across ranks and split the exposed collective
   part of every window exactly into wait and transfer (`tracekit.analyse.collectives.split_exposed`:
   collective == wait + transfer, integer ns).
2. per step index, the slowest rank's window and that rank's parts: compute, memory, transfer,
   wait, unknown, sync, idle (they sum to the window exactly).
3. the first `skip_first` steps are warm-up; the per-token figure of every part is its **mean**
   over the steady steps, kept as an exact fraction. Means are additive: the per-token parts sum
   exactly to the per-token time, so the terms below sum exactly to S. Medians and p10/p90 over
   steps are reported beside (`spread_ns`).

Terms (f = N_base / N):
    compute      = CN - f C1
    memory       = MN - f M1
    transfer     = XN - f X1
    coordination = (WN - f W1) + (YN - f Y1) + (IN - f I1)       wait + sync + idle
    unknown      = UN - f U1    (only in `terms_ns` when it is not zero)
Integers in the JSON: the per-token figures are rounded, S = sharded - ideal, and the leaf terms
are rounded by largest remainder to sum to S exactly (asserted).

Dilation (issue 9): when both runs' manifests carry unprofiled per-token times, T1 and TN come
from the unprofiled pass (the mean over the same steady tokens), and each run's traced parts are
reconciled to it (`reconcile`, documented in docs/METHOD-NOTES.md); the trace-only attribution is
kept under `uncorrected`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.collectives import CollectiveInstances, assign_steps, match_collectives, split_exposed
from tracekit.analyse.dilation import DEFAULT_THRESHOLD, Dilation, dilation_of
from tracekit.errors import MatchError, RankError, StepError
from tracekit.model.events import DataQuality, Run

#: 1.2: collectives.by_op[].bytes_source; 1.3: diagnosis; 1.4: collectives.by_op[].wait_ns_median is the
#: median over instances of the per-instance max wait (was: over every (instance, rank) row)
SCHEMA_VERSION = "1.4"

#: The leaf parts of a step window, after the collective part is split (they sum to the window).
LEAF_PARTS: tuple[str, ...] = ("compute", "memory", "transfer", "wait", "unknown", "sync", "idle")
#: Leaf parts that make up the coordination term.
COORDINATION: tuple[str, ...] = ("wait", "sync", "idle")
#: Terms of the shortfall, in report order.
TERMS: tuple[str, ...] = ("compute", "memory", "transfer", "coordination", "unknown")

_TERM_WORDS = {
    "compute": "compute that did not shrink N-fold",
    "memory": "memory copies and sets that did not shrink N-fold",
    "transfer": "bytes on the link (collective transfer)",
    "coordination": "ranks waiting for each other and host gaps",
    "unknown": "unclassified kernels",
}


# ------------------------------------------------------------------------------------------
# one run


@dataclass
class RunParts:
    """The per-step parts of one run and what they came from.

    - `steps`: per (rank, step): window and the partition parts, plus wait_ns / transfer_ns.
    - `slowest`: per step index (steady and warm-up): the slowest rank and its leaf parts
      (`<part>_ns` for LEAF_PARTS, `window_ns`), with `steady` True for the steps used.
    - `per_token`: exact mean per leaf part over the steady steps (Fractions) and "window".
    """

    n_ranks: int
    ranks: list[int]
    timeline: str
    steps: pd.DataFrame
    slowest: pd.DataFrame
    per_token: dict[str, Fraction]
    collectives: CollectiveInstances
    dilation: Dilation
    step_pattern: str | None
    data_quality: DataQuality = field(default_factory=DataQuality)

    @property
    def steady(self) -> pd.DataFrame:
        return self.slowest[self.slowest["steady"]]


def check_ranks(run: Run, label: str) -> None:
    """RankError when the manifest names more ranks than the run has files for."""
    m = run.manifest or {}
    tp = (m.get("workload") or {}).get("tp") if isinstance(m.get("workload"), Mapping) else None
    if isinstance(tp, int) and tp > 0:
        present = set(run.ranks)
        missing = sorted(set(range(tp)) - present)
        if missing:
            raise RankError(
                f"{label}: the manifest says tp={tp} but there are no trace files for rank(s) "
                f"{', '.join(map(str, missing))} (found ranks {sorted(present)})"
            )


def ranks_without_kernels(classified: pd.DataFrame, ranks: list[int]) -> list[int]:
    """The ranks with GPU activity (a GPU timeline) but not one kernel: a trace that lost its kernels."""
    from tracekit.analyse.steps import cat_mask
    from tracekit.classify.rules import GPU_KINDS

    ev_rank = classified["rank"].to_numpy(np.int64)
    gpu = cat_mask(classified["kind"], GPU_KINDS)
    kern = cat_mask(classified["kind"], {"kernel"})
    out = []
    for r in ranks:
        on = ev_rank == r
        if gpu[on].any() and not kern[on].any():
            out.append(int(r))
    return out


def _host_layers(classified: pd.DataFrame, ranks: list[int]) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Per rank, the partition's compute+memory intervals (`higher`) and collective intervals,
    from the same timeline the step partition uses."""
    from tracekit.analyse import steps as steps_mod

    layers = steps_mod._LAYERS
    coll_layer = layers.index("collective")
    hi, co = [], []
    timelines = set()
    ev_rank = classified["rank"].to_numpy(np.int64)
    for r in ranks:
        timeline, s, e, layer = steps_mod._rank_layers(classified[ev_rank == r])
        timelines.add(timeline)
        h = layer < coll_layer
        c = layer == coll_layer
        hi.append(pd.DataFrame({"rank": r, "start_ns": s[h], "end_ns": e[h]}))
        co.append(pd.DataFrame({"rank": r, "start_ns": s[c], "end_ns": e[c]}))
    timeline = "gpu" if timelines == {"gpu"} else ("host" if timelines == {"host"} else "mixed")
    return pd.concat(hi, ignore_index=True), pd.concat(co, ignore_index=True), timeline


def attribute_run(
    run: Run,
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float = DEFAULT_THRESHOLD,
    label: str = "run",
    allow_partial: bool = False,
) -> RunParts:
    """Per-step leaf parts of one run (see the module doc)."""
    from tracekit.analyse.steps import find_steps_detailed, partition_steps
    from tracekit.classify import classify

    check_ranks(run, label)
    dq = DataQuality()
    classified = run.events if "cls" in run.events.columns else classify(run.events)
    if run.manifest and "workload" in run.manifest and not isinstance(run.manifest["workload"], Mapping):
        dq.add(
            "manifest_field_malformed",
            1,
            f"{label}: manifest.json field 'workload' is not an object; its tp, step pattern and "
            "collectives are ignored",
        )
    if step_pattern is None and run.manifest:
        wl = run.manifest.get("workload")
        sp = wl.get("step_pattern") if isinstance(wl, Mapping) else None
        step_pattern = sp if isinstance(sp, str) and sp else None
    try:
        found = find_steps_detailed(classified, step_pattern)
    except StepError as exc:
        raise StepError(f"{label}: {exc}") from None
    dq.merge(found.data_quality)
    table = partition_steps(classified, found.steps)
    ranks = sorted(int(r) for r in table["rank"].unique())

    coll = match_collectives(
        classified,
        ranks=run.ranks,
        rank_info=run.rank_info,
        manifest=run.manifest,
        allow_partial=allow_partial,
        steps=found.steps,
    )
    dq.merge(coll.data_quality)
    higher, coll_iv, timeline = _host_layers(classified, ranks)
    no_kernels = ranks_without_kernels(classified, ranks)
    if no_kernels:
        dq.add(
            "ranks_without_kernels",
            len(no_kernels),
            f"{label}: rank(s) {', '.join(map(str, no_kernels))} have GPU activity (copies, sets) but no kernels: "
            "were kernels left out of the trace?",
        )
    windows = table[["rank", "step", "start_ns", "end_ns"]]
    split = split_exposed(windows, higher, coll.per_rank, collective=coll_iv)
    table = table.merge(
        split[["rank", "step", "collective_ns", "wait_ns", "transfer_ns"]],
        on=["rank", "step"],
        suffixes=("", "_split"),
    )
    if not (table["collective_ns"] == table["collective_ns_split"]).all():
        bad = table[table["collective_ns"] != table["collective_ns_split"]].iloc[0]
        raise AssertionError(
            f"{label}: exposed collective of rank {bad['rank']} step {bad['step']} is "
            f"{bad['collective_ns']} ns in the partition but {bad['collective_ns_split']} ns in the wait/transfer split"
        )
    table = table.drop(columns=["collective_ns_split"])

    # per step index: the slowest rank's window and its parts (ties: the lowest rank)
    srt = table.sort_values(["step", "window_ns", "rank"], ascending=[True, False, True])
    slowest = srt.drop_duplicates("step").sort_values("step").reset_index(drop=True)
    counts = table.groupby("step")["rank"].nunique()
    partial_steps = counts[counts < len(ranks)]
    if len(partial_steps):
        dq.add(
            "steps_missing_on_some_ranks",
            int(len(partial_steps)),
            f"{label}: {len(partial_steps)} step(s) are not on every rank; their slowest rank is over the ranks that have them",
        )
    n_steps = len(slowest)
    skip = min(skip_first, max(n_steps - 1, 0))
    if skip < skip_first:
        dq.add(
            "too_few_steps",
            1,
            f"{label}: only {n_steps} step(s); skipped {skip} as warm-up instead of {skip_first}",
        )
    slowest["steady"] = np.arange(n_steps) >= skip
    for p in LEAF_PARTS:
        if f"{p}_ns" not in slowest.columns:
            raise AssertionError(f"missing part {p}")
    leaf = slowest[[f"{p}_ns" for p in LEAF_PARTS]].to_numpy(np.int64)
    if not np.array_equal(leaf.sum(axis=1), slowest["window_ns"].to_numpy(np.int64)):
        raise AssertionError(f"{label}: leaf parts do not sum to the window")
    steady = slowest[slowest["steady"]]
    n = len(steady)
    if n == 0:
        raise StepError(f"{label}: no steps to attribute")
    per_token = {p: Fraction(int(steady[f"{p}_ns"].sum()), n) for p in LEAF_PARTS}
    per_token["window"] = Fraction(int(steady["window_ns"].sum()), n)
    assert sum(per_token[p] for p in LEAF_PARTS) == per_token["window"]

    dil = dilation_of(run.manifest, skip_first=skip_first, threshold=dilation_threshold)
    for note in dil.notes:
        dq.add("manifest_field_malformed", 1, f"{label}: {note}")
    return RunParts(
        n_ranks=len(run.ranks),
        ranks=list(run.ranks),
        timeline=timeline,
        steps=table,
        slowest=slowest,
        per_token=per_token,
        collectives=coll,
        dilation=dil,
        step_pattern=found.pattern,
        data_quality=dq,
    )


# ------------------------------------------------------------------------------------------
# reconciliation to the unprofiled per-token time


def reconcile(
    parts: Mapping[str, Fraction], target: Fraction, timeline: str
) -> tuple[dict[str, Fraction], str]:
    """Scale the traced per-token parts to sum to the unprofiled per-token time `target`, exactly.

    - device timeline ("gpu"): the profiler's cost is host time, which shows up between device
      work. Device-side parts (compute, memory, transfer, unknown) are kept as measured; the excess
      (traced - unprofiled) is taken out of idle first, then sync, then wait. If it exceeds all
      three, the rest is taken from every part in proportion. A traced time *shorter* than the
      unprofiled one (no excess) scales every part in proportion.
    - host timeline ("host"/"mixed": CPU-only runs): the compute on the timeline is itself host
      time the profiler dilates (op callbacks land inside parent ops and between ops alike), so
      every host-executed part (all but transfer, whose gloo exchange records no ops) is scaled
      by one factor; transfer is kept.
    Returns the new parts and one sentence saying what was done.
    """
    traced = sum(parts[p] for p in LEAF_PARTS)
    out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
    if traced == target:
        return out, "the traced per-token time equals the unprofiled one; nothing to reconcile"
    excess = traced - target
    pct = float(excess / target) if target else float("nan")

    def proportional(keys: tuple[str, ...]) -> None:
        base = sum(out[k] for k in keys)
        rest = sum(out[k] for k in LEAF_PARTS if k not in keys)
        if base <= 0:
            keys_all = LEAF_PARTS
            base, rest = sum(out[k] for k in keys_all), Fraction(0)
            keys = keys_all
        factor = (target - rest) / base
        for k in keys:
            out[k] = out[k] * factor

    if timeline == "gpu":
        if excess < 0:
            proportional(LEAF_PARTS)
            return out, (
                f"the traced per-token time is {-pct:.1%} below the unprofiled one; every part was scaled up "
                "in proportion to match it"
            )
        left = excess
        taken = []
        for k in ("idle", "sync", "wait"):
            take = min(left, out[k])
            if take > 0:
                out[k] -= take
                left -= take
                taken.append(k)
        if left > 0:
            proportional(LEAF_PARTS)
            return out, (
                f"profiler excess of {pct:.1%} over the unprofiled per-token time exceeds idle + sync + wait; "
                "those were emptied and the rest scaled every part in proportion"
            )
        return out, (
            f"the profiler's excess ({pct:+.1%} over the unprofiled per-token time) was taken out of "
            f"{' then '.join(taken) or 'nothing'} (host time between device work); compute, memory and "
            "transfer are kept as measured"
        )
    keys = tuple(k for k in LEAF_PARTS if k != "transfer")
    proportional(keys)
    return out, (
        f"CPU-only timeline: every host-executed part (all but transfer) was scaled by one factor to "
        f"remove the profiler's {pct:+.1%} on the per-token time (host ops are dilated as much as the gaps)"
    )


# ------------------------------------------------------------------------------------------
# the attribution


@dataclass
class Attribution:
    """Exact per-token figures of one attribution (Fractions) and their integer JSON form."""

    baseline_ns: Fraction
    sharded_ns: Fraction
    ideal_ns: Fraction
    leaf_terms: dict[str, Fraction]  # per LEAF_PARTS: PN - f P1

    @property
    def shortfall_ns(self) -> Fraction:
        return self.sharded_ns - self.ideal_ns

    def terms(self) -> dict[str, Fraction]:
        t = {
            "compute": self.leaf_terms["compute"],
            "memory": self.leaf_terms["memory"],
            "transfer": self.leaf_terms["transfer"],
            "coordination": sum((self.leaf_terms[k] for k in COORDINATION), Fraction(0)),
            "unknown": self.leaf_terms["unknown"],
        }
        assert sum(t.values()) == self.shortfall_ns, "terms do not sum to the shortfall"
        return t

    def integers(self) -> dict[str, Any]:
        """The JSON figures: ints that sum exactly (largest remainder on the leaf terms)."""
        base = _round(self.baseline_ns)
        sharded = _round(self.sharded_ns)
        ideal = _round(self.ideal_ns)
        s = sharded - ideal
        leaf = _round_to_sum(self.leaf_terms, s)
        terms = {
            "compute": leaf["compute"],
            "memory": leaf["memory"],
            "transfer": leaf["transfer"],
            "coordination": sum(leaf[k] for k in COORDINATION),
        }
        if self.leaf_terms["unknown"] != 0 or leaf["unknown"] != 0:
            terms["unknown"] = leaf["unknown"]
        assert sum(terms.values()) == s
        return {
            "per_token_ns": {"baseline": base, "sharded": sharded, "ideal": ideal},
            "shortfall_ns": s,
            "terms_ns": terms,
            "coordination_ns": {k: leaf[k] for k in COORDINATION},
        }


def _round(x: Fraction) -> int:
    return int(math.floor(x + Fraction(1, 2)))


def _round_to_sum(values: Mapping[str, Fraction], total: int) -> dict[str, int]:
    """Round each value to an int so that the ints sum to `total` (largest remainder)."""
    floors = {k: math.floor(v) for k, v in values.items()}
    k_left = total - sum(floors.values())
    order = sorted(values, key=lambda k: (values[k] - floors[k], k), reverse=True)
    out = dict(floors)
    i = 0
    while k_left > 0:
        out[order[i % len(order)]] += 1
        k_left -= 1
        i += 1
    i = 0
    while k_left < 0:
        out[order[::-1][i % len(order)]] -= 1
        k_left += 1
        i += 1
    return out


def attribute(base: Mapping[str, Fraction], sharded: Mapping[str, Fraction], factor: Fraction) -> Attribution:
    """Terms from per-token leaf parts of the baseline and the sharded run; factor = N_base / N."""
    tb = sum(base[p] for p in LEAF_PARTS)
    tn = sum(sharded[p] for p in LEAF_PARTS)
    leaf = {p: sharded[p] - factor * base[p] for p in LEAF_PARTS}
    att = Attribution(Fraction(tb), Fraction(tn), factor * tb, leaf)
    att.terms()  # asserts the exact sum
    return att


# ------------------------------------------------------------------------------------------
# the result


@dataclass
class Shortfall:
    """The attribution of S for one (baseline, sharded) pair; `to_json()` per docs/JSON.md#shortfall."""

    n_ranks: int
    baseline: RunParts
    sharded: RunParts
    factor: Fraction
    corrected: Attribution
    uncorrected: Attribution
    per_token_source: str  # "unprofiled" | "trace"
    reconciliation: str
    spread_ns: dict[str, dict[str, int]]
    data_quality: DataQuality

    @property
    def attribution(self) -> Attribution:
        return self.corrected

    def shares(self) -> dict[str, float | None]:
        ints = self.corrected.integers()
        s = ints["shortfall_ns"]
        return {k: (v / s if s else None) for k, v in ints["terms_ns"].items()}

    def verdict(self) -> str:
        ints = self.corrected.integers()
        s = ints["shortfall_ns"]
        terms = ints["terms_ns"]
        pt = ints["per_token_ns"]
        n = self.n_ranks
        head = f"TP={n}: {_ms(pt['sharded'])} vs ideal {_ms(pt['ideal'])}"
        dil = self._dilation_clause()
        if s <= 0:
            return f"TP={n} meets its ideal: {_ms(pt['sharded'])} per token vs ideal {_ms(pt['ideal'])} (no shortfall). {dil}"
        top = max(terms, key=lambda k: terms[k])
        share = terms[top] / s
        others = []
        if top != "transfer" and "transfer" in terms:
            others.append(f"link transfer is {terms['transfer'] / s:.0%}")
        if top != "coordination":
            others.append(f"coordination is {terms['coordination'] / s:.0%}")
        if top != "compute":
            others.append(f"compute scaling is {terms['compute'] / s:.0%}")
        rest = "; ".join(others[:2])
        return (
            f"{top.capitalize()} holds this run back: {share:.0%} of the {_ms(s)} per-token shortfall "
            f"({head}) is {_TERM_WORDS[top]}; {rest}. {dil}"
        )

    def diagnosis(self) -> str:
        """What to look at next, from the dominant term and the evidence behind it (one sentence)."""
        ints = self.corrected.integers()
        s = ints["shortfall_ns"]
        terms = ints["terms_ns"]
        if s <= 0:
            return "Nothing to recover at this TP degree."
        top = max(terms, key=lambda k: terms[k])
        n = self.n_ranks
        # GPU busy share of a TP=1 token: device work as traced (the reconciliation keeps it as
        # measured on a GPU timeline) over the per-token time T1 the attribution uses
        base = self.baseline.per_token
        t1 = self.corrected.baseline_ns
        busy = (
            float((base.get("compute", 0) + base.get("memory", 0)) / t1)
            if t1 and self.baseline.timeline == "gpu"
            else None
        )
        if top == "coordination":
            st = self.sharded.collectives.stragglers
            if len(st) and float(st["share"].max()) >= 0.8 and n > 1:
                r = st.loc[st["share"].idxmax()]
                return (
                    f"Rank {int(r['rank'])} arrives last at {float(r['share']):.0%} of the collectives: "
                    "look at what that rank does on the host before each collective (a straggler)."
                )
            if busy is not None and busy < 0.5:
                return (
                    f"The TP=1 baseline keeps its GPU busy only {busy:.0%} of a token: the loop is bound by "
                    f"the host launching kernels, and at TP={n} every collective waits for the slower rank's "
                    "host; cut host time (CUDA graphs, torch.compile, fewer launches) before adding ranks."
                )
            return (
                "Ranks wait for each other at collectives: look for host work between collectives "
                "(Python, synchronisations, data-dependent control flow) that differs across ranks."
            )
        if top == "transfer" and self.sharded.timeline == "host":
            return (
                "On this CPU run the link is gloo's exchange over the host (TCP loopback on one machine): "
                "each small collective pays its latency after both ranks arrive; on GPUs, compare links "
                "with `tracekit compare-links`."
            )
        if top == "transfer":
            return (
                "Bytes on the link dominate: compare the realised busbw with the link's "
                "(`tracekit compare-links --trace ... --baseline ...`) and consider fewer or larger collectives."
            )
        if top == "compute":
            return (
                f"Compute did not shrink {n}-fold: per-rank kernels at this size may be too small to fill "
                "the GPU; compare matrix vs vector time in `tracekit breakdown`."
            )
        if top == "memory":
            return "Memory copies did not shrink: look for host-device copies inside the step."
        return "Unclassified kernels dominate: see the unknown kernels in `tracekit breakdown`."

    def _dilation_clause(self) -> str:
        parts = []
        for label, run in (("baseline", self.baseline), ("sharded", self.sharded)):
            d = run.dilation.dilation
            parts.append(f"{label} {d:.2f}x" if d is not None else f"{label} unknown")
        corrected = self.per_token_source == "unprofiled"
        inflated = any(r.dilation.inflated for r in (self.baseline, self.sharded))
        if corrected:
            state = "corrected to the unprofiled times"
        elif all(r.dilation.unprofiled is not None for r in (self.baseline, self.sharded)):
            state = "uncorrected: the unprofiled pass was slower than the profiled one (noisy host)"
        else:
            state = "uncorrected: no unprofiled timing"
        tail = ""
        if inflated and not corrected:
            tail = "; the coordination share is inflated by the profiler"
        elif inflated:
            tail = (
                f"; above {self.sharded.dilation.threshold:.0%}, see `uncorrected` for the trace-only figures"
            )
        return f"Profiler dilation {', '.join(parts)} ({state}{tail})."

    def to_json(self) -> dict[str, Any]:
        ints = self.corrected.integers()
        unc = self.uncorrected.integers()
        s = ints["shortfall_ns"]
        coll = self.sharded.collectives
        d_b, d_s = self.baseline.dilation, self.sharded.dilation
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "tracekit.shortfall",
            "n_ranks": self.n_ranks,
            "baseline_ranks": self.baseline.n_ranks,
            "per_token_ns": ints["per_token_ns"],
            "per_token_source": self.per_token_source,
            "per_token_median_ns": {
                "baseline": _median_window(self.baseline, d_b, self.per_token_source),
                "sharded": _median_window(self.sharded, d_s, self.per_token_source),
            },
            "shortfall_ns": s,
            "terms_ns": ints["terms_ns"],
            "coordination_ns": ints["coordination_ns"],
            "shares": {k: (v / s if s else None) for k, v in ints["terms_ns"].items()},
            "spread_ns": self.spread_ns,
            "verdict": self.verdict(),
            "diagnosis": self.diagnosis(),
            "dilation": {
                "baseline": d_b.dilation,
                "sharded": d_s.dilation,
                "threshold": d_s.threshold,
                "inflated": _any_true(d_b.inflated, d_s.inflated),
                "reconciliation": self.reconciliation,
                "runs": {"baseline": d_b.to_json(), "sharded": d_s.to_json()},
            },
            "uncorrected": {
                "per_token_ns": unc["per_token_ns"],
                "shortfall_ns": unc["shortfall_ns"],
                "terms_ns": unc["terms_ns"],
                "coordination_ns": unc["coordination_ns"],
                "shares": {
                    k: (v / unc["shortfall_ns"] if unc["shortfall_ns"] else None)
                    for k, v in unc["terms_ns"].items()
                },
            },
            "stragglers": coll.stragglers_json(),
            "collectives": _collectives_json(self.sharded),
            "clock": coll.clock.to_json(),
            "steps": {
                "baseline": _steps_json(self.baseline),
                "sharded": _steps_json(self.sharded),
            },
            "data_quality": self.data_quality.to_dict(),
        }
        return doc


def _any_true(*xs: bool | None) -> bool | None:
    if all(x is None for x in xs):
        return None
    return any(bool(x) for x in xs)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms" if abs(ns) >= 1e5 else f"{ns / 1e3:.1f} us"


def _median_window(run: RunParts, d: Dilation, source: str) -> int:
    if source == "unprofiled" and d.unprofiled is not None:
        return int(round(d.unprofiled.median_ns))
    return int(round(float(np.median(run.steady["window_ns"].to_numpy()))))


def _steps_json(run: RunParts) -> dict[str, Any]:
    return {
        "pattern": run.step_pattern,
        "total": int(len(run.slowest)),
        "steady": int(run.slowest["steady"].sum()),
        "timeline": run.timeline,
        "slowest_rank_counts": {
            str(int(k)): int(v) for k, v in run.steady["rank"].value_counts().sort_index().items()
        },
    }


def _collectives_json(run: RunParts) -> dict[str, Any]:
    coll = run.collectives
    inst = coll.instances
    pr = coll.per_rank
    steady_steps = set(run.steady["step"].tolist())
    if len(pr):
        min_rank = pr["rank"].min()
        windows = run.steps[["rank", "step", "start_ns", "end_ns"]]
        first = pr[pr["rank"] == min_rank]
        inst_step = pd.Series(assign_steps(first, windows).to_numpy(), index=first["instance"].to_numpy())
        in_steady = int(inst_step.isin(steady_steps).sum())
    else:
        in_steady = 0
    n_steady = max(len(steady_steps), 1)
    by_op = []
    if len(inst):
        src_col = inst["bytes_source"] if "bytes_source" in inst.columns else "unknown"
        inst = inst.assign(bytes_source=src_col)
        pr_i = pr.merge(
            inst[["instance", "op", "size_bytes", "bytes_source", "skew_ns", "busbw_gbps"]],
            on="instance",
            suffixes=("", "_i"),
        )
        for (op, size, src), g in pr_i.groupby(["op_i", "size_bytes", "bytes_source"], sort=True):
            ig = inst[(inst["op"] == op) & (inst["size_bytes"] == size) & (inst["bytes_source"] == src)]
            bw = ig["busbw_gbps"].dropna()
            by_op.append(
                {
                    "op": str(op),
                    "bytes": int(size),
                    "bytes_source": str(src),  # "trace" | "manifest" | "unknown"
                    "count": int(len(ig)),
                    # per instance the wait of the ranks that waited (the last arriver waits 0 by
                    # definition), then the median over instances
                    "wait_ns_median": int(round(float(ig["wait_ns_max"].median()))),
                    "transfer_ns_median": int(round(float(g["transfer_ns"].median()))),
                    "skew_ns_median": int(round(float(ig["skew_ns"].median()))),
                    "busbw_gbps_median": float(bw.median()) if len(bw) else None,
                }
            )
    return {
        "instances": int(len(inst)),
        "per_token": in_steady / n_steady,
        "level": coll.level,
        "match_by": coll.match_by,
        "by_op": by_op,
    }


def _spread(
    base: RunParts, sharded: RunParts, factor: Fraction, shift: Mapping[str, Fraction]
) -> dict[str, dict[str, int]]:
    """p10 / median / p90 over the sharded run's steady steps of each per-step term
    (PN_step - f * mean P1), shifted by the reconciliation (`shift`: corrected - uncorrected mean)."""
    st = sharded.steady
    per_step: dict[str, np.ndarray] = {}
    for p in LEAF_PARTS:
        per_step[p] = st[f"{p}_ns"].to_numpy(np.float64) - float(factor * base.per_token[p])
    groups = {
        "compute": ("compute",),
        "memory": ("memory",),
        "transfer": ("transfer",),
        "coordination": COORDINATION,
        "wait": ("wait",),
        "sync": ("sync",),
        "idle": ("idle",),
        "unknown": ("unknown",),
    }
    out: dict[str, dict[str, int]] = {}
    for name, keys in groups.items():
        vals = sum(per_step[k] for k in keys) + float(sum(shift[k] for k in keys))
        arr = np.asarray(vals, dtype=np.float64)
        out[name] = {
            "p10": int(round(float(np.quantile(arr, 0.1)))),
            "median": int(round(float(np.median(arr)))),
            "p90": int(round(float(np.quantile(arr, 0.9)))),
        }
    shortfall = (
        st["window_ns"].to_numpy(np.float64)
        - float(factor * base.per_token["window"])
        + float(sum(shift[k] for k in LEAF_PARTS))
    )
    out["shortfall"] = {
        "p10": int(round(float(np.quantile(shortfall, 0.1)))),
        "median": int(round(float(np.median(shortfall)))),
        "p90": int(round(float(np.quantile(shortfall, 0.9)))),
    }
    return out


def shortfall_from_parts(base: RunParts, sharded: RunParts) -> Shortfall:
    """The attribution from two attributed runs (see `shortfall`)."""
    n = sharded.n_ranks
    if base.n_ranks > n:
        raise RankError(
            f"the baseline has {base.n_ranks} ranks and the sharded run {n}: the baseline must be the "
            "run on fewer ranks (TP=1); were --baseline and --sharded swapped?"
        )
    if n > 1 and sharded.timeline == "gpu" and sharded.collectives.n_instances == 0:
        raise MatchError(
            f"the sharded run has {n} ranks on the GPU timeline but no collectives "
            "(kernels missing from the trace?): the wait and transfer between ranks cannot be attributed"
        )
    factor = Fraction(base.n_ranks, n)
    dq = DataQuality()
    dq.merge(base.data_quality).merge(sharded.data_quality)
    uncorrected = attribute(base.per_token, sharded.per_token, factor)

    ub, us = base.dilation.unprofiled, sharded.dilation.unprofiled
    # a profiler cannot make a run faster: a profiled pass clearly faster than the unprofiled one
    # means the two passes ran under different conditions (a noisy host), and the unprofiled
    # figure is then no better a per-token time than the traced one
    faster = [
        (lbl, r.dilation.dilation)
        for lbl, r in (("baseline", base), ("sharded", sharded))
        if r.dilation.dilation is not None and r.dilation.dilation < 1.0 / (1.0 + r.dilation.threshold)
    ]
    if faster:
        dq.add(
            "unprofiled_slower_than_profiled",
            len(faster),
            "the unprofiled pass was slower than the profiled one ("
            + ", ".join(f"{lbl} dilation {d:.2f}x" for lbl, d in faster)
            + "): the host was noisy; the attribution is not corrected",
        )
    if ub is not None and us is not None and not faster:
        pb, rb = reconcile(base.per_token, ub.mean_ns, base.timeline)
        ps, rs = reconcile(sharded.per_token, us.mean_ns, sharded.timeline)
        corrected = attribute(pb, ps, factor)
        source = "unprofiled"
        reconciliation = f"T1 and TN are the unprofiled per-token means over the steady tokens; baseline: {rb}; sharded: {rs}."
        shift = {p: ps[p] - sharded.per_token[p] for p in LEAF_PARTS}
        # the baseline's reconciliation moves every sharded per-step term by the same amount
        for p in LEAF_PARTS:
            shift[p] -= factor * (pb[p] - base.per_token[p])
    else:
        corrected = uncorrected
        source = "trace"
        missing = [lbl for lbl, t in (("baseline", ub), ("sharded", us)) if t is None]
        if missing:
            reconciliation = (
                f"not corrected: no unprofiled per-token times for the {' and '.join(missing)} run "
                "(capture with `tracekit capture`); T1, TN and the parts are the traced ones"
            )
            dq.add(
                "dilation_unknown",
                1,
                "per-token times come from the trace; the profiler's dilation is not removed",
            )
        else:
            reconciliation = (
                "not corrected: the unprofiled pass was slower than the profiled one (a noisy host), so it is no "
                "better a per-token time than the trace; T1, TN and the parts are the traced ones"
            )
        shift = {p: Fraction(0) for p in LEAF_PARTS}
    spread = _spread(base, sharded, factor, shift)
    return Shortfall(
        n_ranks=n,
        baseline=base,
        sharded=sharded,
        factor=factor,
        corrected=corrected,
        uncorrected=uncorrected,
        per_token_source=source,
        reconciliation=reconciliation,
        spread_ns=spread,
        data_quality=dq,
    )


def shortfall(
    baseline: Run,
    sharded: Run,
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float = DEFAULT_THRESHOLD,
    allow_partial: bool = False,
) -> Shortfall:
    """Attribute the per-token shortfall of `sharded` against `baseline` (module doc)."""
    base = attribute_run(
        baseline,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        label="baseline",
        allow_partial=allow_partial,
    )
    shard = attribute_run(
        sharded,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        label="sharded",
        allow_partial=allow_partial,
    )
    return shortfall_from_parts(base, shard)
