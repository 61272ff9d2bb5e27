"""The README and docs/: every relative link resolves, and the README stays a front door.

A link is `[text](target)` outside code; a target with no scheme must name a file of the
repository, relative to the page, and a `#fragment` must name a heading of the page it
points to (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def prose(markdown: str) -> str:
    """The page less its code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the page's headings (a repeated one gets -1, -2, ...)."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file or heading does not exist."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file here
            continue
        path_part, _, fragment = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked.read_text()):
            broken.append(f"{target}: no heading #{fragment} in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    """Each link to a file or a heading in the README and docs/ leads somewhere."""
    assert broken_links(page) == []


def test_the_docs_are_linked_from_the_readme():
    """Every page of docs/ can be reached from the README."""
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(prose(PAGES[0].read_text()))}
    assert {page.name for page in PAGES[1:]} <= linked


def test_the_readme_keeps_the_commands_ci_runs_and_stays_short():
    """CI runs the README's test command (.ci/run): the two set-up commands stay as they are."""
    readme = (ROOT / "README.md").read_text()
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in readme
    assert "bash packaging/install.sh && .venv/bin/specwire demo" in readme
    assert len(readme.splitlines()) < 200


def test_a_broken_link_is_reported(tmp_path):
    """A missing file, a missing heading and a link in code: the first two are reported."""
    (tmp_path / "other.md").write_text("# Other page\n\n## The service's start\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#the-services-start) [b](gone.md) [c](other.md#nowhere)\n"
                    "`[d](gone-too.md)` [e](https://example.org/x)\n```\n[f](gone-three.md)\n```\n")
    assert [problem.split(":")[0] for problem in broken_links(page)] == ["gone.md", "other.md#nowhere"]
