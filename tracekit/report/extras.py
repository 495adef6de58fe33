"""Report sections for the other commands' JSON: decompose, advise, rho, whatif, diff.

`tracekit report --extra FILE.json` (repeatable) adds one section per file, chosen by the JSON's
`kind` (`tracekit.decompose`, `tracekit.advise`, `tracekit.rho`, `tracekit.whatif`,
`tracekit.diff`; docs/JSON.md). Data before rendering: `extra_section(doc, path)` returns an
`ExtraSection` (the one-sentence answer, its key figures, tables of printed cells, notes); the HTML
and Markdown renderers only lay it out, escaping every cell (names, paths and knob specs come from
the files). The numbers print through `data.fmt_*`, so a section reads the same in both formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tracekit.analyse.advise import cliff_sentences
from tracekit.errors import TracekitError, load_json_file
from tracekit.model import units
from tracekit.model.documents import Advise, Decompose, Diff, DocumentError, Rho, Whatif, convert, given
from tracekit.model.documents.diff import DiffCompute as DiffPart
from tracekit.model.documents.report import ReportKeyFigure
from tracekit.model.units import GIB, fmt_ms, fmt_pct, fmt_x
from tracekit.report.extra_section import ExtraSection, ExtraTable
from tracekit.report.sections.fmt import to_float

#: kind -> the command that writes it
EXTRA_KINDS: dict[str, str] = {
    "tracekit.decompose": "decompose",
    "tracekit.advise": "advise",
    "tracekit.rho": "rho",
    "tracekit.whatif": "whatif",
    "tracekit.diff": "diff",
}

TITLES = {
    "decompose": "Speedup decomposition (tracekit decompose)",
    "advise": "Shard or replicate (tracekit advise)",
    "rho": "Tensor-core vs CUDA-core throughput: rho (tracekit rho)",
    "whatif": "What-if replay (tracekit whatif)",
    "diff": "Before vs after (tracekit diff)",
}


class ExtraError(ValueError):
    """A file given with --extra is not a JSON result this report knows (the message says why)."""


# ----------------------------------------------------------------------------------------------
# loading


#: a document --extra takes, decoded (tracekit.model.documents)
ExtraDoc = Decompose | Advise | Rho | Whatif | Diff
#: kind -> its Struct
EXTRA_STRUCTS: dict[str, type[ExtraDoc]] = {
    "tracekit.decompose": Decompose,
    "tracekit.advise": Advise,
    "tracekit.rho": Rho,
    "tracekit.whatif": Whatif,
    "tracekit.diff": Diff,
}


class _ExtraFileError(TracekitError):
    """load_json_file's one-line error, re-raised as ExtraError."""


def load_extra(path: str | Path) -> ExtraDoc:
    """Read one --extra file, decoded once into its document Struct; ExtraError in one line naming
    the file and where it stops fitting: the byte when it is unreadable or not JSON
    (`errors.load_json_file`), its `kind` when of another kind, the JSON path when not of its
    kind's shape."""
    p = Path(path)
    try:
        obj = load_json_file(p, "--extra file", _ExtraFileError)
    except _ExtraFileError as exc:
        raise ExtraError(str(exc)) from None
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind not in EXTRA_KINDS:
        known = ", ".join(sorted(EXTRA_KINDS))
        got = f"kind {kind!r}" if isinstance(kind, str) else "no 'kind'"
        raise ExtraError(
            f"{p}: {got}; --extra takes the JSON of decompose, advise, rho, whatif or diff ({known})"
        )
    return _typed(obj, str(p))


def _typed(doc: ExtraDoc | Mapping[str, object], where: str | None) -> ExtraDoc:
    """`doc` as its kind's Struct (a decoded Struct as it is)."""
    if isinstance(doc, Decompose | Advise | Rho | Whatif | Diff):
        return doc
    kind = str(doc.get("kind"))
    if kind not in EXTRA_STRUCTS:
        raise ExtraError(f"{where or 'document'}: kind {kind!r} has no report section")
    try:
        return convert(doc, EXTRA_STRUCTS[kind])
    except DocumentError as exc:
        at = f" at {exc.where}" if exc.where else ""
        raise ExtraError(
            f"{where or 'document'}{at}: a {kind} document without the expected fields ({exc})"
        ) from None


def extra_sections(docs: Sequence[tuple[ExtraDoc | Mapping[str, object], str | None]]) -> list[ExtraSection]:
    """One section per (document, path), in the order given; keys made unique per command."""
    seen: dict[str, int] = {}
    out = []
    for doc, path in docs:
        typed = _typed(doc, path)
        cmd = EXTRA_KINDS[typed.kind]
        seen[cmd] = seen.get(cmd, 0) + 1
        key = cmd if seen[cmd] == 1 else f"{cmd}-{seen[cmd]}"
        out.append(extra_section(typed, path, key=key))
    return out


def extra_section(
    doc: ExtraDoc | Mapping[str, object], path: str | None = None, *, key: str | None = None
) -> ExtraSection:
    """The section of one result document (by its `kind`)."""
    typed = _typed(doc, path)
    kind = typed.kind
    cmd = EXTRA_KINDS[kind]
    try:
        if isinstance(typed, Decompose):
            parts = _decompose(typed)
        elif isinstance(typed, Advise):
            parts = _advise(typed)
        elif isinstance(typed, Rho):
            parts = _rho(typed)
        elif isinstance(typed, Whatif):
            parts = _whatif(typed)
        else:
            parts = _diff(typed)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ExtraError(
            f"{path or 'document'}: a {kind} document without the expected fields ({exc!r})"
        ) from None
    key = key or cmd
    figures = [msgspec.structs.replace(f, key=f"extra.{key}.{f.key}") for f in parts.figures]
    return ExtraSection(
        key=key,
        kind=kind,
        command=cmd,
        title=TITLES[cmd],
        path=path,
        answer=parts.answer,
        figures=figures,
        tables=[t.document() for t in parts.tables],
        lines=list(parts.lines),
        notes=[] if isinstance(typed, Diff) else [str(n) for n in typed.notes],
        text_columns=[t.text_columns for t in parts.tables],
    )


# ----------------------------------------------------------------------------------------------
# the sections


@dataclass
class _Parts:
    answer: str
    figures: list[ReportKeyFigure] = field(default_factory=list)
    tables: list[ExtraTable] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add(
        self, key: str, label: str, value: float | int | None, unit: str, text: str | None = None
    ) -> None:
        if value is None:
            return
        if text is None:
            text = {"ns": fmt_ms, "ratio": fmt_x, "share": fmt_pct}.get(unit, _num)(value)  # type: ignore[operator]
        self.figures.append(ReportKeyFigure(key=key, label=label, value=value, unit=unit, text=text))


def _f(x: Any) -> float | None:
    """`to_float`, but a bool is not a number here (a flag in another command's JSON)."""
    return None if isinstance(x, bool) else to_float(x)


def _num(x: Any) -> str:
    v = _f(x)
    if v is None:
        return "n/a"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _iv(iv: Any, fmt: Any) -> str:
    if not isinstance(iv, list | tuple) or len(iv) != 2 or _f(iv[0]) is None or _f(iv[1]) is None:
        return ""
    return f" [{fmt(iv[0])} to {fmt(iv[1])}]"


def _ms_signed(ns: Any) -> str:
    return units.ms(_f(ns), unit=True, sign=True, missing="n/a")


def _decompose(doc: Decompose) -> _Parts:
    p = _Parts(answer=str(doc.verdict))
    sp, parts, ivs = doc.speedup, doc.parts, doc.intervals
    for k, label, v, iv in (
        ("total", "speedup, baseline -> full", sp.total, ivs.speedup),
        ("runtime", "speedup, baseline -> intermediate (runtime part)", sp.runtime, ivs.runtime_speedup),
        ("kernel", "speedup, intermediate -> full (kernel part)", sp.kernel, ivs.kernel_speedup),
    ):
        v = _f(v)
        p.add(f"speedup.{k}", label, v, "ratio", None if v is None else fmt_x(v) + _iv(iv, fmt_x))
    for k, v, iv in (("runtime", parts.runtime, ivs.runtime_part), ("kernel", parts.kernel, ivs.kernel_part)):
        v = _f(v)
        p.add(
            f"parts.{k}",
            f"{k} part of the speedup (log scale)",
            v,
            "share",
            None if v is None else fmt_pct(v) + _iv(iv, fmt_pct),
        )
    words = doc.class_words
    classes = list(words) or ["matrix", "vector", "memory", "collective", "coordination", "unknown"]
    rows = []
    for role, r in (
        ("baseline", doc.runs.baseline),
        ("intermediate", doc.runs.intermediate),
        ("full", doc.runs.full),
    ):
        cn = r.classes_ns
        rows.append(
            (role, str(r.path or ""), "" if r.n_ranks is None else str(r.n_ranks), fmt_ms(r.per_token_ns))
            + tuple(fmt_ms(cn.get(c)) for c in classes)
        )
        p.add(f"per_token.{role}", f"per-token time, {role}", _f(r.per_token_ns), "ns")
    p.tables.append(
        ExtraTable(
            "Per-token time per run and its classes (per token)",
            ("run", "path", "ranks", "per token", *classes),
            tuple(rows),
            text_columns=(0, 1),
        )
    )
    moved = (("runtime", doc.moved.runtime), ("kernel", doc.moved.kernel))
    mrows = []
    for c in classes:
        row: tuple[str, ...] = (str(words.get(c, c)),)
        for _, m in moved:
            row += (_ms_signed(m.saved_by_class_ns.get(c)), fmt_pct(_f(m.share_of_saving.get(c))))
        mrows.append(row)
    total: tuple[str, ...] = ("saved in all",)
    for _, m in moved:
        total += (_ms_signed(m.saved_ns), "100.0%")
    mrows.append(total)
    p.tables.append(
        ExtraTable(
            "What moved: time saved per token by class in each part",
            ("class", "runtime part", "share", "kernel part", "share"),
            tuple(mrows),
        )
    )
    b = doc.bootstrap
    p.lines.append(f"Intervals: {fmt_pct(_f(b.level), 0)} bootstrap, {b.resamples} resamples ({b.levels}).")
    return p


def _advise(doc: Advise) -> _Parts:
    recs = doc.recommendations
    p = _Parts(answer=" ".join(str(r.text) for r in recs))
    mem = _f(doc.memory_per_gpu_bytes)
    memory = (
        f"{mem / GIB:.1f} GiB per GPU ({doc.memory_source}, "
        f"{(_f(doc.reserve_bytes) or 0) / GIB:.1f} GiB kept back)"
        if mem
        else "memory per GPU unknown"
    )
    layers = ""
    n_layers, traced = given(doc.layers), given(doc.layers_traced)
    if n_layers is not None:
        layers = f", memory for {n_layers} layers"
        if traced not in (None, n_layers):
            layers += f" (the traces have {traced})"
    p.lines.append(
        f"{doc.gpus} GPU(s), {memory}, context {doc.context} tokens, weights {doc.weight_dtype}{layers}."
    )
    rows = []
    for r in doc.options:
        m = r.memory_per_gpu_bytes
        weights, kv, tot = (None, None, None) if m is None else (m.weights, m.kv_cache, m.total)
        fits = {True: "yes", False: "NO", None: "?"}[r.fits]
        tps = _f(r.tokens_per_s)
        rows.append(
            (
                str(r.batch),
                str(r.option),
                fmt_ms(r.per_token_latency_ns),
                "n/a" if tps is None else f"{tps:,.0f}",
                f"{(_f(weights) or 0) / GIB:.2f}",
                f"{(_f(kv) or 0) / GIB:.3f}",
                f"{(_f(tot) or 0) / GIB:.2f}",
                fits,
                "" if r.status is None else str(r.status),
            )
        )
        tag = f"b{r.batch}.tp{r.tp}"
        p.add(f"{tag}.tokens_per_s", f"batch {r.batch}, {r.option}: tokens/s", tps, "number",
              None if tps is None else f"{tps:,.0f}")  # fmt: skip
        p.add(f"{tag}.memory", f"batch {r.batch}, {r.option}: memory per GPU",
              _f(tot), "bytes", f"{(_f(tot) or 0) / GIB:.2f} GiB")  # fmt: skip
    p.tables.append(
        ExtraTable(
            "Options per batch size",
            (
                "batch",
                "option",
                "per token",
                "tokens/s",
                "weights GiB",
                "KV cache GiB",
                "GiB per GPU",
                "fits",
                "status",
            ),
            tuple(rows),
            text_columns=(1, 8),
        )
    )
    p.lines += ["Memory cliff: " + s for s in cliff_sentences(doc)]
    return p


def _rho(doc: Rho) -> _Parts:
    dev = doc.device
    name = str(dev.name or "the device")
    rhos = [r for r in doc.rho if _f(r.rho) is not None]
    vec = "CUDA-core fp32 FMA" if dev.type == "cuda" else "vector fp32"
    mat = "tensor-core matrix" if dev.type == "cuda" else "matrix"
    if rhos:
        answer = (
            f"On {name}, rho ({mat} throughput / {vec} throughput) is "
            + ", ".join(f"{_num(r.rho)} ({r.dtype})" for r in rhos)
            + ": one vector operation costs the time of that many matrix operations, so vector work "
            "(dequantisation, norms, activations) weighs that much more than its operation count."
        )
    else:
        answer = f"On {name}, no rho was measured (no matrix dtype ran)."
    p = _Parts(answer=answer)
    for r in rhos:
        p.add(f"rho.{r.dtype}", f"rho, {r.dtype}", _f(r.rho), "number")
    rows = []
    for m in [*doc.matrix, *doc.vector]:
        rows.append(
            (
                str(m.kind),
                "" if m.dtype is None else str(m.dtype),
                "" if m.method is None else str(m.method),
                "" if m.shape is None else str(m.shape),
                _num(m.tops),
                _num(m.tops_max),
                _num(m.datasheet_tops) if m.datasheet_tops is not None else "",
                _num(m.anchor_tops) if m.anchor_tops is not None else "",
                str(m.skipped or ""),
            )
        )
    p.tables.append(
        ExtraTable(
            f"Throughput on {name} (T(FL)OP/s, median of the timed batches)",
            ("kind", "dtype", "method", "shape", "median", "max", "datasheet", "anchor", "skipped"),
            tuple(rows),
            text_columns=(0, 1, 2, 3, 8),
        )
    )
    p.tables.append(
        ExtraTable(
            "rho per dtype",
            ("dtype", "rho", "datasheet rho", "anchor rho"),
            tuple(
                (
                    str(r.dtype),
                    _num(r.rho),
                    _num(r.datasheet_rho) if r.datasheet_rho is not None else "",
                    _num(r.anchor_rho) if r.anchor_rho is not None else "",
                )
                for r in rhos
            ),
        )
    )
    return p


def _whatif(doc: Whatif) -> _Parts:
    pred, speed = doc.predicted_ns, doc.speedup_vs_tp1
    ns = list(next(iter(pred.values()))) if pred else []
    s_ns = _f(given(doc.shortfall_ns))
    shap = {k: _f(v) for k, v in (given(doc.shapley_ns) or {}).items()}
    shares = given(doc.shapley_shares) or {}
    check = given(doc.check)
    shap_rng = given(doc.shapley_ranges_ns) or {}
    if s_ns is not None and shap and given(doc.identified) is False:
        # which rank paid the profiler's cost is not identified: the split's ranges, no cause named
        spans = ", ".join(
            f"{k} {fmt_ms(lo)} to {fmt_ms(hi)}" for k, (lo, hi) in shap_rng.items() if k != "residual"
        )
        answer = (
            f"Of the shortfall S = {fmt_ms(s_ns)} per token, the replay's Shapley split is not identified: "
            "the profiler's cost was solved from one per-token time (no calibration in the manifest), and "
            f"which rank paid it moves the split ({spans}); capture with `tracekit capture` to measure it."
        )
    elif s_ns is not None and shap:
        ranked = sorted(
            ((k, v) for k, v in shap.items() if k != "residual" and v is not None), key=lambda kv: -kv[1]
        )
        head = ", ".join(f"{k} {fmt_ms(v)} ({fmt_pct(_f(shares.get(k)))})" for k, v in ranked[:3])
        answer = (
            f"Of the shortfall S = {fmt_ms(s_ns)} per token, the replay's Shapley split gives {head}"
            + (f"; residual {fmt_ms(shap.get('residual'))}" if shap.get("residual") is not None else "")
            + "."
        )
    else:
        best = None
        for spec, by_n in pred.items():
            if spec == "none":
                continue
            for n in ns:
                v = _f(by_n.get(n))
                if v is not None and (best is None or v < best[2]):
                    best = (spec, n, v)
        base = _f((pred.get("none") or {}).get(ns[0])) if ns else None
        answer = (
            f"Replayed at TP={best[1]}, {best[0]} takes the per-token time from {fmt_ms(base)} to {fmt_ms(best[2])}."
            if best is not None and base is not None
            else "No prediction."
        )
    if check:
        answer += (
            f" Check: {check.knobs} predicts {fmt_ms(check.predicted_ns)} at TP={check.ranks}; the run "
            f"measured {fmt_ms(check.measured_ns)} ({check.measured_source}): error "
            f"{_f(check.error) or 0:+.1%}."
        )
    p = _Parts(answer=answer)
    p.add("shortfall", "shortfall S", s_ns, "ns")
    for k, v in shap.items():
        p.add(f"shapley.{k}", f"Shapley: {k}", v, "ns")
    if check:
        p.add("check.error", f"check: {check.knobs} predicted vs measured", _f(check.error), "share",
              f"{_f(check.error) or 0:+.1%}")  # fmt: skip
    applies = {k.spec: k.applies for k in doc.knobs}
    rows = []
    for spec, by_n in pred.items():
        row: tuple[str, ...] = ("none (replay of the trace)" if spec == "none" else str(spec),)
        for n in ns:
            if spec in applies and not applies[spec].get(n, True):
                row += ("n/a", "")
                continue
            sp = _f((speed.get(spec) or {}).get(n))
            row += (fmt_ms(by_n.get(n)), "n/a" if sp is None else f"{sp:.2f}x")
        rows.append(row)
    heads: tuple[str, ...] = ("knobs",)
    for n in ns:
        heads += (f"TP={n} per token", f"TP={n} vs T1")
    p.tables.append(ExtraTable("Predicted per-token time per knob combination", heads, tuple(rows)))
    if s_ns is not None and shap:
        acc = given(doc.accounting)
        srows = [
            (str(k), f"{fmt_ms(shap_rng[k][0])} to {fmt_ms(shap_rng[k][1])}", "not identified")
            if k in shap_rng and shap_rng[k][0] != shap_rng[k][1]
            else (str(k), fmt_ms(v), fmt_pct(_f(shares.get(k))))
            for k, v in shap.items()
        ]
        srows.append(("S", fmt_ms(s_ns), "100.0%"))
        p.tables.append(
            ExtraTable("Shapley split of S (per token)", ("knob", "per token", "share of S"), tuple(srows))
        )
        if acc is not None and acc.terms_ns:
            p.tables.append(
                ExtraTable(
                    "Beside it, the shortfall's accounting",
                    ("term", "per token", "share of S"),
                    tuple(
                        (str(k), fmt_ms(v), fmt_pct(_f(acc.shares.get(k)))) for k, v in acc.terms_ns.items()
                    ),
                )
            )
    for key, r in (("baseline", doc.runs.baseline), ("sharded", given(doc.runs.sharded))):
        if r is not None:
            p.lines.append(
                f"{key} run (TP={r.ranks}, {r.timeline} timeline): {fmt_ms(r.per_token_ns)} "
                f"per token ({r.per_token_source})."
            )
    return p


def _diff(doc: Diff) -> _Parts:
    p = _Parts(answer=str(doc.summary or doc.verdict))
    pt, piv, iv = doc.per_token_ns, doc.per_token_interval_ns, doc.interval
    for role, ns, ns_iv in (("before", pt.before, piv.before), ("after", pt.after, piv.after)):
        v = _f(ns)
        p.add(f"per_token.{role}", f"per-token time, {role}", v, "ns",
              None if v is None else fmt_ms(v) + _iv(ns_iv, fmt_ms))  # fmt: skip
    ch = _f(doc.change_ns)
    p.add(
        "change",
        "change per token",
        ch,
        "ns",
        None if ch is None else _ms_signed(ch) + _iv(iv.change_ns, _ms_signed),
    )
    rel = _f(doc.relative_change)
    p.add("relative", "relative change", rel, "share",
          None if rel is None else f"{rel:+.1%}" + _iv(iv.relative, lambda x: f"{float(x):+.1%}"))  # fmt: skip
    terms, leaves = doc.by_part.terms, doc.by_part.leaves

    def row(label: str, v: DiffPart) -> tuple[str, ...]:
        return (
            label,
            fmt_ms(v.before_ns),
            fmt_ms(v.after_ns),
            _ms_signed(v.change_ns),
            _iv(v.interval_ns, _ms_signed).strip(" []").replace(" to ", " .. "),
        )

    if terms or leaves:
        # each term, then its parts indented under it (compute: matrix / vector; coordination: wait /
        # sync / idle), as `tracekit diff` prints them; a part under no term stays on its own
        subs = {"compute": ("matrix", "vector"), "coordination": ("wait", "sync", "idle")}
        rows: list[tuple[str, ...]] = []
        used: set[str] = set()
        for k, part in terms.items():
            rows.append(row(str(k), part))
            for leaf in subs.get(str(k), ()):
                if leaf in leaves and leaf != k:
                    rows.append(row(f"  {k}: {leaf}", leaves[leaf]))
                    used.add(leaf)
        rows += [row(str(k), v) for k, v in leaves.items() if k not in used and k not in terms]
        p.tables.append(
            ExtraTable(
                "By term and part (per token)",
                ("part", "before", "after", "change", "95% interval of the change"),
                tuple(rows),
            )
        )
    for role, r in (("before", doc.runs.before), ("after", doc.runs.after)):
        p.lines.append(
            f"{role}: {r.path} ({r.n_ranks} rank(s), {r.timeline} timeline, {r.steady_steps} steady steps)."
        )
    return p
