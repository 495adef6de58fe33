"""A report section of another command's result (`--extra`): the data both renderers lay out.

Its own module so that the report document (`tracekit.report.data`) and the sections' builders
(`tracekit.report.extras`) need not import each other."""

from __future__ import annotations

import msgspec

from tracekit.model.documents.report import ReportExtra, ReportTable


class ExtraTable(msgspec.Struct, frozen=True):
    """A table of printed cells, as the builders write it. `text_columns`: the columns holding
    names from the file (escaped as text in Markdown); the others hold numbers and fixed words."""

    caption: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    text_columns: tuple[int, ...] = (0,)

    def document(self) -> ReportTable:
        """The table as the report's JSON holds it (without `text_columns`)."""
        return ReportTable(
            caption=self.caption, headers=list(self.headers), rows=[list(r) for r in self.rows]
        )


class ExtraSection(ReportExtra, kw_only=True):
    """One command's result as a report section: the JSON's `extras[]` object (`ReportExtra`) and,
    per table, its `text_columns` (`ExtraTable`), which the renderers need and the JSON leaves out.

    `key` is unique in the report (`decompose`, `advise`, `advise-2`, ...): the section's figures
    carry keys `extra.<key>.<figure>` in every format, like `ReportData.key_figures`."""

    text_columns: list[tuple[int, ...]]

    def document(self) -> ReportExtra:
        """The section as the report's JSON holds it (`extras[]`: its fields less `text_columns`)."""
        return ReportExtra(**{f: getattr(self, f) for f in ReportExtra.__struct_fields__})
