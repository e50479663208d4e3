"""BM25's corpus statistics and postings, and its weights for any statistics: what lets a shard score with the
whole corpus's statistics and an update skip analysing the documents it keeps.

bm25s computes its document frequencies, document count and average length from the documents it indexes, has no
way to take them from elsewhere, and keeps only the weights, not the term counts they came from. So this module
keeps the :class:`Postings` (each document's term counts and length, the term x document matrix in CSC form) and
computes the same weights as bm25s's Lucene variant from them, with the statistics passed in:

    w(t, d) = float32( idf32(t) * tf / (k1 * ((1 - b) + b * |d| / avgdl) + tf) )   (the quotient in float64)
    idf32(t) = float32( ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)) )

with the floating-point operations in bm25s's order, so that with a corpus's own statistics the weights are bit for
bit bm25s's (tested), and with global statistics a document scores in its shard exactly as in one engine. An update
(:meth:`Postings.updated`) drops the deleted documents' postings and analyses only the new documents; the weights are
then recomputed from the counts (numpy, a slice at a time), never from the texts.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twostage.indexer.errors import DataError, IndexFormatError

_STEP = 1 << 22  # postings weighted at a time (bounds the float64 temporaries)


@dataclass(frozen=True)
class CorpusStats:
    """What BM25 needs to know of a corpus: document count, total length in terms, document frequency by term."""

    num_docs: int
    total_length: int
    doc_freqs: Mapping[str, int] = field(repr=False)

    @classmethod
    def of(cls, doc_terms: Iterable[Sequence[str]]) -> CorpusStats:
        """The statistics of analysed documents (each a list of terms)."""
        n, total, df = 0, 0, Counter[str]()
        for terms in doc_terms:
            n += 1
            total += len(terms)
            df.update(set(terms))
        return cls(n, total, df)

    @classmethod
    def combine(cls, parts: Iterable[CorpusStats]) -> CorpusStats:
        """The statistics of the union of disjoint corpora (e.g. every shard)."""
        n, total, df = 0, 0, Counter[str]()
        for p in parts:
            n, total = n + p.num_docs, total + p.total_length
            df.update(p.doc_freqs)
        return cls(n, total, df)

    @property
    def avgdl(self) -> float:
        # np.mean of the lengths (bm25s): the float64 sum of integers is exact, then one rounded division
        return self.total_length / self.num_docs


@dataclass(frozen=True, eq=False)
class Postings:
    """Each document's term counts, as the term x document matrix in CSC form, and each document's length.

    Column ``c`` (the term ``terms[c]``) holds the postings ``indptr[c]:indptr[c + 1]``: the documents (``rows``,
    ascending, as scipy orders them) and how often the term occurs there (``counts``). A term's document frequency
    is its column's length; ``lengths[d]`` is document ``d``'s number of terms.
    """

    terms: Sequence[str] = field(repr=False)
    indptr: np.ndarray = field(repr=False)
    rows: np.ndarray = field(repr=False)
    counts: np.ndarray = field(repr=False)
    lengths: np.ndarray = field(repr=False)

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
        return CorpusStats(self.num_docs, int(self.lengths.sum(dtype=np.int64)),
                           dict(zip(self.terms, np.diff(self.indptr).tolist())))

    @classmethod
    def of_chunks(cls, chunks: Iterable[Sequence[Sequence[str]]]) -> Postings:
        """The postings of analysed documents given a chunk at a time (columns in order of first occurrence): one
        chunk's terms are held at once, plus its postings (12 bytes each: row, column, count) until every chunk is
        read and they are placed, chunk by chunk, in the CSC arrays (8 bytes a posting)."""
        vocab: dict[str, int] = {}
        terms: list[str] = []
        parts: list[Any] = []
        lengths: list[Any] = []
        n = 0
        for doc_terms in chunks:
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
        return cls(terms, indptr, rows_out, counts, np.concatenate(lengths) if lengths else np.zeros(0, np.int32))

    def updated(self, keep: np.ndarray, new_docs: Sequence[Sequence[str]]) -> Postings:
        """The postings of the documents ``keep`` marks (their order kept, renumbered from 0) followed by ``new_docs``
        (analysed documents). Only the new documents are counted; the kept ones' postings are copied. Terms left
        without a document are dropped."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (self.num_docs,):
            raise DataError(f"the keep mask has {len(keep)} entries for {self.num_docs} documents")
        kept_n = int(keep.sum())
        remap = (np.cumsum(keep, dtype=np.int64) - 1).astype(_row_dtype(kept_n + len(new_docs)))
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
        return Postings([t for t, alive in zip(terms, live) if alive], indptr, rows_out, counts_out,
                        np.concatenate([np.asarray(self.lengths)[keep].astype(np.int32), lens]))

    def weights(self, stats: CorpusStats | None, k1: float, b: float) -> np.ndarray:
        """The BM25 weight of every posting (float32, aligned with ``rows``), scored with ``stats`` (default: these
        documents' own statistics), which must cover every term."""
        if stats is None:
            stats = CorpusStats(self.num_docs, int(self.lengths.sum(dtype=np.int64)), {})
            df = np.diff(self.indptr)
        else:
            df = np.fromiter((stats.doc_freqs.get(t, 0) for t in self.terms), dtype=np.int64, count=len(self.terms))
        if stats.num_docs <= 0 or stats.total_length <= 0:
            raise DataError("BM25 statistics over no terms: the corpus has no text")
        if len(df) and int(df.min()) <= 0:
            missing = self.terms[int(np.argmin(df))]
            raise DataError(f"the BM25 statistics do not cover the term {missing!r}; compute them over every document")
        values, inverse = np.unique(df, return_inverse=True)  # idf in Python floats, once per distinct df
        idf32 = np.array([math.log(1 + (stats.num_docs - int(v) + 0.5) / (int(v) + 0.5)) for v in values],
                         dtype=np.float32)[inverse.reshape(-1)]
        avgdl = stats.avgdl
        data = np.empty(len(self.rows), dtype=np.float32)
        for a in range(0, len(data), _STEP):
            z = min(len(data), a + _STEP)
            col = np.searchsorted(self.indptr, np.arange(a, z), side="right") - 1
            tf = np.asarray(self.counts[a:z], dtype=np.float64)
            # bm25s: tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf), l_d a Python int, l_avg a float64, all in float64
            norm = k1 * ((1 - b) + (b * np.asarray(self.lengths)[self.rows[a:z]].astype(np.float64)) / avgdl)
            data[a:z] = (idf32[col].astype(np.float64) * (tf / (norm + tf))).astype(np.float32)
        return data

    def check(self, where: str) -> None:
        """Raise IndexFormatError unless the arrays are a well-formed matrix (files on disk are untrusted)."""
        n, nnz, v = self.num_docs, len(self.rows), len(self.terms)
        ok = (self.indptr.ndim == self.rows.ndim == self.counts.ndim == self.lengths.ndim == 1
              and len(self.indptr) == v + 1 and len(self.counts) == nnz and int(self.indptr[0]) == 0
              and int(self.indptr[-1]) == nnz and bool(np.all(np.diff(self.indptr) > 0))
              and (nnz == 0 or (int(self.rows.min()) >= 0 and int(self.rows.max()) < n
                                and int(np.asarray(self.counts).min()) >= 1))
              and (n == 0 or int(np.asarray(self.lengths).min()) >= 0))
        if not ok:
            raise IndexFormatError(f"{where}: the BM25 postings are malformed (counts, lengths or shapes); rebuild it")


def _row_dtype(num_docs: int) -> type:
    return np.int32 if num_docs < 2**31 else np.int64


def _indptr(per_col: np.ndarray, num_docs: int) -> np.ndarray:
    indptr = np.zeros(len(per_col) + 1, dtype=np.int64)
    np.cumsum(per_col, out=indptr[1:])
    return indptr.astype(np.int32 if max(int(indptr[-1]), num_docs) < 2**31 else np.int64)  # scipy's choice


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
