"""Speedup decomposition through a matched intermediate (docs/METHOD.md section Speedup decomposition).

Three runs of the same workload: a baseline stack A, an intermediate B (the new runtime with the
old kernels: CUDA graphs, torch.compile, ...) and the full stack C (B plus new kernels, another
dtype or quantisation). With per-token times tA, tB, tC the end-to-end speedup factors exactly,
tA/tC = (tA/tB)(tB/tC), so on a log scale

    runtime part = log(tA/tB) / log(tA/tC)        kernel part = log(tB/tC) / log(tA/tC)

and the two parts sum to 1. Each comes with a 95% percentile bootstrap interval over steps (each
run's rounds drawn with replacement, then its tokens within each drawn round, as the dilation's
interval does; 2000 resamples, seed 0), and with the classes that moved in
it: per class (matrix compute, vector compute, memory, collective transfer, coordination = wait +
sync + idle, unknown) the per-token time it saved, `parts_A - parts_B` and `parts_B - parts_C`,
which sum exactly to `tA - tB` and `tB - tC`; a class's share of a part's log contribution is its
share of that part's saving.

Per-token times and parts are the shortfall's (`tracekit.analyse.attribution.plan.attribute_run`): the
steady steps' mean, parts per rank averaged over ranks, and, when the manifests carry unprofiled
per-token times, the unprofiled means with each rank's traced parts reconciled to them
(`correction.correct_run`), exactly as the shortfall does; else the traced ones. The compute part is
split into matrix and vector by the traced share of each rank's compute time under matrix
kernels (classifier subclass `matrix`: GEMM, attention) on a GPU timeline, or under matrix ops
(`aten::mm`, `addmm`, `bmm`, `matmul`, `linear`, scaled-dot-product attention, ...) on a CPU-only
host timeline (`compute_split`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from tracekit.analyse.attribution.correction import correct_run
from tracekit.analyse.attribution.options import DEFAULT_OPTIONS, AttributionOptions
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.run import RunParts, mean_over_ranks
from tracekit.analyse.exact import round_half_up, round_to_sum
from tracekit.analyse.resample import boot_means
from tracekit.analyse.timeline.compute_split import compute_split
from tracekit.classify import classify
from tracekit.errors import TracekitError
from tracekit.model import units
from tracekit.model.documents import decompose as dd
from tracekit.model.documents.base import Documented
from tracekit.model.events import DataQuality, Run
from tracekit.model.parts import LEAF_PARTS

SCHEMA_VERSION = "1.0"

#: The classes of the decomposition, in report order, and what each is in words.
CLASS_WORDS: dict[str, str] = {
    "matrix": "matrix compute (GEMM, attention)",
    "vector": "vector compute (elementwise, norms, activations, dequantisation)",
    "memory": "memory copies and sets",
    "collective": "collective transfer",
    "coordination": "coordination (wait, sync, host gaps)",
    "unknown": "unclassified kernels",
}
CLASSES: tuple[str, ...] = tuple(CLASS_WORDS)
RUNS: tuple[str, ...] = ("baseline", "intermediate", "full")

BOOTSTRAP_RESAMPLES = 2000  # per run: rounds drawn with replacement, then tokens within each
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95


class DecomposeError(TracekitError):
    """The three runs cannot be decomposed (no speedup to split, no steps, ...)."""


# ------------------------------------------------------------------------------------------
# one run


@dataclass
class RunFigures:
    """One run's per-token time and class parts (Fractions, ns), and the samples to bootstrap."""

    label: str
    path: str
    n_ranks: int
    timeline: str
    per_token_ns: Fraction
    source: str  # "unprofiled" | "trace"
    classes: dict[str, Fraction]  # CLASSES -> per-token ns, summing to per_token_ns
    samples_ns: list[list[int]]  # per-token samples by round (unprofiled rounds, or the steady steps as one)
    steps: int
    matrix_share_of_compute: float | None
    reconciliation: str
    data_quality: DataQuality = field(default_factory=DataQuality)

    def document(self) -> dd.DecomposeBaseline:
        return dd.DecomposeBaseline(
            path=self.path,
            n_ranks=self.n_ranks,
            timeline=self.timeline,
            per_token_ns=round_half_up(self.per_token_ns),
            per_token_source=self.source,
            samples=sum(len(r) for r in self.samples_ns),
            sample_rounds=len(self.samples_ns),
            steady_steps=self.steps,
            classes_ns=round_to_sum(self.classes, round_half_up(self.per_token_ns)),
            matrix_share_of_compute=self.matrix_share_of_compute,
            reconciliation=self.reconciliation,
        )


def run_figures(
    run: Run, label: str, *, path: str = "", options: AttributionOptions = DEFAULT_OPTIONS
) -> RunFigures:
    """Per-token time and class parts of one run attributed with `options` (module doc)."""

    if "cls" not in run.events.columns:
        run = replace(run, events=classify(run.events))
    rp: RunParts = attribute_run(run, options, label=label)
    return figures_of(rp, compute_split(run.events, split_windows(rp)), label, path=path)


def split_windows(rp: RunParts) -> pd.DataFrame:
    """The (rank, step) windows `compute_split` splits: the attributed run's rank steps."""
    return rp.rank_steps[["rank", "step", "start_ns", "end_ns", "compute_ns"]]


def figures_of(rp: RunParts, split: pd.DataFrame, label: str, *, path: str = "") -> RunFigures:
    """`run_figures` from the attributed run and its `compute_split` (both engines: on Dask the
    split is computed per rank where the events are, `command_plans.figures_plan`)."""
    dq = DataQuality().merge(rp.data_quality)
    traced_steps = [int(x) for x in rp.steady["window_ns"].to_numpy(np.int64)]
    u = rp.dilation.unprofiled
    faster = False
    if u is not None and u.n:
        factor = float(rp.per_token["window"] / u.mean_ns)
        faster = factor < 1.0 / (1.0 + rp.dilation.threshold)
    per_rank: dict[int, dict[str, Fraction]] = {}
    if u is not None and u.n and not faster:
        target = u.mean_ns
        corr = correct_run(
            rp, Fraction(target)
        )  # as the shortfall corrects (docs/METHOD.md section Dilation)
        for r in rp.per_rank:
            rec = corr.per_rank[r]
            per_rank[r] = {**rec, "window": sum((rec[p] for p in LEAF_PARTS), Fraction(0))}
        source, samples = "unprofiled", [list(r) for r in u.rounds if len(r)] or [list(u.per_token_ns)]
        reconciliation = (
            f"corrected to the unprofiled per-token mean (rank {min(rp.per_rank)}: {corr.sentence})"
        )
    else:
        per_rank = {r: dict(p) for r, p in rp.per_rank.items()}
        target = rp.per_token["window"]
        source, samples = "trace", [traced_steps]
        reconciliation = (
            "not corrected: the unprofiled pass was slower than the traced one (a noisy host)"
            if faster
            else "not corrected: no unprofiled per-token times in the manifest; traced figures"
        )
        dq.add(
            "dilation_unknown" if not faster else "unprofiled_slower_than_profiled",
            1,
            f"{label}: {reconciliation}",
        )
    # matrix share of each rank's traced compute, applied to its reconciled compute
    n_steady = len(rp.steady)
    steady = set(int(s) for s in rp.steady["step"])
    sp = split[split["step"].isin(steady)]
    shares = []
    for r, parts in per_rank.items():
        g = sp[sp["rank"] == r]
        comp = int(g["matrix_ns"].sum() + g["vector_ns"].sum())
        share = Fraction(int(g["matrix_ns"].sum()), comp) if comp else Fraction(0)
        shares.append(share)
        parts["matrix"] = parts["compute"] * share
        parts["vector"] = parts["compute"] - parts["matrix"]
    mean = mean_over_ranks(
        {r: {k: v for k, v in p.items() if k in (*LEAF_PARTS, "window")} for r, p in per_rank.items()}
    )
    n = len(per_rank)
    matrix = sum((p["matrix"] for p in per_rank.values()), Fraction(0)) / n
    classes = {
        "matrix": matrix,
        "vector": mean["compute"] - matrix,
        "memory": mean["memory"],
        "collective": mean["transfer"],
        "coordination": mean["wait"] + mean["sync"] + mean["idle"],
        "unknown": mean["unknown"],
    }
    assert sum(classes.values()) == mean["window"]
    comp_total = sum(float(s) for s in shares) / len(shares) if shares else None
    return RunFigures(
        label=label,
        path=path,
        n_ranks=rp.n_ranks,
        timeline=rp.timeline,
        per_token_ns=Fraction(target),
        source=source,
        classes=classes,
        samples_ns=samples,
        steps=n_steady,
        matrix_share_of_compute=comp_total if mean["compute"] else None,
        reconciliation=reconciliation,
        data_quality=dq,
    )


# ------------------------------------------------------------------------------------------
# the decomposition


def log_shares(ta: float, tb: float, tc: float) -> tuple[float, float] | None:
    """(runtime part, kernel part) = (log(ta/tb), log(tb/tc)) / log(ta/tc); None when ta == tc."""
    if min(ta, tb, tc) <= 0:
        return None
    total = math.log(ta / tc)
    if total == 0:
        return None
    return math.log(ta / tb) / total, math.log(tb / tc) / total


def bootstrap(
    samples: Sequence[Sequence[Any]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = BOOTSTRAP_LEVEL,
) -> dict[str, tuple[float, float] | None]:
    """Percentile intervals of the speedups and the two log parts. `samples`: per run (baseline,
    intermediate, full) its per-token samples, a flat list (one round) or a list of rounds. The runs
    are separate captures, drawn independently; within a run two levels (`tracekit.analyse.resample.boot_means`)."""
    rng = np.random.default_rng(seed)
    means = []
    for s in samples:
        rounds = [list(s)] if len(s) and not isinstance(s[0], (list, tuple)) else [list(r) for r in s]
        means.append(boot_means(rounds, rng, resamples))
    ma, mb, mc = means
    alpha = (1.0 - level) / 2.0

    def q(x: np.ndarray) -> tuple[float, float] | None:
        x = x[np.isfinite(x)]
        if not len(x):
            return None
        lo, hi = np.quantile(x, [alpha, 1.0 - alpha])
        return round(float(lo), 4), round(float(hi), 4)

    total = np.log(ma / mc)
    with np.errstate(divide="ignore", invalid="ignore"):
        runtime = np.where(total != 0, np.log(ma / mb) / total, np.nan)
        kernel = np.where(total != 0, np.log(mb / mc) / total, np.nan)
    return {
        "speedup": q(ma / mc),
        "runtime_speedup": q(ma / mb),
        "kernel_speedup": q(mb / mc),
        "runtime_part": q(runtime),
        "kernel_part": q(kernel),
    }


@dataclass
class Decomposition(Documented):
    """The decomposition of tA/tC through tB; `to_json()` per docs/JSON.md#decompose."""

    baseline: RunFigures
    intermediate: RunFigures
    full: RunFigures
    intervals: dict[str, tuple[float, float] | None]
    data_quality: DataQuality

    @property
    def times(self) -> tuple[float, float, float]:
        return (
            float(self.baseline.per_token_ns),
            float(self.intermediate.per_token_ns),
            float(self.full.per_token_ns),
        )

    def parts(self) -> tuple[float, float] | None:
        return log_shares(*self.times)

    def moved(self) -> dd.DecomposeMoved:
        """Per part: the per-token time each class saved (ns; sums to the part's saving) and its
        share of the part's log contribution."""
        ps = self.parts()
        out = {}
        for part, (x, y), log_part in (
            ("runtime", (self.baseline, self.intermediate), ps[0] if ps else None),
            ("kernel", (self.intermediate, self.full), ps[1] if ps else None),
        ):
            saved = {c: x.classes[c] - y.classes[c] for c in CLASSES}
            total = x.per_token_ns - y.per_token_ns
            assert sum(saved.values()) == total
            ints = round_to_sum(saved, round_half_up(x.per_token_ns) - round_half_up(y.per_token_ns))
            share = {c: (float(saved[c] / total) if total else None) for c in CLASSES}
            out[part] = dd.DecomposeRuntime(
                saved_ns=round_half_up(x.per_token_ns) - round_half_up(y.per_token_ns),
                saved_by_class_ns=ints,
                share_of_saving=share,
                log_part_by_class={c: _times(log_part, share[c]) for c in CLASSES},
                top=max(CLASSES, key=lambda c: saved[c])
                if total > 0
                else min(CLASSES, key=lambda c: saved[c]),
            )
        return dd.DecomposeMoved(**out)

    def verdict(self) -> str:
        ta, tb, tc = self.times
        ps = self.parts()
        head = f"{ta / 1e6:.2f} -> {tb / 1e6:.2f} -> {tc / 1e6:.2f} ms per token"
        if ps is None:
            return f"No speedup to split: the baseline and the full stack take the same time ({head})."
        speed = ta / tc
        if speed < 1:
            lead = f"The full stack is slower than the baseline ({speed:.2f}x, {head})"
        else:
            lead = f"Speedup {speed:.2f}x ({head})"
        mv = self.moved()
        iv = self.intervals

        def pct(x: float) -> str:
            return units.pct(x, 0)

        def rng(key: str) -> str:
            v = iv.get(key)
            return f" [{pct(v[0])}-{pct(v[1])}]" if v else ""

        rt, kn = ps
        return (
            f"{lead}: the runtime part (baseline -> intermediate, {ta / tb:.2f}x) is {pct(rt)}{rng('runtime_part')} "
            f"of it on a log scale, mostly {CLASS_WORDS[mv.runtime.top]}; the kernel part (intermediate -> full, "
            f"{tb / tc:.2f}x) is {pct(kn)}{rng('kernel_part')}, mostly {CLASS_WORDS[mv.kernel.top]}."
        )

    def document(self) -> dd.Decompose:
        ta, tb, tc = self.times
        ps = self.parts()
        notes = []
        if ps is not None and not (min(ta, tc) <= tb <= max(ta, tc)):
            notes.append(
                "the intermediate is not between the baseline and the full stack: one part is negative and the "
                "other above 100% (reported as they are, not clipped)"
            )
        return dd.Decompose(
            schema_version=SCHEMA_VERSION,
            kind="tracekit.decompose",
            verdict=self.verdict(),
            runs=dd.DecomposeRuns(
                baseline=self.baseline.document(),
                intermediate=self.intermediate.document(),
                full=self.full.document(),
            ),
            speedup=dd.DecomposeSpeedup(total=ta / tc, runtime=ta / tb, kernel=tb / tc),
            parts=dd.DecomposeParts(runtime=ps[0] if ps else None, kernel=ps[1] if ps else None),
            intervals=dd.DecomposeIntervals(
                **{k: (list(v) if v else None) for k, v in self.intervals.items()}
            ),
            bootstrap=dd.DecomposeBootstrap(
                resamples=BOOTSTRAP_RESAMPLES,
                seed=BOOTSTRAP_SEED,
                level=BOOTSTRAP_LEVEL,
                levels="per run: its rounds with replacement, then tokens within each drawn round",
            ),
            moved=self.moved(),
            class_words=dict(CLASS_WORDS),
            notes=notes,
            data_quality=self.data_quality.document(),
        )


def decompose_runs(
    runs: Mapping[str, Run],
    *,
    paths: Mapping[str, str] | None = None,
    options: AttributionOptions = DEFAULT_OPTIONS,
) -> Decomposition:
    """Decompose the speedup of runs["baseline"] -> runs["full"] through runs["intermediate"]
    (each attributed with `options`)."""
    figs = {k: run_figures(runs[k], k, path=(paths or {}).get(k, ""), options=options) for k in RUNS}
    return decomposition_of(figs)


def decomposition_of(figs: Mapping[str, RunFigures]) -> Decomposition:
    """The decomposition of the three runs' figures (`RUNS` keys)."""
    dq = DataQuality()
    for f in figs.values():
        dq.merge(f.data_quality)
    sources = {f.source for f in figs.values()}
    if len(sources) > 1:
        dq.add(
            "mixed_per_token_sources",
            1,
            "some runs' per-token times are unprofiled and some traced: the ratios mix a profiler's dilation in",
        )
    intervals = bootstrap([figs[k].samples_ns for k in RUNS])
    return Decomposition(figs["baseline"], figs["intermediate"], figs["full"], intervals, dq)


def _times(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a * b
