"""The view of a what-if replay (`tracekit whatif`'s table and Markdown): its typed document
(`tracekit.model.documents.Whatif`, docs/JSON.md#whatif) as rows, then text or Markdown."""

from __future__ import annotations

from tracekit.model import units
from tracekit.model.documents import Whatif, given
from tracekit.render.writers import console_text, markdown_table, text_console, titled_table


def _rows(doc: Whatif) -> tuple[list[str], list[list[str]]]:
    """The prediction table: per knob combination, the per-token time at each rank count and the
    speedup over the measured TP=1 time."""
    ns = list(next(iter(doc.predicted_ns.values())))
    head = ["knobs"]
    for n in ns:
        head += [f"TP={n} ms", f"TP={n} vs T1"]
    rows = []
    applies = {k.spec: k.applies for k in doc.knobs}
    ranges = given(doc.predicted_ranges_ns) or {}
    for spec, by_n in doc.predicted_ns.items():
        row = ["none (replay of the trace)" if spec == "none" else spec]
        for n in ns:
            sp = doc.speedup_vs_tp1[spec][n]
            if spec in applies and not applies[spec].get(n, True):
                row += ["n/a", ""]  # the knob does not apply to this run (docs/METHOD-NOTES.md What-if)
                continue
            rng = ranges.get(spec, {}).get(n)
            if rng is not None and units.ms(rng[0]) != units.ms(rng[1]):
                # not identified: the range the splits of the profiler's cost allow, not one value
                row += [f"{units.ms(rng[0])} to {units.ms(rng[1])} (not identified)", ""]
                continue
            row += [units.ms(by_n[n]), "-" if sp is None else f"{sp:.2f}x"]
        rows.append(row)
    return head, rows


def _shapley_rows(doc: Whatif) -> list[list[str]]:
    accounting = given(doc.accounting)
    acc = accounting.terms_ns if accounting is not None else {}
    acc_sh = accounting.shares if accounting is not None else {}
    shares = given(doc.shapley_shares) or {}
    ranges = given(doc.shapley_ranges_ns) or {}

    def value(k: str, v: int | None) -> list[str]:
        rng = ranges.get(k)
        if rng is not None and units.ms(rng[0]) != units.ms(rng[1]):  # not identified: no one value
            return [k, f"{units.ms(rng[0])} to {units.ms(rng[1])} (not identified)", ""]
        return [k, units.ms(v), units.pct(shares[k])]

    out = [value(k, v) for k, v in (given(doc.shapley_ns) or {}).items()]
    out.append(["S", units.ms(given(doc.shortfall_ns)), "100.0%"])
    acc_rows = [[k, units.ms(v), units.pct(acc_sh.get(k))] for k, v in acc.items()]
    n = max(len(out), len(acc_rows))
    merged = []
    for i in range(n):
        a = out[i] if i < len(out) else ["", "", ""]
        b = acc_rows[i] if i < len(acc_rows) else ["", "", ""]
        merged.append(a + b)
    return merged


def _summary(doc: Whatif) -> list[str]:
    lines = []
    runs = [("baseline", doc.runs.baseline)]
    sharded = given(doc.runs.sharded)
    if sharded is not None:
        runs.append(("sharded", sharded))
    for key, r in runs:
        e = r.replay_error
        if r.device_scale is not None and r.device_scale != 1.0:
            cost = f"profiler cost on the device: device times scaled by {r.device_scale:.3f}"
        elif r.timeline == "gpu":
            cost = f"profiler cost removed per host call {(r.host_cost_per_call_ns or 0) / 1e3:.2f} us"
        else:
            cost = f"host time scaled by {r.host_scale:.3f}"
        lines.append(
            f"{key} (TP={r.ranks}, {r.timeline} timeline): per-token {units.ms(r.per_token_ns)} ms "
            f"({r.per_token_source}); replay of the trace {units.ms(e.replayed_ns)} ms vs traced "
            f"{units.ms(e.traced_ns)} ms (error {e.mean:+.2%}, worst step {e.max_step:.2%}); "
            + cost
            + (
                " (from the manifest's profiler calibration)"
                if r.profiler_correction.method == "manifest calibration"
                else ""
            )
        )
    c = given(doc.check)
    if c is not None:
        lines.append(
            f"check: {c.knobs} predicts {units.ms(c.predicted_ns)} ms at TP={c.ranks}; {c.run} measured "
            f"{units.ms(c.measured_ns)} ms ({c.measured_source}): error {c.error:+.1%}"
        )
        dw = given(c.device_work_ns)
        a, b = (dw.predicting_run, dw.check_run) if dw is not None else (None, None)
        if a and b and abs(b - a) > 0.01 * a:
            lines.append(
                f"  the check run's device work differs: {units.ms(b)} vs {units.ms(a)} ms per token in the replayed run "
                f"({(b - a) / a:+.1%}): a knob re-times the work the trace holds, so this difference is "
                "not the model's error"
            )
    return lines


def table(doc: Whatif, width: int | None = None, color: bool = True) -> str:
    """The terminal form: the runs and the replay's error, the predictions, the Shapley split."""
    console = text_console(width, color)
    for line in _summary(doc):
        console.print(line)
    head, rows = _rows(doc)
    t = titled_table(
        "Predicted per-token time under each knob (ms, mean over steady steps)",
        head,
    )
    for row in rows:
        t.add_row(*row)
    console.print(t)
    if given(doc.shapley_ns) is not None:
        s = titled_table(
            "S split by counterfactuals (Shapley values, sum to S) beside the accounting",
            ("knob", "ms", "share", "accounting term", "ms", "share"),
        )
        for row in _shapley_rows(doc):
            s.add_row(*row)
        console.print(s)
    for n in doc.notes:
        console.print(f"note: {n}")
    return console_text(console)


def markdown(doc: Whatif) -> str:
    """The Markdown form: the summary as a list, the predictions and the Shapley split as tables."""
    out = ["# What-if: predicted per-token time under counterfactuals", ""]
    out += [f"- {line}" for line in _summary(doc)]
    out.append("")
    head, rows = _rows(doc)
    out += markdown_table(head, rows, align_numbers=False, cells=False)
    if given(doc.shapley_ns) is not None:
        shapley_head = ["knob (Shapley)", "ms", "share", "accounting term", "ms", "share"]
        out += ["", *markdown_table(shapley_head, _shapley_rows(doc), align_numbers=False, cells=False)]
    out += ["", "Knobs:", ""]
    out += [f"- `{k.spec}`: {k.definition}" for k in doc.knobs]
    for n in doc.notes:
        out.append(f"- note: {n}")
    return "\n".join(out) + "\n"
