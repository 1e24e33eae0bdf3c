"""The README and docs/ stay true and usable: short enough to read, every link resolves, every
command the README shows runs, and no code cites an issue number instead of saying why.

Why a test: docs drift silently. A newcomer who follows a dead link or a command that no longer
runs stops trusting every number after it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$")


def _outside_code(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a ``# comment`` in bash is not a heading)."""
    out: list[str] = []
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text, flags=re.UNICODE)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a page's headings give, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _outside_code(page.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file or anchor does not exist."""
    bad: list[str] = []
    for line in _outside_code(page.read_text(encoding="utf-8")):
        for m in _LINK.finditer(line):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                bad.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                bad.append(f"{page.name}: {target} (no such heading)")
    return bad


def test_slug_follows_github() -> None:
    assert slug("GPU time: why is my GPU idle?") == "gpu-time-why-is-my-gpu-idle"
    assert slug("From Lightning, Hugging Face and torch.profiler") == "from-lightning-hugging-face-and-torchprofiler"
    assert slug("The `--csv` option") == "the---csv-option"


def test_the_link_check_finds_a_dead_link_and_a_dead_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## Real part\n\n[ok](#real-part) [gone](b.md) [bad](#nope)\n")
    assert broken_links(tmp_path / "a.md") == ["a.md: b.md (no such file)", "a.md: #nope (no such heading)"]


def test_readme_reads_in_ten_minutes() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; topic pages belong in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_no_code_cites_an_issue_number() -> None:
    found = []
    for path in sorted((ROOT / "dpcore").rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bissue #?\d+", line, flags=re.IGNORECASE):
                found.append(f"{path.relative_to(ROOT)}:{n}")
    assert found == [], "say why in words; the history belongs in commits"
