"""The truth of a case, computed from the simulation alone (no tracekit code).

`case_truth(case)` returns a flat dict of figures (ns, Fractions) keyed like the comparisons the
harness makes (`tests/test_groundtruth.py`):

* `per_token`: T1, TN (unprofiled, true clock), S = TN - T1 * N1/N;
* `terms`: mean over ranks of each part minus N1/N x the baseline's (compute, memory, transfer,
  wait, sync, idle, coordination = wait + sync + idle), and the same per rank (`terms.r<k>`);
* `path`: the causal critical path per rank and kind (host, compute, memory, transfer, sync),
  mean per steady token;
* `whatif`: the per-token time at TP=1 and TP=N under each knob alone and all together;
* `shapley`: the Shapley value of each knob in S, and the residual v(all knobs);
* `clock`: each rank's clock offset relative to rank 0;
* `steps`: the number of tokens matched across ranks and of steady ones;
* `diff` (cases with an `after` run): the change of TN, of each term and of the path.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache
from typing import Any

from tests.groundtruth import sim
from tests.groundtruth.cases import CASES, Case


def _terms(parts: dict[str, Fraction], base: dict[str, Fraction], f: Fraction) -> dict[str, Fraction]:
    t = {k: parts[k] - f * base[k] for k in sim.PARTS}
    t["coordination"] = t["wait"] + t["sync"] + t["idle"]
    return t


def _mean_step(res: sim.SimResult, skip_first: int = 1) -> Fraction:
    """The traced run's mean steady token period (the latest end of a token over ranks less the
    previous token's): what the unchanged replay of its trace must give back exactly, since the
    replay's token time is that period (nothing between steps is frozen). The longest window, the
    accounting's step time, is the same only in a periodic run: with random host gaps it differs
    from the period by up to 0.5 us per token (`loaded_host_noise`)."""
    return res.per_token_ns(skip_first)


def _run_truth(res: sim.SimResult) -> dict[str, Any]:
    return {"T": res.per_token_ns(), "parts": sim.parts_truth(res), "path": sim.critical_path(res)}


def no_wait(name: str) -> bool:
    """True when no rank of the case's sharded run waits at any collective (< 1 us per token)."""
    spec = CASES[name].sharded
    if spec is None:
        return False
    return all(p["wait"] < 1000 for p in sim.parts_truth(sim.simulate(spec)).values())


@cache
def case_truth(name: str) -> dict[str, Any]:
    case: Case = CASES[name]
    out: dict[str, Any] = {}
    ub = sim.simulate(case.baseline)
    tb = _run_truth(ub)
    base_parts = tb["parts"][0]
    out["T1"] = tb["T"]
    out["T1_traced"] = _mean_step(sim.simulate(case.baseline, profiled=True))
    out["base_parts"] = base_parts
    out["base_path"] = tb["path"]
    if case.sharded is None:
        out["whatif"] = {
            k: {
                "1": sim.simulate(
                    case.baseline, knobs=sim.applicable(case.baseline, frozenset([k]))
                ).per_token_ns()
            }
            for k in ("launch=0", "sync=0")
        }
        return out
    spec = case.sharded
    us = sim.simulate(spec)
    ts = _run_truth(us)
    f = Fraction(case.baseline.tp, spec.tp)
    out["f"] = f
    out["TN_traced"] = _mean_step(sim.simulate(spec, profiled=True))
    out["TN"] = ts["T"]
    out["S"] = ts["T"] - f * tb["T"]
    per_rank = {r: _terms(p, base_parts, f) for r, p in ts["parts"].items()}
    out["terms_rank"] = per_rank
    out["no_wait"] = no_wait(name)
    out["terms"] = {k: sum((per_rank[r][k] for r in per_rank), Fraction(0)) / spec.tp for k in per_rank[0]}
    out["path"] = ts["path"]
    values, times = sim.shapley(case.baseline, spec)
    out["shapley"] = values
    out["shapley_residual"] = times[frozenset(sim.KNOBS)][1] - f * times[frozenset(sim.KNOBS)][0]
    out["whatif"] = {k: {"1": times[frozenset([k])][0], "N": times[frozenset([k])][1]} for k in sim.KNOBS}
    out["whatif"]["all"] = {"1": times[frozenset(sim.KNOBS)][0], "N": times[frozenset(sim.KNOBS)][1]}
    if case.drift is not None:
        from tests.groundtruth.kineto import with_host_scale

        largest = []
        names = ("compute", "memory", "transfer", "coordination")
        for sc in case.drift:
            t1 = _run_truth(sim.simulate(with_host_scale(case.baseline, sc)))
            tn = _run_truth(sim.simulate(with_host_scale(spec, sc)))
            rt = [_terms(p, t1["parts"][0], f) for p in tn["parts"].values()]
            mean = {k: sum((x[k] for x in rt), Fraction(0)) / spec.tp for k in names}
            largest.append(max(range(4), key=lambda i: mean[names[i]]))
        out["largest_by_round"] = largest
    o0 = spec.ranks[0].clock_offset_ns
    out["clock"] = {r: rs.clock_offset_ns - o0 for r, rs in enumerate(spec.ranks)}
    out["steps"] = {"total": spec.tokens, "steady": spec.tokens - 1}
    if case.after is not None:
        ua = sim.simulate(case.after)
        ta = _run_truth(ua)
        pa = {r: _terms(p, base_parts, f) for r, p in ta["parts"].items()}
        after_terms = {k: sum((pa[r][k] for r in pa), Fraction(0)) / case.after.tp for k in pa[0]}
        out["diff"] = {
            "T": ta["T"] - ts["T"],
            "terms": {k: after_terms[k] - out["terms"][k] for k in after_terms},
            "path": {r: {k: ta["path"][r][k] - ts["path"][r][k] for k in sim.PATH_KINDS} for r in ta["path"]},
        }
    return out
