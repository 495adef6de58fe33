"""The view of a speedup decomposition (`tracekit decompose`'s text): its typed document
(`tracekit.model.documents.Decompose`, docs/JSON.md#decompose) as lines."""

from __future__ import annotations

from tracekit.analyse.compare.decompose import CLASSES, RUNS
from tracekit.model import units
from tracekit.model.documents import Decompose


def text(doc: Decompose) -> str:
    """The verdict, each run's per-token time by class, the speedup and its parts, what each part saved."""

    def iv(key: str, pct: bool = False) -> str:
        v = getattr(doc.intervals, key)
        if not v:
            return ""
        return f" [{100 * v[0]:.0f}%-{100 * v[1]:.0f}%]" if pct else f" [{v[0]:.2f}-{v[1]:.2f}]"

    lines = [str(doc.verdict), ""]
    lines.append(f"{'run':<13} {'ms/token':>9} {'source':<11} " + " ".join(f"{c:>12}" for c in CLASSES))
    for k in RUNS:
        r = getattr(doc.runs, k)
        lines.append(
            f"{k:<13} {units.ms(r.per_token_ns):>9} {r.per_token_source:<11} "
            + " ".join(f"{units.ms(r.classes_ns[c]):>12}" for c in CLASSES)
        )
    sp, parts = doc.speedup, doc.parts
    lines += [
        "",
        f"speedup A/C {sp.total:.3f}x{iv('speedup')} = runtime A/B {sp.runtime:.3f}x{iv('runtime_speedup')}"
        f" x kernel B/C {sp.kernel:.3f}x{iv('kernel_speedup')}",
    ]
    if parts.runtime is not None and parts.kernel is not None:
        lines.append(
            f"log-scale parts: runtime {100 * parts.runtime:.1f}%{iv('runtime_part', True)}, "
            f"kernel {100 * parts.kernel:.1f}%{iv('kernel_part', True)} "
            f"(95% bootstrap: rounds, then steps within them; {doc.bootstrap.resamples} resamples)"
        )
    for part in ("runtime", "kernel"):
        mv = getattr(doc.moved, part)
        lines += [
            "",
            f"{part} part: {units.ms(mv.saved_ns)} ms per token saved, by class (ms, share of the saving):",
        ]
        for c in CLASSES:
            share = mv.share_of_saving[c]
            if mv.saved_by_class_ns[c] == 0 and not share:
                continue
            lines.append(
                f"  {c:<13} {units.ms(mv.saved_by_class_ns[c]):>9}  {'-' if share is None else f'{100 * share:.1f}%':>7}"
            )
    for n in doc.notes:
        lines.append(f"note: {n}")
    for n in dict.fromkeys(doc.data_quality.notes):
        lines.append(f"data quality: {n}")
    return "\n".join(lines) + "\n"
