"""BM25's corpus statistics and postings, and its weights for any statistics: what lets a shard score with the
whole corpus's statistics and an update skip analysing the documents it keeps.

bm25s computes its document frequencies, document count and average length from the documents it indexes, has no
way to take them from elsewhere, and keeps only the weights, not the term counts they came from. So this module
keeps the :class:`Postings` (each document's term counts and length, the term x document matrix in CSC form) and
computes the same weights as bm25s's Lucene variant from them, with the statistics passed in:

    w(t, d) = float32( idf32(t) * tf / (k1 * ((1 - b) + b * |d| / avgdl) + tf) )   (the quotient in float64)
    idf32(t) = float32( ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)) )

with the floating-point operations in bm25s's order, so that with a corpus's own statistics the weights are bit for
bit bm25s's (tested), and with global statistics a document scores in its shard exactly as in one engine.

A corpus of several languages: each document is scored with the statistics of the documents analysed in its unit
(:func:`~twostage.retriever.languages.statistics_group`: CJK characters, Thai-like syllables, or words), so a
Chinese document scores exactly as in an engine of the corpus's CJK documents alone. One set for all scored whole
languages as long or short (a Chinese sentence is its characters and their bigrams, twice the terms of an English
one): in a de + ru + zh + en engine XQuAD-R's Chinese test queries lost 0.024 nDCG@10 that way
(benchmarks/results/languages_mixed.md). A corpus in one unit, or an index saved before each document's language was
kept, has one set. An update
(:meth:`Postings.updated`) drops the deleted documents' postings and analyses only the new documents; the weights are
then recomputed from the counts (numpy, a slice at a time), never from the texts.

The BM25 index directory (:func:`read_bm25_files`, :func:`write_bm25_files`): JSON and ``.npy`` files only,
checksummed, written atomically. :class:`twostage.retriever.bm25.BM25Retriever` (``save``, ``load``, ``write_files``)
turns them into a retriever, so the dependency points one way (bm25 -> bm25_stats).

    BM25_DIR/
      manifest.json   format, version, BM25 and analyzer config, counts, size and sha256 of every file
      doc_ids.json    document ids in row order
      vocab.json      term -> column of the weight matrix
      weights.data.npy, weights.indices.npy, weights.indptr.npy   the bm25s CSC term x document weights
      postings.counts.npy   each weight's term count (int32), so an update need not analyse the kept documents
      doc_lengths.npy       each document's number of terms (int32)

The last two came with format version 3; an index without them (versions 1 and 2) still loads, and an update
rebuilds it from the stored documents.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.atomic import load_npy
from twostage.indexer.errors import DataError, IndexFormatError
from twostage.indexer.manifest import (
    check_file_entries,
    describe_files,
    manifest_text,
    read_manifest_json,
    verify_files,
)
from twostage.retriever.languages import statistics_group

_STEP = 1 << 22  # postings weighted at a time (bounds the float64 temporaries)


@dataclass(frozen=True)
class CorpusStats:
    """What BM25 needs to know of a corpus: document count, total length in terms, document frequency by term; and
    ``groups``: the same for the documents of each statistics group (unit of analysis), or None where the documents'
    languages are not known (an index saved before they were kept)."""

    num_docs: int
    total_length: int
    doc_freqs: Mapping[str, int] = field(repr=False)
    groups: Mapping[str, CorpusStats] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, analysed: Iterable[tuple[Sequence[str], str]]) -> CorpusStats:
        """The statistics of analysed documents (each its terms and its language)."""
        n, total, df = 0, 0, Counter[str]()
        groups: dict[str, list[Any]] = {}
        for terms, language in analysed:
            n += 1
            total += len(terms)
            unique = set(terms)
            df.update(unique)
            group = groups.setdefault(statistics_group(language), [0, 0, Counter[str]()])
            group[0] += 1
            group[1] += len(terms)
            group[2].update(unique)
        return cls(n, total, df, {name: cls(*g) for name, g in groups.items()})

    @classmethod
    def combine(cls, parts: Iterable[CorpusStats]) -> CorpusStats:
        """The statistics of the union of disjoint corpora (e.g. every shard)."""
        n, total, df = 0, 0, Counter[str]()
        groups: dict[str, list[Any]] | None = {}
        for p in parts:
            n, total = n + p.num_docs, total + p.total_length
            df.update(p.doc_freqs)
            if p.groups is None:  # one part without languages: one set of statistics for all
                groups = None
            elif groups is not None:
                for name, g in p.groups.items():
                    have = groups.setdefault(name, [0, 0, Counter[str]()])
                    have[0] += g.num_docs
                    have[1] += g.total_length
                    have[2].update(g.doc_freqs)
        return cls(n, total, df, None if groups is None else {name: cls(*g) for name, g in groups.items()})

    @property
    def avgdl(self) -> float:
        # np.mean of the lengths (bm25s): the float64 sum of integers is exact, then one rounded division
        return self.total_length / self.num_docs


@dataclass(frozen=True, eq=False)
class Postings:
    """Each document's term counts, as the term x document matrix in CSC form, and each document's length.

    Column ``c`` (the term ``terms[c]``) holds the postings ``indptr[c]:indptr[c + 1]``: the documents (``rows``,
    ascending, as scipy orders them) and how often the term occurs there (``counts``). A term's document frequency
    is its column's length; ``lengths[d]`` is document ``d``'s number of terms; ``languages[d]`` the position of its
    language in ``language_codes`` (None, with no codes, in an index saved before languages were kept).
    """

    terms: Sequence[str] = field(repr=False)
    indptr: np.ndarray = field(repr=False)
    rows: np.ndarray = field(repr=False)
    counts: np.ndarray = field(repr=False)
    lengths: np.ndarray = field(repr=False)
    languages: np.ndarray | None = field(default=None, repr=False)
    language_codes: tuple[str, ...] = ()

    @property
    def num_docs(self) -> int:
        return len(self.lengths)

    def vocab(self) -> dict[str, int]:
        """term -> column, plus bm25s's empty term (in its vocabulary, without a column)."""
        vocab = {t: c for c, t in enumerate(self.terms)}
        vocab.setdefault("", len(vocab))
        return vocab

    def stats(self) -> CorpusStats:
        """The statistics of these documents alone."""
        groups = None
        grouped = self._doc_groups()
        if grouped is not None:
            doc_group, names = grouped
            df, docs, lengths = self._group_counts(doc_group, len(names))
            groups = {name: CorpusStats(int(docs[g]), int(lengths[g]),
                                        {self.terms[c]: int(df[g, c]) for c in np.flatnonzero(df[g]).tolist()})
                      for g, name in enumerate(names) if docs[g]}
        return CorpusStats(self.num_docs, int(self.lengths.sum(dtype=np.int64)),
                           dict(zip(self.terms, np.diff(self.indptr).tolist())), groups)

    def _doc_groups(self) -> tuple[np.ndarray, tuple[str, ...]] | None:
        """Each document's statistics group (a position in the names returned with it), or None where the
        documents' languages are not known."""
        if self.languages is None:
            return None
        names: dict[str, int] = {}
        of_code = np.array([names.setdefault(statistics_group(c), len(names)) for c in self.language_codes],
                           dtype=np.int64)
        return (of_code[np.asarray(self.languages)] if len(of_code) else np.zeros(self.num_docs, np.int64),
                tuple(names))

    def _group_counts(self, doc_group: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each group's document frequencies (groups x terms), document counts and total lengths."""
        v = len(self.terms)
        df = np.zeros(n_groups * v, dtype=np.int64)
        for a, z, col in self._slices():
            df += np.bincount(doc_group[self.rows[a:z]] * v + col, minlength=n_groups * v)
        docs = np.bincount(doc_group, minlength=n_groups)
        lengths = np.bincount(doc_group, weights=np.asarray(self.lengths, dtype=np.float64), minlength=n_groups)
        return df.reshape(n_groups, v), docs, lengths.astype(np.int64)

    @classmethod
    def of_chunks(cls, chunks: Iterable[Sequence[tuple[Sequence[str], str]]]) -> Postings:
        """The postings of analysed documents (each its terms and its language) given a chunk at a time (columns in
        order of first occurrence): one chunk's terms are held at once, plus its postings (12 bytes each: row,
        column, count) until every chunk is read and they are placed, chunk by chunk, in the CSC arrays (8 bytes a
        posting)."""
        vocab: dict[str, int] = {}
        terms: list[str] = []
        parts: list[Any] = []
        lengths: list[Any] = []
        codes: dict[str, int] = {}
        languages: list[Any] = []
        n = 0
        for chunk in chunks:
            doc_terms = [t for t, _ in chunk]
            languages.append(_language_rows(chunk, codes))
            rows, cols, tfs, lens = _chunk_postings(doc_terms, vocab, terms, n)
            order = np.argsort(cols, kind="stable")  # by column, rows ascending within each
            parts.append((rows[order].astype(_row_dtype(n + len(doc_terms))), cols[order].astype(np.int32),
                          tfs[order]))
            lengths.append(lens)
            n += len(doc_terms)
        per_col = np.zeros(len(terms), dtype=np.int64)
        for _, cols, _ in parts:
            per_col += np.bincount(cols, minlength=len(terms))
        indptr = _indptr(per_col, n)
        rows_out = np.empty(int(indptr[-1]), dtype=indptr.dtype)
        counts = np.empty(int(indptr[-1]), dtype=np.int32)
        next_free = indptr[:-1].astype(np.int64)  # where each column's next row goes
        parts.reverse()
        while parts:  # in row order, each chunk's postings appended to their columns, then the chunk freed
            rows, cols, tfs = parts.pop()
            if not len(cols):
                continue
            starts = np.flatnonzero(np.concatenate(([True], cols[1:] != cols[:-1])))
            sizes = np.diff(np.append(starts, len(cols)))
            at = next_free[cols] + (np.arange(len(cols)) - np.repeat(starts, sizes))
            rows_out[at], counts[at] = rows, tfs
            next_free[cols[starts]] += sizes
        return cls(terms, indptr, rows_out, counts, np.concatenate(lengths) if lengths else np.zeros(0, np.int32),
                   np.concatenate(languages) if languages else np.zeros(0, np.uint8), tuple(codes))

    def updated(self, keep: np.ndarray, analysed: Sequence[tuple[Sequence[str], str]]) -> Postings:
        """The postings of the documents ``keep`` marks (their order kept, renumbered from 0) followed by the
        ``analysed`` documents (each its terms and its language). Only the new documents are counted; the kept ones'
        postings are copied. Terms left without a document are dropped."""
        new_docs = [t for t, _ in analysed]
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (self.num_docs,):
            raise DataError(f"the keep mask has {len(keep)} entries for {self.num_docs} documents")
        kept_n = int(keep.sum())
        remap: np.ndarray = (np.cumsum(keep, dtype=np.int64) - 1).astype(_row_dtype(kept_n + len(new_docs)))
        mask = keep[self.rows]
        # every column holds a posting (none is ever written empty; check() refuses files that hold one)
        kept_per_col = np.add.reduceat(mask, self.indptr[:-1], dtype=np.int64) if len(self.terms) else \
            np.zeros(0, dtype=np.int64)
        kept_rows = remap[self.rows[mask]]
        kept_counts = np.asarray(self.counts[mask], dtype=np.int32)
        del mask, remap
        terms = list(self.terms)
        vocab = {t: c for c, t in enumerate(terms)}
        rows, cols, tfs, lens = _chunk_postings(new_docs, vocab, terms, kept_n)
        order = np.argsort(cols, kind="stable")
        rows, cols, tfs = rows[order], cols[order], tfs[order]
        per_col = np.zeros(len(terms), dtype=np.int64)
        per_col[:len(kept_per_col)] = kept_per_col
        per_col += np.bincount(cols, minlength=len(terms))
        ends = np.cumsum(kept_per_col)  # a column's new postings go after its kept ones (their rows are larger)
        at = np.full(len(cols), len(kept_rows), dtype=np.int64)  # new terms' columns come last, in order
        old = cols < len(ends)
        at[old] = ends[cols[old]]
        live = per_col > 0
        indptr = _indptr(per_col[live], kept_n + len(new_docs))
        rows_out = np.insert(kept_rows, at, rows).astype(indptr.dtype, copy=False)
        del kept_rows  # each kept array freed once copied: ~21 bytes a posting at the peak, the old index included
        counts_out = np.insert(kept_counts, at, tfs)
        del kept_counts
        languages: np.ndarray | None = None
        codes: tuple[str, ...] = ()
        if self.languages is not None:  # (an index saved without its documents' languages keeps one set of stats)
            known = {c: i for i, c in enumerate(self.language_codes)}
            new_languages = _language_rows(analysed, known)
            languages = np.concatenate([np.asarray(self.languages)[keep].astype(np.uint8), new_languages])
            codes = tuple(known)
        return Postings([t for t, alive in zip(terms, live) if alive], indptr, rows_out, counts_out,
                        np.concatenate([np.asarray(self.lengths)[keep].astype(np.int32), lens]), languages, codes)

    def weights(self, stats: CorpusStats | None, k1: float, b: float) -> np.ndarray:
        """The BM25 weight of every posting (float32, aligned with ``rows``), scored with ``stats`` (default: these
        documents' own statistics), which must cover every term; each document with its group's statistics where
        the corpus has several groups (units of analysis)."""
        grouped = self._doc_groups()
        if grouped is not None:
            doc_group, names = grouped
            groups = stats.groups if stats is not None else {names[g] for g in np.unique(doc_group).tolist()}
            if groups is not None and len(groups) > 1:
                return self._grouped_weights(stats, doc_group, names, k1, b)
        if stats is None:
            stats = CorpusStats(self.num_docs, int(self.lengths.sum(dtype=np.int64)), {})
            df = np.diff(self.indptr)
        else:
            df = np.fromiter((stats.doc_freqs.get(t, 0) for t in self.terms), dtype=np.int64, count=len(self.terms))
        if stats.num_docs <= 0 or stats.total_length <= 0:
            raise DataError("BM25 statistics over no terms: the corpus has no text")
        _check_covered(df, lambda i: self.terms[i])
        idf32 = _idf32(df.reshape(1, -1), np.array([stats.num_docs]))[0]
        avgdl = stats.avgdl
        return self._weighted(lambda rows, col: idf32[col], lambda rows: avgdl, k1, b)

    def _grouped_weights(self, stats: CorpusStats | None, doc_group: np.ndarray, names: tuple[str, ...], k1: float,
                         b: float) -> np.ndarray:
        """:meth:`weights` with each document scored with its group's statistics (``stats.groups``, or these
        documents' own)."""
        if stats is None:
            df, docs, lengths = self._group_counts(doc_group, len(names))
        else:
            assert stats.groups is not None
            df = np.zeros((len(names), len(self.terms)), dtype=np.int64)
            docs, lengths = np.zeros(len(names), np.int64), np.zeros(len(names), np.int64)
            for g, name in enumerate(names):
                part = stats.groups.get(name)
                if part is not None:
                    df[g] = np.fromiter((part.doc_freqs.get(t, 0) for t in self.terms), np.int64, len(self.terms))
                    docs[g], lengths[g] = part.num_docs, part.total_length
        used = np.unique(doc_group)
        if np.any(docs[used] <= 0) or np.any(lengths[used] <= 0):
            raise DataError("BM25 statistics over no terms for a language of these documents: compute them over "
                            "every document, and give every language's documents some text")
        idf32 = _idf32(df, np.maximum(docs, 1))  # groups x terms
        averages = lengths / np.maximum(docs, 1)

        def idf(rows: np.ndarray, col: np.ndarray) -> np.ndarray:
            group = doc_group[rows]
            _check_covered(df[group, col], lambda i: self.terms[int(col[i])])
            return idf32[group, col]

        return self._weighted(idf, lambda rows: averages[doc_group[rows]], k1, b)

    def _slices(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """The postings a slice at a time (bounding the temporaries): its bounds and each posting's column."""
        for a in range(0, len(self.rows), _STEP):
            z = min(len(self.rows), a + _STEP)
            yield a, z, np.searchsorted(self.indptr, np.arange(a, z), side="right") - 1

    def _weighted(self, idf: Any, avgdl: Any, k1: float, b: float) -> np.ndarray:
        """Every posting's weight, a slice at a time: ``idf(rows, columns)`` its term's idf (float32) in its document
        and ``avgdl(rows)`` its document's average length."""
        data = np.empty(len(self.rows), dtype=np.float32)
        for a, z, col in self._slices():
            tf = np.asarray(self.counts[a:z], dtype=np.float64)
            rows = self.rows[a:z]
            # bm25s: tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf), l_d a Python int, l_avg a float64, all in float64
            norm = k1 * ((1 - b) + (b * np.asarray(self.lengths)[rows].astype(np.float64)) / avgdl(rows))
            data[a:z] = (idf(rows, col).astype(np.float64) * (tf / (norm + tf))).astype(np.float32)
        return data

    def check(self, where: str) -> None:
        """Raise IndexFormatError unless the arrays are a well-formed matrix (files on disk are untrusted)."""
        n, nnz, v = self.num_docs, len(self.rows), len(self.terms)
        ok = (self.indptr.ndim == self.rows.ndim == self.counts.ndim == self.lengths.ndim == 1
              and len(self.indptr) == v + 1 and len(self.counts) == nnz and int(self.indptr[0]) == 0
              and int(self.indptr[-1]) == nnz and bool(np.all(np.diff(self.indptr) > 0))
              and (nnz == 0 or (int(self.rows.min()) >= 0 and int(self.rows.max()) < n
                                and int(np.asarray(self.counts).min()) >= 1))
              and (n == 0 or int(np.asarray(self.lengths).min()) >= 0)
              and (self.languages is None
                   or (self.languages.shape == (n,) and (n == 0 or int(np.asarray(self.languages).max())
                                                          < len(self.language_codes)))))
        if not ok:
            raise IndexFormatError(f"{where}: the BM25 postings are malformed (counts, lengths or shapes); rebuild it")


def _row_dtype(num_docs: int) -> type:
    return np.int32 if num_docs < 2**31 else np.int64


def _indptr(per_col: np.ndarray, num_docs: int) -> np.ndarray:
    indptr = np.zeros(len(per_col) + 1, dtype=np.int64)
    np.cumsum(per_col, out=indptr[1:])
    return indptr.astype(np.int32 if max(int(indptr[-1]), num_docs) < 2**31 else np.int64)  # scipy's choice


def _idf32(df: np.ndarray, num_docs: np.ndarray) -> np.ndarray:
    """float32 Lucene idf of every (group, term) document frequency, with that group's document count: in Python
    floats, once per distinct value, as bm25s computes it."""
    out = np.empty(df.shape, dtype=np.float32)
    for g in range(df.shape[0]):
        n = int(num_docs[g])
        values, inverse = np.unique(df[g], return_inverse=True)
        out[g] = np.array([math.log(1 + (n - int(v) + 0.5) / (int(v) + 0.5)) for v in values],
                          dtype=np.float32)[inverse.reshape(-1)]
    return out


def _check_covered(df: np.ndarray, term: Any) -> None:
    """Raise DataError unless every document frequency in ``df`` is positive (``term(i)``: the term of ``df[i]``)."""
    if len(df) and int(df.min()) <= 0:
        raise DataError(f"the BM25 statistics do not cover the term {term(int(np.argmin(df)))!r}; compute them over "
                        "every document")


def _language_rows(analysed: Sequence[tuple[Sequence[str], str]], codes: dict[str, int]) -> np.ndarray:
    """Each document's language as its position in ``codes`` (a language new to it appended)."""
    for _, code in analysed:
        codes.setdefault(code, len(codes))
    if len(codes) > 255:
        raise DataError(f"{len(codes)} languages in one BM25 index; at most 255")
    return np.fromiter((codes[code] for _, code in analysed), dtype=np.uint8, count=len(analysed))


def _chunk_postings(doc_terms: Sequence[Sequence[str]], vocab: dict[str, int], terms: list[str],
                    row0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows, columns (new terms appended to ``vocab``/``terms``) and counts of the documents' postings, in document
    order, and each document's length."""
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    tfs: list[np.ndarray] = []
    lengths = np.empty(len(doc_terms), dtype=np.int32)
    for row, doc in enumerate(doc_terms):
        counts = Counter(doc)
        lengths[row] = len(doc)
        for t in counts:
            if t not in vocab:
                vocab[t] = len(terms)
                terms.append(t)
        cols.append(np.fromiter((vocab[t] for t in counts), dtype=np.int64, count=len(counts)))
        tfs.append(np.fromiter(counts.values(), dtype=np.int32, count=len(counts)))
        rows.append(np.full(len(counts), row0 + row, dtype=np.int64))
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32), lengths
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(tfs), lengths


FORMAT = "twostage.bm25"
FORMAT_VERSION = 4  # 4: each document's language (statistics per language); 3: the postings' counts and lengths;
# 2: files list sha256 and bytes; 1 listed sha256 only
ARRAYS = ("data", "indices", "indptr")
BASE_FILES = ("doc_ids.json", "vocab.json", *(f"weights.{a}.npy" for a in ARRAYS))
POSTINGS_FILES = ("postings.counts.npy", "doc_lengths.npy")
LANGUAGES_FILE = "doc_languages.npy"  # with the manifest's "languages": the codes its values are positions in


def write_bm25_files(tmp: Path, model: Any, doc_ids: Any, config: dict[str, Any], postings: Postings | None) -> None:
    """Write the weights (bm25s's layout: ``model.vocab_dict``, ``model.scores``), its postings (when kept) and the manifest into the existing directory ``tmp``
    (the caller makes it atomic). ``config`` is the retriever's BM25Config as a dict."""
    (tmp / "doc_ids.json").write_text(json.dumps([str(i) for i in doc_ids]), encoding="utf-8")
    (tmp / "vocab.json").write_text(json.dumps(model.vocab_dict, ensure_ascii=False), encoding="utf-8")
    for name in ARRAYS:
        np.save(tmp / f"weights.{name}.npy", np.asarray(model.scores[name]), allow_pickle=False)
    files = list(BASE_FILES)
    if postings is not None:
        np.save(tmp / "postings.counts.npy", np.asarray(postings.counts, dtype=np.int32), allow_pickle=False)
        np.save(tmp / "doc_lengths.npy", np.asarray(postings.lengths, dtype=np.int32), allow_pickle=False)
        files += POSTINGS_FILES
    extra: dict[str, Any] = {}
    if postings is not None and postings.languages is not None:
        np.save(tmp / LANGUAGES_FILE, np.asarray(postings.languages, dtype=np.uint8), allow_pickle=False)
        files.append(LANGUAGES_FILE)
        extra["languages"] = list(postings.language_codes)
    text = manifest_text(FORMAT, FORMAT_VERSION, describe_files(tmp, files), config=config, num_docs=len(doc_ids),
                         vocab_size=len(model.vocab_dict), **extra)
    (tmp / "manifest.json").write_text(text, encoding="utf-8")


def _read_manifest(root: Path) -> dict[str, Any]:
    return read_manifest_json(root, FORMAT, FORMAT_VERSION, "a BM25 index directory", "BM25Retriever.save")


def read_bm25_files(path: str | Path) -> tuple[dict[str, Any], list[str], dict[str, int], dict[str, np.ndarray],
                                               Postings | None]:
    """The config dict, document ids, vocabulary, weight arrays and postings (None when the index has none) of a
    BM25 directory, after checking the manifest and every file's checksum (before any array is read) and that arrays
    and counts agree. The postings' counts and lengths are memory-mapped: only an update reads them."""
    root = Path(path)
    if not root.is_dir():
        raise IndexFormatError(f"{root}: no such BM25 index directory")
    manifest = _read_manifest(root)
    files = manifest.get("files", {})
    has_languages = isinstance(files, dict) and set(files) == {*BASE_FILES, *POSTINGS_FILES, LANGUAGES_FILE}
    has_postings = has_languages or (isinstance(files, dict) and set(files) == {*BASE_FILES, *POSTINGS_FILES})
    if not isinstance(files, dict) or not (set(files) == set(BASE_FILES) or has_postings):
        raise IndexFormatError(f"{root / 'manifest.json'}: lists other files than a BM25 index holds; rebuild it")
    if manifest.get("format_version") == 1:  # v1 listed sha256 only: take the sizes as found, the sha256 decides
        if not all(isinstance(digest, str) for digest in files.values()):
            raise IndexFormatError(f"{root / 'manifest.json'}: malformed file list; rebuild the index")
        files = {name: {"sha256": digest, "bytes": (root / name).stat().st_size if (root / name).is_file() else 0}
                 for name, digest in files.items()}
    verify_files(root, check_file_entries(root / "manifest.json", files))
    try:
        config = manifest["config"]
        doc_ids = json.loads((root / "doc_ids.json").read_text(encoding="utf-8"))
        vocab = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
        arrays = {name: load_npy(root / f"weights.{name}.npy") for name in ARRAYS}
        extra = [load_npy(root / f, mmap=True) for f in POSTINGS_FILES] if has_postings else []
        languages = load_npy(root / LANGUAGES_FILE) if has_languages else None
    except (KeyError, ValueError, OSError) as exc:
        raise IndexFormatError(f"{root}: cannot read the index ({exc}); rebuild it") from None
    n = int(manifest["num_docs"])
    data, indices, indptr = arrays["data"], arrays["indices"], arrays["indptr"]
    columns = [v for term, v in vocab.items() if term]  # bm25s keeps "" as a term without a column
    consistent = (
        isinstance(doc_ids, list) and all(type(i) is str for i in doc_ids) and isinstance(vocab, dict)
        and len(doc_ids) == n
        and len(vocab) == int(manifest["vocab_size"])
        and (not columns or max(columns) < len(indptr) - 1)
        and len(data) == len(indices) == int(indptr[-1])
        and (len(indices) == 0 or int(indices.max()) < n)
    )
    if not consistent:
        raise IndexFormatError(f"{root}: arrays and counts disagree with manifest.json; rebuild the index")
    if not isinstance(config, dict):
        raise IndexFormatError(f"{root / 'manifest.json'}: config is not an object; rebuild the index")
    postings = None
    if has_postings:
        cols = sorted((c, t) for t, c in vocab.items() if t and type(c) is int)
        terms = [t for _, t in cols]
        if [c for c, _ in cols] != list(range(len(indptr) - 1)) or len(extra[0]) != len(indices) or \
                len(extra[1]) != n or not all(np.issubdtype(a.dtype, np.integer) for a in extra):
            raise IndexFormatError(f"{root}: the postings disagree with the vocabulary or the weights; rebuild it")
        codes = manifest.get("languages")
        if languages is not None and not (
                isinstance(codes, list) and all(isinstance(c, str) for c in codes) and len(set(codes)) == len(codes)
                and languages.dtype == np.uint8 and languages.shape == (n,)
                and (n == 0 or int(languages.max()) < len(codes))):
            raise IndexFormatError(f"{root}: {LANGUAGES_FILE} disagrees with the manifest's languages; rebuild it")
        postings = Postings(terms, indptr, indices, extra[0], extra[1], languages,
                            tuple(codes or ()) if languages is not None else ())
    return config, doc_ids, vocab, arrays, postings
