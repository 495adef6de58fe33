"""The view of `tracekit predict`'s document (`Predict`): its terminal table."""

from __future__ import annotations

from tracekit.model import units
from tracekit.model.documents import Predict, given
from tracekit.render.writers import console_text, text_console, titled_table


def table(doc: Predict, width: int | None = None, color: bool = True) -> str:
    """The terminal form: the link probed, then per TP the shard, the collectives it skipped, the
    prediction (flat and ring) and the measured check."""
    console = text_console(width, color)
    pr = doc.probe
    console.print(
        f"Link: {pr.path} (mode {pr.mode or '-'}, {pr.ranks or '?'} ranks, "
        f"{'CUDA-graph' if pr.graph_timed else 'eager' if pr.graph_timed is False else 'mixed'} timing)"
    )
    t = titled_table(
        "Per token, ms (prediction = shard alone + the collectives it skipped)",
        (
            "TP",
            "shard",
            "shard 95%",
            "collectives",
            "link flat",
            "link ring",
            "predicted",
            "ring",
            "measured",
            "error",
        ),
    )
    for r in doc.predictions:
        sh, pn, ck = r.shard, r.predicted_ns, given(r.check)
        n_coll = sum(c.per_token for c in r.collectives)
        t.add_row(
            str(r.tp),
            units.ms(sh.per_token_ns),
            f"{units.ms(sh.interval_ns[0])}-{units.ms(sh.interval_ns[1])}",
            str(n_coll),
            units.ms(r.transfer_ns.flat),
            units.ms(r.transfer_ns.ring),
            units.ms(pn.flat),
            units.ms(pn.ring),
            units.ms(ck.measured_ns) if ck else "-",
            f"{ck.error:+.1%}" if ck else "-",
        )
    console.print(t)
    console.print(f"[bold]{doc.caveat[0].upper() + doc.caveat[1:]}.[/bold]")
    return console_text(console, color)
