"""The profiler correction of a (baseline, sharded) pair (`correct_pair`, called by
`tracekit.analyse.attribution.pair.shortfall_from_parts`; docs/METHOD.md section Dilation): T1 and
TN from the traced per-token times with the measured dilation removed, every rank's parts corrected
to them, or the traced ones kept and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tracekit.analyse.attribution.correction import correct_run
from tracekit.analyse.attribution.reconcile import AppliedDilation
from tracekit.analyse.attribution.run import RunParts, mean_over_ranks
from tracekit.analyse.attribution.terms import Attribution, attribute, leaf_with_window
from tracekit.model.events import DataQuality
from tracekit.model.parts import LEAF_PARTS


@dataclass(frozen=True)
class PairCorrection:
    """What the profiler correction of a pair gives `shortfall_from_parts`: each run's correction
    (`tracekit.analyse.attribution.correction_replay.Correction`, or None), the baseline's per-token parts (`pb`) and
    the sharded run's per rank (`rank_parts`) the terms are taken from, the corrected attribution,
    where T1 and TN came from (`per_token_source`: unprofiled | trace) and the sentence saying so, the
    shift of every per-step term (corrected - traced mean), and the critical paths: the fields of
    the same names of `Shortfall` are these."""

    corrections: dict[str, Any]
    pb: Mapping[str, Fraction]
    rank_parts: dict[int, dict[str, Fraction]]
    corrected: Attribution
    per_token_source: str
    reconciliation: str
    shift: dict[str, Fraction]
    path: dict[str, Any]
    base_path: dict[str, Any]


def correct_pair(
    base: RunParts,
    sharded: RunParts,
    factor: Fraction,
    uncorrected: Attribution,
    ad_b: AppliedDilation,
    ad_s: AppliedDilation,
    dq: DataQuality,
) -> PairCorrection:
    """The profiler correction's call site (docs/METHOD.md section Dilation): where both runs' applied
    dilations are known and neither unprofiled pass was the slower, each run is corrected to its
    traced per-token time / D (`tracekit.analyse.attribution.correction.correct_run`: the replay, else the
    proportional reconciliation) and the terms are taken from the corrected parts; else the traced
    ones are kept and the reason noted in `dq`."""
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
        corr_b, corr_s = correct_run(base, tb), correct_run(sharded, ts)
        corrections: dict[str, Any] = {"baseline": corr_b, "sharded": corr_s}
        pb = mean_over_ranks({r: leaf_with_window(v) for r, v in corr_b.per_rank.items()})
        per_rank_c = {r: leaf_with_window(v) for r, v in corr_s.per_rank.items()}
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
        per_rank_c = {r: leaf_with_window(p) for r, p in sharded.per_rank.items()}
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
    return PairCorrection(
        corrections=corrections,
        pb=pb,
        rank_parts=per_rank_c,
        corrected=corrected,
        per_token_source=source,
        reconciliation=reconciliation,
        shift=shift,
        path=path,
        base_path=base_path,
    )
