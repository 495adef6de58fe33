"""A clone carries what it cites (issue 24): every "docs/METHOD.md section <name>" in the code,
the tests and the docs names a `## ` heading of docs/METHOD.md, and nothing points into the
shared folder beside the checkout (a clone does not have it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHOD = ROOT / "docs" / "METHOD.md"


def _headings() -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^## (.+)$", METHOD.read_text(), re.M)]


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for sub in ("tracekit", "tests"):
        files += sorted((ROOT / sub).rglob("*.py"))
    return files


def _citations(text: str) -> list[str]:
    """The section names cited in `text` (whitespace collapsed, so a citation may wrap a line)."""
    flat = re.sub(r"\s+", " ", text)
    out: list[str] = []
    for m in re.finditer(r"METHOD\.md sections ((?:\"[^\"]+\"(?:, | and )?)+)", flat):
        out += re.findall(r"\"([^\"]+)\"", m.group(1))
    for m in re.finditer(r"METHOD\.md section (.{0,80})", flat):
        out.append(m.group(1))
    return out


def test_every_method_citation_names_a_heading() -> None:
    heads = _headings()
    assert len(heads) >= 10, heads
    bad = []
    n = 0
    for f in _sources():
        if f == METHOD or f.name == "test_docs_refs.py":
            continue
        for cited in _citations(f.read_text(encoding="utf-8")):
            n += 1
            # the longest heading the citation starts with, followed by a non-letter (or the end)
            ok = any(re.match(re.escape(h) + r"(?![A-Za-z])", cited) for h in heads)
            if not ok:
                bad.append(f"{f.relative_to(ROOT)}: section {cited[:50]!r}")
    assert n >= 30, f"only {n} citations found: the pattern no longer matches how the code cites"
    assert not bad, "citations of docs/METHOD.md that name no heading:\n" + "\n".join(bad)


def test_no_citation_by_number_of_the_reference_method() -> None:
    hits = []
    for f in _sources():
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"METHOD\.md (sections? )?\d", line):
                hits.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)


def test_nothing_points_into_the_shared_folder() -> None:
    hits = []
    for f in [*_sources(), *sorted((ROOT / "tracekit").rglob("*.md"))]:
        if f.parts[-2] == "tests" or "tests" in f.relative_to(ROOT).parts[:1]:
            continue  # tests may read third-party traces from there (they skip without it)
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if "../shared" in line:
                hits.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()[:80]}")
    assert not hits, "\n".join(hits)
