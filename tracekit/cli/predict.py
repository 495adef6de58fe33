"""`tracekit predict`: TP=N per-token time from one rank's shard plus the link's collectives
(tracekit/analyse/predict.py)."""

from __future__ import annotations

import click

from tracekit.cli.options import emit_result, out_file_option, run_option
from tracekit.model.documents import to_builtins
from tracekit.render import predict as view


@click.command("predict", context_settings={"help_option_names": ["-h", "--help"]})
@run_option(
    "shard",
    "A `tracekit capture --shard-of N` run (repeatable: one prediction each).",
    dest="shards",
    multiple=True,
    metavar="RUN",
)
@click.option(
    "--link",
    "link",
    required=True,
    metavar="FILE[@MODE]",
    help="A `tracekit probe` / `compare-links` JSON: the collectives' times by op and size (MODE picks "
    "the rows' mode, e.g. nvlink; default the first). Graph-timed rows (`probe --graph`) for a CUDA-graph "
    "decode.",
)
@run_option(
    "check",
    "A real TP=N run of a predicted degree: its unprofiled per-token time against the prediction.",
    dest="checks",
    required=False,
    multiple=True,
    metavar="RUN",
)
@click.option(
    "--probe-ranks",
    type=int,
    default=None,
    help="The rank count the probe ran at (default: its rows' `ranks`).",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@out_file_option
def command(
    shards: tuple[str, ...],
    link: str,
    checks: tuple[str, ...],
    probe_ranks: int | None,
    fmt: str,
    out: str | None,
) -> None:
    """Predict the per-token time of TP=N from one rank's shard measured alone (`capture --shard-of N`:
    the per-rank compute of TP=N on one device) plus the collectives it skipped (two all-reduces per
    layer and the logits' all-gather, from the model shape) at the link probe's measured times. The
    collectives sit on the decode's one dependency chain, so they add; coordination (ranks waiting for
    each other) is left out. When the probe ran at fewer ranks than N, `flat` keeps its times and
    `ring` scales them by (N-1)/(P-1). A prediction until a machine with N devices measures it.
    See docs/METHOD.md section Predicting TP=N from one rank's shard.

    \b
    Examples:
      tracekit predict --shard traces/h200-shard4-graphs --link reports/h200/links-graph.json@nvlink
      tracekit predict --shard traces/h200-shard2-graphs --link reports/h200/links-graph.json@nvlink \\
          --check traces/h200x2-tp2-b1-graphs
    """
    from tracekit.analyse.predict import predict

    doc = predict(list(shards), link, checks=list(checks), probe_ranks=probe_ranks)
    emit_result(
        out, fmt, lambda: to_builtins(doc), lambda width, color: view.table(doc, width=width, color=color)
    )
