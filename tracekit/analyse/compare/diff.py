"""Two runs of the same workload side by side (issue 20): what moved per token, and a CI gate.

`diff(before, after)` attributes both runs as the shortfall does (`attribute_run`: per-rank
per-token leaf parts, exact Fractions; the critical path; the matched collectives) and compares:

1. **Per-token time.** T before / after as the shortfall corrects it when *both* captures measured
   their dilation D against unprofiled passes and neither run's profiled pass was clearly faster
   than its unprofiled one (the shortfall's rule): T = traced per-token time / D
   (`AppliedDilation.target_ns`); else the traced steady step times for both
   (`per_token_source`: never one of each). The change `T_after - T_before` gets a 95% percentile
   bootstrap interval (`BOOTSTRAP_RESAMPLES` resamples, seeded): each run's unprofiled tokens (or
   its traced steps) are resampled in two levels (its rounds with replacement, then the tokens
   within each drawn round), the two runs independently, and each resampled mean is carried onto
   T in proportion (the spread of the unprofiled rounds, host drift included, centred on T). The
   verdict is "slower" when the interval of the relative change lies above 0, "faster" below 0,
   "no significant change" when it holds 0, and "cannot judge" when there is no interval: a run
   with fewer than `MIN_TOKENS_TO_JUDGE` tokens to resample, or runs whose per-token steps are not
   alike (a serving engine's decode steps of another batch size, decode against prefill: docs/
   METHOD.md, Serving engines); never "no significant change" without an interval.
2. **The change by part**, exactly: each run's parts are the mean over ranks of every rank's
   per-token leaf parts (corrected to the corrected time when that is the source, as the shortfall
   does: `tracekit.analyse.attribution.correction.correct_run`), so they sum to T exactly, and their differences sum exactly to the
   change. On GPU timelines compute is split into matrix (GEMM / attention kernels) and vector
   (everything else the classifier calls compute): per window, the time a matrix kernel covers is
   matrix, the rest of the compute part is vector (matrix > vector, as compute > memory in the
   partition). Integers in the JSON: T rounded, the change = after - before, the leaf changes by
   largest remainder (they sum to the change exactly; so do every rank's and the critical path's).
   Each part's change has an interval: the bootstrap over the traced steady steps of the per-step
   difference of means (mean over ranks), shifted onto the reported figure.
3. **The cause**, from the critical path (`tracekit.analyse.path.critical_path`, reconciled like the
   parts): the path component that moved most in the direction of the change, and the rank it
   moved on; the per-rank parts say which ranks now wait for it.
4. **What moved**: kernels matched by (kind, name) (the event table carries no shapes) and
   collectives by (op, bytes), each with count and time per token per rank (traced durations),
   new and vanished names marked.
5. **Dilation** of both runs (the applied factor D, `shortfall.applied_dilation`). The profiler
   alone changes the traced per-token time by d_after / d_before - 1; a warning is raised when
   that differs from 0 beyond noise (the two intervals do not overlap, or it exceeds
   `DILATION_WARN`) and is at least half the traced change.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from tracekit.analyse.attribution.options import DEFAULT_OPTIONS, AttributionOptions
from tracekit.analyse.compare.result import GROUPS, MIN_TOKENS_TO_JUDGE, TOP, Diff
from tracekit.analyse.compare.sides import (
    BOOTSTRAP_LEVEL,
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    DIFF_PARTS,
    Side,
    attribute_side,
    pooled_mean,
    settle,
)
from tracekit.analyse.dilation import DEFAULT_THRESHOLD
from tracekit.analyse.resample import boot_means, boot_steps
from tracekit.model.events import DataQuality, Run

# ------------------------------------------------------------------------------------------
# the comparison


def diff_sides(
    before: Side, after: Side, *, top: int = TOP, dilation_threshold: float = DEFAULT_THRESHOLD
) -> Diff:
    """Compare two attributed runs (module doc)."""
    dq = DataQuality()
    for side in (before, after):
        # counts summed over both runs; each note says which run it is about
        dq.counts.update(side.parts.data_quality.counts)
        for note in side.parts.data_quality.notes:
            dq.add(side.label, 0, note if note.startswith(f"{side.label} (") else f"{side.label}: {note}")
    missing = [s.label for s in (before, after) if s.applied.target_ns is None]
    faster = [
        (s.label, s.applied.factor)
        for s in (before, after)
        if s.applied.factor is not None and s.applied.factor < 1.0 / (1.0 + dilation_threshold)
    ]
    if missing:
        source = "trace"
        reason = (
            f"no unprofiled per-token times for the {' and '.join(missing)} run: both runs use their traced "
            "steady step times (like with like)"
        )
        dq.add("dilation_unknown", len(missing), reason)
    elif faster:
        source = "trace"
        reason = (
            "the unprofiled pass was slower than the traced one ("
            + ", ".join(f"{lbl} dilation {d:.2f}x" for lbl, d in faster)
            + "): a noisy host; both runs use their traced steady step times"
        )
        dq.add("unprofiled_slower_than_profiled", len(faster), reason)
    else:
        source = "unprofiled"
        reason = (
            "both captures measured their dilation D against unprofiled passes: T is the traced per-token time "
            "divided by D, each rank's traced parts reconciled to it (as the shortfall does); the interval's "
            "spread comes from the unprofiled rounds"
        )
        for s in (before, after):
            drift = s.applied.drift
            if drift is not None and abs(drift) > dilation_threshold:
                dq.add(
                    "host_drift_between_rounds",
                    1,
                    f"{s.label}: the traced pass with the profiler's factor removed is {drift:+.0%} off the mean of "
                    "the unprofiled rounds: the host's speed moved between rounds",
                )
    for s in (before, after):
        settle(s, source)
    if before.parts.n_ranks != after.parts.n_ranks:
        dq.add(
            "rank_counts_differ",
            1,
            f"before has {before.parts.n_ranks} ranks, after {after.parts.n_ranks}: parts are per rank "
            "(mean over ranks); per-rank changes are shown for the ranks in both",
        )
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    # each run's resampled means, relative to its samples' own mean, carried onto its per-token time
    # (the samples are the unprofiled tokens; T is the traced time / D: the same spread, T's centre)
    mb = boot_means(before.samples, rng, BOOTSTRAP_RESAMPLES) * (
        float(before.per_token_ns) / pooled_mean(before.samples)
    )
    ma = boot_means(after.samples, rng, BOOTSTRAP_RESAMPLES) * (
        float(after.per_token_ns) / pooled_mean(after.samples)
    )
    alpha = (1.0 - BOOTSTRAP_LEVEL) / 2.0
    d = ma - mb
    lo, hi = np.quantile(d, [alpha, 1.0 - alpha])
    ok = mb > 0
    rel = ma[ok] / mb[ok] - 1.0
    rlo, rhi = np.quantile(rel, [alpha, 1.0 - alpha]) if ok.any() else (float("nan"), float("nan"))
    own = {
        "before": tuple(float(x) for x in np.quantile(mb, [alpha, 1.0 - alpha])),
        "after": tuple(float(x) for x in np.quantile(ma, [alpha, 1.0 - alpha])),
    }
    few = [s for s in (before, after) if sum(len(r) for r in s.samples) < MIN_TOKENS_TO_JUDGE]
    cannot = ""
    if few:
        # too few tokens have no meaningful spread: no interval, so no verdict either way (and the
        # gate cannot fail)
        cannot = "; ".join(f"{s.label}: {sum(len(r) for r in s.samples)} token(s)" for s in few) + (
            f", fewer than {MIN_TOKENS_TO_JUDGE}"
        )
        dq.add(
            "too_few_tokens_for_an_interval",
            len(few),
            f"the {' and '.join(s.label for s in few)} run has fewer than {MIN_TOKENS_TO_JUDGE} steady tokens "
            f"({cannot}): no interval, the runs cannot be judged",
        )
    unlike = _unlike_steps(before, after)
    if unlike:
        cannot = "; ".join(x for x in (cannot, unlike) if x)
        dq.add("steps_not_comparable", 1, f"{unlike}: no interval, the runs cannot be judged")
    if cannot:
        lo = hi = rlo = rhi = float("nan")
    part_iv = _part_intervals(before, after, rng)
    return Diff(
        before=before,
        after=after,
        per_token_source=source,
        source_reason=reason,
        change_interval_ns=(float(lo), float(hi)),
        relative_interval=(round(float(rlo), 6), round(float(rhi), 6)),
        part_intervals_ns=part_iv,
        per_token_intervals_ns={k: (v[0], v[1]) for k, v in own.items()},
        data_quality=dq,
        top=top,
        cannot_judge=cannot,
    )


def _token_words(side: Side) -> str:
    tok = side.parts.token_steps
    if tok is None:
        return "every step"
    return f"decode steps of batch size {tok.batch}" if tok.kind == "decode" else "steps of no one kind"


def _unlike_steps(before: Side, after: Side) -> str:
    """Why the two runs' per-token steps are not alike ("" when they are): like with like is decode
    with decode of one batch size (a serving engine's step names say it) or, where no step name
    says a kind, every step of each."""
    tb, ta = before.parts.token_steps, after.parts.token_steps
    key_b = None if tb is None else (tb.kind, tb.batch)
    key_a = None if ta is None else (ta.kind, ta.batch)
    if key_b == key_a and (key_b is None or key_b[0] == "decode"):
        return ""
    return (
        f"the before run's per-token steps are {_token_words(before)}, the after run's {_token_words(after)}: "
        "not like with like"
    )


def _per_step_parts(side: Side) -> pd.DataFrame:
    """Per steady step: each DIFF_PARTS leaf as the mean over ranks (traced)."""
    rs = side.parts.rank_steps.merge(side.steps_matrix, on=["rank", "step"], how="left")
    rs["matrix_ns"] = rs["matrix_ns"].fillna(0).clip(upper=rs["compute_ns"])
    rs["vector_ns"] = rs["compute_ns"] - rs["matrix_ns"]
    cols = [f"{p}_ns" for p in DIFF_PARTS]
    return rs.groupby("step", sort=True)[cols].mean()


def _part_intervals(before: Side, after: Side, rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """95% interval of each part's (and group's) change: bootstrap of the traced steady steps'
    per-step parts (mean over ranks), the difference of means shifted onto the reported change."""
    pb, pa = _per_step_parts(before), _per_step_parts(after)
    if not len(pb) or not len(pa):
        return {}
    names = list(DIFF_PARTS)
    cols = [f"{p}_ns" for p in names]
    vb, va = pb[cols].to_numpy(np.float64), pa[cols].to_numpy(np.float64)
    bb = boot_steps(vb, rng, BOOTSTRAP_RESAMPLES)
    ba = boot_steps(va, rng, BOOTSTRAP_RESAMPLES)
    diff_boot = ba - bb
    traced = va.mean(axis=0) - vb.mean(axis=0)
    alpha = (1.0 - BOOTSTRAP_LEVEL) / 2.0
    out: dict[str, tuple[float, float]] = {}
    groups = {**{p: (p,) for p in names}, **GROUPS}
    for g, keys in groups.items():
        j = [names.index(k) for k in keys]
        boot = diff_boot[:, j].sum(axis=1)
        t = float(traced[j].sum())
        rep = float(sum((after.leaf[k] - before.leaf[k] for k in keys), Fraction(0)))
        lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
        out[g] = (float(lo) - t + rep, float(hi) - t + rep)
    return out


def diff(
    before: Run,
    after: Run,
    *,
    before_path: str = "before",
    after_path: str = "after",
    options: AttributionOptions = DEFAULT_OPTIONS,
    top: int = TOP,
) -> Diff:
    """Compare two runs of the same workload, both attributed with `options` (module doc)."""
    b = attribute_side(before, label=f"before ({before_path})", path=before_path, options=options)
    a = attribute_side(after, label=f"after ({after_path})", path=after_path, options=options)
    b.label, a.label = "before", "after"
    return diff_sides(b, a, top=top, dilation_threshold=options.dilation_threshold)
