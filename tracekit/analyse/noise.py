"""How much of a shortfall is noise (docs/METHOD.md section "Noise and the profiler correction").

The point figures of a shortfall (T1, TN, S and the terms, exact integers that sum) come from one
traced pass of each run. Two kinds of noise move them:

- between steps of that pass (a descheduled rank, a late collective): seen by resampling the
  pass's steady steps;
- between passes (the host's speed drifts: the H200 host moved 9.3 -> 4.9 ms per token within
  16 s): the traced pass of TP=1 and the one of TP=N ran at different moments. The capture's
  alternating rounds (manifest `unprofiled.rounds` / `profiled.rounds`) time every round, so the
  spread of the rounds' per-token times is the measure of it; only the last profiled round is
  traced, so another round's parts are the traced pass's parts at that round's speed.

`bootstrap` draws, per resample (2000, seed 0, so one input always gives one interval): for each
run its steady steps with replacement (whole steps: every rank's parts of the step together);
its rounds with replacement (`rounds` slots), each drawn round's tokens with replacement within
it; the dilation D* of the drawn rounds (the median of their profiled/unprofiled ratios, as
`tracekit.analyse.dilation` defines D); the speed of one drawn round against the traced round's,
s* = mean(P_k*) / mean(P_traced), which scales that run's parts. When the two runs' rounds were
captured interleaved (`tracekit study`: manifest `workload.interleaved`, the same group on both),
the same round indices are drawn for both (drift falls on both alike and cancels in S); else each
run's rounds are drawn on their own. The corrected parts are then reconciled to s* x traced / D*
by the shortfall's own rule (`reconcile_arrays`, the vectorised `shortfall.reconcile`): when the
shortfall corrected through the replay (`tracekit.analyse.attribution.correction`), the drawn steps' parts on
the corrected timeline (`RunSample.replayed`) are reconciled, else their traced parts; averaged
over ranks, and the terms formed as the point figures are. The intervals are the 2.5 and 97.5
percentiles. A run without rounds in its manifest (or without a manifest) is resampled over steps
only, and `basis` says so.

`reading` turns the intervals into what the verdict may say: a term whose interval excludes zero
is a finding (positive) or a real negative term; one whose interval spans zero is within noise; S
spanning zero means the run is too noisy to attribute. The largest finding is named as the cause
only where it is also the largest of the findings in at least STABILITY (95%) of the resamples
(`Intervals.leaders`: per finding, the share of resamples in which it is the largest of them);
else the run is `unsettled`: too noisy to say which term holds it back, the candidates listed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tracekit.model.documents import shortfall as sd
from tracekit.model.documents.base import Documented
from tracekit.model.fields import copy_fields
from tracekit.model.parts import COORDINATION as COORD
from tracekit.model.parts import LEAF_PARTS as PARTS

#: The bootstrap: resamples, seed, coverage (the dilation's interval uses the same).
RESAMPLES = 2000
SEED = 0
LEVEL = 0.95
#: the share of resamples in which the largest finding must also be the largest term to be named
STABILITY = 0.95


@dataclass(frozen=True)
class RunSample:
    """What the bootstrap needs of one run.

    `steps`: [steady steps, ranks, PARTS] per-step leaf parts (ns; each rank's padded to the step
    time, so every rank's parts of a step sum to it). `unprofiled` / `profiled`: the manifest's
    rounds (per round, the per-token times, slowest rank, warm-up removed; the last profiled
    round is the traced one). `corrected`: the point figures were reconciled to traced / D.
    `pairing`: the interleaving group of the capture (None: captured on its own)."""

    steps: np.ndarray
    timeline: str
    unprofiled: tuple[tuple[int, ...], ...] = ()
    profiled: tuple[tuple[int, ...], ...] = ()
    corrected: bool = False
    pairing: str | None = None
    #: [steady steps, ranks, PARTS]: the same steps' parts on the profiler-corrected timeline
    #: (`tracekit.analyse.attribution.correction`), each step summing to its corrected step time; None: the
    #: correction is the proportional rule on the traced parts
    replayed: np.ndarray | None = None

    @property
    def rounds(self) -> int:
        return len([r for r in self.profiled if len(r)])


@dataclass(frozen=True)
class Intervals(Documented):
    """95% bootstrap intervals (integer ns, [lo, hi]) of a shortfall's figures."""

    per_token: dict[str, tuple[int, int]]  # baseline, sharded, ideal
    shortfall: tuple[int, int]
    terms: dict[str, tuple[int, int]]  # TERMS (unknown only when asked)
    coordination: dict[str, tuple[int, int]]  # wait, sync, idle
    basis: str  # "paired rounds and steps" | "rounds and steps" | "steps"
    paired: bool
    rounds: dict[str, int]
    resamples: int = RESAMPLES
    seed: int = SEED
    level: float = LEVEL
    #: "a-b" (a before b in TERMS' order) -> the interval of term a minus term b over the same
    #: resamples: whether the larger of two terms is larger beyond the noise (`reading`'s ties)
    leads: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: term -> its value in each resample ([resamples] floats, ns): `leaders` reads them
    draws: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def leaders(self, keys: Sequence[str]) -> dict[str, float]:
        """Per term of `keys`, the share of the resamples in which it is the largest of `keys`
        (the shares sum to 1; an exact tie goes to the first of `keys`, a measure-zero event)."""
        keys = [k for k in keys if k in self.draws]
        if not keys:
            return {}
        top = np.argmax(np.stack([self.draws[k] for k in keys], axis=1), axis=1)
        return {k: float(np.mean(top == j)) for j, k in enumerate(keys)}

    def lead(self, a: str, b: str) -> tuple[int, int] | None:
        """The interval of term `a` minus term `b`, or None where it was not drawn."""
        if f"{a}-{b}" in self.leads:
            return self.leads[f"{a}-{b}"]
        if f"{b}-{a}" in self.leads:
            lo, hi = self.leads[f"{b}-{a}"]
            return -hi, -lo
        return None

    @property
    def method(self) -> str:
        rounds = f"{self.rounds['baseline']} baseline and {self.rounds['sharded']} sharded rounds"
        if self.basis == "steps":
            return (
                "bootstrap over the traced pass's steady steps only (no rounds in the manifests: the noise "
                "between captures is not seen; capture with `tracekit study` or `tracekit capture --rounds`)"
            )
        pair = (
            "drawn as pairs (the runs' rounds were captured interleaved: drift falls on both alike)"
            if self.paired
            else "drawn for each run on its own (the runs were captured separately: drift between the two "
            "captures is not seen)"
        )
        return (
            f"bootstrap over {rounds}, {pair}, tokens within each drawn round, and the traced pass's steps; "
            "another round's parts are the traced pass's at that round's speed"
        )

    def document(self) -> sd.ShortfallIntervals:
        # level, resamples, seed, basis, paired, method: the intervals' own
        return copy_fields(
            sd.ShortfallIntervals,
            self,
            rounds=dict(self.rounds),
            per_token_ns=sd.ShortfallIntervalsPerTokenNs(**{k: list(v) for k, v in self.per_token.items()}),
            shortfall_ns=list(self.shortfall),
            terms_ns={k: list(v) for k, v in self.terms.items()},
            coordination_ns={k: list(v) for k, v in self.coordination.items()},
        )


# ------------------------------------------------------------------------------------------
# reconciliation, vectorised


def reconcile_arrays(parts: np.ndarray, target: np.ndarray, timeline: str) -> np.ndarray:
    """`shortfall.reconcile` on arrays: `parts` [..., PARTS] scaled to sum to `target` [...] by
    the same rules (device timeline: the excess out of wait + sync + idle in proportion, emptied
    and the rest scaled when it exceeds them, every part scaled up when there is no excess; host
    timeline: every part but transfer scaled by one factor). Floats; the test holds it to the
    exact Fraction version."""
    p = np.asarray(parts, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    traced = p.sum(axis=-1)
    excess = traced - t
    idx = {k: i for i, k in enumerate(PARTS)}
    coord_mask = np.zeros(len(PARTS), dtype=bool)
    coord_mask[[idx[k] for k in COORD]] = True

    def scaled(keys_mask: np.ndarray) -> np.ndarray:
        base = (p * keys_mask).sum(axis=-1)
        rest = traced - base
        use_all = base <= 0
        mask = np.where(use_all[..., None], True, keys_mask)
        base = np.where(use_all, traced, base)
        rest = np.where(use_all, 0.0, rest)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(base != 0, (t - rest) / base, 1.0)
        return np.where(mask, p * factor[..., None], p)

    if timeline != "gpu":
        mask = np.ones(len(PARTS), dtype=bool)
        mask[idx["transfer"]] = False
        return scaled(mask)
    coord = (p * coord_mask).sum(axis=-1)
    up = scaled(np.ones(len(PARTS), dtype=bool))  # excess < 0
    emptied = np.where(coord_mask, 0.0, p)
    rest_base = emptied.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        f_rest = np.where(rest_base > 0, t / rest_base, 1.0)
    over = np.where(coord_mask, 0.0, emptied * f_rest[..., None])  # excess > coord
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(coord > 0, 1.0 - excess / np.where(coord > 0, coord, 1.0), 1.0)
    inside = np.where(coord_mask, p * keep[..., None], p)  # 0 < excess <= coord
    out = np.where((excess < 0)[..., None], up, np.where((excess > coord)[..., None], over, inside))
    return np.where((excess == 0)[..., None], p, out)


# ------------------------------------------------------------------------------------------
# the bootstrap


def _round_means(rounds: Sequence[Sequence[int]], rng: np.random.Generator, b: int) -> np.ndarray:
    """[b, K]: each round's mean with its tokens resampled (resample i draws every round)."""
    out = np.empty((b, len(rounds)))
    for j, r in enumerate(rounds):
        a = np.asarray(r, dtype=np.float64)
        out[:, j] = a[rng.integers(0, len(a), size=(b, len(a)))].mean(axis=1)
    return out


def _run_draws(
    run: RunSample, rng: np.random.Generator, b: int, idx: np.ndarray | None, dilation: float | None
) -> np.ndarray:
    """[b, PARTS]: the run's per-token parts (mean over ranks) in each resample."""
    steps = np.asarray(run.steps, dtype=np.float64)
    n = steps.shape[0]
    w = rng.multinomial(n, np.full(n, 1.0 / n), size=b).astype(np.float64) / n  # [b, n]
    parts = np.einsum("bn,nrp->brp", w, steps)  # [b, ranks, parts]
    u = [r for r in run.unprofiled if len(r)]
    p = [r for r in run.profiled if len(r)]
    scale = np.ones(b)
    pm = _round_means(p, rng, b) if p else None
    if pm is not None and len(p) >= 2 and idx is not None:
        traced = float(np.mean(p[-1]))
        if traced > 0:
            scale = pm[np.arange(b), idx[:, 0]] / traced
    parts = parts * scale[:, None, None]
    if not run.corrected or dilation is None:
        return parts.mean(axis=1)
    um = _round_means(u, rng, b) if u else None
    d = np.full(b, float(dilation))
    if um is not None and pm is not None:
        if len(u) == len(p) >= 2 and idx is not None:
            rows = np.arange(b)[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                d = np.median(pm[rows, idx] / um[rows, idx], axis=1)
        else:
            nu = np.array([len(r) for r in u], dtype=np.float64)
            npr = np.array([len(r) for r in p], dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                d = ((pm * npr).sum(axis=1) / npr.sum()) / ((um * nu).sum(axis=1) / nu.sum())
    d = np.where(np.isfinite(d) & (d > 0), d, float(dilation))
    traced_t = parts.sum(axis=-1)  # [b, ranks]: every rank's parts sum to the step time
    target = traced_t / d[:, None]
    if run.replayed is not None:  # the corrected timeline's parts of the same drawn steps
        rep = np.einsum("bn,nrp->brp", w, np.asarray(run.replayed, dtype=np.float64)) * scale[:, None, None]
        # time the corrected timeline leaves short of the target is idle (`correction_replay.rest_to_target`)
        rep[..., PARTS.index("idle")] += np.maximum(target - rep.sum(axis=-1), 0.0)
        return reconcile_arrays(rep, target, run.timeline).mean(axis=1)
    return reconcile_arrays(parts, target, run.timeline).mean(axis=1)


def _q(x: np.ndarray, level: float) -> tuple[int, int]:
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(x, [a, 1.0 - a])
    return int(np.floor(lo + 0.5)), int(np.floor(hi + 0.5))


def bootstrap(
    base: RunSample,
    shard: RunSample,
    factor: float,
    *,
    dilations: tuple[float | None, float | None] = (None, None),
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
    with_unknown: bool = False,
) -> Intervals:
    """Intervals of T1, TN, the ideal, S and every term (module doc). `dilations`: the point
    dilation of (base, shard), used where a resample's rounds give no ratio. Deterministic."""
    rng = np.random.default_rng(seed)
    b = int(resamples)
    kb, ks = base.rounds, shard.rounds
    paired = kb == ks >= 2 and base.pairing is not None and base.pairing == shard.pairing
    idx_b: np.ndarray | None
    idx_s: np.ndarray | None
    if paired:
        idx_b = idx_s = rng.integers(0, kb, size=(b, kb))
    else:
        idx_b = rng.integers(0, kb, size=(b, kb)) if kb >= 2 else None
        idx_s = rng.integers(0, ks, size=(b, ks)) if ks >= 2 else None
    pb = _run_draws(base, rng, b, idx_b, dilations[0])
    ps = _run_draws(shard, rng, b, idx_s, dilations[1])
    leaf = ps - factor * pb
    i = {k: j for j, k in enumerate(PARTS)}
    t1, tn = pb.sum(axis=1), ps.sum(axis=1)
    terms = {
        "compute": leaf[:, i["compute"]],
        "memory": leaf[:, i["memory"]],
        "transfer": leaf[:, i["transfer"]],
        "coordination": leaf[:, [i[k] for k in COORD]].sum(axis=1),
    }
    if with_unknown:
        terms["unknown"] = leaf[:, i["unknown"]]
    rounds_any = kb >= 2 or ks >= 2
    basis = "paired rounds and steps" if paired else ("rounds and steps" if rounds_any else "steps")
    return Intervals(
        per_token={
            "baseline": _q(t1, level),
            "sharded": _q(tn, level),
            "ideal": _q(factor * t1, level),
        },
        shortfall=_q(tn - factor * t1, level),
        terms={k: _q(v, level) for k, v in terms.items()},
        coordination={k: _q(leaf[:, i[k]], level) for k in COORD},
        leads={
            f"{a}-{b}": _q(terms[a] - terms[b], level)
            for j, a in enumerate(terms)
            for b in list(terms)[j + 1 :]
        },
        draws=terms,
        basis=basis,
        paired=paired,
        rounds={"baseline": kb, "sharded": ks},
        resamples=b,
        seed=seed,
        level=level,
    )


# ------------------------------------------------------------------------------------------
# what the verdict may say


def term_reading(interval: tuple[int, int]) -> str:
    """ "finding" (interval above zero), "negative" (below zero) or "within_noise" (spans zero)."""
    lo, hi = interval
    if lo > 0:
        return "finding"
    if hi < 0:
        return "negative"
    return "within_noise"


@dataclass(frozen=True)
class Reading(Documented):
    """What the intervals allow the verdict to say.

    `status`: "attributed" (a positive term stands clear of the noise and is the largest of those
    in at least STABILITY of the resamples: `cause`), "unsettled" (S and several terms are clear
    of zero, but none is the largest of them in STABILITY of the resamples: `candidates`),
    "unattributed" (S is clear of zero but no positive term is), "too_noisy" (S's interval spans
    zero), "beats_ideal" (S's interval is below zero). `terms`: per term its point figure,
    interval and `term_reading`. `stability`: the share of resamples in which the largest finding
    (by its point figure) is the largest of the findings; None where there is no finding."""

    status: str
    cause: str | None
    terms: dict[str, sd.ShortfallShortfall]
    shortfall: sd.ShortfallShortfall
    stability: float | None = None
    #: unsettled: the findings that are the largest of them in at least 1 - STABILITY of the
    #: resamples (and the largest finding), most often first; lead_ns: the interval of the largest
    #: finding minus this term (None for the largest finding itself)
    candidates: list[sd.ShortfallCandidate] = field(default_factory=list)

    @property
    def named(self) -> bool:
        """Whether the verdict names a cause."""
        return self.cause is not None

    def document(self) -> sd.ShortfallNoise:
        return sd.ShortfallNoise(
            status=self.status,
            cause=self.cause,
            named=self.named,
            stability=None if self.stability is None else round(self.stability, 4),
            stability_required=STABILITY,
            candidates=self.candidates,
            shortfall=self.shortfall,
            terms=self.terms,
        )


def reading(s_ns: int, terms_ns: Mapping[str, int], iv: Intervals) -> Reading:
    """The verdict's reading of the point figures against their intervals (module doc)."""
    terms = {
        k: sd.ShortfallShortfall(ns=int(v), interval=list(iv.terms[k]), reading=term_reading(iv.terms[k]))
        for k, v in terms_ns.items()
        if k in iv.terms
    }
    s_read = term_reading(iv.shortfall)
    shortfall = sd.ShortfallShortfall(ns=int(s_ns), interval=list(iv.shortfall), reading=s_read)
    if s_read == "within_noise":
        return Reading("too_noisy", None, terms, shortfall)
    if s_read == "negative":
        return Reading("beats_ideal", None, terms, shortfall)
    found = [k for k, t in terms.items() if t.reading == "finding"]
    if not found:
        return Reading("unattributed", None, terms, shortfall)
    top = max(found, key=lambda k: (terms[k].ns, k))
    # named only where the resamples agree: the largest finding is the largest of the findings in
    # at least STABILITY of them; two findings within each other's noise trade places between
    # resamples, and naming either would pass the noise off as a ranking. (A term within its
    # noise is no finding and no candidate: the verdict already says it is within noise.)
    shares = iv.leaders(found)
    stability = shares.get(top, 1.0 if len(found) == 1 else 0.0)
    if stability >= STABILITY:
        return Reading("attributed", top, terms, shortfall, stability)
    floor = 1.0 - STABILITY
    cands = [
        k
        for k in sorted(found, key=lambda k: (-shares.get(k, 0.0), k))
        if k == top or shares.get(k, 0.0) >= floor
    ]
    candidates = [
        sd.ShortfallCandidate(
            term=k,
            leads_share=round(shares.get(k, 0.0), 4),
            lead_ns=None if k == top or (lead := iv.lead(top, k)) is None else list(lead),
        )
        for k in cands
    ]
    return Reading("unsettled", None, terms, shortfall, stability, candidates)


#: what a term below zero (its interval clear of zero) means, in words; {n} the TP degree
NEGATIVE_WORDS = {
    "compute": "compute scaled better than {n}-fold",
    "memory": "memory copies shrank more than {n}-fold",
    "transfer": "collective transfer is below the baseline's",
    "coordination": "ranks waited and idled less than 1/{n} of the TP=1 run's host gaps",
    "unknown": "unclassified kernels shrank more than {n}-fold",
}
