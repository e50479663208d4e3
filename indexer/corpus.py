"""Reading corpora: BEIR ``corpus.jsonl``, parquet, CSV/TSV and pandas DataFrames, streamed or in memory."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from twostage.indexer.errors import DataError, DataNotFoundError
from twostage.indexer.jsonl import iter_jsonl, optional_string, require_string_id
from twostage.indexer.records import Document, check_metadata

logger = logging.getLogger(__name__)

ID_KEYS = ("_id", "id", "doc_id", "docid")
TEXT_KEYS = ("text", "contents", "body")
_RESERVED = set(ID_KEYS) | set(TEXT_KEYS) | {"title", "metadata"}

CorpusSource = Any  # a path (BEIR dir, .jsonl, .parquet, .csv, .tsv), a DataFrame, an iterable of Documents, or
#                     a CorpusFields naming the columns of one of these


@dataclass(frozen=True)
class CorpusFields:
    """A corpus whose id, text or title live under other names (``--id-field``, ``--text-field``,
    ``--title-field``); fields left None use the BEIR names and their aliases."""

    source: Any
    id: str | None = None
    text: str | None = None
    title: str | None = None

    def rename(self, rec: dict[str, Any], where: str) -> dict[str, Any]:
        out = dict(rec)
        for given, ours, flag in ((self.id, "_id", "--id-field"), (self.text, "text", "--text-field"),
                                  (self.title, "title", "--title-field")):
            if given is None:
                continue
            if given not in rec:
                raise DataError(f"{where}: no field {given!r} ({flag}); its fields are: {', '.join(map(str, rec))}")
            value = out.pop(given)  # first: the field given may itself be one of the aliases (--text-field body)
            for alias in ((*ID_KEYS,) if ours == "_id" else (*TEXT_KEYS,) if ours == "text" else ("title",)):
                out.pop(alias, None)
            out[ours] = value
        return out


def document_from_record(obj: dict[str, Any], where: str) -> Document:
    """A checked Document from one corpus record (BEIR ``_id``/``title``/``text``/``metadata`` or aliases)."""
    doc_id = require_string_id(obj, ID_KEYS, where)
    where = f"{where} (document {doc_id!r})"
    text_key = next((k for k in TEXT_KEYS if k in obj), "text")
    text = optional_string(obj, text_key, where)
    title = optional_string(obj, "title", where)
    metadata: dict[str, Any] = {}
    extra = obj.get("metadata")
    if isinstance(extra, dict):
        metadata.update(extra)
    elif isinstance(extra, str) and extra:
        try:
            parsed = json.loads(extra)
        except json.JSONDecodeError:
            raise DataError(f"{where}: field 'metadata' is neither an object nor a JSON string") from None
        if isinstance(parsed, dict):
            metadata.update(parsed)
    metadata.update({k: v for k, v in obj.items() if k not in _RESERVED and v is not None})
    return Document(id=doc_id, text=text, title=title, metadata=metadata)


def _iter_rows(frame: Any, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for offset, row in enumerate(frame.to_dict("records")):  # pandas' missing value (NaN) is a missing field
        yield f"{name}: row {offset + 1}", {k: None if isinstance(v, float) and v != v else v for k, v in row.items()}


def _iter_source(source: CorpusSource) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, record)`` pairs; a record is a dict or already a Document."""
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        yield from _iter_rows(source, "DataFrame")
        return
    if isinstance(source, (str, Path)):
        path = Path(source)
        from twostage.indexer.files import FolderCorpus, is_folder_corpus

        if is_folder_corpus(path):  # a folder of .txt, .md, .html and .pdf files
            yield from ((doc.id, doc) for doc in FolderCorpus(path))
            return
        if path.is_dir():
            path = path / "corpus.jsonl"
        if not path.exists():
            raise DataNotFoundError(f"{path}: no such corpus (give a folder of .txt, .md, .html or .pdf files, a BEIR "
                                    "directory, or a .jsonl, .parquet, .csv or .tsv file)")
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            for number, obj in iter_jsonl(path):
                yield f"{path}:{number}", obj
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            row = 0
            try:
                parquet = pq.ParquetFile(path)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several types on a broken file
                raise DataError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0][:160]})") from None
            for batch in parquet.iter_batches(batch_size=4096):
                for rec in batch.to_pylist():
                    row += 1
                    yield f"{path}: row {row}", rec
        elif suffix in (".csv", ".tsv"):
            sep = "\t" if suffix == ".tsv" else ","
            row = 0
            try:
                chunks = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, chunksize=4096)
            except pd.errors.EmptyDataError:
                raise DataError(f"{path}: empty file; a CSV corpus needs a header line and one line per document") \
                    from None
            except (pd.errors.ParserError, UnicodeDecodeError) as exc:
                raise DataError(f"{path}: not a readable {suffix[1:].upper()} file ({str(exc)[:160]})") from None
            for chunk in chunks:
                for rec in chunk.to_dict("records"):
                    row += 1
                    yield f"{path}: line {row + 1}", rec
        else:
            raise DataError(f"{path}: unknown corpus format {suffix!r}; use .jsonl, .parquet, .csv or .tsv")
        return
    for number, item in enumerate(source, start=1):
        yield f"document #{number}", item


def iter_documents(source: CorpusSource, *, warn_empty: bool = True) -> Iterator[Document]:
    """Stream the documents of a corpus, checking each one, without holding the corpus in memory.

    Raises :class:`DataError` on a malformed record or a duplicate id (naming both places), and on an
    empty corpus. Documents with neither title nor text are kept and counted in a warning once the source is read
    to its end; ``warn_empty=False`` leaves the warning to another read of the same documents (a build reads its
    corpus several times: a sample for its languages, then every document once, and its passages after that), as
    does a :class:`Corpus`, which said it when it was loaded.
    """
    warn_empty = warn_empty and not isinstance(source, Corpus)
    seen: dict[str, str] = {}
    empty: list[str] = []
    fields = source if isinstance(source, CorpusFields) else None
    for where, rec in _iter_source(fields.source if fields else source):
        if fields is not None and isinstance(rec, dict):
            rec = fields.rename(rec, where)
        if not seen and isinstance(rec, dict) and not any(k in rec for k in (*TEXT_KEYS, "title")):
            raise DataError(f"{where}: no text field (expected one of {', '.join(TEXT_KEYS)} or title); its fields "
                            f"are: {', '.join(map(str, rec))}; name the text column with --text-field")
        doc = rec if isinstance(rec, Document) else document_from_record(dict(rec), where) if isinstance(rec, dict) else None
        if doc is None:
            raise DataError(f"{where}: expected a Document or a mapping, got {type(rec).__name__}")
        if doc.metadata:
            check_metadata(doc.metadata, f"{where}: document {doc.id!r}: metadata")
        if doc.id in seen:
            raise DataError(f"{where}: duplicate document id {doc.id!r} (first seen at {seen[doc.id]}); ids must be unique")
        seen[doc.id] = where
        if not doc.text.strip() and not doc.title.strip():
            empty.append(doc.id)
        yield doc
    if not seen:
        raise DataError(f"corpus {source if isinstance(source, (str, Path)) else type(source).__name__} has no documents")
    if empty and warn_empty:
        logger.warning("%d documents have neither title nor text (kept; first: %s)", len(empty), ", ".join(empty[:5]))


class Corpus(Sequence[Document]):
    """Documents in memory, in corpus order, with lookup by id. Row ``i`` is the ``i``-th document read."""

    def __init__(self, source: CorpusSource) -> None:
        self._docs = list(iter_documents(source))
        self._row = {d.id: i for i, d in enumerate(self._docs)}

    @classmethod
    def load(cls, source: CorpusSource) -> Corpus:
        return cls(source)

    @overload
    def __getitem__(self, i: int) -> Document: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Document]: ...
    def __getitem__(self, i: int | slice) -> Document | Sequence[Document]:
        return self._docs[i]

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._row

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self._docs]

    def row(self, doc_id: str) -> int:
        try:
            return self._row[doc_id]
        except KeyError:
            raise KeyError(f"document id {doc_id!r} is not in the corpus") from None

    def get(self, doc_id: str) -> Document:
        return self._docs[self.row(doc_id)]

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(
            {
                "id": [d.id for d in self._docs],
                "title": [d.title for d in self._docs],
                "text": [d.text for d in self._docs],
                "metadata": [json.dumps(dict(d.metadata), sort_keys=True) for d in self._docs],
            }
        )


def load_corpus(source: CorpusSource) -> Corpus:
    """Read a whole corpus into memory (see :func:`iter_documents` for the checks)."""
    return Corpus.load(source)
