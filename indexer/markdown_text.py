"""Markdown as a reader sees it: the text a rendered page shows, not its source (#81).

A folder's ``.md`` files were indexed as source, so hits showed ``<!-- comments -->``, ``</Listing>``,
``<span class="filename">``, ``{{#include ../listings/...}}`` and ``[text][ref]`` syntax. Here the source is parsed
by markdown-it-py (CommonMark, with tables and strikethrough) and rendered to plain text:

- headings, paragraphs, list items, quotes and table rows each on their own line (a row's cells joined by " | ");
- code blocks kept as code (their lines as they are), less the lines mdBook hides in a Rust block (``# `` at the
  start of a line, ``#`` alone); inline code as its text;
- links and images as their text (an image's alt text); autolinks as their address;
- HTML blocks and inline HTML as their visible text (comments, ``<script>`` and ``<style>`` dropped, tags removed;
  a ``caption`` attribute, mdBook's ``<Listing number="4-1" caption="...">``, shown as "Listing 4-1: ...");
- reference-link definitions (``[ref]: https://...``) dropped, as a renderer does;
- template directives that static-site tools expand (mdBook's ``{{#include file}}``, ``{{#title ...}}``;
  Jinja / Liquid ``{% ... %}``; mkdocs' snippets ``--8<-- "file"``) dropped: the files they name are not this
  page's text;
- the Python-Markdown extensions mkdocs sites use: an admonition or a collapsible block (``!!! note "Title"``,
  ``??? tip``) and a content tab (``=== "Tab"``) as their title, their indented body as text (not as the code
  block CommonMark would make of it); icon shortcodes (``:material-check:``, ``:octicons-...:``), attribute
  lists (``{ .md-button }``), reference links to definitions the page does not hold (mkdocs-autorefs'
  ``[text][heading]``: their text), footnote marks (``[^1]``, a footnote's text kept) and abbreviation definitions
  dropped.

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

# {{#include ...}} and the other mdBook directives; {% ... %} (Jinja, Liquid); mkdocs' --8<-- snippets
_TEMPLATES = re.compile(r"\{\{#[^{}]*\}\}|\{%-?.*?-?%\}|^[ \t]*-{2}8<-{2}[^\n]*$", re.DOTALL | re.MULTILINE)
# an admonition (!!! note "Title"), a collapsible block (??? / ???+) or a content tab (=== "Title"): a title, then
# a body indented four spaces more
_BLOCK = re.compile(r'^([ \t]*)(?:(?:!!!|\?\?\?\+?)[ \t]+[\w-]+(?:[ \t]+[\w-]+)*|===\+?)(?:[ \t]+"(.*)")?[ \t]*$'
                    r'|^([ \t]*)\[\^[^\]\s]+\]:[ \t]*(.*)$')  # and a footnote: its text kept, its mark not
# an icon (:material-check:, :octicons-...:) anywhere; an emoji (:smile:) standing alone between spaces
_SHORTCODE = re.compile(r":(?:material|fontawesome|octicons|simple)-[\w-]+:|(?<!\S):[a-z][a-z0-9_+-]*:(?!\S)")
_ATTRIBUTES = re.compile(r"\{:?[ \t]*[.#][\w-][^{}\n]*\}")
# a reference link to a definition the page does not hold (mkdocs-autorefs resolves [text][heading.id] at build):
# its text, as the rendered page shows it; not inside words or code such as a[i][j]
_UNRESOLVED = re.compile(r"(?<![\w\]])\[([^\[\]\n]+)\]\[[^\[\]\n]*\]")
_FOOTNOTE = re.compile(r"\[\^[^\]\s]+\]")
_DEFINITION = re.compile(r"^[ \t]*\[[^\]\n]+\]:[ \t]*\S+[ \t]*$", re.MULTILINE)
_ABBREVIATION = re.compile(r"^\*\[[^\]]+\]:.*$", re.MULTILINE)
# a line mdBook hides in a Rust code block: `# ` then code, or `#` alone (not `#[derive]` nor `#![allow]`)
_HIDDEN_RUST = re.compile(r"^\s*#(?:\s|$)")


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
    tokens = _parser().parse(_extension_blocks(_ABBREVIATION.sub("", _TEMPLATES.sub("", source))))
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
            if kind == "fence" and tok.info.strip().lower().startswith("rust"):
                code = "\n".join(line for line in code.split("\n") if not _HIDDEN_RUST.match(line))
            if code.strip():
                lines.append(code)
        elif kind == "html_block":  # (a link definition runs into one when no blank line comes between)
            shown = _SHORTCODE.sub("", html_text(_DEFINITION.sub("", tok.content))[1])
            if shown:
                lines.append(shown)
    return Rendered(title or "", "\n".join(lines), counted[0], counted[1])


def _extension_blocks(source: str) -> str:
    """Admonitions, collapsible blocks and content tabs (see the module's docstring) as their title, then their
    body dedented to the title's indent (nested blocks too)."""
    if "!!!" not in source and "???" not in source and "===" not in source and "[^" not in source:
        return source
    return "\n".join(_blocks(source.split("\n")))


def _blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _BLOCK.match(lines[i])
        if m is None:
            out.append(lines[i])
            i += 1
            continue
        indent = len((m.group(1) if m.group(1) is not None else m.group(3)).expandtabs(4))
        title = m.group(2) if m.group(3) is None else m.group(4)
        # a block's body is indented four more than its title; a footnote's, four (Python-Markdown's rule)
        need = indent + 4 if m.group(3) is None or indent >= 4 else 4
        body: list[str] = []
        i += 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i].expandtabs(4)) -
                                  len(lines[i].expandtabs(4).lstrip()) >= need):
            body.append(lines[i].expandtabs(4)[need - indent:] if lines[i].strip() else "")
            i += 1
        out += ["", " " * indent + title, ""] if title else [""]
        out += _blocks(body)
    return out


def _inline(children: list[Any], counted: list[int] | None = None) -> str:
    parts: list[str] = []
    tags = VisibleText()
    in_link = False
    for tok in children:
        kind = tok.type
        if kind in ("text", "code_inline"):
            if not tags.skipping:
                shown = tok.content if kind == "code_inline" else \
                    _FOOTNOTE.sub("", _ATTRIBUTES.sub("", _SHORTCODE.sub("", tok.content)))
                parts.append(shown)
                if in_link and counted is not None:
                    counted[1] += len(shown)
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
    return _UNRESOLVED.sub(r"\1", " ".join("".join(parts).split()))
