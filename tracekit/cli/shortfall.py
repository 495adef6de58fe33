"""`tracekit shortfall`: where the per-token shortfall S = TN - T1/N goes (docs/METHOD.md sections "Wait and transfer", "Shortfall attribution" and "Dilation")."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import click

from tracekit.analyse.compute.kernel_scaling import short_kernel_name
from tracekit.cli.options import (
    cache_dir_option,
    emit_result,
    engine_options,
    format_option,
    no_cache_option,
    out_file_option,
    show_progress,
)
from tracekit.model import units
from tracekit.model.parts import PATH_PARTS

if TYPE_CHECKING:
    from tracekit.analyse.shortfall import Shortfall


def _x(ratio: float | None, interval: Any = None) -> str:
    """A dilation with its interval, as the verdict prints it: "1.37x [1.27-1.48]"."""
    if ratio is None:
        return "unknown"
    text = f"{ratio:.2f}x"
    if isinstance(interval, list | tuple) and len(interval) == 2 and None not in interval:
        text += f" [{interval[0]:.2f}-{interval[1]:.2f}]"
    return text


def _short(words: str) -> str:
    return words.split(" (", 1)[0]


#: the critical path's parts per rank (shortfall `critical_path.by_rank[r]`, without `_ns`)


_SCALING_WORDS = {
    "replicated": "replicated (did not shrink)",
    "partly_shrank": "shrank less than N-fold",
    "shrank": "shrank N-fold",
    "added": "only in the sharded run",
    "removed": "only in the baseline",
}


def render_compute_scaling(console: Any, cs: dict[str, Any], n: int) -> None:
    """The compute term split by kernel class, with each class's top kernel (JSON `compute_scaling`)."""
    from rich.table import Table

    if not cs.get("available"):
        return
    t = Table(
        title=f"Compute that did not shrink, by kernel: {units.ms(cs['compute_term_ns'])} ms per token = the classes "
        f"+ residual (TP=1 -> TP={n}, per rank)",
        title_justify="left",
    )
    for col in ("class", "lost ms", "kernels/token", "TP=1 ms", f"TP={n} ms", "top kernel (lost ms)"):
        t.add_column(col, justify="left" if col in ("class", "top kernel (lost ms)") else "right")
    for c, v in cs["classes"].items():
        if not v["kernels_per_token"]:
            continue
        top = v["top"][0] if v["top"] else None
        t.add_row(
            _SCALING_WORDS.get(c, c),
            units.ms(v["lost_ns"]),
            str(v["kernels_per_token"]),
            units.ms(v["baseline_ns"]),
            units.ms(v["sharded_ns"]),
            f"{short_kernel_name(top['name'])} ({units.ms(top['lost_ns'])})" if top else "",
        )
    t.add_row("residual (overlap, steps off the sequence)", units.ms(cs["residual_ns"]), "", "", "", "")
    console.print(t)


def render_table(sf: Shortfall, width: int | None = None, color: bool = True) -> str:
    """The human-readable report: verdict first, then the figures (rich tables) as text."""
    from rich.console import Console
    from rich.table import Table

    from tracekit.report.data import chance_clause

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
    head.add_row(
        f"T1 (baseline, {doc['baseline_ranks']} rank)", units.ms(pt["baseline"]), units.ms(med["baseline"])
    )
    head.add_row(f"TN (sharded, N={n})", units.ms(pt["sharded"]), units.ms(med["sharded"]))
    head.add_row(f"ideal T1/{n}" if doc["baseline_ranks"] == 1 else "ideal", units.ms(pt["ideal"]), "")
    head.add_row("[bold]shortfall S[/bold]", f"[bold]{units.ms(doc['shortfall_ns'])}[/bold]", "")
    console.print(head)

    words: dict[str, str] = doc.get("term_words") or {}
    transfer_label = f"transfer ({_short(words['transfer'])})" if words.get("transfer") else "transfer"
    label = {k: k for k in doc["terms_ns"]} | {"transfer": transfer_label}
    agg = doc.get("aggregate")
    terms = Table(
        title="Attribution of S (terms sum to S exactly)" + (f"; aggregate: {agg}" if agg else ""),
        title_justify="left",
    )
    for col in (
        "term",
        "ms",
        "95% interval ms",
        "share of S",
        "p10 ms",
        "median ms",
        "p90 ms",
        "uncorrected ms",
    ):
        terms.add_column(col, justify="right")
    spread = doc["spread_ns"]
    unc = doc["uncorrected"]
    ivs = doc.get("intervals") or {}

    def iv_cell(iv: list[int] | None) -> str:
        return f"[{units.ms(iv[0])}, {units.ms(iv[1])}]" if iv else ""

    def share_cell(iv: list[int] | None, share: float | None) -> str:
        # a share only for a term whose interval is above zero (docs/METHOD.md section "Noise and
        # the profiler correction"): within noise or below zero is said as such, not as a share
        if not iv or iv[0] > 0:
            return units.pct(share)
        if iv[0] == iv[1] == 0:
            return "none"
        return "below zero" if iv[1] < 0 else "within noise"

    for k, v in doc["terms_ns"].items():
        sp = spread.get(k, {})
        terms.add_row(
            label[k],
            units.ms(v),
            iv_cell((ivs.get("terms_ns") or {}).get(k)),
            share_cell((ivs.get("terms_ns") or {}).get(k), doc["shares"][k]),
            units.ms(sp.get("p10")),
            units.ms(sp.get("median")),
            units.ms(sp.get("p90")),
            units.ms(unc["terms_ns"].get(k)),
        )
    for k, v in doc["coordination_ns"].items():
        sp = spread.get(k, {})
        share = v / doc["shortfall_ns"] if doc["shortfall_ns"] else None
        terms.add_row(
            f"  coordination: {k}",
            units.ms(v),
            iv_cell((ivs.get("coordination_ns") or {}).get(k)),
            share_cell((ivs.get("coordination_ns") or {}).get(k), share),
            units.ms(sp.get("p10")),
            units.ms(sp.get("median")),
            units.ms(sp.get("p90")),
            units.ms(unc["coordination_ns"].get(k)),
        )
    terms.add_row(
        "S",
        units.ms(doc["shortfall_ns"]),
        iv_cell(ivs.get("shortfall_ns")),
        "100.0%",
        "",
        "",
        "",
        units.ms(unc["shortfall_ns"]),
    )
    console.print(terms)
    if ivs.get("method"):
        console.print(f"Intervals: {ivs['method']}.")
    if words:
        console.print("What the terms are in this run:")
        for k in doc["terms_ns"]:
            if words.get(k):
                console.print(f"  {k}: {words[k]}")

    s_ns = doc["shortfall_ns"]
    per_rank = doc.get("per_rank") or []
    if per_rank:
        term_keys = list(doc["terms_ns"])
        pr = Table(
            title="Per rank: each rank's own attribution of S, ms (share of S); its parts minus the baseline's, "
            "each rank sums to S; the attribution above is their mean",
            title_justify="left",
        )
        pr.add_column("term", justify="right")
        for r in per_rank:
            pr.add_column(f"rank {r['rank']}", justify="right")
        pr.add_column("mean", justify="right")

        def cell(ns: int | None) -> str:
            return f"{units.ms(ns)} ({units.pct(ns / s_ns if s_ns and ns is not None else None)})"

        for k in term_keys:
            pr.add_row(
                label.get(k, k), *[cell(r["terms_ns"].get(k, 0)) for r in per_rank], cell(doc["terms_ns"][k])
            )
        for c in ("wait", "sync", "idle"):
            pr.add_row(
                f"coordination: {c}",
                *[cell(r["coordination_ns"].get(c, 0)) for r in per_rank],
                cell(doc["coordination_ns"].get(c, 0)),
            )
        pr.add_row("pad (idle to the step time)", *[units.ms(r.get("pad_ns")) for r in per_rank], "")
        console.print(pr)

    cp = doc.get("critical_path")
    if cp and cp.get("by_rank"):
        step = cp["step_ns"]
        path_label = {p: p for p in PATH_PARTS} | {"transfer": transfer_label}
        gpu = (doc.get("steps") or {}).get("sharded", {}).get("timeline") == "gpu"
        path_label["host"] = "host (launch gaps, host work)" if gpu else "host (time between its ops)"
        ranks = sorted(cp["by_rank"].items(), key=lambda kv: int(kv[0]))
        base = sorted(((cp.get("baseline") or {}).get("by_rank") or {}).items())
        ct_path = Table(
            title=f"Critical path of a token, ms (rendezvous model: a collective starts when its last rank "
            f"arrives; waiting is not on the path): ranks + offset {units.ms(cp['offset_ns'])} = T{n} {units.ms(step)}",
            title_justify="left",
        )
        ct_path.add_column("on the path", justify="right")
        for rank, _row in ranks:
            ct_path.add_column(f"rank {rank}", justify="right")
        ct_path.add_column("offset", justify="right")
        for rank, _row in base:
            ct_path.add_column(f"TP=1 token (rank {rank})", justify="right")
        for p in PATH_PARTS:
            ct_path.add_row(
                path_label[p],
                *[units.ms(row.get(f"{p}_ns")) for _, row in ranks],
                "",
                *[units.ms(row.get(f"{p}_ns")) for _, row in base],
            )
        ct_path.add_row(
            "total",
            *[units.ms(row.get("total_ns")) for _, row in ranks],
            units.ms(cp["offset_ns"]),
            *[units.ms(sum(row.get(f"{p}_ns", 0) for p in PATH_PARTS)) for _, row in base],
        )
        ct_path.add_row(
            "share of the token",
            *[units.pct(row["total_ns"] / step if step else None) for _, row in ranks],
            units.pct(cp["offset_ns"] / step if step else None),
            *["" for _ in base],
        )
        console.print(ct_path)
        if cp.get("cause"):
            console.print(cp["cause"])
    render_compute_scaling(console, doc.get("compute_scaling") or {}, n)
    st = doc.get("straggler") or {}
    if st.get("rank") is not None:
        console.print(
            f"Straggler test: rank {st['rank']} arrives last at {units.pct(st.get('last_share'))} of the collectives"
            f"{chance_clause(st)}, "
            f"{units.ms(st.get('lateness_ns_median'))} ms after the others on median (symmetric launch-bound hosts "
            f"explain {units.ms(st.get('threshold_ns'))} ms): "
            + ("[bold]a straggler[/bold]" if st.get("is_straggler") else "not a straggler")
        )

    st = Table(title="Stragglers (how often each rank arrived last at a collective)", title_justify="left")
    for col in ("rank", "last", "of", "share"):
        st.add_column(col, justify="right")
    for s in doc["stragglers"]:
        st.add_row(str(s["rank"]), str(s["last_count"]), str(s["instances"]), units.pct(s["share"]))
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
                units.ms(o["wait_ns_median"]),
                units.ms(o["transfer_ns_median"]),
                units.ms(o["skew_ns_median"]),
                "-" if o["busbw_gbps_median"] is None else f"{o['busbw_gbps_median']:.3g}",
            )
        console.print(ct)
    else:
        console.print("Collectives: none in the sharded run")

    dil = doc["dilation"]
    iv = dil.get("interval") or {}
    console.print(
        f"Profiler dilation applied (profiled / unprofiled per-token time from the capture's rounds; the traced "
        f"per-token time divided by it; 95% interval): "
        f"baseline {_x(dil['baseline'], iv.get('baseline'))}, sharded {_x(dil['sharded'], iv.get('sharded'))}; "
        f"threshold {dil['threshold']:.0%}" + ("  [bold]ABOVE THRESHOLD[/bold]" if dil["inflated"] else "")
    )
    app = dil.get("applied") or {}
    rows = [
        (k, app[k]["corrected_mean_ns"], app[k]["unprofiled_mean_ns"])
        for k in ("baseline", "sharded")
        if (app.get(k) or {}).get("corrected_mean_ns") and (app.get(k) or {}).get("unprofiled_mean_ns")
    ]
    if rows:
        console.print(
            "Cross-check, corrected per-token time vs the unprofiled rounds' own mean: "
            + ", ".join(f"{k} {c / 1e6:.3f} vs {u / 1e6:.3f} ms ({c / u - 1:+.1%})" for k, c, u in rows)
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


@click.command("shortfall", context_settings={"help_option_names": ["-h", "--help"]})
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
@format_option("table", "json", help="table for people; json per docs/JSON.md#shortfall.")
@click.option(
    "--steps",
    "--step-pattern",
    "step_pattern",
    default=None,
    metavar="auto|whole|REGEX",
    help="How to find the steps (default: the manifest's pattern, else auto: decode_step, ProfilerStep#N, a "
    "serving engine's iteration range, a CUDA-graph launch period, repeated NVTX ranges, else the whole trace); "
    "whole: one window per rank; or a REGEX of the step annotations. --step-pattern is the same option.",
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
@cache_dir_option
@engine_options
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
    engine: str | None,
    scheduler: str | None,
    workers: int | None,
) -> None:
    """Attribute the per-token shortfall S = TN - T1/N of a tensor-parallel run to compute that did
    not scale, memory, transfer (bytes on the link on GPUs; gloo's exchange on CPU runs) and
    coordination (collective wait + sync + idle), as the mean over ranks and per rank, with the
    critical path of a token across ranks (whose compute / host time / sync / transfer it runs
    through), the spread over steps, the straggler test and the profiler's dilation (the factor
    applied, with its interval). T1 and TN come from the unprofiled pass when the capture
    manifests have it (the traced parts are reconciled to it).

    \b
    Examples:
      tracekit shortfall --baseline traces/cpu-tp1 --sharded traces/cpu-tp2
      tracekit shortfall --baseline traces/cpu-tp1 --sharded traces/cpu-tp2-straggler --format json -o s.json
      tracekit shortfall --baseline traces/h200-tp1 --sharded traces/h200-tp2-straggler
    """
    from tracekit.engine import Engine, shortfall_paths

    eng = Engine.parse(engine, scheduler, workers, progress=show_progress())
    result = shortfall_paths(
        [baseline],
        [sharded],
        eng,
        step_pattern=step_pattern,
        skip_first=skip_first,
        dilation_threshold=dilation_threshold,
        allow_partial=allow_partial,
        cache=not no_cache,
    )
    emit_result(out, fmt, result.to_json, lambda width, color: render_table(result, width=width, color=color))
