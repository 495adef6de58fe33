"""`Shortfall`: the attribution of S for one (baseline, sharded) pair, its words (through
`tracekit.analyse.prose`) and `to_json()` per docs/JSON.md#shortfall."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pandas as pd

from tracekit.analyse import prose
from tracekit.analyse.attribution.correction_replay import Correction
from tracekit.analyse.attribution.document import (
    SCHEMA_VERSION,
    median_window,
    path_integers,
    per_rank_json,
    run_canonical,
    run_collectives,
    run_sample,
    steps_json,
)
from tracekit.analyse.attribution.reconcile import AppliedDilation
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.attribution.straggler import straggler_test
from tracekit.analyse.attribution.terms import Attribution
from tracekit.analyse.compute.kernel_scaling import scaling_of
from tracekit.analyse.display import shortfall_html, shortfall_repr
from tracekit.analyse.noise import Intervals, Reading
from tracekit.analyse.noise import bootstrap as noise_bootstrap
from tracekit.analyse.noise import reading as noise_reading
from tracekit.model.documents import shortfall as sd
from tracekit.model.documents.base import Documented
from tracekit.model.events import DataQuality
from tracekit.model.parts import PATH_PARTS, term_words


@dataclass(frozen=True)
class Shortfall(Documented):
    """The attribution of S for one (baseline, sharded) pair; `to_json()` per docs/JSON.md#shortfall,
    `to_frame()` its attribution as a table."""

    n_ranks: int
    baseline: RunParts
    sharded: RunParts
    factor: Fraction
    corrected: Attribution
    uncorrected: Attribution
    per_token_source: str  # "unprofiled" | "trace"
    reconciliation: str
    spread_ns: dict[str, sd.ShortfallCompute]
    data_quality: DataQuality
    per_rank: dict[int, Attribution]  # each sharded rank's own parts (corrected) against the baseline
    per_rank_uncorrected: dict[int, Attribution]
    path: dict[str, Any]  # the sharded run's critical path per token (corrected): by_rank, offset, step
    path_uncorrected: dict[str, Any]
    base_path: dict[str, Any]  # the baseline's (one rank: its own host / compute split)
    applied: dict[str, AppliedDilation]
    rank_parts: dict[int, dict[str, Fraction]]  # each sharded rank's per-token leaf parts (as attributed)
    #: per run label, how its parts were corrected to its corrected per-token time
    #: (`tracekit.analyse.attribution.correction_replay.Correction`; None: not corrected)
    corrections: dict[str, Correction | None] = field(default_factory=dict)

    @property
    def attribution(self) -> Attribution:
        return self.corrected

    def __repr__(self) -> str:
        return shortfall_repr(self)

    def _repr_html_(self) -> str:
        return shortfall_html(self)

    def shares(self) -> dict[str, float | None]:
        ints = self.corrected.integers()
        s = ints["shortfall_ns"]
        return {k: (v / s if s else None) for k, v in ints["terms_ns"].items()}

    def term_words(self) -> dict[str, str]:
        """What each term is, in words, for this run (on a CPU run the 'link' is gloo's exchange)."""
        return term_words(self.sharded.timeline)

    @functools.cached_property
    def intervals(self) -> Intervals:
        """95% bootstrap intervals of T1, TN, the ideal, S and every term (`tracekit.analyse.noise`):
        over the runs' rounds (paired when captured interleaved) and the traced passes' steps;
        over steps only when the manifests have no rounds. Deterministic (seed 0)."""
        corrected = self.per_token_source == "unprofiled"
        ints = self.corrected.integers()
        return noise_bootstrap(
            run_sample(self.baseline, corrected, self.corrections.get("baseline")),
            run_sample(self.sharded, corrected, self.corrections.get("sharded")),
            float(self.factor),
            dilations=(self.applied["baseline"].factor, self.applied["sharded"].factor),
            with_unknown="unknown" in ints["terms_ns"],
        )

    def noise(self) -> Reading:
        """What the intervals allow the verdict to say (`tracekit.analyse.noise.reading`)."""
        ints = self.corrected.integers()
        return noise_reading(ints["shortfall_ns"], ints["terms_ns"], self.intervals)

    def verdict(self) -> str:
        """`tracekit.analyse.prose.verdict` (the prose lives there)."""
        return prose.verdict(self)

    def _noise_checked_diagnosis(self) -> str:
        """`tracekit.analyse.prose.noise_checked_diagnosis` (the prose lives there)."""
        return prose.noise_checked_diagnosis(self)

    # ---- the critical path

    def path_ints(self, corrected: bool = True) -> sd.ShortfallUncorrected:
        """The critical path per token as integers: by_rank -> {<part>_ns}, offset_ns, step_ns; the
        components and the offset are rounded by largest remainder to sum to step_ns exactly."""
        return path_integers(self.path if corrected else self.path_uncorrected)

    def straggler(self) -> sd.ShortfallStraggler:
        """Is one rank late by more than symmetric launch-bound hosts explain? (`straggler_test`;
        made once: the document and the diagnosis both read it)"""
        got = self.__dict__.get("_straggler")
        if got is None:
            got = self.__dict__["_straggler"] = straggler_test(self.baseline, self.sharded, self.n_ranks)
        return got  # type: ignore[no-any-return]

    def _correction_json(self) -> dict[str, sd.ShortfallCorrection | None]:
        """Each run's correction; where the sharded one is not identified, its ranges of wait, sync
        and idle also as terms (`term_ranges`: less N1/N x the baseline's corrected part)."""
        out = {
            k: (sd.ShortfallCorrection(**c.to_json()) if c is not None else None)
            for k, c in self.corrections.items()
        }
        cs, cb = self.corrections.get("sharded"), self.corrections.get("baseline")
        doc = out.get("sharded")
        if doc is not None and cs is not None and cs.ranges is not None and cb is not None:
            f = Fraction(self.factor)
            base = {
                k: sum((p[k] for p in cb.per_rank.values()), Fraction(0)) / max(len(cb.per_rank), 1)
                for k in ("wait", "sync", "idle")
            }
            doc.term_ranges = {
                k: {
                    who: [int(math.floor(lo - f * base[k])), int(math.ceil(hi - f * base[k]))]
                    for who, (lo, hi) in cs.ranges[k].items()
                }
                for k in ("wait", "sync", "idle")
            }
        return out

    def path_cause(self) -> str:
        """`tracekit.analyse.prose.path_cause` (the prose lives there)."""
        return prose.path_cause(self)

    def per_rank_parts(self, rank: int) -> dict[str, Fraction]:
        """Rank `rank`'s own per-token leaf parts (corrected when the attribution is)."""
        return self.rank_parts[rank]

    def diagnosis(self) -> str:
        """`tracekit.analyse.prose.diagnosis` (the prose lives there)."""
        return prose.diagnosis(self)

    def _one_host(self) -> bool:
        """`tracekit.analyse.prose.one_host` (the prose lives there)."""
        return prose.one_host(self)

    def _dilation_clause(self) -> str:
        """`tracekit.analyse.prose.dilation_clause` (the prose lives there)."""
        return prose.dilation_clause(self)

    def _inflated(self) -> bool | None:
        """`tracekit.analyse.prose.inflated` (the prose lives there)."""
        return prose.inflated(self)

    def compute_scaling(self) -> sd.ShortfallComputeScaling:
        """The compute term split by kernel: replicated, shrank N-fold, partly shrank, added,
        removed (`tracekit.analyse.kernel_scaling`), summing to the printed compute term."""
        return scaling_of(
            run_canonical(self.baseline),
            run_canonical(self.sharded),
            max(1, round(1 / self.factor)),
            self.corrected.integers()["terms_ns"]["compute"],
        )

    def document(self) -> sd.Shortfall:
        """The document of docs/JSON.md#shortfall."""
        ints = self.corrected.integers()
        unc = self.uncorrected.integers()
        s = ints["shortfall_ns"]
        coll = self.sharded.collectives
        d_b, d_s = self.baseline.dilation, self.sharded.dilation
        ad_b, ad_s = self.applied["baseline"], self.applied["sharded"]
        path = self.path_ints()
        return sd.Shortfall(
            schema_version=SCHEMA_VERSION,
            kind="tracekit.shortfall",
            n_ranks=self.n_ranks,
            baseline_ranks=self.baseline.n_ranks,
            per_token_ns=sd.ShortfallPerTokenNs(**ints["per_token_ns"]),
            per_token_source=self.per_token_source,
            per_token_median_ns=sd.ShortfallPerTokenMedianNs(
                baseline=median_window(self.baseline, ad_b, self.per_token_source),
                sharded=median_window(self.sharded, ad_s, self.per_token_source),
            ),
            shortfall_ns=s,
            terms_ns=ints["terms_ns"],
            coordination_ns=ints["coordination_ns"],
            shares={k: (v / s if s else None) for k, v in ints["terms_ns"].items()},
            term_words={k: v for k, v in self.term_words().items() if k in ints["terms_ns"]},
            aggregate="mean over ranks of each rank's parts (each rank's window padded to the step time with idle)",
            per_rank=per_rank_json(self.per_rank, self.sharded),
            critical_path=sd.ShortfallCriticalPath(
                step_ns=path.step_ns,
                offset_ns=path.offset_ns,
                by_rank=path.by_rank,
                cause=self.path_cause(),
                hops_per_step_median=float(
                    self.sharded.critical.per_step.drop_duplicates("step")["hops"].median()
                )
                if len(self.sharded.critical.per_step)
                else 0.0,
                baseline=self._base_path_ints(),
                uncorrected=self.path_ints(corrected=False),
            ),
            straggler=self.straggler(),
            compute_scaling=self.compute_scaling(),
            spread_ns=self.spread_ns,
            verdict=self.verdict(),
            intervals=self.intervals.document(),
            noise=self.noise().document(),
            diagnosis=self._noise_checked_diagnosis(),
            dilation=sd.ShortfallDilation(
                definition="profiled / unprofiled per-token time, measured by the capture's alternating "
                "rounds (median of per-round ratios; one round: the mean ratio); the corrected per-token time is "
                "the trace's divided by exactly this factor",
                baseline=ad_b.factor,
                sharded=ad_s.factor,
                interval=sd.ShortfallInterval(
                    baseline=list(ad_b.interval) if ad_b.interval else None,
                    sharded=list(ad_s.interval) if ad_s.interval else None,
                ),
                applied=sd.ShortfallApplied(baseline=ad_b.document(), sharded=ad_s.document()),
                threshold=d_s.threshold,
                inflated=self._inflated(),
                reconciliation=self.reconciliation,
                correction=self._correction_json(),
                runs=sd.ShortfallRuns(baseline=d_b.document(), sharded=d_s.document()),
            ),
            uncorrected=sd.ShortfallUncorrected_(
                per_token_ns=sd.ShortfallPerTokenNs(**unc["per_token_ns"]),
                shortfall_ns=unc["shortfall_ns"],
                terms_ns=unc["terms_ns"],
                coordination_ns=unc["coordination_ns"],
                shares={
                    k: (v / unc["shortfall_ns"] if unc["shortfall_ns"] else None)
                    for k, v in unc["terms_ns"].items()
                },
                per_rank=per_rank_json(self.per_rank_uncorrected, self.sharded),
            ),
            stragglers=coll.stragglers_json(),
            collectives=run_collectives(self.sharded),
            clock=coll.clock.document(),
            steps=sd.ShortfallSteps(baseline=steps_json(self.baseline), sharded=steps_json(self.sharded)),
            data_quality=self.data_quality.document(),
        )

    def to_frame(self) -> pd.DataFrame:
        """The attribution of S as a table, from `document()` (so the two agree): one row per term
        (`terms_ns`), then the coordination components (`parent` "coordination"); columns `ns`,
        `share` (of S), `p10_ns`, `median_ns`, `p90_ns` (spread over steps), `uncorrected_ns`."""
        doc = self.document()
        s = doc.shortfall_ns
        rows = []
        for parent, key in (("", "terms_ns"), ("coordination", "coordination_ns")):
            for term, ns in getattr(doc, key).items():
                sp = doc.spread_ns.get(term)
                rows.append(
                    {
                        "term": term,
                        "parent": parent,
                        "ns": ns,
                        "share": ns / s if s else None,
                        "p10_ns": sp.p10 if sp else None,
                        "median_ns": sp.median if sp else None,
                        "p90_ns": sp.p90 if sp else None,
                        "uncorrected_ns": getattr(doc.uncorrected, key).get(term),
                    }
                )
        return pd.DataFrame(rows)

    def _base_path_ints(self) -> sd.ShortfallBaseline:
        ints = path_integers(self.base_path)
        return sd.ShortfallBaseline(
            step_ns=ints.step_ns,
            by_rank={
                r: sd.ShortfallPathParts(**{f"{p}_ns": getattr(d, f"{p}_ns") for p in PATH_PARTS})
                for r, d in ints.by_rank.items()
            },
        )
