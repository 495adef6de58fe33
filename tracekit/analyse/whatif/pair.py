"""The what-if of a (baseline, sharded) pair (`tracekit.analyse.whatif`): `whatif` replays both
runs, calibrates them to their unprofiled per-token times, predicts every knob and combination
at both rank counts and splits S by Shapley values; `split_ranges` where the sharded run's
profiler cost per rank is not identified; `check_run` a prediction against a run not used to make it."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction

import numpy as np
import pandas as pd

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.correction import alone, refine_splits
from tracekit.analyse.attribution.pair import shortfall_from_parts
from tracekit.analyse.attribution.run import RunParts
from tracekit.analyse.retime.calibrate import calibrate
from tracekit.analyse.retime.model import RunModel
from tracekit.analyse.retime.setting import Setting
from tracekit.analyse.whatif.build import build_model
from tracekit.analyse.whatif.knobs import MAX_SHAPLEY_KNOBS, Knob, ReplayError, combination_spec, setting_for
from tracekit.analyse.whatif.result import SplitRanges, WhatIf
from tracekit.analyse.whatif.shapley import mean_int, shapley
from tracekit.model.documents.whatif import WhatifAccounting, WhatifCheck, WhatifDeviceWork


def whatif(
    base_parts: RunParts,
    base_classified: pd.DataFrame | AnalysedRun,
    shard_parts: RunParts | None,
    shard_classified: pd.DataFrame | AnalysedRun | None,
    knobs: Sequence[Knob],
    combinations: Sequence[tuple[Knob, ...]] = (),
    check: tuple[RunParts, tuple[Knob, ...], str] | None = None,
) -> WhatIf:
    """Replay both runs, calibrate them to their unprofiled per-token times (as `shortfall` does),
    predict every knob and combination at both rank counts, and split S by Shapley values."""
    if len(knobs) > MAX_SHAPLEY_KNOBS:
        raise ReplayError(f"at most {MAX_SHAPLEY_KNOBS} knobs (2^k replays), got {len(knobs)}")
    sf = shortfall_from_parts(base_parts, shard_parts) if shard_parts is not None else None
    corrected = sf is not None and sf.per_token_source == "unprofiled"
    if sf is None:
        u = base_parts.dilation.unprofiled
        corrected = u is not None and u.n > 0 and u.mean_ns > 0
    # the per-token times the accounting states (T1, TN), so both splits share one S
    tgt_b: Fraction | None = None
    tgt_s: Fraction | None = None
    if corrected and sf is not None:
        tgt_b, tgt_s = Fraction(sf.corrected.baseline_ns), Fraction(sf.corrected.sharded_ns)
    elif corrected and base_parts.dilation.unprofiled is not None:
        tgt_b = Fraction(base_parts.dilation.unprofiled.mean_ns)
    base = build_model(base_parts, base_classified, tgt_b, "baseline")
    shard = None
    if shard_parts is not None and shard_classified is not None:
        shard = build_model(shard_parts, shard_classified, tgt_s, "sharded")
    replayed = {"baseline": base.replay(Setting())}
    if shard is not None:
        replayed["sharded"] = shard.replay(Setting())
    for m in (base, shard):
        if m is not None:
            calibrate(m)
    measured = {
        base.n_ranks: base.target_ns
        if base.target_ns is not None
        else Fraction(base_parts.per_token["window"])
    }
    if shard is not None and shard_parts is not None:
        measured[shard.n_ranks] = (
            shard.target_ns if shard.target_ns is not None else Fraction(shard_parts.per_token["window"])
        )
    base_compute = base.compute_per_token
    c1 = float(np.mean(list(base_compute.values()))) if base_compute else None
    n_shard = shard.n_ranks if shard is not None else base.n_ranks
    f = Fraction(base.n_ranks, n_shard)

    def setting(m: RunModel, ks: Iterable[Knob]) -> Setting:
        # compute=/N scales to the baseline's compute x (baseline ranks / N)
        s = setting_for(m, ks, c1 * base.n_ranks if c1 is not None else None, m.n_ranks)
        if m is base:
            s = dataclasses.replace(s, compute_scale=None)
        return s

    memo: dict[tuple[int, str], Fraction] = {}

    def key_of(m: RunModel, ks: Sequence[Knob]) -> tuple[int, str]:
        return (id(m), combination_spec(k for k in ks if m.applicable(k)))

    def cached(m: RunModel, ks: Sequence[Knob]) -> Fraction:
        key = key_of(m, ks)
        if key not in memo:
            memo[key] = mean_int(m.replay(setting(m, ks)))
        return memo[key]

    combos: list[tuple[Knob, ...]] = [()] + [(k,) for k in knobs] + list(combinations)
    if check is not None:
        combos.append(check[1])
    if len(knobs) > 1:
        combos.append(tuple(knobs))
    # every replay the predictions and the Shapley game need, per run in one forward pass
    wanted = list(combos)
    if shard is not None:
        wanted += [
            tuple(knobs[i] for i in sub)
            for size in range(len(knobs) + 1)
            for sub in itertools.combinations(range(len(knobs)), size)
        ]
    shard_settings: dict[tuple[int, str], Setting] = {}
    for m in (base, shard):
        if m is None:
            continue
        todo: dict[tuple[int, str], Setting] = {}
        for ks in wanted:
            key = key_of(m, ks)
            if key not in memo and key not in todo:
                todo[key] = setting(m, ks)
        if m is shard:
            shard_settings = dict(todo)
        for key, per in zip(todo, m.replay_many(list(todo.values())), strict=True):
            memo[key] = mean_int(per)
    predicted: dict[str, dict[int, Fraction]] = {}
    for ks in combos:
        spec = combination_spec(ks)
        if spec in predicted:
            continue
        predicted[spec] = {base.n_ranks: cached(base, ks)}
        if shard is not None:
            predicted[spec][shard.n_ranks] = cached(shard, ks)
    shap: dict[str, Fraction] | None = None
    resid: dict[str, Fraction] | None = None
    ideal = s_ns = None
    if shard is not None:
        ideal = measured[base.n_ranks] * f
        s_ns = measured[shard.n_ranks] - ideal
        values: dict[frozenset[int], Fraction] = {}
        for size in range(len(knobs) + 1):
            for sub in itertools.combinations(range(len(knobs)), size):
                sub_knobs = [knobs[i] for i in sub]
                # the game: the shortfall under the knobs, TN(K) - f T1(K) (both runs replayed)
                values[frozenset(sub)] = cached(shard, sub_knobs) - f * cached(base, sub_knobs)
        phis = shapley(values, len(knobs))
        shap = {k.spec: phi for k, phi in zip(knobs, phis, strict=True)}
        after_all = values[frozenset(range(len(knobs)))]
        gap = s_ns - values[frozenset()]
        shap["residual"] = after_all + gap
        resid = {"after_all_knobs": after_all, "replay_gap": gap}
        assert sum(shap.values()) == s_ns
    ranges = None
    corr_s = sf.corrections.get("sharded") if sf is not None else None
    if (
        shard is not None
        and corr_s is not None
        and not corr_s.identified
        and corr_s.intervals
        and shard.correction == "solved"
        and s_ns is not None
    ):
        ranges = split_ranges(
            shard, corr_s.intervals, shard_settings, memo, combos, knobs, key_of, base, cached, f, s_ns
        )
    check_doc = None
    if check is not None:
        same_n = base_parts if len(check[0].ranks) == base.n_ranks else shard_parts
        check_doc = check_run(check, predicted, corrected, same_n)
    accounting = None
    if sf is not None:
        j = sf.document()
        accounting = WhatifAccounting(
            shortfall_ns=j.shortfall_ns, terms_ns=dict(j.terms_ns), shares=dict(j.shares)
        )
    return WhatIf(
        baseline=base,
        sharded=shard,
        knobs=tuple(knobs),
        combinations=list(combinations),
        predicted=predicted,
        replayed=replayed,
        shapley=shap,
        residual_parts=resid,
        ideal_ns=ideal,
        shortfall_ns=s_ns,
        measured=measured,
        accounting=accounting,
        check=check_doc,
        ranges=ranges,
    )


def split_ranges(
    shard: RunModel,
    intervals: list[tuple[int, float, float]],
    settings: Mapping[tuple[int, str], Setting],
    memo: Mapping[tuple[int, str], Fraction],
    combos: Sequence[tuple[Knob, ...]],
    knobs: Sequence[Knob],
    key_of: Callable[[RunModel, Sequence[Knob]], tuple[int, str]],
    base: RunModel,
    cached: Callable[[RunModel, Sequence[Knob]], Fraction],
    f: Fraction,
    s_ns: Fraction,
) -> SplitRanges:
    """Where the profiler's cost per rank is not identified (`attribution.correction.identify`): the sharded
    run's predictions and the Shapley values over the splits of the cost the data allow, the one
    cost on every rank and each rank's interval of costs that alone give the unprofiled time (read
    where the predictions bend: `attribution.correction.refine_splits`)."""
    keys = list(settings)
    ranks = list(shard.ranks)
    exact: dict[tuple[int, float], dict[tuple[int, str], Fraction]] = {}

    def evaluate(points: list[tuple[int, float]]) -> list[np.ndarray]:
        todo = [
            dataclasses.replace(settings[k], rank_costs=alone(ranks, r, c)) for r, c in points for k in keys
        ]
        per = shard.replay_many(todo)
        out = []
        for i, p in enumerate(points):
            vals = {k: mean_int(per[i * len(keys) + j]) for j, k in enumerate(keys)}
            exact[p] = vals
            out.append(np.asarray([float(v) for v in vals.values()]))
        return out

    refine_splits(intervals, evaluate)
    splits = [dict(memo), *({**memo, **v} for v in exact.values())]
    predicted: dict[str, list[int]] = {}
    for ks in combos:
        spec = combination_spec(ks)
        vals = [sp[key_of(shard, ks)] for sp in splits]
        predicted[spec] = [math.floor(min(vals)), math.ceil(max(vals))]
    shap: dict[str, list[Fraction]] = {k.spec: [] for k in knobs}
    shap["residual"] = []
    subs = [
        frozenset(sub)
        for size in range(len(knobs) + 1)
        for sub in itertools.combinations(range(len(knobs)), size)
    ]
    for sp in splits:
        values = {
            sub: sp[key_of(shard, [knobs[i] for i in sub])] - f * cached(base, [knobs[i] for i in sub])
            for sub in subs
        }
        for k, phi in zip(knobs, shapley(values, len(knobs)), strict=True):
            shap[k.spec].append(phi)
        shap["residual"].append(values[frozenset(range(len(knobs)))] + s_ns - values[frozenset()])
    return SplitRanges(
        predicted=predicted,
        shapley={k: [math.floor(min(v)), math.ceil(max(v))] for k, v in shap.items()},
        splits=len(splits),
    )


def check_run(
    check: tuple[RunParts, tuple[Knob, ...], str],
    predicted: Mapping[str, Mapping[int, Fraction]],
    corrected: bool,
    predicting: RunParts | None = None,
) -> WhatifCheck:
    """A prediction set against a real run that was not used to make it (docs/METHOD.md section Critical path and what-if).

    Also the device work per token (compute + memory kernels, per rank, mean) of the check run and
    of the run the prediction replays: a knob re-times the work the trace holds, so when the check
    run does different device work (a CUDA-graph loop over a static KV cache runs masked attention
    over every cached position), that difference bounds the agreement and is stated beside the error."""
    parts, combo, label = check
    spec = combination_spec(combo)
    n = len(parts.ranks)
    by_n = predicted[spec]
    if n not in by_n:
        raise ReplayError(
            f"--check {label} has {n} rank(s) but the predictions are for {', '.join(map(str, by_n))} rank(s)"
        )
    pred = by_n[n]
    traced = Fraction(parts.per_token["window"])
    u = parts.dilation.unprofiled
    unprof = Fraction(u.mean_ns) if u is not None and u.n > 0 and u.mean_ns > 0 else None
    measured, source = (unprof, "unprofiled") if corrected and unprof is not None else (traced, "trace")
    return WhatifCheck(
        run=label,
        knobs=spec,
        ranks=n,
        predicted_ns=int(round(pred)),
        measured_ns=int(round(measured)),
        measured_source=source,
        measured_traced_ns=int(round(traced)),
        measured_unprofiled_ns=int(round(unprof)) if unprof is not None else None,
        error=float((pred - measured) / measured),
        device_work_ns=WhatifDeviceWork(
            check_run=device_work(parts),
            predicting_run=device_work(predicting) if predicting is not None else None,
        ),
    )


def device_work(parts: RunParts) -> int:
    """Mean per-token device work (compute + memory kernels) over the run's ranks, integer ns."""
    per = [
        sum((Fraction(leaf.get(k, 0)) for k in ("compute", "memory")), Fraction(0))
        for leaf in parts.per_rank.values()
    ]
    return int(round(sum(per, Fraction(0)) / len(per))) if per else 0
