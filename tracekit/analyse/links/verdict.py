"""The link verdict (docs/METHOD.md section Bandwidth and the link verdict): a decode trace judged against compare-links probe results.

The probe results are `tracekit compare-links`' (rows per op, mode and size, NCCL's transport per
mode: `tracekit.probe.compare` runs the sweeps); a mode is `nvlink` (NCCL's default), `pcie` (P2P
disabled or limited) or `default`. Everything here is a pure function of a decode trace (its
folder, read with `tracekit.read`) and a probe JSON: no sweep, no GPU, no torch.

The question the verdict answers: would a faster link (NVLink vs PCIe) shrink the decode's
per-token shortfall S? With a decode trace (`trace_dir`) and, for S, its baseline run
(`baseline_dir`), it sets side by side
(a) the probe's busbw per mode at the message sizes the decode used, and whether those sizes are
    latency-bound (the probe's per-call time there is under twice its floor: the fixed cost, not
    the bytes, sets it) or bandwidth-bound;
(b) the busbw the trace realised (transfer time from `tracekit.analyse.collectives.matching`: wait removed;
    kernel duration when ranks cannot be matched, said so). The trace's transfer time leaves out
    the launch latency that the probe's per-iteration time includes, so at small sizes the trace
    can exceed the probe; that is said, not read as "the link explains it";
(c) the bound: per size, the larger of two models of what the faster link removes per token:
    XN_i (1 - 1/k) (bandwidth-bound: the transfer shrinks k-fold, k the fast/slow busbw ratio at
    that size, XN_i the size's share of the transfer) and, at latency-bound sizes only, calls per
    token x (the slow mode's probe per-call time - the fast mode's) (a fixed cost per call that the
    trace's transfer time does not hold); and even an infinitely fast link at most XN; XN is the
    shortfall's transfer term when a baseline is given (then also as a share of S), else the
    trace's collective transfer per token.

`recompute(saved, ...)` redoes the trace part and the verdict from a saved result (no GPU needed).
The probe's part comes in as a `LinksProbe` (typed rows, decoded once where the file is read:
`load_compare`), the result goes out as the `Links` document (docs/JSON.md#probe,
`tracekit.compare_links`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from msgspec import UNSET

from tracekit.analyse.links.curves import (
    busbw_at,
    curve,
    mode_labels,
    probe_timing,
    regime_at,
    side_by_side,
    time_at,
    timing_sentence,
    tuning_in_timed_loop,
)
from tracekit.analyse.links.probe_only import iters_of, probe_only_verdict
from tracekit.analyse.links.trace import shortfall_context, trace_collectives
from tracekit.analyse.links.words import fmt_bytes, fmt_gbps, fmt_ratio, fmt_share
from tracekit.errors import ProbeError
from tracekit.model.documents.base import given
from tracekit.model.documents.links import (
    Links,
    LinksLarge,
    LinksModes,
    LinksPerSizeItem,
    LinksProbe,
    LinksShortfall,
    LinksSize,
    LinksTrace,
    LinksTransportsValue,
    LinksVerdictDetails,
    ProbeRow,
)
from tracekit.model.units import ms_or_us
from tracekit.read.probe import read_probe

SCHEMA_VERSION = "1.1"  # 1.1: verdict from the shortfall (baseline), regimes, bounds; probe_notes, config


KIND = "tracekit.compare_links"


#: realised / probe busbw at or above which the link's bandwidth is what sets the transfer time
LINK_BOUND_SHARE = 0.7


#: fast / slow busbw within this factor (either way) reads as "similar"
SIMILAR_RATIO = 1.2


#: a share of S below this is "does not explain"
SMALL_SHARE = 0.10


@dataclass(frozen=True)
class _Large:
    """The largest size both modes swept (`LinksLarge`)."""

    op: str
    bytes: int
    busbw_gbps: dict[str, float]
    k: float  # fast / slow busbw there

    def doc(self) -> LinksLarge:
        return LinksLarge(op=self.op, bytes=self.bytes, busbw_gbps=dict(self.busbw_gbps), k=self.k)


def _order_modes(
    rows: Sequence[ProbeRow], modes: Sequence[str], op: str
) -> tuple[str, str | None, _Large | None]:
    """(fast, slow, largest-size figures): the faster link is the mode with the higher busbw at the
    largest size both modes swept for `op` (where the link's bandwidth, not latency, sets the time)."""
    if len(modes) < 2:
        return modes[0], None, None
    a, b = modes[0], modes[1]
    ca, cb = dict(curve(rows, op, a)), dict(curve(rows, op, b))
    common = sorted(set(ca) & set(cb))
    if not common:
        return a, b, None
    big = common[-1]
    va, vb = ca[big], cb[big]
    fast, slow = (b, a) if math.isfinite(va) and math.isfinite(vb) and vb > va else (a, b)
    large = _Large(
        op=op,
        bytes=big,
        busbw_gbps={a: va, b: vb},
        k=(ca[big] if fast == a else cb[big]) / (cb[big] if fast == a else ca[big])
        if min(va, vb) > 0
        else float("nan"),
    )
    return fast, slow, large


@dataclass
class _Size:
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
        out = LinksPerSizeItem(
            op=self.op,
            bytes=self.bytes,
            count=self.count,
            per_token=self.per_token,
            transfer_weight=self.transfer_weight,
            transfer_ns_per_token=self.transfer_ns_per_token,
            realised_busbw_gbps=self.realised_busbw_gbps,
            swept=self.swept,
            regime=self.regime,
            k=self.k,
        )
        if self.swept:
            out.probe_busbw_gbps = dict(self.probe_busbw_gbps or {})
            out.probe_time_us = dict(self.probe_time_us or {})
            out.probe_how = dict(self.probe_how or {})
            out.realised_vs_probe = dict(self.realised_vs_probe or {})
            if self.bounded:
                out.bound_ratio_ns_per_token = self.bound_ratio_ns_per_token
                out.bound_per_call_ns_per_token = self.bound_per_call_ns_per_token
        if self.bounded:
            out.bound_ns_per_token = self.bound_ns_per_token
        return out


def _weight(s: LinksSize) -> float:
    """A trace size's transfer time in all (results written before time_ns_total: count x median)."""
    tot = given(s.time_ns_total)
    if tot is None:
        tot = float(s.count or 0) * float(s.time_ns_median or 0.0)
    return max(float(tot), 0.0)


def verdict(
    rows: Sequence[ProbeRow],
    modes: Sequence[str],
    trace: LinksTrace | None,
    cpu_only: bool,
    *,
    shortfall: LinksShortfall | None = None,
    transports: Mapping[str, LinksTransportsValue] | None = None,
) -> tuple[str, LinksVerdictDetails]:
    """The link verdict (docs/METHOD.md section Bandwidth and the link verdict), and the numbers behind it (see the module doc).

    `trace`: `trace_collectives(...)` of the decode; `shortfall`: `shortfall_context(...)` against
    its baseline (S known, XN = its transfer term); `transports`: per mode, NCCL's account (labels
    the modes, and says whether the timed loops logged TUNING)."""
    details = LinksVerdictDetails(per_size=[])
    prefix = "CPU only (gloo): there are no GPU links to compare; " if cpu_only else ""
    if not trace or not trace.sizes:
        return probe_only_verdict(rows, modes, prefix, details, cpu_only)

    swept = {r.op for r in rows}
    labels = mode_labels(modes, transports)
    if cpu_only:  # gloo ignores the modes' NCCL settings: the runs of one sweep, not links
        labels = {m: f"run {i + 1} of the gloo sweep" for i, m in enumerate(modes)}
    sizes = list(trace.sizes)
    trace_mode = given(trace.mode)

    total_w = sum(_weight(s) for s in sizes)
    main_op = max(sizes, key=_weight).op if sizes else None
    main_probe_op = main_op if main_op in swept else next((s.op for s in sizes if s.op in swept), None)
    if main_probe_op is None:
        return prefix + "the decode trace used no op the probe swept; sweep its ops (--op).", details
    fast, slow, large = _order_modes(rows, modes, main_probe_op)
    if cpu_only:  # every mode ran the same gloo path: their ratio is noise, not a link
        slow, large = None, None
    pair = [m for m in (fast, slow) if m]
    ref_mode: str = trace_mode if trace_mode in modes and trace_mode is not None else fast

    # XN: what the link's speed acts on, per token
    if shortfall is not None:
        xn: float | None = float(shortfall.transfer_ns) if shortfall.transfer_ns is not None else None
        xn_source = "shortfall"
    else:
        xn = trace.transfer_ns_per_token
        xn = float(xn) if xn is not None else None
        xn_source = "trace"
    s_ns = (
        float(shortfall.shortfall_ns)
        if shortfall is not None and shortfall.shortfall_ns is not None
        else None
    )

    per_size: list[_Size] = []
    for s in sizes:
        op, size = str(s.op), int(s.bytes or 0)
        w = _weight(s) / total_w if total_w > 0 else 1.0 / len(sizes)
        xn_i = xn * w if xn is not None else None
        realised = s.busbw_gbps if s.busbw_gbps is not None else float("nan")  # null: written for NaN
        e = _Size(op, size, s.count, s.per_token, w, xn_i, realised, op in swept)
        if e.swept:
            probe = {m: busbw_at(rows, op, m, size) for m in modes}
            fv = probe[fast][0]
            sv = probe[slow][0] if slow else float("nan")
            e.k = fv / sv if slow and math.isfinite(sv) and sv > 0 and math.isfinite(fv) else float("nan")
            e.probe_busbw_gbps = {m: v for m, (v, _) in probe.items()}
            e.probe_time_us = {m: time_at(rows, op, m, size) for m in modes}
            e.probe_how = {m: how for m, (_, how) in probe.items()}
            e.regime = regime_at(rows, op, pair, size)
            e.realised_vs_probe = {
                m: realised / v if math.isfinite(realised) and math.isfinite(v) and v > 0 else float("nan")
                for m, (v, _) in probe.items()
            }
            if xn_i is not None:
                # a k-times faster link: this size's transfer shrinks to 1/k of it (at most) ...
                ratio_b = max(0.0, xn_i * (1 - 1 / e.k)) if math.isfinite(e.k) and e.k > 0 else xn_i
                # ... or, where a fixed per-call cost sets the time (latency-bound sizes), each call
                # saves the difference of the probe's per-call times, which the ratio model misses:
                # on two H200s the CUDA-graph decode at 8 KiB ran 82 us/token slower over PCIe/SHM
                # than NVLink, twice the ratio model's 40 us (reports/multi-gpu)
                add_b = float("nan")
                if slow and s.per_token is not None and e.regime == "latency":
                    dt = e.probe_time_us[slow] - e.probe_time_us[fast]
                    if math.isfinite(dt):
                        add_b = max(0.0, dt) * 1000.0 * float(s.per_token)
                e.bounded = True
                e.bound_ratio_ns_per_token = ratio_b
                e.bound_per_call_ns_per_token = add_b if math.isfinite(add_b) else None
                e.bound_ns_per_token = max(ratio_b, add_b) if math.isfinite(add_b) else ratio_b
        else:
            e.bounded, e.bound_ns_per_token = True, xn_i
        per_size.append(e)
    per_size.sort(key=lambda e: -e.transfer_weight)
    main = next(e for e in per_size if e.swept)

    bound = (
        max(0.0, sum(e.bound_ns_per_token for e in per_size if e.bound_ns_per_token is not None))
        if xn is not None
        else None
    )
    # one k for the decode: the k for which XN (1 - 1/k) is the bound (each size's transfer shrinks
    # by its own k, never below zero); without per-token figures the transfer-weighted harmonic mean
    finite = [e for e in per_size if e.swept and math.isfinite(e.k) and e.k > 0]
    k_eff = float("nan")
    ratio_bound = sum(
        (e.bound_ratio_ns_per_token if e.swept and e.bounded else e.bound_ns_per_token) or 0.0
        for e in per_size
    )
    per_call_wins = any(
        (e.bound_per_call_ns_per_token or 0.0) > (e.bound_ratio_ns_per_token or 0.0) for e in per_size
    )
    if finite and xn is not None and xn > 0 and bound is not None and ratio_bound < xn:
        k_eff = xn / (xn - ratio_bound)
    elif finite:
        wsum = sum(e.transfer_weight for e in finite)
        inv = sum(e.transfer_weight / e.k for e in finite)
        k_eff = wsum / inv if inv > 0 else float("nan")
    bound_inf = max(0.0, xn) if xn is not None else None
    regimes = {e.regime for e in per_size if e.swept}
    regime = regimes.pop() if len(regimes) == 1 else "mixed"
    timing = probe_timing(rows, modes)
    # under --graph NCCL logs TUNING at capture, not in the timed replay: no inflation there
    tuning_modes = [m for m in tuning_in_timed_loop(transports) if timing.get(m) != "graph"]
    details = LinksVerdictDetails(
        per_size=[e.item() for e in per_size],
        modes=LinksModes(fast=fast, slow=slow),
        labels=dict(labels),
        trace_mode=trace_mode,
        reference_mode=ref_mode,
        k=k_eff,
        regime=regime,
        large=large.doc() if large is not None else None,
        transfer_ns_per_token=xn,
        xn_source=xn_source,
        bound_ns_per_token=bound,
        bound_inf_ns_per_token=bound_inf,
        shortfall_ns=s_ns,
        transfer_share_of_shortfall=(xn / s_ns if xn is not None and s_ns else None),
        bound_share_of_shortfall=(bound / s_ns if bound is not None and s_ns else None),
        tuning_in_timed_loop=list(tuning_modes),
        timing=dict(timing),
        source=trace.source,
    )

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
        assert shortfall is not None
        if s_ns <= 0:
            answer = "no"
            lead = (
                f"There is no per-token shortfall to explain: TP={shortfall.n_ranks} meets its ideal "
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
    details.answer = answer

    # the sizes: probe busbw per mode at the decode's sizes, regime, and the large-size contrast
    def count_text(e: _Size) -> str:
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

    # realised in the trace against the probe
    realised = main.realised_busbw_gbps
    pref = main_bw.get(ref_mode, float("nan"))
    transfer = trace.source == "transfer"
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
    if prefix:
        lead = lead[0].lower() + lead[1:]
    return prefix + lead + body + tail + caveats, details


def load_compare(path: str | Path) -> LinksProbe:
    """The probe's part of a saved `tracekit compare-links` JSON result, typed (any schema: a 1.0
    file reads too); ProbeError in one line naming the file, and the JSON path where it stops
    fitting (`$.rows[3]`), when it is not one."""
    saved = read_probe(path, what="compare-links result", error=ProbeError, kind=KIND)
    assert isinstance(saved, LinksProbe)  # the kind says an object
    return saved


def recompute(
    saved: LinksProbe,
    *,
    trace_dir: str | Path | None = None,
    baseline_dir: str | Path | None = None,
    loaded_from: str | Path | None = None,
) -> Links:
    """The trace part, side-by-side marks and verdict for probe results (`compare_links`'s own, or a
    saved result's: no sweep, no GPU). With `trace_dir` the trace is read again; without it a saved
    trace part is reused. `baseline_dir` (needs `trace_dir`) gives S through the shortfall."""
    if baseline_dir and not trace_dir:
        raise ProbeError("--baseline needs --trace (the sharded decode run it is the baseline of)")
    modes = [m.mode for m in saved.modes]
    cpu_only = bool(saved.modes) and all(m.device == "cpu" for m in saved.modes)
    saved_trace = given(saved.trace)
    probe_notes = given(saved.probe_notes)
    if probe_notes is None:  # schema 1.0: notes = the sweep's notes + the trace's
        old_trace_notes = set(saved_trace.notes if saved_trace is not None else [])
        probe_notes = [n for n in given(saved.notes) or [] if n not in old_trace_notes]
    notes = list(probe_notes)
    if loaded_from is not None:
        notes.append(
            f"probe rows loaded from {loaded_from} (schema {saved.schema_version}); "
            + ("trace, " if trace_dir else "")
            + "verdict recomputed"
        )
    trace = trace_collectives(trace_dir) if trace_dir else saved_trace
    if trace:
        notes.extend(trace.notes)
    sf = shortfall_context(baseline_dir, trace_dir) if baseline_dir and trace_dir else None
    decode_sizes: dict[str, set[int]] = {}
    for s in trace.sizes if trace is not None else []:
        decode_sizes.setdefault(str(s.op), set()).add(int(s.bytes or 0))
    text, details = verdict(saved.rows, modes, trace, cpu_only, shortfall=sf, transports=saved.transports)
    return Links(
        schema_version=SCHEMA_VERSION,
        kind=saved.kind,
        config=saved.config,
        modes=saved.modes,
        rows=saved.rows,
        transports=saved.transports,
        links=saved.links,
        probe_notes=probe_notes,
        meta=saved.meta,
        side_by_side=side_by_side(saved.rows, modes, decode_sizes),
        trace=trace,
        shortfall=sf,
        verdict=text,
        verdict_details=details,
        notes=notes,
        loaded_from=str(loaded_from) if loaded_from is not None else UNSET,
    )
