"""HTML as a reader sees it: the visible text of a page (or of a fragment, Markdown's HTML blocks and tags) and its
<title>; scripts, styles, the head and comments left out, a line for each block, a ``caption`` attribute shown."""

from __future__ import annotations

from html.parser import HTMLParser

__all__ = ["VisibleText", "html_text"]


class VisibleText(HTMLParser):
    """Visible text of an HTML page (or a fragment: Markdown's HTML blocks and tags) and its <title>; ``skipping``
    says whether the last tag fed opened a script, style or other hidden part."""

    SKIP = {"script", "style", "head", "noscript", "template", "svg"}
    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "header",
              "footer", "blockquote", "pre", "table", "ul", "ol", "dd", "dt", "hr", "main", "nav", "aside"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self.skipping = 0
        self.in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
        elif tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")
        caption = dict(attrs).get("caption")
        if caption and not self.skipping:  # mdBook's <Listing number="4-1" caption="...">: shown above the code
            number = dict(attrs).get("number")
            label = f"{tag.capitalize()} {number}: " if number else ""
            self.parts.append(f"\n{label}{caption.replace('`', '')}\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        elif tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
        elif not self.skipping:
            self.parts.append(data)


def html_text(source: str) -> tuple[str, str]:
    """The <title> and the visible text of HTML, one line a block, blank lines dropped."""
    parser = VisibleText()
    parser.feed(source)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return " ".join("".join(parser.title).split()), "\n".join(line for line in lines if line)
