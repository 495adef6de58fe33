"""Text safe on the HTML page: every string from a trace or a manifest escaped (`esc`), and JSON
embedded in a `<script type="application/json">` block with `<`, `>` and `&` written as `\\u003c`,
`\\u003e`, `\\u0026`, so no name can close the script element (`safe_json`)."""

from __future__ import annotations

import html
import json
from typing import Any


def esc(value: Any) -> str:
    """HTML-escape any value (quotes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def safe_json(obj: Any) -> str:
    """JSON for embedding inside a <script> element: `<`, `>`, `&` and U+2028/9 escaped."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_json_default)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o)}")
