"""The shortfall of a (baseline, sharded) pair: `shortfall(baseline, sharded)` attributes both runs and
compares them (`shortfall_from_parts`: the terms, corrected for the profiler's dilation where both
manifests carry unprofiled times, the spread, per rank); `check_pair` refuses pairs that are not
like with like."""

from __future__ import annotations

import os
from fractions import Fraction

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.corrected import correct_pair
from tracekit.analyse.attribution.document import step_spread
from tracekit.analyse.attribution.options import DEFAULT_OPTIONS, AttributionOptions
from tracekit.analyse.attribution.plan import attribute_run
from tracekit.analyse.attribution.reconcile import applied_dilation
from tracekit.analyse.attribution.result import Shortfall
from tracekit.analyse.attribution.run import RunParts, check_ranks
from tracekit.analyse.attribution.terms import attribute, leaf_with_window
from tracekit.analyse.timeline.kinds import TokenSteps
from tracekit.errors import MatchError, RankError
from tracekit.model.documents.base import given, to_builtins
from tracekit.model.events import DataQuality, Run
from tracekit.model.fields import copy_fields


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

    c = correct_pair(base, sharded, factor, uncorrected, ad_b, ad_s, dq)
    per_rank_unc = {
        r: attribute(base.per_token, leaf_with_window(p), factor) for r, p in sharded.per_rank.items()
    }
    # corrected, per_token_source, reconciliation, path, base_path, rank_parts, corrections: the correction's
    return copy_fields(
        Shortfall,
        c,
        n_ranks=n,
        baseline=base,
        sharded=sharded,
        factor=factor,
        uncorrected=uncorrected,
        spread_ns=step_spread(base, sharded, factor, c.shift),
        data_quality=dq,
        per_rank={r: attribute(c.pb, p, factor) for r, p in c.rank_parts.items()},
        per_rank_uncorrected=per_rank_unc,
        path_uncorrected=dict(sharded.path_token),
        applied={"baseline": ad_b, "sharded": ad_s},
    )


def shortfall(
    baseline: Run | AnalysedRun,
    sharded: Run | AnalysedRun,
    options: AttributionOptions = DEFAULT_OPTIONS,
) -> Shortfall:
    """Attribute the per-token shortfall of `sharded` against `baseline`, both runs attributed
    with `options` (module doc)."""
    baseline, sharded = AnalysedRun.of(baseline), AnalysedRun.of(sharded)  # each classified once
    # a rank file missing is the real problem of a pair that looks wrong because of it: said first
    check_ranks(baseline.run, "baseline")
    check_ranks(sharded.run, "sharded")
    pair_notes = check_pair(baseline.run, sharded.run)
    base = attribute_run(baseline, options, label="baseline")
    shard = attribute_run(sharded, options, label="sharded")
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
    wb = given(baseline.manifest.workload) if baseline.manifest is not None else None
    ws = given(sharded.manifest.workload) if sharded.manifest is not None else None
    if wb is None or ws is None:
        return []
    # as JSON values: a shape shows as the object the manifest holds
    b_fields, s_fields = to_builtins(wb), to_builtins(ws)
    differ = [
        k for k in WORKLOAD_SHAPE_FIELDS if k in b_fields and k in s_fields and b_fields[k] != s_fields[k]
    ]
    if not differ:
        return []
    shown = "; ".join(f"{k} {str(b_fields[k])[:60]} vs {str(s_fields[k])[:60]}" for k in differ)
    return [
        (
            "baseline_workload_differs",
            f"the baseline's manifest describes another workload than the sharded run's ({shown}): the "
            "shortfall compares two different decodes",
        )
    ]
