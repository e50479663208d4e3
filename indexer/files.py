"""A folder of files as a corpus: .txt, .md, .html and .pdf read as a reader sees them (Markdown rendered to text).

Every file below the folder whose suffix is one of :data:`SUFFIXES` is one document (hidden files and folders are
passed over): its id is its path relative to the folder (with ``/``), its title comes from the file (the HTML
``<title>``, the first Markdown heading, the PDF's metadata; none for plain text), and its metadata holds the path,
its folder (``guide/setup``; ``.`` at the top) and section (the folder's first part: ``guide``), the type and the
modification time (an ISO date, so ``{"modified": {"$gte": "2026-01-01"}}`` filters by it).

Markdown front matter (YAML between ``---`` lines, TOML between ``+++`` lines, at the top of the file, as mkdocs,
Jekyll, Hugo and pandoc write it) is metadata, not text: its ``title`` is the document's title, its other fields
with plain values (strings, numbers, dates, lists of them) join the metadata. Heading attributes (mkdocs' and
pandoc's ``# Title { #anchor .class }``) are dropped from the title and the text.

HTML is turned into text by a real parser (the standard library's :class:`html.parser.HTMLParser`: scripts,
styles and the head are left out, block elements end a line); PDF text is extracted by pypdf (the ``pdf`` extra).
A file that cannot be read (not UTF-8, binary, empty, a broken PDF, a PDF without pypdf installed, larger than
``max_file_bytes``, a symbolic link out of the folder) is logged as one warning line naming it and skipped, or,
with ``strict``, stops the reading with a :class:`DataError` naming it; :attr:`FolderCorpus.skipped` lists the
files skipped.
"""

from __future__ import annotations

import logging
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from twostage.indexer.errors import ConfigError, DataError, DataNotFoundError
from twostage.indexer.html_text import html_text
from twostage.indexer.records import Document, check_metadata

logger = logging.getLogger(__name__)
SUFFIXES = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html",
            ".htm": "html", ".pdf": "pdf"}
LABELS = {"text": "plain text", "markdown": "Markdown", "html": "HTML", "pdf": "PDF"}


MAX_FILE_BYTES = 20_000_000  # a larger file is skipped (about 3 million words of text: hours to encode)


class UnreadableFile(Exception):
    """Why one file cannot be a document (the message completes "PATH: ...")."""


class ContentsPage(Exception):
    """A Markdown file that is a table of contents: left out of a folder's documents (not an error)."""


@dataclass(frozen=True)
class FoundFile:
    """A file the folder holds: where it is, its id (the path relative to the folder) and its size in bytes."""

    path: Path
    rel: str
    size: int


@dataclass
class FolderCorpus:
    """The documents of the files below ``root``, read one at a time in path order (iterate it once per use).

    Reading stays inside the folder: a symbolic link whose target is outside it is skipped with one line unless
    ``follow_symlinks``; a folder reached twice (a link loop, or a link to a folder already read) is read once. A
    file over ``max_file_bytes`` is skipped with one line.
    """

    root: Path
    strict: bool = False
    show_progress: bool = False
    follow_symlinks: bool = False
    max_file_bytes: int = MAX_FILE_BYTES
    keep_contents: bool = False  # read tables of contents too (a Markdown page that is mostly links)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (relative path, why), from the last read
    contents: list[str] = field(default_factory=list)  # tables of contents left out by the last read
    read: int = 0  # documents read by the last iteration
    ignored: int = 0  # files with another suffix

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise DataNotFoundError(f"{self.root}: no such folder")
        if isinstance(self.max_file_bytes, bool) or not isinstance(self.max_file_bytes, int) \
                or self.max_file_bytes <= 0:
            raise ConfigError(f"max_file_bytes must be a positive integer, got {self.max_file_bytes!r}")

    def files(self) -> list[FoundFile]:
        """The files that are read, in path order; counts the others in ``ignored`` and lists in ``skipped`` the
        ones passed over before reading (links out of the folder, files over the size limit)."""
        found, self.ignored, _ = walk(self.root, self.follow_symlinks, self.max_file_bytes)
        return found

    def __iter__(self) -> Iterator[Document]:
        from tqdm.auto import tqdm

        files, self.ignored, passed = walk(self.root, self.follow_symlinks, self.max_file_bytes)
        self.skipped, self.contents, self.read = [], [], 0
        for rel, why in passed:
            self._skip(rel, why)
        if not files:
            raise DataError(f"{self.root}: no .txt, .md, .html or .pdf files to read (and no corpus.jsonl)"
                            + (f"; {len(self.skipped)} skipped, each named above" if self.skipped else "")
                            + "; put documents there or give a corpus file")
        total = sum(f.size for f in files)
        with tqdm(total=total, desc=f"read {len(files)} files", unit="B", unit_scale=True,
                  disable=not self.show_progress) as bar:
            for i, f in enumerate(files, 1):
                try:
                    doc = read_file(f.path, f.rel, self.max_file_bytes, keep_contents=self.keep_contents)
                except ContentsPage:
                    logger.info("left out %s: a table of contents (its text is mostly links to other pages)",
                                self.root / f.rel)
                    self.contents.append(f.rel)
                except UnreadableFile as exc:
                    self._skip(f.rel, str(exc))
                else:
                    self.read += 1
                    yield doc
                bar.update(f.size)
                bar.set_postfix_str(f"{i}/{len(files)} files", refresh=False)

    def _skip(self, rel: str, why: str) -> None:
        path = self.root / rel
        if self.strict:
            raise DataError(f"{path}: {why}; fix or remove it, or build without --strict to skip it")
        logger.warning("skipped %s: %s", path, why)
        self.skipped.append((rel, why))

    def summary(self) -> str:
        skipped = f", {len(self.skipped)} skipped (each named above)" if self.skipped else ""
        ignored = f", {self.ignored} other files ignored" if self.ignored else ""
        n, names = len(self.contents), ", ".join(self.contents[:3]) + (", ..." if len(self.contents) > 3 else "")
        contents = f", {n} table{'s' if n > 1 else ''} of contents left out ({names})" if n else ""
        return f"{self.read} files read{skipped}{contents}{ignored}"


def walk(root: Path, follow_symlinks: bool, max_bytes: int) -> tuple[list[FoundFile], int, list[tuple[str, str]]]:
    """Every file below ``root`` with a suffix of :data:`SUFFIXES`, in path order; how many files have another
    suffix; and the ones passed over with why. Hidden files and folders are left out; each folder is read once (by
    device and inode), so link loops end."""
    inside = root.resolve()
    found: list[FoundFile] = []
    ignored = 0
    passed: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            st = folder.stat()
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            passed.append((prefix.rstrip("/") or ".", f"a folder that cannot be read ({exc.strerror or exc})"))
            continue
        if (st.st_dev, st.st_ino) in seen:
            passed.append((prefix.rstrip("/"), "a folder already read (a link loop, or a second link to it)"))
            continue
        seen.add((st.st_dev, st.st_ino))
        folders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = prefix + entry.name
            path = Path(entry.path)
            link = entry.is_symlink()
            try:
                target_st = path.stat()
            except OSError:
                if Path(entry.name).suffix.lower() in SUFFIXES:
                    passed.append((rel, "a symbolic link to nothing" if link else "cannot be read"))
                continue
            if link and not follow_symlinks:
                target = path.resolve()
                if target != inside and inside not in target.parents:
                    if stat.S_ISDIR(target_st.st_mode) or Path(entry.name).suffix.lower() in SUFFIXES:
                        passed.append((rel, f"a symbolic link to {target}, outside the folder; move it in, or "
                                            "read links out of the folder with --follow-symlinks"))
                    continue
            if stat.S_ISDIR(target_st.st_mode):
                folders.append((path, rel + "/"))
            elif not stat.S_ISREG(target_st.st_mode):
                continue  # a device, socket or pipe is no document
            elif Path(entry.name).suffix.lower() not in SUFFIXES:
                ignored += 1
            elif target_st.st_size > max_bytes:
                passed.append((rel, f"{target_st.st_size / 1e6:,.1f} MB, over the limit of {max_bytes / 1e6:,.1f} MB "
                                    "a file; raise it with --max-file-mb, or split the file"))
            else:
                found.append(FoundFile(path, rel, target_st.st_size))
        stack.extend(reversed(folders))
    return sorted(found, key=lambda f: f.rel), ignored, sorted(passed)


def is_folder_corpus(path: Path) -> bool:
    """A folder that is not a BEIR directory (no corpus.jsonl)."""
    return path.is_dir() and not (path / "corpus.jsonl").exists()


def read_file(path: Path, rel: str, max_bytes: int = MAX_FILE_BYTES, *, keep_contents: bool = True) -> Document:
    """One file as a Document (id ``rel``); UnreadableFile says why it cannot be one (one over ``max_bytes``
    too: it is read no further than that); ContentsPage, unless ``keep_contents``, that a Markdown file is a table
    of contents (:func:`twostage.indexer.markdown_text.is_contents`)."""
    kind = SUFFIXES[path.suffix.lower()]
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
            modified = datetime.fromtimestamp(os.fstat(fh.fileno()).st_mtime, tz=timezone.utc)
    except OSError as exc:
        raise UnreadableFile(f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise UnreadableFile(f"over the limit of {max_bytes / 1e6:,.1f} MB a file; raise it with --max-file-mb")
    if not raw.strip():
        raise UnreadableFile("empty file")
    front: dict[str, object] = {}  # a Markdown file's front matter
    if kind == "pdf":
        title, text = _pdf(raw)
    else:
        if b"\x00" in raw[:8192]:
            raise UnreadableFile(f"a binary file, not {LABELS[kind]}")
        try:
            source = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise UnreadableFile(f"not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
        if kind == "markdown":
            fields, source = front_matter(source, rel)
            front = {k: v for k, v in ((k, _plain(v)) for k, v in fields.items()) if v is not None}
            title, text = _markdown(source, keep_contents)
            title = str(front.pop("title", "") or "").strip() or title
        else:
            title, text = html_text(source) if kind == "html" else ("", source)
    if not text.strip() and not title.strip():
        raise UnreadableFile("no text in it")
    folder = rel.rpartition("/")[0] or "."
    metadata: dict[str, object] = {"path": rel, "folder": folder, "section": folder.partition("/")[0], "type": kind,
                                   "modified": modified.strftime("%Y-%m-%dT%H:%M:%SZ")}
    metadata = {**{k: v for k, v in front.items() if k not in metadata}, **metadata}
    return Document(rel, text.strip(), title.strip(), metadata)


_FENCES = {"---": "yaml", "+++": "toml"}
# a heading's attribute block: { #id .class key=value } (mkdocs attr_list, pandoc), at the end of the heading
_ATTRIBUTES = re.compile(r"[ \t]*\{:?[ \t]*(?:[#.][\w:-]+|[\w-]+=(?:\"[^\"]*\"|\S+))"
                         r"(?:[ \t]+(?:[#.][\w:-]+|[\w-]+=(?:\"[^\"]*\"|\S+)))*[ \t]*\}[ \t]*$")
_HEADING_ATTRIBUTES = re.compile(r"^(#{1,6}[ \t].*?)" + _ATTRIBUTES.pattern[:-1] + r"$", re.MULTILINE)


def front_matter(source: str, where: str = "") -> tuple[dict[str, Any], str]:
    """The fields of the front matter ``source`` starts with (YAML between ``---`` lines, TOML between ``+++``
    lines; parsed safely) and the text after it; when there is none, or it is not a mapping of fields: nothing and
    the text as it is (``where`` names the text in the debug line)."""
    fence = source[:source.find("\n")].rstrip() if "\n" in source else ""
    if fence not in _FENCES:  # (most texts: decided before any split)
        return {}, source
    lines = source.split("\n")
    ends = (fence, "...") if fence == "---" else (fence,)
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ends), None)
    if end is None:
        return {}, source
    head = "\n".join(lines[1:end])
    import yaml  # type: ignore[import-untyped]  # no types shipped

    try:
        if _FENCES[fence] == "yaml":
            fields = yaml.safe_load(head) if head.strip() else {}
        else:
            from importlib import import_module

            fields = import_module("tomllib").loads(head)  # Python 3.11+ (on 3.10 a TOML front matter stays text)
    except (ImportError, yaml.YAMLError, ValueError, RecursionError) as exc:  # left in the text
        # (tomllib.TOMLDecodeError is a ValueError)
        logger.debug("%s: front matter not read (%s)", where, exc)
        return {}, source
    if not isinstance(fields, dict):
        return {}, source
    return {str(k): v for k, v in fields.items()}, "\n".join(lines[end + 1:])


def _plain(value: object) -> object:
    """A front-matter value as metadata: strings, numbers, booleans and dates (as ISO text), lists of them; None
    for anything else (nested tables are left out)."""
    import datetime as dt

    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, float) and math.isnan(value):  # never equal to itself: useless to filter on
        return None
    if isinstance(value, (str, bool, int, float)):
        try:
            check_metadata(value, "front matter")
        except DataError:
            return None
        return value
    if isinstance(value, list):
        items = [_plain(v) for v in value]
        return items if items and all(v is not None and not isinstance(v, list) for v in items) else None
    return None


def _markdown(source: str, keep_contents: bool = True) -> tuple[str, str]:
    """The first heading (ATX or setext) and the text as a rendered page shows it
    (:func:`twostage.indexer.markdown_text.render`), headings without their attribute blocks."""
    from twostage.indexer.markdown_text import is_contents, render

    page = render(_HEADING_ATTRIBUTES.sub(r"\1", source))
    if not keep_contents and is_contents(page):
        raise ContentsPage
    return _ATTRIBUTES.sub("", page.title), page.text


def _pdf(raw: bytes) -> tuple[str, str]:
    try:
        import pypdf
    except ImportError:
        raise UnreadableFile("PDF files need pypdf: pip install 'twostage-search[pdf]'") from None
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
