"""The README stays a guide (short, every local link resolves); the docs' links resolve too."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_is_short_and_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    assert "# 1. install everything and run the demo" in text and "# 2. install everything and run the tests" in text


def test_every_local_link_resolves():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            assert path.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
            if anchor and path.suffix == ".md":
                slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                         for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
                assert anchor in slugs, f"{page.relative_to(ROOT)} links to {target}: no such heading"
