"""From run folders to a `ReportData`, and from a `ReportData` to files.

`analyse_dirs` is the only place the report layer calls the analyses (reader, breakdown,
shortfall); it keeps only their documents, each decoded once into its typed Struct
(`tracekit.model.documents`: `analysed_document`), so everything after it works on typed data.
`write_report` picks the format from each output's suffix (.html, .md, .json).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from tracekit.analyse.analysed import AnalysedRun
from tracekit.analyse.attribution.pair import shortfall
from tracekit.analyse.compute.kernels import top_kernels
from tracekit.analyse.timeline.breakdown import breakdown
from tracekit.errors import TracekitError
from tracekit.model.documents import (
    Breakdown,
    Links,
    ProbeRow,
    Shortfall,
    TopKernels,
    decode,
)
from tracekit.model.documents import Manifest as ManifestDoc
from tracekit.read import read_run
from tracekit.read.probe import read_rows_file
from tracekit.report.data import ReportData, build_report_data
from tracekit.report.extra_section import ExtraSection
from tracekit.report.extras import ExtraError, extra_sections, load_extra
from tracekit.report.markdown import render_markdown

T = TypeVar("T")

FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".json": "json"}


class ReportError(TracekitError):
    """A report cannot be written (unknown output suffix, unreadable links file)."""


@dataclass
class AnalysedRuns:
    """The analyses' documents for one report, typed."""

    breakdown: Breakdown
    manifest: ManifestDoc | None
    baseline_breakdown: Breakdown | None = None
    baseline_manifest: ManifestDoc | None = None
    shortfall: Shortfall | None = None
    #: per run, the top kernels per class in the steady steps (`tracekit.analyse.compute.kernels.top_kernels`)
    top_kernels: TopKernels | None = None
    baseline_top_kernels: TopKernels | None = None


def analysed_document(result: Any, type_: type[T]) -> T:
    """An analysis' result (an object with `to_json()`, or its JSON dict) as its typed document:
    through JSON once, so only JSON-able data reaches the report (numpy scalars -> numbers)."""
    d = result.to_json() if hasattr(result, "to_json") else result
    return decode(orjson.dumps(d, option=orjson.OPT_SERIALIZE_NUMPY), type_)


def analyse_dirs(
    run_dir: str | Path, baseline_dir: str | Path | None = None, *, step_pattern: str | None = None
) -> AnalysedRuns:
    """Read the run (and the baseline), run breakdown (and shortfall); keep only their JSON.

    Each run is analysed once (`AnalysedRun`: classified, its steps found and partitioned once),
    and that analysis serves both its breakdown and the shortfall."""
    run = AnalysedRun.of(read_run([Path(run_dir)]))
    out = AnalysedRuns(
        breakdown=analysed_document(breakdown(run, step_pattern=step_pattern), Breakdown),
        manifest=run.manifest,
    )
    out.top_kernels = top_kernels_document(run, step_pattern)
    if baseline_dir is not None:
        base = AnalysedRun.of(read_run([Path(baseline_dir)]))
        out.baseline_breakdown = analysed_document(breakdown(base, step_pattern=step_pattern), Breakdown)
        out.baseline_manifest = base.manifest
        out.baseline_top_kernels = top_kernels_document(base, step_pattern)
        out.shortfall = analysed_document(shortfall(base, run), Shortfall)
    return out


def top_kernels_document(run: Any, step_pattern: str | None) -> TopKernels:
    """The report's top kernels per class of an analysed run (`tracekit.analyse.compute.kernels`)."""
    return analysed_document(top_kernels(run.events, run.steps(step_pattern).steps), TopKernels)


def load_links(path: str | Path) -> Links | list[ProbeRow]:
    """A compare-links result (an object with `rows`) or a probe JSON (a list of rows), decoded
    once into its Struct (`tracekit.read.probe.read_rows_file`); ReportError in one line naming the
    file and where it stops fitting: the byte when it is unreadable or not JSON, the JSON path when a
    field is not of its Struct's shape."""
    return read_rows_file(path, Links, what="links file", error=ReportError)


def report_from_dirs(
    run_dir: str | Path,
    baseline_dir: str | Path | None = None,
    *,
    links: Links | list[ProbeRow] | None = None,
    links_note: str | None = None,
    step_pattern: str | None = None,
    title: str | None = None,
    extras: list[ExtraSection] | None = None,
) -> ReportData:
    a = analyse_dirs(run_dir, baseline_dir, step_pattern=step_pattern)
    return report_from_analyses(
        a, run_path=str(run_dir), baseline_path=None if baseline_dir is None else str(baseline_dir),
        links=links, links_note=links_note, title=title, extras=extras,
    )  # fmt: skip


def report_from_analyses(
    a: AnalysedRuns,
    *,
    run_path: str | None,
    baseline_path: str | None,
    links: Links | list[ProbeRow] | None = None,
    links_note: str | None = None,
    title: str | None = None,
    extras: list[ExtraSection] | None = None,
) -> ReportData:
    return build_report_data(
        breakdown=a.breakdown,
        baseline_breakdown=a.baseline_breakdown,
        shortfall=a.shortfall,
        links=links,
        manifest=a.manifest,
        baseline_manifest=a.baseline_manifest,
        top_kernels=a.top_kernels,
        baseline_top_kernels=a.baseline_top_kernels,
        run_path=run_path,
        baseline_path=baseline_path,
        links_note=links_note,
        title=title,
        extras=extras,
    )


def load_extras(paths: Sequence[str | Path]) -> list[ExtraSection]:
    """The sections of the --extra files (decompose / advise / rho / whatif / diff JSON, by `kind`);
    ReportError naming the file when one is unreadable or of another kind."""
    try:
        return extra_sections([(load_extra(p), str(p)) for p in paths])
    except ExtraError as exc:
        raise ReportError(str(exc)) from None


def format_of(path: str | Path) -> str:
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ReportError(f"{path}: unknown report format; the suffix picks it: {', '.join(sorted(FORMATS))}")
    return fmt


def render(data: ReportData, fmt: str, *, offline: bool = True) -> str:
    if fmt == "html":
        from tracekit.report.html import render_html  # plotly (imported by report.html) only for HTML

        return render_html(data, offline=offline)
    if fmt == "markdown":
        return render_markdown(data)
    if fmt == "json":
        return (
            orjson.dumps(data.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
            + "\n"
        )
    raise ReportError(f"unknown report format {fmt!r}")


def write_report(data: ReportData, outputs: Sequence[str | Path], *, offline: bool = True) -> list[Path]:
    """Write each output (format by suffix); returns the paths written. The HTML inlines plotly.js
    unless `offline=False` (`--cdn`)."""
    fmts = [(Path(o), format_of(o)) for o in outputs]  # check every suffix before writing any
    written: list[Path] = []
    # HTML last: it alone needs plotly, and a machine without it still gets the other formats
    for path, fmt in sorted(fmts, key=lambda pf: pf[1] == "html"):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = render(data, fmt, offline=offline)
        except ModuleNotFoundError as exc:
            done = ", ".join(str(p) for p in written) or "nothing"
            raise ReportError(
                f"{path}: the HTML report needs {exc.name} (pip install {exc.name}); written: {done}"
            ) from None
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return [path for path, _ in fmts]  # in the order asked for
