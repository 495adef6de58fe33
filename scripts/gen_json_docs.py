#!/usr/bin/env python3
"""Write docs/JSON.md from the document Structs (tracekit/model/documents/reference.py).

python scripts/gen_json_docs.py           # write docs/JSON.md
python scripts/gen_json_docs.py --check   # exit 1 when docs/JSON.md is not up to date
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tracekit.model.documents.reference import render  # noqa: E402


def main(argv: list[str]) -> int:
    target = ROOT / "docs" / "JSON.md"
    text = render()
    if "--check" in argv:
        if target.read_text() != text:
            print(f"{target} is not up to date: run python scripts/gen_json_docs.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
