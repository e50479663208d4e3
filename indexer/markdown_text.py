"""Markdown as a reader sees it: the text a rendered page shows, not its source (#81).

A folder's ``.md`` files were indexed as source, so hits showed ``<!-- comments -->``, ``</Listing>``,
``<span class="filename">``, ``{{#include ../listings/...}}`` and ``[text][ref]`` syntax. Here the source is parsed
by markdown-it-py (CommonMark, with tables and strikethrough) and rendered to plain text:

- headings, paragraphs, list items, quotes and table rows each on their own line (a row's cells joined by " | ");
- code blocks kept as code (their lines as they are); inline code as its text;
- links and images as their text (an image's alt text); autolinks as their address;
- HTML blocks and inline HTML as their visible text (comments, ``<script>`` and ``<style>`` dropped, tags removed);
- reference-link definitions (``[ref]: https://...``) dropped, as a renderer does;
- template directives that static-site tools expand (mdBook's ``{{#include file}}``, ``{{#title ...}}``;
  Jinja / Liquid ``{% ... %}``) dropped: the files they name are not this page's text.

The title is the first heading's text (ATX or setext), without inline markup. :func:`render` also counts the
links and the share of the text that is link text: a page that is mostly links (mdBook's ``SUMMARY.md``, a
translation's contents ``README.md``) is a table of contents, which a folder's reader leaves out
(:func:`is_contents`): it matched every question's words and outranked the chapters it lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from twostage.indexer.html_text import VisibleText, html_text

__all__ = ["Rendered", "is_contents", "markdown_text", "render"]

CONTENTS_LINKS = 10  # a table of contents: at least this many links...
CONTENTS_SHARE = 0.7  # ...whose text is at least this share of the page's text

# {{#include ...}} and the other mdBook directives; {% ... %} (Jinja, Liquid)
_TEMPLATES = re.compile(r"\{\{#[^{}]*\}\}|\{%-?.*?-?%\}", re.DOTALL)


@lru_cache(maxsize=1)
def _parser() -> Any:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


@dataclass(frozen=True)
class Rendered:
    """A Markdown document as text: its first heading, its text, its links and the characters of their text."""

    title: str
    text: str
    links: int = 0
    link_chars: int = 0


def markdown_text(source: str) -> tuple[str, str]:
    """(title, text) of a Markdown document: the first heading's text and the document rendered to plain text."""
    page = render(source)
    return page.title, page.text


def is_contents(page: Rendered) -> bool:
    """Whether a rendered page is a table of contents: :data:`CONTENTS_LINKS` links or more, their text at least
    :data:`CONTENTS_SHARE` of the page's (headings and spaces aside)."""
    chars = sum(len(line) for line in page.text.splitlines()[1 if page.title else 0:])
    return page.links >= CONTENTS_LINKS and chars > 0 and page.link_chars >= CONTENTS_SHARE * chars


def render(source: str) -> Rendered:
    """The document rendered to plain text (the module's docstring says how), with its link counts."""
    tokens = _parser().parse(_TEMPLATES.sub("", source))
    counted = [0, 0]  # links, their characters
    lines: list[str] = []
    title: str | None = None
    in_heading = False
    row: list[str] | None = None
    for tok in tokens:
        kind = tok.type
        if kind == "heading_open":
            in_heading = True
        elif kind == "heading_close":
            in_heading = False
        elif kind == "tr_open":
            row = []
        elif kind == "tr_close":
            if row is not None and any(row):
                lines.append(" | ".join(row))
            row = None
        elif kind == "inline":
            text = _inline(tok.children or [], counted)
            if in_heading and title is None:
                title = text.strip()
            if row is not None:
                row.append(text.strip())
            elif text.strip():
                lines.append(text)
        elif kind in ("fence", "code_block"):
            code = tok.content.rstrip("\n")
            if code.strip():
                lines.append(code)
        elif kind == "html_block":
            shown = html_text(tok.content)[1]
            if shown:
                lines.append(shown)
    return Rendered(title or "", "\n".join(lines), counted[0], counted[1])


def _inline(children: list[Any], counted: list[int] | None = None) -> str:
    parts: list[str] = []
    tags = VisibleText()
    in_link = False
    for tok in children:
        kind = tok.type
        if kind in ("text", "code_inline"):
            if not tags.skipping:
                parts.append(tok.content)
                if in_link and counted is not None:
                    counted[1] += len(tok.content)
        elif kind == "link_open":
            in_link = True
            if counted is not None:
                counted[0] += 1
        elif kind == "link_close":
            in_link = False
        elif kind in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif kind == "image":
            parts.append(_inline(tok.children or []) or tok.content)
        elif kind == "html_inline":
            tags.feed(tok.content)  # a tag: nothing shown, but <script> or <style> hide what follows
            if tok.content.startswith("<br"):
                parts.append(" ")
    return " ".join("".join(parts).split())
