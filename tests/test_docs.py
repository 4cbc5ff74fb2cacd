"""The README stays a newcomer's page whose links resolve; the docs carry no diary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.MULTILINE)
# Session and before/after wording: history belongs to git, not to the pages.
DIARY = re.compile(r"this session|previous session|the session before|previous run", re.I)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs' toc both write it for these pages."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path, anchor: str) -> set[str]:
    """The page's heading anchors (with `anchor` itself when none is asked for)."""
    if not anchor:
        return {anchor}
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return {_slug(h) for h in HEADING.findall(text)}


def test_the_readme_is_a_newcomers_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move the detail to docs/"
    assert "make run" in lines and "make test" in lines


@pytest.mark.parametrize("source", [README, *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)  # fmt: skip
def test_relative_links_resolve(source: Path) -> None:
    broken = []
    for target in LINK.findall(source.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        page = (source.parent / path).resolve() if path else source
        if not page.exists() or (page.suffix == ".md" and anchor not in _anchors(page, anchor)):
            broken.append(target)
    assert broken == []


def test_no_page_keeps_a_diary() -> None:
    pages = [README, ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")]
    found = [f"{p.name}: {m.group(0)}" for p in pages for m in DIARY.finditer(p.read_text())]
    assert found == []
