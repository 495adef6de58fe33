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
    tuning_in_timed_loop,
)
from tracekit.analyse.links.probe_only import probe_only_verdict
from tracekit.analyse.links.sentences import (
    LargestSize,
    SizeBound,
    caveats_sentence,
    lead_sentence,
    realised_sentence,
    sizes_sentence,
)
from tracekit.analyse.links.trace import shortfall_context, trace_collectives
from tracekit.errors import ProbeError
from tracekit.model.documents.base import given
from tracekit.model.documents.links import (
    Links,
    LinksModes,
    LinksProbe,
    LinksShortfall,
    LinksSize,
    LinksTrace,
    LinksTransportsValue,
    LinksVerdictDetails,
    ProbeRow,
)
from tracekit.model.fields import copy_fields
from tracekit.read.probe import read_probe

SCHEMA_VERSION = "1.1"  # 1.1: verdict from the shortfall (baseline), regimes, bounds; probe_notes, config


KIND = "tracekit.compare_links"


def _order_modes(
    rows: Sequence[ProbeRow], modes: Sequence[str], op: str
) -> tuple[str, str | None, LargestSize | None]:
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
    large = LargestSize(
        op=op,
        bytes=big,
        busbw_gbps={a: va, b: vb},
        k=(ca[big] if fast == a else cb[big]) / (cb[big] if fast == a else ca[big])
        if min(va, vb) > 0
        else float("nan"),
    )
    return fast, slow, large


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

    per_size: list[SizeBound] = []
    for s in sizes:
        op, size = str(s.op), int(s.bytes or 0)
        w = _weight(s) / total_w if total_w > 0 else 1.0 / len(sizes)
        xn_i = xn * w if xn is not None else None
        realised = s.busbw_gbps if s.busbw_gbps is not None else float("nan")  # null: written for NaN
        e = SizeBound(op, size, s.count, s.per_token, w, xn_i, realised, op in swept)
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

    answer, lead = lead_sentence(
        labels,
        fast,
        slow,
        k_eff,
        bound,
        per_call_wins,
        cpu_only=cpu_only,
        xn=xn,
        s_ns=s_ns,
        n_ranks=shortfall.n_ranks if shortfall is not None else None,
        bound_inf=bound_inf,
    )
    details.answer = answer
    body = sizes_sentence(per_size, main, large, labels, fast, slow)
    tail = realised_sentence(main, trace.source, trace_mode, ref_mode, labels, timing)
    caveats = caveats_sentence(rows, timing, tuning_modes, per_size)
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
    # the probe's part as saved (kind, config, modes, rows, transports, links, meta), the rest redone
    return copy_fields(
        Links,
        saved,
        schema_version=SCHEMA_VERSION,
        probe_notes=probe_notes,
        side_by_side=side_by_side(saved.rows, modes, decode_sizes),
        trace=trace,
        shortfall=sf,
        verdict=text,
        verdict_details=details,
        notes=notes,
        loaded_from=str(loaded_from) if loaded_from is not None else UNSET,
    )
