"""The prose of a shortfall: its verdict, the diagnosis (what to look at next), the sentence on
the critical path and the one on the profiler's dilation (docs/METHOD.md section "Shortfall
attribution"). Functions of a `tracekit.analyse.attribution.result.Shortfall`; its methods of the same
names (`Shortfall.verdict`, `.diagnosis`, `.path_cause`) call these, so callers of either keep
working. Every figure a sentence states is one the attribution measured; a clause is said only
when its figure was measured so."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from tracekit.analyse.exact import round_half_up
from tracekit.analyse.noise import NEGATIVE_WORDS
from tracekit.model.parts import COORDINATION, PATH_PARTS
from tracekit.model.units import ms_or_us as _ms

if TYPE_CHECKING:
    from tracekit.analyse.attribution.result import Shortfall

#: what the bootstrap resampled, in words (`Intervals.basis`)
BASIS_WORDS = {
    "paired rounds and steps": "the paired rounds of the interleaved captures and their steps",
    "rounds and steps": "each run's rounds and steps (the runs were captured separately)",
    "steps": "the traced steps only (no rounds in the manifests)",
}


def iv_words(iv: tuple[int, int] | list[int]) -> str:
    """An interval in the unit its larger end reads in: "[0.12, 0.48 ms]"."""
    lo, hi = iv
    if max(abs(lo), abs(hi)) >= 1e5:
        return f"[{lo / 1e6:.2f}, {hi / 1e6:.2f} ms]"
    return f"[{lo / 1e3:.1f}, {hi / 1e3:.1f} us]"


def verdict(sf: Shortfall) -> str:
    """One paragraph: the largest term whose interval excludes zero, the others as what their
    intervals say (a finding with its share, "within noise [lo, hi]", or a real negative term
    in words), or that the run was too noisy to attribute (S's interval spans zero)."""
    ints = sf.corrected.integers()
    s = ints["shortfall_ns"]
    terms = ints["terms_ns"]
    pt = ints["per_token_ns"]
    n = sf.n_ranks
    iv = sf.intervals
    rd = sf.noise()
    head = f"TP={n}: {_ms(pt['sharded'])} vs ideal {_ms(pt['ideal'])}"
    dil = dilation_clause(sf)
    s_iv = iv_words(iv.shortfall)
    basis = f"95% bootstrap over {BASIS_WORDS[iv.basis]}"
    if rd.status == "too_noisy":
        return (
            f"Too noisy to attribute: the per-token shortfall S = {_ms(s)} ({head}) has a 95% interval "
            f"{s_iv} that spans zero ({basis}), so no term can be named. Capture more rounds (`--rounds`), "
            f"on a quieter host, or with CUDA graphs (fewer host launches, less host noise). {dil}"
        )
    if rd.status == "beats_ideal":
        return (
            f"TP={n} meets its ideal: {_ms(pt['sharded'])} per token vs ideal {_ms(pt['ideal'])} "
            f"(S = {_ms(s)} {s_iv}, below zero; no shortfall). {dil}"
        )
    words = sf.term_words()
    link = "link transfer" if sf.sharded.timeline == "gpu" else "gloo exchange"
    names = {"transfer": link, "coordination": "coordination", "compute": "compute scaling"}
    names |= {"memory": "memory scaling", "unknown": "unclassified kernels"}

    def clause(k: str) -> str:
        t = rd.terms[k]
        if t["reading"] == "finding":
            return f"{names[k]} is {t['ns'] / s:.0%} ({_ms(t['ns'])} {iv_words(t['interval'])})"
        if t["reading"] == "negative":
            return f"{NEGATIVE_WORDS[k].format(n=n)} ({_ms(t['ns'])} {iv_words(t['interval'])})"
        return f"{names[k]} is within noise {iv_words(t['interval'])}"

    # transfer, coordination and compute always; memory and unknown where they are neither
    # noise nor under 1% of S
    shown = [
        k
        for k in ("transfer", "coordination", "compute", "memory", "unknown")
        if k in rd.terms
        and (
            k in ("transfer", "coordination", "compute")
            or (rd.terms[k]["reading"] != "within_noise" and abs(terms[k]) >= 0.01 * s)
        )
    ]
    if rd.status == "unattributed":
        rest = "; ".join(clause(k) for k in shown)
        return (
            f"No single term stands clear of the noise: the per-token shortfall is {_ms(s)} {s_iv} "
            f"({head}; {basis}), but {rest}. Capture more rounds (`--rounds`) or on a quieter host "
            f"to attribute it. {dil}"
        )
    top = rd.cause
    assert top is not None
    # the path sentence names the waiting the path causes; with coordination inside its noise
    # that waiting would be noise passed off as a consequence, so it is left out
    path = path_cause(sf) if rd.terms["coordination"]["reading"] != "within_noise" else ""
    if rd.tied:  # the cause does not lead them beyond the noise: named together, the order not claimed
        named = [top, *(t["term"] for t in rd.tied)]
        others = "; ".join(clause(k) for k in shown if k not in named)
        lead = "; ".join(f"{names[top]} minus {names[t['term']]} {iv_words(t['lead_ns'])}" for t in rd.tied)
        title = " and ".join([", ".join(names[k] for k in named[:-1]), names[named[-1]]])
        shares = " and ".join(
            [", ".join(f"{terms[k] / s:.0%}" for k in named[:-1]), f"{terms[named[-1]] / s:.0%}"]
        )
        what = " and ".join(
            f"{words[k]} ({_ms(terms[k])} {iv_words(rd.terms[k]['interval'])})" for k in named
        )
        return (
            f"{title[0].upper() + title[1:]} hold this run back together: {shares} of the {_ms(s)} {s_iv} "
            f"per-token shortfall ({head}) are {what}; which is larger is within noise ({lead})"
            + (f"; {others}" if others else "")
            + f" ({basis}). "
            + (f"{path} " if path else "")
            + dil
        )
    others = "; ".join(clause(k) for k in shown if k != top)
    return (
        f"{top.capitalize()} holds this run back: {terms[top] / s:.0%} of the {_ms(s)} {s_iv} per-token "
        f"shortfall ({head}) is {words[top]} ({_ms(terms[top])} {iv_words(rd.terms[top]['interval'])}); "
        f"{others} ({basis}). " + (f"{path} " if path else "") + dil
    )


def noise_checked_diagnosis(sf: Shortfall) -> str:
    """`diagnosis()` where the verdict names a cause; where it cannot (S or every term within
    its noise), what to do instead: a next step read from a term inside its noise would be
    the noise passed off as a finding."""
    rd = sf.noise()
    if rd.status in ("attributed", "beats_ideal"):
        return diagnosis(sf)
    return (
        "Too noisy to say what to look at next: capture more rounds (`--rounds`), on a quieter host "
        "(no other jobs on its cores), or with CUDA graphs, and compare the intervals again."
    )


def robust_path_top(ranges: dict[str, dict[str, list[int]]] | None) -> tuple[str, str, int, int] | None:
    """The critical path's top component (rank, part, least, largest ns) when it stays on top in
    every split of an unidentified profiler cost (`correction.identify`'s `ranges`): its least
    value over the splits above every other component's largest; else None."""
    if not ranges:
        return None
    comps = [
        (r, key[len("path_") :], int(lo), int(hi))
        for key, by in ranges.items()
        if key.startswith("path_")
        for r, (lo, hi) in by.items()
    ]
    if len(comps) < 2:
        return None
    top = max(comps, key=lambda c: c[2])
    if all(top[2] > c[3] for c in comps if c[:2] != top[:2]):
        return top
    return None


def path_cause(sf: Shortfall) -> str:
    """One sentence: what lies on the critical path, and the waiting it causes elsewhere."""
    pi = sf.path_ints()
    step = pi["step_ns"]
    if step <= 0:
        return ""
    corr = sf.corrections.get("sharded")
    comp = [(r, p, d[f"{p}_ns"]) for r, d in pi["by_rank"].items() for p in PATH_PARTS]
    r_top, p_top, v_top = max(comp, key=lambda x: x[2])
    robust = ""
    if corr is not None and not getattr(corr, "identified", True):
        # which rank paid the profiler's cost may decide which rank holds the path: named only
        # when the top component tops every other in every split of the cost (its least value
        # over the splits above every other's largest), with its range
        top = robust_path_top(getattr(corr, "ranges", None))
        if top is None or top[:2] != (r_top, p_top):
            return (
                "Which rank's time holds the critical path is not identified: the profiler's cost was "
                "solved from one per-token time for every rank (no calibration in the manifest), and "
                "removed from one rank or another it puts the path on a different rank "
                "(`dilation.correction.sharded.ranges`); capture with `tracekit capture` to measure "
                "each rank's cost."
            )
        if _ms(top[2]) != _ms(top[3]):  # a range only where it shows at the sentence's precision
            robust = (
                f" (whichever rank paid the profiler's cost, which the manifest cannot say: "
                f"{_ms(top[2])}-{_ms(top[3])})"
            )
    host_total = sum(v for _, p, v in comp if p == "host")
    by_rank_host = sorted(((v, r) for r, p, v in comp if p == "host"), reverse=True)
    words = {
        "host": "host time (launch gaps and host work before its collectives)"
        if sf.sharded.timeline == "gpu"
        else "host time between its ops (Python, sleeps, scheduling)",
        "compute": "compute",
        "memory": "memory copies",
        "transfer": "collective transfer" if sf.sharded.timeline == "gpu" else "gloo exchange",
        "sync": "host-device synchronisation",
        "unknown": "unclassified kernels",
    }
    head = (
        f"On the critical path, rank {r_top}'s {words[p_top]} is {_ms(v_top)}{robust} of the "
        f"{_ms(step)} per token"
    )
    if p_top == "host" and len(by_rank_host) > 1 and by_rank_host[1][0] > 0.1 * host_total:
        head += (
            " (host time on the path: "
            + ", ".join(f"rank {r} {_ms(v)}" for v, r in by_rank_host if v > 0)
            + ")"
        )
    base_host = sf.base_path["by_rank"]
    bh = sum(float(d["host"]) for d in base_host.values()) / max(len(base_host), 1)
    if p_top == "host" and bh > 0:
        head += f", against {_ms(bh)} of host time in a TP=1 token"
    waits = []
    for r in sorted(sf.rank_parts):
        wait_abs = round_half_up(sf.rank_parts[r]["wait"])
        if str(r) != r_top and wait_abs > 0.05 * step:
            waits.append(f"rank {r} waits {_ms(wait_abs)}")
    tail = f"; the consequence: {', '.join(waits)} per token at the collectives" if waits else ""
    return head + tail + "."


def diagnosis(sf: Shortfall) -> str:
    """What to look at next, from the dominant term and the evidence behind it (one sentence).
    Every clause is said only when the figure it rests on was measured so: waiting only when
    the sharded run's ranks wait (mean wait per token > 0), a host-bound loop only when the TP=1
    GPU is measured busy under half of a token, one machine only when the capture or the
    traces name one host, a long tail only when the collectives' p90 is over twice their
    median; each states its figure."""
    ints = sf.corrected.integers()
    s = ints["shortfall_ns"]
    terms = ints["terms_ns"]
    if s <= 0:
        return "Nothing to recover at this TP degree."
    # the verdict's cause (the largest term clear of its noise), not a larger one inside it
    top = sf.noise().cause or max(terms, key=lambda k: terms[k])
    n = sf.n_ranks
    gpu = sf.sharded.timeline == "gpu"
    # GPU busy share of a TP=1 token: device work as traced (the reconciliation keeps it as
    # measured on a GPU timeline) over the per-token time T1 the attribution uses
    base = sf.baseline.per_token
    t1 = sf.corrected.baseline_ns
    busy = (
        float((base.get("compute", 0) + base.get("memory", 0)) / t1)
        if t1 and sf.baseline.timeline == "gpu"
        else None
    )
    host_bound = busy is not None and busy < 0.5
    bound = (
        f"the TP=1 baseline keeps its GPU busy only {busy:.0%} of a token: the loop is bound by the host "
        "launching kernels"
        if host_bound and busy is not None
        else ""
    )
    ranks = sorted(sf.rank_parts)
    wait = round_half_up(sum((sf.rank_parts[r]["wait"] for r in ranks), Fraction(0)) / max(len(ranks), 1))
    term = f"{_ms(terms[top])} per token"
    if top == "coordination":
        coord = ints["coordination_ns"]
        lead = max(COORDINATION, key=lambda k: coord[k])
        waits = f"the ranks wait {_ms(wait)} per token at the collectives"
        st = sf.straggler() if wait > 0 else {"is_straggler": False}
        if st["is_straggler"]:
            r = st["rank"]
            host = sf.path_ints()["by_rank"].get(str(r), {}).get("host_ns", 0)
            on_path = f", and its host time on the critical path is {_ms(host)} per token" if host > 0 else ""
            return (
                f"Rank {r} is a straggler: it arrives last at {st['last_share']:.0%} of the collectives, "
                f"{_ms(st['lateness_ns_median'])} after the others on median (symmetric launch-bound hosts "
                f"explain up to {_ms(st['threshold_ns'])}){on_path}: look at what rank {r} does before "
                "each collective."
            )
        if host_bound:
            also = f", and at TP={n} {waits} for the slower rank's host" if wait > 0 else ""
            return (
                f"{bound[0].upper()}{bound[1:]}{also}; cut host time (CUDA graphs, torch.compile, fewer "
                "launches) before adding ranks."
            )
        if lead == "wait" and wait > 0:
            return (
                f"Ranks wait for each other at collectives ({_ms(wait)} per token, mean over ranks): look for "
                "host work between collectives (Python, synchronisations, data-dependent control flow) that "
                "differs across ranks."
            )
        if lead == "sync" and coord["sync"] > 0:
            return (
                f"Host-device synchronisation grew: {_ms(coord['sync'])} per token beyond the TP=1 share; look "
                "for synchronising calls in the step (.item(), torch.cuda.synchronize, blocking copies)."
            )
        idle = f"Idle time grew: {_ms(coord['idle'])} per token beyond the TP=1 share"
        idle += " (the GPU idle until its host launches work)" if gpu else " (time between the host's ops)"
        also = f"; {waits}" if wait > 0 else ""
        return f"{idle}{also}: look at the host work between the kernels of a step (Python, launches, scheduling)."
    if top == "transfer" and not gpu:
        per = sf.sharded.collectives.instances
        tr = per["transfer_ns_mean"].to_numpy(np.float64) if len(per) else np.zeros(0)
        tail = ""
        if tr.size:
            med, p90 = float(np.median(tr)), float(np.quantile(tr, 0.9))
            tail = f"; per collective its median is {_ms(med)}"
            if med > 0 and p90 > 2 * med:
                tail += f" with a long tail (p90 {_ms(p90)}: the host scheduler's delay)"
        where = "TCP loopback on one machine" if one_host(sf) else "TCP between the ranks"
        return (
            f"On this CPU run the 'transfer' ({term} beyond the TP=1 share) is gloo's exchange after the last "
            f"rank arrives, over the host ({where}){tail}: it says nothing about a GPU link; on GPUs, compare "
            "links with `tracekit compare-links`."
        )
    if top == "transfer":
        bus = sf.sharded.collectives.instances
        bw = bus["busbw_gbps"].to_numpy(np.float64) if len(bus) else np.zeros(0)
        bw = bw[np.isfinite(bw)]
        realised = f" (median {float(np.median(bw)):.3g} GB/s over {bw.size} collectives)" if bw.size else ""
        return (
            f"Collective transfer is {term} beyond the TP=1 share: compare the realised busbw{realised} with "
            "the link's (`tracekit compare-links --trace ... --baseline ...`) and consider fewer or larger "
            "collectives."
        )
    if top == "compute":
        cs = sf.compute_scaling()
        if gpu and cs.get("available"):
            cls = cs["classes"]
            worst = max(("replicated", "partly_shrank", "added"), key=lambda c: cls[c]["lost_ns"])
            k = cls[worst]
            what = {
                "replicated": "kernels the TP layout repeats on every rank (norms, rotary, casts, copies) that do "
                "not shrink at all",
                "partly_shrank": "sharded kernels that shrank less than N-fold (GEMMs too small to fill the GPU)",
                "added": "kernels only the sharded run has",
            }[worst]
            where = (
                f"{k['kernels_per_token']} {what} lose {k['lost_ns'] / 1e6:.2f} ms per token"
                + (f" (top: {k['top'][0]['name'][:60]})" if k["top"] else "")
                + "; fuse them or run fewer (`compute_scaling` in the JSON, `tracekit roofline`)"
            )
        else:
            where = (
                "per-rank kernels at this size may be too small to fill the GPU; compare matrix vs vector time "
                "in `tracekit breakdown`"
                if gpu
                else "per-rank ops at this size do not run N times faster; compare the ranks' op times in "
                "`tracekit breakdown`"
            )
        return f"Compute did not shrink {n}-fold ({term} beyond the TP=1 compute / {n}): {where}."
    if top == "memory":
        return f"Memory copies did not shrink ({term} beyond the TP=1 share): look for host-device copies inside the step."
    return f"Unclassified kernels dominate ({term} beyond the TP=1 share): see the unknown kernels in `tracekit breakdown`."


def one_host(sf: Shortfall) -> bool:
    """The sharded run's ranks ran on one machine: its capture manifest names a host (one
    capture runs its ranks on the host it names), or the traces name one host for every rank."""
    m = sf.sharded.collectives.clock.hosts
    if m and len(m) == sf.n_ranks and len(set(m.values())) == 1:
        return True
    return False


def dilation_clause(sf: Shortfall) -> str:
    parts = []
    for label in ("baseline", "sharded"):
        ad = sf.applied[label]
        if ad.factor is None:
            parts.append(f"{label} unknown")
        elif ad.interval:
            parts.append(f"{label} {ad.factor:.2f}x [{ad.interval[0]:.2f}-{ad.interval[1]:.2f}]")
        else:
            parts.append(f"{label} {ad.factor:.2f}x")
    corrected = sf.per_token_source == "unprofiled"
    is_inflated = inflated(sf)
    if corrected:
        state = "removed: the per-token times are the traced ones divided by it"
    elif all(sf.applied[k].factor is not None for k in ("baseline", "sharded")):
        state = "not removed: the unprofiled pass was slower than the traced one (noisy host)"
    else:
        state = "not removed: no unprofiled timing"
    tail = ""
    if is_inflated and not corrected:
        tail = "; the coordination share is inflated by the profiler"
    elif is_inflated:
        tail = f"; above {sf.sharded.dilation.threshold:.0%}, see `uncorrected` for the trace-only figures"
    return f"Profiler dilation (profiled / unprofiled per-token time) {', '.join(parts)} ({state}{tail})."


def inflated(sf: Shortfall) -> bool | None:
    th = sf.sharded.dilation.threshold
    fs = [ad.factor for ad in sf.applied.values()]
    if all(f is None for f in fs):
        return None
    return any(f is not None and f > 1.0 + th for f in fs)


def chance_clause(p_value: float | None) -> str:
    """' (no more often than chance ...: p = 0.54)' when the straggler's last share is one equal
    ranks explain (p >= 0.01, the test's alpha), else ''."""
    if p_value is None or p_value < 0.01:
        return ""
    return f" (no more often than chance among equal ranks: p = {p_value:.2f})"
