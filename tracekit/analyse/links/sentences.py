"""The link verdict's working figures per decode size (`SizeBound`, the largest size both modes
swept: `LargestSize`) and its sentences: the answer and its lead, the sizes, what the trace realised
against the probe, the caveats (docs/METHOD.md section Bandwidth and the link verdict).
`tracekit.analyse.links.verdict` computes the figures and puts these together."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from msgspec import UNSET

from tracekit.analyse.links.curves import timing_sentence
from tracekit.analyse.links.probe_only import iters_of
from tracekit.analyse.links.words import fmt_bytes, fmt_gbps, fmt_ratio, fmt_share
from tracekit.model.documents.links import LinksLarge, LinksPerSizeItem, ProbeRow
from tracekit.model.fields import copy_fields
from tracekit.model.units import ms_or_us

#: realised / probe busbw at or above which the link's bandwidth is what sets the transfer time
LINK_BOUND_SHARE = 0.7


#: fast / slow busbw within this factor (either way) reads as "similar"
SIMILAR_RATIO = 1.2


#: a share of S below this is "does not explain"
SMALL_SHARE = 0.10


@dataclass(frozen=True)
class LargestSize:
    """The largest size both modes swept (`LinksLarge`)."""

    op: str
    bytes: int
    busbw_gbps: dict[str, float]
    k: float  # fast / slow busbw there

    def doc(self) -> LinksLarge:
        return LinksLarge(op=self.op, bytes=self.bytes, busbw_gbps=dict(self.busbw_gbps), k=self.k)


@dataclass
class SizeBound:
    """One size the decode used, as the verdict works it out (`item()`: its `per_size` entry)."""

    op: str
    bytes: int
    count: int | None
    per_token: float | None
    transfer_weight: float  # this size's share of the trace's collective transfer time
    transfer_ns_per_token: float | None  # XN x transfer_weight
    realised_busbw_gbps: float
    swept: bool
    regime: str = "unknown"
    k: float = float("nan")
    probe_busbw_gbps: dict[str, float] | None = None  # per mode (swept ops only)
    probe_time_us: dict[str, float] | None = None
    probe_how: dict[str, str] | None = None
    realised_vs_probe: dict[str, float] | None = None
    bounded: bool = False  # the bounds below were computed (XN known, or an unswept op)
    bound_ratio_ns_per_token: float | None = None
    bound_per_call_ns_per_token: float | None = None
    bound_ns_per_token: float | None = None

    def item(self) -> LinksPerSizeItem:
        # op, bytes, count, per_token, transfer_*, realised_busbw_gbps, swept, regime, k: its own;
        # the probe's figures only for a swept op, the bounds only where they were computed
        swept, bounded = self.swept, self.bounded
        return copy_fields(
            LinksPerSizeItem,
            self,
            probe_busbw_gbps=dict(self.probe_busbw_gbps or {}) if swept else UNSET,
            probe_time_us=dict(self.probe_time_us or {}) if swept else UNSET,
            probe_how=dict(self.probe_how or {}) if swept else UNSET,
            realised_vs_probe=dict(self.realised_vs_probe or {}) if swept else UNSET,
            bound_ratio_ns_per_token=self.bound_ratio_ns_per_token if swept and bounded else UNSET,
            bound_per_call_ns_per_token=self.bound_per_call_ns_per_token if swept and bounded else UNSET,
            bound_ns_per_token=self.bound_ns_per_token if bounded else UNSET,
        )


def lead_sentence(
    labels: Mapping[str, str],
    fast: str,
    slow: str | None,
    k_eff: float,
    bound: float | None,
    per_call_wins: bool,
    *,
    cpu_only: bool,
    xn: float | None,
    s_ns: float | None,
    n_ranks: int | None,
    bound_inf: float | None,
) -> tuple[str, str]:
    """The answer ("no" / "little" / "yes" / "unknown") and the verdict's lead: would a faster link
    shrink the per-token shortfall S? (XN against S, and the k-times faster link's bound)."""
    fl, sl = labels[fast], (labels[slow] if slow else None)
    have_k = math.isfinite(k_eff) and slow is not None
    k_clause = ""
    if have_k and bound is not None:
        if k_eff > 1:
            k_clause = (
                f"{fl} is {fmt_ratio(k_eff)} faster than {sl} at these sizes, so moving from {sl} to {fl} "
                f"removes at most {ms_or_us(bound)} per token"
                + (
                    " (each call saves the probe's per-call time difference: a fixed cost at these sizes)"
                    if per_call_wins
                    else ""
                )
            )
        else:
            k_clause = (
                f"at these sizes {sl} is as fast as or faster than {fl} ({fmt_ratio(1 / k_eff)}), so moving "
                f"to {fl} removes nothing (bound {ms_or_us(bound)})"
            )

    # lead: the answer to "would a faster link shrink my per-token shortfall?"
    if cpu_only and xn is not None:
        answer = (
            "unknown" if s_ns is None else ("no" if s_ns <= 0 or max(0.0, xn) / s_ns < SMALL_SHARE else "yes")
        )
        lead = (
            f"the modes ran the same gloo path (their ratio is noise). Collective transfer is {ms_or_us(xn)} per token"
            + (f" of the {ms_or_us(s_ns)} per-token shortfall ({fmt_share(xn / s_ns)})" if s_ns else "")
            + f"; even an infinitely fast interconnect would remove at most {ms_or_us(bound_inf or 0.0)}."
        )
    elif s_ns is not None and xn is not None:
        if s_ns <= 0:
            answer = "no"
            lead = (
                f"There is no per-token shortfall to explain: TP={n_ranks} meets its ideal "
                f"(S = {ms_or_us(s_ns)}); collective transfer is {ms_or_us(xn)} per token."
            )
        else:
            share_inf = max(0.0, xn) / s_ns
            share_k = (bound or 0.0) / s_ns
            head = (
                f"collective transfer is {ms_or_us(xn)} of the {ms_or_us(s_ns)} per-token shortfall "
                f"({fmt_share(xn / s_ns)})"
            )
            if share_inf < SMALL_SHARE:
                answer = "no"
                lead = (
                    f"Link bandwidth does not explain this run's shortfall: {head}; even an infinitely fast link "
                    f"would remove at most {ms_or_us(bound_inf or 0.0)}."
                )
                if k_clause:
                    lead += f" {k_clause[0].upper()}{k_clause[1:]} ({fmt_share(share_k)} of S)."
            elif have_k and share_k < SMALL_SHARE:
                answer = "little"
                lead = (
                    f"A faster link would barely shrink this run's shortfall: {head}, but {k_clause} "
                    f"({fmt_share(share_k)} of S); an infinitely fast link at most {ms_or_us(bound_inf or 0.0)}."
                )
            else:
                answer = "yes"
                lead = (
                    f"Link bandwidth explains part of this run's shortfall: {head}; "
                    + (f"{k_clause} ({fmt_share(share_k)} of S); " if k_clause else "")
                    + f"an infinitely fast link at most {ms_or_us(bound_inf or 0.0)}."
                )
    elif xn is not None:
        answer = "unknown"
        lead = (
            f"Collective transfer is {ms_or_us(xn)} per token in this trace"
            + (f"; {k_clause}" if k_clause else "")
            + f", and even an infinitely fast link at most {ms_or_us(bound_inf or 0.0)}. Give --baseline "
            "(the TP=1 run) to set this against the per-token shortfall."
        )
    else:
        answer = "unknown"
        lead = (
            "Per-token transfer is unknown (the trace has no step annotations), so the bound on the shortfall "
            "cannot be given"
            + (f"; the faster mode is {fmt_ratio(k_eff)} the slower at these sizes." if have_k else ".")
        )
    return answer, lead


def sizes_sentence(
    per_size: Sequence[SizeBound],
    main: SizeBound,
    large: LargestSize | None,
    labels: Mapping[str, str],
    fast: str,
    slow: str | None,
) -> str:
    """The decode's sizes, the probe's busbw per mode at the main one (its regime), and the
    contrast at the largest size both modes swept."""
    fl, sl = labels[fast], (labels[slow] if slow else None)

    # the sizes: probe busbw per mode at the decode's sizes, regime, and the large-size contrast
    def count_text(e: SizeBound) -> str:
        if e.per_token is not None:
            pt = float(e.per_token)
            return f"x{pt:.0f} per token" if pt == round(pt) else f"x{pt:.2f} per token"
        return f"x{e.count} in the trace"

    listed = per_size[:4]
    size_text = ", ".join(f"{e.op} {fmt_bytes(e.bytes)} {count_text(e)}" for e in listed)
    if len(per_size) > 4:
        size_text += f" and {len(per_size) - 4} more"
    body = f" At the decode's sizes ({size_text})"
    main_bw = main.probe_busbw_gbps or {}
    if slow is not None and math.isfinite(main.k):
        fv, sv = main_bw[fast], main_bw[slow]
        at = f"{fmt_gbps(fv)} vs {fmt_gbps(sv)} GB/s at {fmt_bytes(main.bytes)}"
        reg = f": {main.regime}-bound" if main.regime in ("latency", "bandwidth") else ""
        if 1 / SIMILAR_RATIO < main.k < SIMILAR_RATIO:
            body += f" {fl} and {sl} realise similar busbw ({at}{reg})"
        else:
            body += f" {fl} reaches {fmt_ratio(main.k)} the busbw of {sl} ({at}{reg})"
        if large is not None and large.bytes > main.bytes and math.isfinite(large.k):
            joint = "while" if main.regime == "latency" or main.k < SIMILAR_RATIO else "and"
            body += (
                f", {joint} at {fmt_bytes(large.bytes)} {fl} is {fmt_ratio(large.k)} faster "
                f"({fmt_gbps(large.busbw_gbps[fast])} vs {fmt_gbps(large.busbw_gbps[slow])} GB/s)"
            )
        body += "."
    else:
        pv = main_bw[fast]
        body += f" the probe reaches {fmt_gbps(pv)} GB/s at {fmt_bytes(main.bytes)} ({labels[fast]})."
    return body


def realised_sentence(
    main: SizeBound,
    source: str | None,
    trace_mode: str | None,
    ref_mode: str,
    labels: Mapping[str, str],
    timing: Mapping[str, str],
) -> str:
    """What the trace realised at its main size against the probe over the reference mode, said
    plainly when it is above the probe (what the probe's time holds that the trace's does not)."""
    main_bw = main.probe_busbw_gbps or {}
    # realised in the trace against the probe
    realised = main.realised_busbw_gbps
    pref = main_bw.get(ref_mode, float("nan"))
    transfer = source == "transfer"
    how = (
        "transfer time, wait removed"
        if transfer
        else "kernel duration, which includes waiting: a lower bound"
    )
    trace_time = "transfer time" if transfer else "kernel time"
    ref_words = labels[ref_mode] + (" (the mode the decode ran in)" if trace_mode == ref_mode else "")
    where = f"{main.op} {fmt_bytes(main.bytes)}"
    # what the probe's per-iteration time holds that the trace's transfer time does not
    launch = (
        "the gap between back-to-back kernels" if timing.get(ref_mode) == "graph" else "the launch latency"
    )
    tail = ""
    if math.isfinite(realised) and math.isfinite(pref) and pref > 0:
        ratio = realised / pref
        if ratio > 1 and main.regime == "bandwidth" and ratio <= 1 / LINK_BOUND_SHARE:
            tail = (
                f" The trace realised {fmt_gbps(realised)} GB/s at {where} ({how}), {fmt_share(ratio)} of the "
                f"probe's {fmt_gbps(pref)} GB/s over {ref_words}: its transfers run at what the link gives at "
                f"this size (the trace's {trace_time} leaves out {launch} the probe's time includes)."
            )
        elif ratio > 1 and main.regime == "bandwidth":
            tail = (
                f" The trace realised {fmt_gbps(realised)} GB/s at {where} ({how}), {fmt_ratio(ratio)} the "
                f"probe's {fmt_gbps(pref)} GB/s over {ref_words}, more than the link gave the probe at this "
                "bandwidth-bound size: check the message size (bytes_source) and that the probe ran on the same link."
            )
        elif ratio > 1:
            tail = (
                f" The trace realised {fmt_gbps(realised)} GB/s at {where} ({how}), {fmt_ratio(ratio)} the "
                f"probe's {fmt_gbps(pref)} GB/s over {ref_words}: the trace's {trace_time} leaves out {launch} "
                "that the probe's per-iteration time includes, so at "
                + ("these latency-bound sizes" if main.regime == "latency" else "small sizes")
                + " the trace can exceed the probe; that is not the link running at its limit."
            )
        elif ratio >= LINK_BOUND_SHARE:
            tail = (
                f" The trace realised {fmt_gbps(realised)} GB/s at {where} ({how}), {fmt_share(ratio)} of the "
                f"probe's {fmt_gbps(pref)} GB/s over {ref_words}: its transfers run near what the link gives "
                "at this size."
            )
        else:
            tail = (
                f" The trace realised {fmt_gbps(realised)} GB/s at {where} ({how}), only {fmt_share(ratio)} of "
                f"the probe's {fmt_gbps(pref)} GB/s over {ref_words}: something other than the link's bandwidth "
                "(e.g. contention with concurrent kernels) slows these transfers."
            )
    return tail


def caveats_sentence(
    rows: Sequence[ProbeRow],
    timing: Mapping[str, str],
    tuning_modes: Sequence[str],
    per_size: Sequence[SizeBound],
) -> str:
    """How the probe was timed, TUNING in its timed loops, sizes outside its sweep, ops it did not sweep."""
    caveats = timing_sentence(timing, iters_of(rows))
    if tuning_modes and any(e.regime == "latency" for e in per_size if e.swept):
        caveats += (
            f" The probe's timed loops ({', '.join(tuning_modes)}) logged NCCL TUNING, a host log line per call, "
            "which inflates small-size times: its busbw at these latency-bound sizes is a lower bound."
        )
    outside = sorted(
        {e.bytes for e in per_size if e.swept for h in (e.probe_how or {}).values() if "sweep" in h}
    )
    if outside:
        caveats += (
            f" ({len(outside)} decode size(s) lie outside the probe's sweep; the nearest probe size stands in: "
            "widen --min/--max.)"
        )
    unswept = sorted({e.op for e in per_size if not e.swept})
    if unswept:
        caveats += f" ({', '.join(unswept)} not swept: its transfer counts in full towards the bound; add it to --op.)"
    return caveats
