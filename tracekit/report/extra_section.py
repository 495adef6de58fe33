"""A report section of another command's result (`--extra`): the data both renderers lay out.

Its own module so that the report document (`tracekit.report.data`) and the sections' builders
(`tracekit.report.extras`) need not import each other."""

from __future__ import annotations

import msgspec

from tracekit.model.documents.report import ReportExtra, ReportKeyFigure, ReportTable


class ExtraTable(msgspec.Struct, frozen=True):
    """A table of printed cells. `text_columns`: the columns holding names from the file (escaped
    as text in Markdown); the others hold numbers and fixed words. Not in the JSON."""

    caption: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    text_columns: tuple[int, ...] = (0,)


class ExtraSection(msgspec.Struct, frozen=True, kw_only=True):
    """One command's result as a report section.

    `key` is unique in the report (`decompose`, `advise`, `advise-2`, ...): the section's figures
    carry keys `extra.<key>.<figure>` in every format, like `ReportData.key_figures`."""

    key: str
    kind: str
    command: str
    title: str
    path: str | None
    answer: str
    figures: tuple[ReportKeyFigure, ...] = ()
    tables: tuple[ExtraTable, ...] = ()
    lines: tuple[str, ...] = ()  # further sentences under the tables (the memory cliff, a check)
    notes: tuple[str, ...] = ()

    def document(self) -> ReportExtra:
        """The section as the report's JSON holds it (`extras[]`: the tables without text_columns)."""
        return ReportExtra(
            key=self.key,
            kind=self.kind,
            command=self.command,
            title=self.title,
            path=self.path,
            answer=self.answer,
            figures=list(self.figures),
            tables=[
                ReportTable(caption=t.caption, headers=list(t.headers), rows=[list(r) for r in t.rows])
                for t in self.tables
            ],
            lines=list(self.lines),
            notes=list(self.notes),
        )
