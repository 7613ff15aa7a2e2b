"""Relative links in README.md and docs/ name files that exist, and their #anchors name headings; every
file under benchmarks/results/ is linked from a page (a result nobody cites is deleted: git keeps it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RESULTS = ROOT / "benchmarks" / "results"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(path: Path) -> str:
    """The file's text without fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", path.read_text()))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, only letters, digits, spaces, - and _; spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, with GitHub's -1, -2 … for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        base = slug(re.sub(r"`", "", heading))
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of one markdown file whose file or #anchor does not exist."""
    broken = []
    for target in LINK.findall(prose(path)):
        if re.match(r"(https?|mailto):", target):
            continue
        name, _, anchor = target.partition("#")
        dest = (path.parent / name).resolve() if name else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


def linked_files(pages: list[Path]) -> set[Path]:
    """Every file a relative link of ``pages`` names (resolved; anchors and web links left out)."""
    found = set()
    for page in pages:
        for target in LINK.findall(prose(page)):
            name = target.partition("#")[0]
            if name and not re.match(r"(https?|mailto):", name):
                found.add((page.parent / name).resolve())
    return found


def test_every_result_is_linked_from_a_page() -> None:
    """benchmarks/results/ holds what the docs cite: each file there is linked from README.md, a page
    under docs/ or a Markdown file under benchmarks/ (a table linking its plot counts)."""
    linked = linked_files([*DOCS, *sorted((ROOT / "benchmarks").rglob("*.md"))])
    assert sorted(p.name for p in RESULTS.iterdir() if p.resolve() not in linked) == []


def test_the_guide_stays_short() -> None:
    """The guide holds what a user needs (issue 74): README.md at most 8 KB, each page under docs/ at
    most 12 KB (the evidence lives in docs/research/ and benchmarks/results/, not held to it)."""
    assert (ROOT / "README.md").stat().st_size <= 8_000
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert {p.name: p.stat().st_size for p in pages if p.stat().st_size > 12_000} == {}
