"""The shortfall of a (baseline, sharded) pair: `shortfall(baseline, sharded)` attributes both runs and
compares them (`shortfall_from_parts`: the terms, corrected for the profiler's dilation where both
manifests carry unprofiled times, the spread, per rank); `check_pair` refuses pairs that are not
like with like."""

from __future__ import annotations

import os
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.document import step_spread
from tracekit.analyse.attribution.reconcile import applied_dilation
from tracekit.analyse.attribution.result import Shortfall
from tracekit.analyse.attribution.run import RunParts, attribute_run, check_ranks, mean_over_ranks
from tracekit.analyse.attribution.terms import attribute
from tracekit.analyse.dilation import DEFAULT_THRESHOLD
from tracekit.analyse.timeline.kinds import TokenSteps
from tracekit.errors import MatchError, RankError
from tracekit.model.events import DataQuality, Run
from tracekit.model.parts import LEAF_PARTS


def _leaf_with_window(parts: Mapping[str, Fraction]) -> dict[str, Fraction]:
    out = {p: Fraction(parts[p]) for p in LEAF_PARTS}
    out["window"] = sum((out[p] for p in LEAF_PARTS), Fraction(0))
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
    tb_, ts_ = base.token_steps, sharded.token_steps
    if (tb_ is None) != (ts_ is None) or (tb_ and ts_ and (tb_.kind, tb_.batch) != (ts_.kind, ts_.batch)):

        def words(t: TokenSteps | None) -> str:
            return "every step" if t is None else f"{t.kind or 'every'} steps of batch size {t.batch}"

        dq.add(
            "per_token_steps_differ",
            1,
            f"the baseline's per-token steps are {words(tb_)}, the sharded run's {words(ts_)}: T1 and TN are "
            "not like with like (capture both at one batch size; docs/METHOD.md, Serving engines)",
        )
    uncorrected = attribute(base.per_token, sharded.per_token, factor)
    ad_b, ad_s = applied_dilation(base), applied_dilation(sharded)

    ub, us = base.dilation.unprofiled, sharded.dilation.unprofiled
    # a profiler cannot make a run faster: a traced pass clearly faster than the unprofiled one
    # means the two ran under different conditions (a noisy host), and the unprofiled figure is
    # then no better a per-token time than the traced one
    threshold = sharded.dilation.threshold
    faster = [
        (lbl, ad.factor)
        for lbl, ad in (("baseline", ad_b), ("sharded", ad_s))
        if ad.factor is not None and ad.factor < 1.0 / (1.0 + threshold)
    ]
    if faster:
        dq.add(
            "unprofiled_slower_than_profiled",
            len(faster),
            "the unprofiled pass was slower than the traced one ("
            + ", ".join(f"{lbl} dilation {d:.2f}x" for lbl, d in faster)
            + "): the host was noisy; the attribution is not corrected",
        )
    per_rank_c: dict[int, dict[str, Fraction]]
    tb, ts = ad_b.target_ns, ad_s.target_ns
    if tb is not None and ts is not None and not faster:
        for lbl, ad in (("baseline", ad_b), ("sharded", ad_s)):
            if ad.drift is not None and abs(ad.drift) > threshold:
                dq.add(
                    "host_drift_between_rounds",
                    1,
                    f"{lbl}: the traced pass with the profiler's factor removed is {ad.drift:+.0%} off the mean of "
                    "the unprofiled rounds: the host's speed moved between rounds; the corrected per-token time is "
                    "the traced pass's",
                )
        from tracekit.analyse.correction import correct_run

        corr_b, corr_s = correct_run(base, tb), correct_run(sharded, ts)
        corrections: dict[str, Any] = {"baseline": corr_b, "sharded": corr_s}
        pb = mean_over_ranks({r: _leaf_with_window(v) for r, v in corr_b.per_rank.items()})
        per_rank_c = {r: _leaf_with_window(v) for r, v in corr_s.per_rank.items()}
        ps = mean_over_ranks(per_rank_c)
        corrected = attribute(pb, ps, factor)
        source = "unprofiled"
        reconciliation = (
            f"T1 and TN are the traced per-token times with the measured dilation removed (traced / D: the "
            f"unprofiled-equivalent of the traced pass); each rank's traced parts were corrected to them, then "
            f"averaged over ranks; baseline: {corr_b.sentence}; sharded (rank "
            f"{min(corr_s.per_rank)}): {corr_s.sentence}."
        )
        for lbl, c in corrections.items():
            why = "; ".join(c.notes)
            if c.method == "replay":
                dq.add(
                    "profiler_correction_replay",
                    0,
                    f"{lbl}: the profiler's cost per call ({c.cost_source}) was removed call by call in the "
                    "replay of the dependency graph; wait, sync and idle are read from the corrected timeline"
                    + (f" ({why})" if why else ""),
                )
            else:
                dq.add(
                    "profiler_correction_proportional",
                    1,
                    f"{lbl}: the profiler's excess was taken out of wait, sync and idle in proportion ({why}); "
                    "where the profiler changed which rank arrives last, wait and idle are not corrected",
                )
        shift = {p: ps[p] - sharded.per_token[p] for p in LEAF_PARTS}
        # the baseline's reconciliation moves every sharded per-step term by the same amount
        for p in LEAF_PARTS:
            shift[p] -= factor * (pb[p] - base.per_token[p])
        path = corr_s.path
        base_path = corr_b.path
    else:
        corrections = {"baseline": None, "sharded": None}
        corrected = uncorrected
        per_rank_c = {r: _leaf_with_window(p) for r, p in sharded.per_rank.items()}
        pb = base.per_token
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
                "not corrected: the unprofiled pass was slower than the traced one (a noisy host), so it is no "
                "better a per-token time than the trace; T1, TN and the parts are the traced ones"
            )
        shift = {p: Fraction(0) for p in LEAF_PARTS}
        path = dict(sharded.path_token)
        base_path = dict(base.path_token)
    spread = step_spread(base, sharded, factor, shift)
    per_rank_att = {r: attribute(pb, p, factor) for r, p in per_rank_c.items()}
    per_rank_unc = {
        r: attribute(base.per_token, _leaf_with_window(p), factor) for r, p in sharded.per_rank.items()
    }
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
        per_rank=per_rank_att,
        per_rank_uncorrected=per_rank_unc,
        path=path,
        path_uncorrected=dict(sharded.path_token),
        base_path=base_path,
        applied={"baseline": ad_b, "sharded": ad_s},
        rank_parts=per_rank_c,
        corrections=corrections,
    )


def shortfall(
    baseline: Run | AnalysedRun,
    sharded: Run | AnalysedRun,
    *,
    step_pattern: str | None = None,
    skip_first: int = 1,
    dilation_threshold: float = DEFAULT_THRESHOLD,
    allow_partial: bool = False,
) -> Shortfall:
    """Attribute the per-token shortfall of `sharded` against `baseline` (module doc)."""
    baseline, sharded = AnalysedRun.of(baseline), AnalysedRun.of(sharded)  # each classified once
    # a rank file missing is the real problem of a pair that looks wrong because of it: said first
    check_ranks(baseline.run, "baseline")
    check_ranks(sharded.run, "sharded")
    pair_notes = check_pair(baseline.run, sharded.run)
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
    return shortfall_of_pair(base, shard, pair_notes)


def shortfall_of_pair(base: RunParts, shard: RunParts, pair_notes: list[tuple[str, str]]) -> Shortfall:
    """The attribution of two attributed runs with `check_pair`'s notes (made before the runs
    were attributed: its refusals come first) on the baseline's data quality; `shortfall`'s tail,
    and the Dask engine's."""
    for key, note in pair_notes:
        base.data_quality.add(key, 1, note)
    return shortfall_from_parts(base, shard)


#: workload fields that must agree between the baseline and the sharded run for S to mean anything
WORKLOAD_SHAPE_FIELDS = ("preset", "shape", "layers", "batch", "prompt", "dtype", "device")


def check_pair(baseline: Run, sharded: Run) -> list[tuple[str, str]]:
    """RankError when the two runs read the same trace files (the sharded run as its own baseline)
    or have as many ranks (no smaller baseline); notes when their manifests describe different
    workloads (shape, batch, prompt, dtype, device: the shortfall would compare two models)."""
    same = {os.path.realpath(s) for s in baseline.sources.values() if os.path.isfile(s)} & {
        os.path.realpath(s) for s in sharded.sources.values() if os.path.isfile(s)
    }
    if same:
        names = ", ".join(sorted(os.path.basename(s) for s in same)[:4])
        raise RankError(
            f"the baseline and the sharded run read the same trace file(s) ({names}): pass the run on "
            "fewer ranks (TP=1) as --baseline"
        )
    if len(baseline.ranks) == len(sharded.ranks):
        b_file, s_file = ((sorted(r.sources.values()) or ["?"])[0] for r in (baseline, sharded))
        raise RankError(
            f"{s_file}: the sharded run has {len(sharded.ranks)} rank(s), as many as the baseline "
            f"({b_file}): the baseline must be the run on fewer ranks (TP=1)"
        )
    wb = (baseline.manifest or {}).get("workload")
    ws = (sharded.manifest or {}).get("workload")
    if not isinstance(wb, Mapping) or not isinstance(ws, Mapping):
        return []
    differ = [k for k in WORKLOAD_SHAPE_FIELDS if k in wb and k in ws and wb[k] != ws[k]]
    if not differ:
        return []
    shown = "; ".join(f"{k} {str(wb[k])[:60]} vs {str(ws[k])[:60]}" for k in differ)
    return [
        (
            "baseline_workload_differs",
            f"the baseline's manifest describes another workload than the sharded run's ({shown}): the "
            "shortfall compares two different decodes",
        )
    ]
