"""A folder of files as a corpus: .txt, .md, .html and .pdf read as they are.

Every file below the folder whose suffix is one of :data:`SUFFIXES` is one document (hidden files and folders are
passed over): its id is its path relative to the folder (with ``/``), its title comes from the file (the HTML
``<title>``, the first Markdown heading, the PDF's metadata; none for plain text), and its metadata holds the path,
the type and the modification time (an ISO date, so ``{"modified": {"$gte": "2026-01-01"}}`` filters by it).

HTML is turned into text by a real parser (the standard library's :class:`html.parser.HTMLParser`: scripts,
styles and the head are left out, block elements end a line); PDF text is extracted by pypdf (the ``pdf`` extra).
A file that cannot be read (not UTF-8, binary, empty, a broken PDF) is logged as one warning line naming it and
skipped, or, with ``strict``, stops the reading with a :class:`DataError` naming it; :attr:`FolderCorpus.skipped`
lists the files skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

from twostage.indexer.errors import DataError, DataNotFoundError, MissingDependencyError
from twostage.indexer.records import Document

logger = logging.getLogger(__name__)
SUFFIXES = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html",
            ".htm": "html", ".pdf": "pdf"}
LABELS = {"text": "plain text", "markdown": "Markdown", "html": "HTML", "pdf": "PDF"}


class UnreadableFile(Exception):
    """Why one file cannot be a document (the message completes "PATH: ...")."""


@dataclass
class FolderCorpus:
    """The documents of the files below ``root``, read one at a time in path order (iterate it once per use)."""

    root: Path
    strict: bool = False
    show_progress: bool = False
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (relative path, why), from the last read
    read: int = 0  # documents read by the last iteration
    ignored: int = 0  # files with another suffix

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise DataNotFoundError(f"{self.root}: no such folder")

    def files(self) -> list[Path]:
        """The files that are read, in order; counts the others in ``ignored``."""
        out, ignored = [], 0
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root)
            if any(part.startswith(".") for part in rel.parts) or not path.is_file():
                continue
            if path.suffix.lower() in SUFFIXES:
                out.append(path)
            else:
                ignored += 1
        self.ignored = ignored
        return out

    def __iter__(self) -> Iterator[Document]:
        from tqdm.auto import tqdm

        files = self.files()
        if not files:
            raise DataError(f"{self.root}: no .txt, .md, .html or .pdf files (and no corpus.jsonl); put documents "
                            "there or give a corpus file")
        self.skipped, self.read = [], 0
        with tqdm(total=len(files), desc="read files", unit="file", disable=not self.show_progress) as bar:
            for path in files:
                rel = path.relative_to(self.root).as_posix()
                try:
                    doc = read_file(path, rel)
                except UnreadableFile as exc:
                    if self.strict:
                        raise DataError(f"{path}: {exc}; fix or remove it, or build without --strict to skip it") \
                            from None
                    logger.warning("skipped %s: %s", path, exc)
                    self.skipped.append((rel, str(exc)))
                else:
                    self.read += 1
                    yield doc
                bar.update(1)

    def summary(self) -> str:
        skipped = f", {len(self.skipped)} skipped (unreadable, each named above)" if self.skipped else ""
        ignored = f", {self.ignored} other files ignored" if self.ignored else ""
        return f"{self.read} files read{skipped}{ignored}"


def is_folder_corpus(path: Path) -> bool:
    """A folder that is not a BEIR directory (no corpus.jsonl)."""
    return path.is_dir() and not (path / "corpus.jsonl").exists()


def read_file(path: Path, rel: str) -> Document:
    """One file as a Document (id ``rel``); UnreadableFile says why it cannot be one."""
    kind = SUFFIXES[path.suffix.lower()]
    try:
        raw = path.read_bytes()
        modified = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    except OSError as exc:
        raise UnreadableFile(f"cannot be read ({exc.strerror or exc})") from None
    if not raw.strip():
        raise UnreadableFile("empty file")
    if kind == "pdf":
        title, text = _pdf(raw)
    else:
        if b"\x00" in raw[:8192]:
            raise UnreadableFile(f"a binary file, not {LABELS[kind]}")
        try:
            source = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UnreadableFile(f"not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
        title, text = _html(source) if kind == "html" else _markdown(source) if kind == "markdown" else ("", source)
    if not text.strip() and not title.strip():
        raise UnreadableFile("no text in it")
    metadata = {"path": rel, "type": kind, "modified": modified.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return Document(rel, text.strip(), title.strip(), metadata)


def _markdown(source: str) -> tuple[str, str]:
    """The first heading (``# Title`` or a line underlined with ``===``/``---``) and the text as it is."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            heading = stripped.lstrip("#")
            if not heading or heading.startswith(" "):
                return heading.strip().rstrip("#").strip(), source
        if stripped and i + 1 < len(lines) and set(lines[i + 1].strip()) in ({"="}, {"-"}) \
                and len(lines[i + 1].strip()) >= 3:
            return stripped, source
    return "", source


class _Text(HTMLParser):
    """Visible text of an HTML page and its <title>."""

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


def _html(source: str) -> tuple[str, str]:
    parser = _Text()
    parser.feed(source)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return " ".join("".join(parser.title).split()), "\n".join(line for line in lines if line)


def _pdf(raw: bytes) -> tuple[str, str]:
    try:
        import pypdf
    except ImportError:
        raise MissingDependencyError("PDF files need pypdf: pip install 'twostage-search[pdf]'") from None
    import io

    try:
        reader = pypdf.PdfReader(io.BytesIO(raw))
        if reader.is_encrypted:
            raise UnreadableFile("an encrypted PDF; decrypt it first")
        title = str((reader.metadata or {}).get("/Title") or "")
        text = "\n".join(page.extract_text() or "" for page in reader.pages)
    except UnreadableFile:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf raises many types on a broken file
        raise UnreadableFile(f"not a readable PDF ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") \
            from None
    return title, text
