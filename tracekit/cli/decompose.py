"""`tracekit decompose`: a per-token speedup split through a matched intermediate (docs/METHOD.md section Speedup decomposition)."""

from __future__ import annotations

import click

from tracekit.cli.options import (
    cache_dir_option,
    engine_options,
    format_option,
    no_cache_option,
    out_file_option,
    show_progress,
    step_pattern_option,
    write_text,
)
from tracekit.model import units

EXAMPLES = """
\b
Examples:
  tracekit decompose --baseline runs/eager --intermediate runs/graphs --full runs/graphs-fp8
  tracekit decompose --baseline runs/eager --intermediate runs/compile --full runs/compile-int4 --format json
  tracekit decompose --baseline traces/cpu-tp2-straggler --intermediate traces/cpu-tp2 --full traces/cpu-tp1
"""


def render_text(doc: dict) -> str:
    from tracekit.analyse.decompose import CLASSES, RUNS

    def iv(key: str, pct: bool = False) -> str:
        v = doc["intervals"].get(key)
        if not v:
            return ""
        return f" [{100 * v[0]:.0f}%-{100 * v[1]:.0f}%]" if pct else f" [{v[0]:.2f}-{v[1]:.2f}]"

    lines = [doc["verdict"], ""]
    lines.append(f"{'run':<13} {'ms/token':>9} {'source':<11} " + " ".join(f"{c:>12}" for c in CLASSES))
    for k in RUNS:
        r = doc["runs"][k]
        lines.append(
            f"{k:<13} {units.ms(r['per_token_ns']):>9} {r['per_token_source']:<11} "
            + " ".join(f"{units.ms(r['classes_ns'][c]):>12}" for c in CLASSES)
        )
    sp, parts = doc["speedup"], doc["parts"]
    lines += [
        "",
        f"speedup A/C {sp['total']:.3f}x{iv('speedup')} = runtime A/B {sp['runtime']:.3f}x{iv('runtime_speedup')}"
        f" x kernel B/C {sp['kernel']:.3f}x{iv('kernel_speedup')}",
    ]
    if parts["runtime"] is not None:
        lines.append(
            f"log-scale parts: runtime {100 * parts['runtime']:.1f}%{iv('runtime_part', True)}, "
            f"kernel {100 * parts['kernel']:.1f}%{iv('kernel_part', True)} "
            f"(95% bootstrap: rounds, then steps within them; {doc['bootstrap']['resamples']} resamples)"
        )
    for part in ("runtime", "kernel"):
        mv = doc["moved"][part]
        lines += [
            "",
            f"{part} part: {units.ms(mv['saved_ns'])} ms per token saved, by class (ms, share of the saving):",
        ]
        for c in CLASSES:
            share = mv["share_of_saving"][c]
            if mv["saved_by_class_ns"][c] == 0 and not share:
                continue
            lines.append(
                f"  {c:<13} {units.ms(mv['saved_by_class_ns'][c]):>9}  {'-' if share is None else f'{100 * share:.1f}%':>7}"
            )
    for n in doc["notes"]:
        lines.append(f"note: {n}")
    for n in dict.fromkeys(doc["data_quality"].get("notes", [])):
        lines.append(f"data quality: {n}")
    return "\n".join(lines) + "\n"


@click.command(
    epilog=EXAMPLES, context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]}
)
@click.option(
    "--baseline", "baseline", required=True, type=click.Path(exists=True), help="Run A: the baseline stack."
)
@click.option(
    "--intermediate",
    "intermediate",
    required=True,
    type=click.Path(exists=True),
    help="Run B: new runtime, old kernels.",
)
@click.option("--full", "full", required=True, type=click.Path(exists=True), help="Run C: the full stack.")
@step_pattern_option
@click.option(
    "--skip-first", type=int, default=1, show_default=True, help="Warm-up steps left out of each run."
)
@format_option("table", "json", help="table for people; json for machines (text: the old name of table).")
@out_file_option
@no_cache_option
@cache_dir_option
@engine_options
def command(
    baseline: str,
    intermediate: str,
    full: str,
    step_pattern: str | None,
    skip_first: int,
    fmt: str,
    out: str | None,
    no_cache: bool,
    engine: str | None,
    scheduler: str | None,
    workers: int | None,
) -> None:
    """Split the per-token speedup A/C into runtime (A/B) and kernel (B/C) parts on a log scale.

    A is the baseline stack, B the intermediate (the new runtime with the old kernels: CUDA graphs,
    torch.compile), C the full stack (B in another dtype or kernel path). The runtime part is
    log(A/B)/log(A/C), the kernel part log(B/C)/log(A/C); each with a 95% bootstrap interval over
    steps, and the per-token time each class saved in it (matrix compute, vector compute, memory,
    collective transfer, coordination), which sums exactly to the part's saving. Per-token times
    are the unprofiled ones when the manifests carry them (the traced parts reconciled to them, as
    `tracekit shortfall` does), else the traced ones.
    """
    from tracekit.cli.probe import dumps_json
    from tracekit.engine import Engine, decompose_paths

    eng = Engine.parse(engine, scheduler, workers, progress=show_progress())
    paths = {"baseline": baseline, "intermediate": intermediate, "full": full}
    result = decompose_paths(paths, eng, step_pattern=step_pattern, skip_first=skip_first, cache=not no_cache)
    doc = result.to_json()
    write_text(dumps_json(doc).decode() if fmt == "json" else render_text(doc), out)
