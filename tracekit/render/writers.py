"""The writers every view renders through: a recording rich console (text tables for a terminal or
a file), Markdown tables and JSON text (a breakdown's CSV is its own `Breakdown.to_csv`). A view
builds its rows from a typed document; these turn rows into text, the same way for every command."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = [
    "Console",
    "Table",
    "console_text",
    "escape",
    "json_text",
    "markdown_cell",
    "markdown_table",
    "text_console",
    "titled_table",
]


def text_console(width: int | None, color: bool, default_width: int = 120) -> Console:
    """A console that records what is printed: `width` columns (`default_width` without one),
    colour codes only when `color`; `console_text` gives back what was printed."""
    return Console(
        record=True,
        width=width or default_width,
        force_terminal=color,
        no_color=not color,
        file=io.StringIO(),
    )


def titled_table(title: str, columns: Iterable[str], *, left: Collection[str] = (), **column: Any) -> Table:
    """A rich table of every view: its title on the left, then `columns`, right-aligned (numbers)
    but for those named in `left`; `column`: further settings of every column (`no_wrap=True`)."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right", **column)
    return t


def console_text(console: Console, color: bool = False) -> str:
    """What `console` printed, as text (with colour codes when `color`)."""
    return console.export_text(styles=color)


def json_text(doc: object) -> str:
    """A document as the JSON every command writes: indent 1, a newline at the end."""
    return json.dumps(doc, indent=1) + "\n"


def markdown_cell(text: str) -> str:
    """A Markdown table cell: a leading indent as non-breaking spaces (Markdown trims the spaces of
    a cell), `|` escaped, `<` `>` as entities."""
    body = text.lstrip(" ")
    return "&nbsp;" * (len(text) - len(body)) + body.replace("|", "\\|").replace("<", "&lt;").replace(
        ">", "&gt;"
    )


def _is_number_column(rows: Sequence[Sequence[str]], i: int) -> bool:
    return i > 0 and all(re.match(r"[-+]?[\d.]", r[i].strip()) for r in rows if i < len(r) and r[i].strip())


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, align_numbers: bool = True, cells: bool = True
) -> list[str]:
    """A Markdown table's lines: header, the rule (number columns right-aligned when
    `align_numbers`: every filled cell of the column reads as a number) and the rows; `cells`:
    each cell through `markdown_cell`, else as it is."""
    cell = markdown_cell if cells else str
    out = ["| " + " | ".join(cell(h) for h in header) + " |"]
    if align_numbers:
        out.append(
            "| "
            + " | ".join("---:" if _is_number_column(rows, i) else "---" for i in range(len(header)))
            + " |"
        )
    else:
        out.append("|" + " --- |" * len(header))
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return out
