"""`tracekit whatif`: replay a decode trace under counterfactuals (docs/METHOD.md section Critical path and what-if, docs/METHOD-NOTES.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from tracekit.cli import options as opt
from tracekit.model import documents
from tracekit.render import whatif as view

if TYPE_CHECKING:
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.analyse.whatif.result import WhatIf


@click.command(
    "whatif",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Knobs (each a transformation of the replay; `a,b` combines):
  transfer=0             every collective ends at its last arrival (infinitely fast link)
  transfer=probe:FILE    each collective takes the time a `tracekit probe` / `compare-links` JSON measured
                         for its op and size (FILE@MODE picks rows, e.g. @pcie); --probe FILE: transfer=probe
  launch=0               no host launch overhead (what CUDA graphs remove): the GPU runs back to back
  sync=0                 synchronisations return at once
  straggler=off          every rank's host gaps set to the fastest rank's, per segment between collectives
  compute=/N             each rank's compute scaled to the baseline's / N (perfect scaling)
  collective_latency=US[@GBPS]
                         each collective's transfer: the lesser of its own and US us + size x bus factor /
                         GBPS (without @GBPS: --probe's bandwidth), what a one-shot custom all-reduce buys
  allreduce_norm=fused   the vector kernels between each all-reduce and the next GEMM (residual add, norm)
                         take no device time: a fused all-reduce + RMSNorm kernel (GPU timeline, TP > 1)
  (docs/METHOD.md section Critical path and what-if)
\b
Examples:
  tracekit whatif --baseline traces/h200-tp1 --sharded traces/h200-tp2
  tracekit whatif --baseline traces/cpu-tp1 --sharded traces/cpu-tp2-straggler --check traces/cpu-tp2 \\
      --check-knob straggler=off
  tracekit whatif --baseline traces/h200-tp1-eager-whatif --knob launch=0 --check traces/h200-tp1-graphs \\
      --check-knob launch=0
  tracekit whatif --baseline traces/h200-tp1 --sharded traces/h200-tp2 --probe reports/h200/links-graph.json \\
      --knob transfer=probe --knob launch=0 --knob straggler=off --format json -o whatif.json
  tracekit whatif --baseline traces/h200x2-tp1-b1-graphs --sharded traces/h200x2-tp2-b1-graphs \\
      --knob collective_latency=5@400 --knob allreduce_norm=fused
""",
)
@click.option("--baseline", required=True, metavar="DIR", help="TP=1 run: folder of rank files.")
@click.option("--sharded", default=None, metavar="DIR", help="TP=N run (without it: TP=1 predictions only).")
@click.option(
    "--knob",
    "knobs",
    multiple=True,
    metavar="KNOB[,KNOB...]",
    help="A knob, or a combination of knobs joined by commas; repeat. Single knobs are the Shapley players "
    "(default: transfer=0 launch=0 sync=0 straggler=off compute=/N).",
)
@click.option("--probe", default=None, metavar="FILE[@MODE]", help="Probe JSON for transfer=probe.")
@click.option(
    "--check", "check_dir", default=None, metavar="DIR", help="A real run to check a prediction against."
)
@click.option(
    "--check-knob", default=None, metavar="KNOB[,KNOB...]", help="The prediction --check is held to."
)
@opt.format_option(
    "table", "json", "md", help="table for people; json per docs/JSON.md#whatif; md for reports."
)
@opt.skip_first_option()
@opt.step_pattern_option
@opt.analysis_options
def command(
    baseline: str,
    sharded: str | None,
    knobs: tuple[str, ...],
    probe: str | None,
    check_dir: str | None,
    check_knob: str | None,
    fmt: str,
    skip_first: int,
    step_pattern: str | None,
    out: str | None,
    run_on: opt.RunOn,
) -> None:
    """Replay the traces token by token across ranks (host launches, GPU work, syncs, collectives as
    rendezvous) and predict the per-token time at TP=1 and TP=N under counterfactual knobs; split
    the shortfall S exactly by the knobs' Shapley values (plus a named residual), beside the
    accounting attribution of `tracekit shortfall`. Predictions are corrected to the unprofiled
    per-token times as `shortfall` is; `--check` holds one to a real run not used to make it.
    """
    from tracekit.analyse.attribution.options import AttributionOptions
    from tracekit.analyse.whatif.knobs import DEFAULT_KNOBS, ReplayError, parse_combination
    from tracekit.analyse.whatif.pair import whatif

    singles: list[tuple[Any, ...]] = []
    combos: list[tuple[Any, ...]] = []
    for text in knobs or ((f"transfer=probe:{probe}",) if probe else ()) + DEFAULT_KNOBS:
        ks = parse_combination(text, probe)
        (singles if len(ks) == 1 else combos).append(ks)
    players: list[Any] = []
    for ks in singles:  # one player per knob name; another value of the same knob is a row of its own
        if any(p.name == ks[0].name for p in players):
            combos.append(ks)
        else:
            players.append(ks[0])
    if check_dir and not check_knob:
        raise ReplayError("--check needs --check-knob (the prediction to hold to the run)")
    eng = run_on.engine()
    paths = {"baseline": baseline, "sharded": sharded, "check": check_dir if check_knob else None}
    options = AttributionOptions(step_pattern, skip_first)
    runs = _load_runs({k: p for k, p in paths.items() if p}, eng, not run_on.cache, options)
    base_parts, base_cl = runs["baseline"]
    shard = runs.get("sharded")
    check = None
    if check_dir and check_knob:
        check = (runs["check"][0], parse_combination(check_knob, probe), check_dir)
    result: WhatIf = whatif(
        base_parts,
        base_cl,
        shard[0] if shard else None,
        shard[1] if shard else None,
        players,
        combos,
        check=check,
    )
    doc = result.document()
    doc.runs.baseline.path = baseline
    shard_doc = documents.given(doc.runs.sharded)
    if sharded and shard_doc is not None:
        shard_doc.path = sharded
    opt.emit_document(out, fmt, documents.to_builtins(doc), documents.Whatif, view, md=True)


def _load_runs(
    paths: dict[str, str], eng: Any, no_cache: bool, options: AttributionOptions
) -> dict[str, tuple[Any, Any]]:
    """Per label, the attributed run and what the replay reads of its events: locally the
    analysed run itself (its steps, found for attribute_run, are not found again); on Dask
    `tracekit.engine.whatif_runs` (the graph and the device events from the workers)."""
    from tracekit.analyse.analysed import AnalysedRun
    from tracekit.analyse.attribution.plan import attribute_run
    from tracekit.engine import whatif_runs
    from tracekit.read import read_run

    if eng.kind == "dask":
        got = whatif_runs(paths, eng, options=options, cache=not no_cache)
        return {k: (v.parts, v.classified) for k, v in got.items()}
    out = {}
    for label, path in paths.items():
        run = AnalysedRun.of(read_run([path], cache=not no_cache, progress=eng.progress))  # classified once
        out[label] = (attribute_run(run, options, label=label), run)
    return out
