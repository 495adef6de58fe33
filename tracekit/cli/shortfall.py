"""`tracekit shortfall`: where the per-token shortfall S = TN - T1/N goes (METHOD.md 5, 6, 9)."""

from __future__ import annotations

import io
import json
import sys
from typing import TYPE_CHECKING, Any

import click

from tracekit.cli.options import no_cache_option, out_file_option, write_text

if TYPE_CHECKING:
    from tracekit.analyse.shortfall import Shortfall


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


def render_table(sf: Shortfall, width: int | None = None, color: bool = True) -> str:
    """The human-readable report: verdict first, then the figures (rich tables) as text."""
    from rich.console import Console
    from rich.table import Table

    console = Console(
        record=True, width=width or 120, force_terminal=color, no_color=not color, file=io.StringIO()
    )
    doc = sf.to_json()
    console.print(f"[bold]{doc['verdict']}[/bold]")
    if doc.get("diagnosis"):
        console.print(f"Next: {doc['diagnosis']}")
    console.print()

    pt = doc["per_token_ns"]
    n = doc["n_ranks"]
    head = Table(
        title=f"Per-token time (ms; source: {doc['per_token_source']}, mean over steady steps)",
        title_justify="left",
    )
    for col in ("", "ms", "median ms"):
        head.add_column(col, justify="right")
    med = doc["per_token_median_ns"]
    head.add_row(f"T1 (baseline, {doc['baseline_ranks']} rank)", _ms(pt["baseline"]), _ms(med["baseline"]))
    head.add_row(f"TN (sharded, N={n})", _ms(pt["sharded"]), _ms(med["sharded"]))
    head.add_row(f"ideal T1/{n}" if doc["baseline_ranks"] == 1 else "ideal", _ms(pt["ideal"]), "")
    head.add_row("[bold]shortfall S[/bold]", f"[bold]{_ms(doc['shortfall_ns'])}[/bold]", "")
    console.print(head)

    terms = Table(title="Attribution of S (terms sum to S exactly)", title_justify="left")
    for col in ("term", "ms", "share of S", "p10 ms", "median ms", "p90 ms", "uncorrected ms"):
        terms.add_column(col, justify="right")
    spread = doc["spread_ns"]
    unc = doc["uncorrected"]
    for k, v in doc["terms_ns"].items():
        sp = spread.get(k, {})
        terms.add_row(
            k,
            _ms(v),
            _pct(doc["shares"][k]),
            _ms(sp.get("p10")),
            _ms(sp.get("median")),
            _ms(sp.get("p90")),
            _ms(unc["terms_ns"].get(k)),
        )
    for k, v in doc["coordination_ns"].items():
        sp = spread.get(k, {})
        share = v / doc["shortfall_ns"] if doc["shortfall_ns"] else None
        terms.add_row(
            f"  coordination: {k}",
            _ms(v),
            _pct(share),
            _ms(sp.get("p10")),
            _ms(sp.get("median")),
            _ms(sp.get("p90")),
            _ms(unc["coordination_ns"].get(k)),
        )
    terms.add_row("S", _ms(doc["shortfall_ns"]), "100.0%", "", "", "", _ms(unc["shortfall_ns"]))
    console.print(terms)

    st = Table(title="Stragglers (how often each rank arrived last at a collective)", title_justify="left")
    for col in ("rank", "last", "of", "share"):
        st.add_column(col, justify="right")
    for s in doc["stragglers"]:
        st.add_row(str(s["rank"]), str(s["last_count"]), str(s["instances"]), _pct(s["share"]))
    console.print(st)

    coll = doc["collectives"]
    if coll["instances"]:
        ct = Table(
            title=f"Collectives: {coll['instances']} instances, {coll['per_token']:.1f} per token "
            f"({coll['level']}, matched by {', '.join(sorted(set(coll['match_by'].values())))})",
            title_justify="left",
        )
        for col in (
            "op",
            "bytes",
            "count",
            "wait ms (median of per-collective max)",
            "transfer ms (median)",
            "skew ms (median)",
            "busbw GB/s",
        ):
            ct.add_column(col, justify="right")
        for o in coll["by_op"]:
            ct.add_row(
                o["op"],
                (str(o["bytes"]) if o["bytes"] >= 0 else "?")
                + (" (manifest)" if o.get("bytes_source") == "manifest" else ""),
                str(o["count"]),
                _ms(o["wait_ns_median"]),
                _ms(o["transfer_ns_median"]),
                _ms(o["skew_ns_median"]),
                "-" if o["busbw_gbps_median"] is None else f"{o['busbw_gbps_median']:.3g}",
            )
        console.print(ct)
    else:
        console.print("Collectives: none in the sharded run")

    dil = doc["dilation"]

    def _d(x: float | None) -> str:
        return "unknown" if x is None else f"{x:.2f}x"

    console.print(
        f"Profiler dilation (profiled / unprofiled per-token time): baseline {_d(dil['baseline'])}, "
        f"sharded {_d(dil['sharded'])}; threshold {dil['threshold']:.0%}"
        + ("  [bold]ABOVE THRESHOLD[/bold]" if dil["inflated"] else "")
    )
    console.print(f"Reconciliation: {dil['reconciliation']}")
    clock = doc["clock"]
    console.print(
        f"Clock: {clock['method']}"
        + (f"; offsets {clock['offsets_ns']}" if clock.get("offsets_applied") else "")
    )
    dq = doc["data_quality"]
    if dq["counts"] or dq["notes"]:
        console.print("[bold]Data quality[/bold]")
        for key, count in dq["counts"].items():
            console.print(f"  {key}: {count}")
        for note in dq["notes"]:
            console.print(f"  - {note}")
    return console.export_text(styles=color)


@click.command("shortfall")
@click.option(
    "--baseline",
    "baseline",
    required=True,
    type=click.Path(exists=True, path_type=str),
    help="TP=1 run: folder of rank files (or one trace).",
)
@click.option(
    "--sharded",
    "sharded",
    required=True,
    type=click.Path(exists=True, path_type=str),
    help="TP=N run: folder of rank files.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people; json per docs/JSON.md#shortfall.",
)
@click.option(
    "--step-pattern",
    default=None,
    metavar="REGEX",
    help="Regex of the step annotations (default: the manifest's, else decode_step, then ProfilerStep#N).",
)
@click.option(
    "--skip-first",
    type=int,
    default=1,
    show_default=True,
    help="Warm-up steps left out of the per-token figures.",
)
@click.option(
    "--dilation-threshold",
    type=float,
    default=0.10,
    show_default=True,
    help="Dilation above 1 + this is reported as inflating the coordination share.",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Match collectives even when their group names ranks that are not in the run.",
)
@out_file_option
@no_cache_option
def command(
    baseline: str,
    sharded: str,
    fmt: str,
    step_pattern: str | None,
    skip_first: int,
    dilation_threshold: float,
    allow_partial: bool,
    out: str | None,
    no_cache: bool,
) -> None:
    """Attribute the per-token shortfall S = TN - T1/N of a tensor-parallel run to compute that did
    not scale, memory, link transfer and coordination (collective wait + sync + idle), with the
    spread over steps, the stragglers and the profiler's dilation. T1 and TN come from the
    unprofiled pass when the capture manifests have it (the traced parts are reconciled to it).

    \b
    Examples:
      tracekit shortfall --baseline traces/cpu-tp1 --sharded traces/cpu-tp2
      tracekit shortfall --baseline traces/cpu-tp1 --sharded traces/cpu-tp2-straggler --format json --out s.json
    """
    from tracekit.analyse.shortfall import shortfall
    from tracekit.read import read_run

    tty = sys.stderr.isatty()
    run_b = read_run([baseline], cache=not no_cache, progress=tty)
    run_s = read_run([sharded], cache=not no_cache, progress=tty)
    result = shortfall(
        run_b,
        run_s,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        allow_partial=allow_partial,
    )
    if fmt == "json":
        doc: dict[str, Any] = result.to_json()
        text = json.dumps(doc, indent=1) + "\n"
    else:
        to_terminal = out is None and sys.stdout.isatty()
        text = render_table(result, width=None if out is None else 120, color=to_terminal)
    write_text(text, out)
