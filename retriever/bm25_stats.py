"""BM25 weights from corpus statistics given from outside: the piece a sharded engine needs.

bm25s computes its document frequencies, document count and average length from the documents it indexes, and
has no way to take them from elsewhere. A shard must score with the statistics of the *whole* corpus (every
shard's documents), or its scores, and so the merged ranking, differ from one engine's. :func:`weight_arrays`
computes the same term x document weights as bm25s's Lucene variant, with the statistics passed in:

    w(t, d) = float32( idf32(t) * tf / (k1 * ((1 - b) + b * |d| / avgdl) + tf) )   (the quotient in float64)
    idf32(t) = float32( ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)) )

with the floating-point operations in bm25s's order, so that with a corpus's own statistics the weights are
bit for bit bm25s's (tested), and with global statistics a document scores in its shard exactly as in one engine.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from twostage.indexer.errors import DataError


@dataclass(frozen=True)
class CorpusStats:
    """What BM25 needs to know of a corpus: document count, total length in terms, document frequency by term."""

    num_docs: int
    total_length: int
    doc_freqs: Mapping[str, int] = field(repr=False)

    @classmethod
    def of(cls, doc_terms: Iterable[Sequence[str]]) -> CorpusStats:
        """The statistics of analysed documents (each a list of terms)."""
        n, total, df = 0, 0, Counter()
        for terms in doc_terms:
            n += 1
            total += len(terms)
            df.update(set(terms))
        return cls(n, total, df)

    @classmethod
    def combine(cls, parts: Iterable[CorpusStats]) -> CorpusStats:
        """The statistics of the union of disjoint corpora (e.g. every shard)."""
        n, total, df = 0, 0, Counter()
        for p in parts:
            n, total = n + p.num_docs, total + p.total_length
            df.update(p.doc_freqs)
        return cls(n, total, df)

    @property
    def avgdl(self) -> float:
        # np.mean of the lengths (bm25s): the float64 sum of integers is exact, then one rounded division
        return self.total_length / self.num_docs


def weight_arrays(doc_terms: Sequence[Sequence[str]], stats: CorpusStats, k1: float,
                  b: float) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
    """Vocabulary (term -> column, plus bm25s's empty term) and the CSC arrays (data, indices, indptr) of the
    documents x terms weight matrix of ``doc_terms``, scored with ``stats`` (which must cover every term)."""
    return weight_arrays_chunked([doc_terms], stats, k1, b)


def weight_arrays_chunked(chunks: Iterable[Sequence[Sequence[str]]], stats: CorpusStats, k1: float,
                          b: float) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
    """:func:`weight_arrays` over documents given a chunk at a time: only one chunk's terms are held at once, plus
    the weights (12 bytes a posting: row, column, weight) until they are placed in the CSC arrays (8 bytes a
    posting), chunk by chunk, each column's rows ascending as scipy orders them."""
    if stats.num_docs <= 0 or stats.total_length <= 0:
        raise DataError("BM25 statistics over no terms: the corpus has no text")
    vocab: dict[str, int] = {}
    idf: list[float] = []
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n = 0
    for doc_terms in chunks:
        rows, cols, weights = _chunk_weights(doc_terms, stats, k1, b, vocab, idf, n)
        order = np.argsort(cols, kind="stable")  # by column, rows ascending within each
        parts.append((rows[order].astype(np.int32), cols[order].astype(np.int32), weights[order]))
        n += len(doc_terms)
    counts = np.zeros(len(vocab), dtype=np.int64)
    for _, cols, _ in parts:
        counts += np.bincount(cols, minlength=len(vocab))
    indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    index_dtype = np.int32 if max(int(indptr[-1]), n) < 2**31 else np.int64  # scipy's choice
    indices = np.empty(int(indptr[-1]), dtype=index_dtype)
    data = np.empty(int(indptr[-1]), dtype=np.float32)
    next_free = indptr[:-1].copy()  # where each column's next row goes
    parts.reverse()
    while parts:  # in row order, each chunk's postings appended to their columns, then the chunk freed
        rows, cols, weights = parts.pop()
        if not len(cols):
            continue
        starts = np.flatnonzero(np.concatenate(([True], cols[1:] != cols[:-1])))
        sizes = np.diff(np.append(starts, len(cols)))
        at = next_free[cols] + (np.arange(len(cols)) - np.repeat(starts, sizes))
        indices[at], data[at] = rows, weights
        next_free[cols[starts]] += sizes
    vocab.setdefault("", len(vocab))  # bm25s's empty term: in the vocabulary, without a column
    return vocab, data, indices, indptr.astype(index_dtype)


def _chunk_weights(doc_terms: Sequence[Sequence[str]], stats: CorpusStats, k1: float, b: float,
                   vocab: dict[str, int], idf: list[float], row0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    tfs: list[np.ndarray] = []
    lengths = np.empty(len(doc_terms), dtype=np.int64)
    for row, terms in enumerate(doc_terms):
        counts = Counter(terms)
        lengths[row] = len(terms)
        for t in counts:
            if t not in vocab:
                df = stats.doc_freqs.get(t, 0)
                if df <= 0:
                    raise DataError(f"the BM25 statistics do not cover the term {t!r}; compute them over every "
                                    "document")
                vocab[t] = len(vocab)
                idf.append(math.log(1 + (stats.num_docs - df + 0.5) / (df + 0.5)))
        cols.append(np.fromiter((vocab[t] for t in counts), dtype=np.int64, count=len(counts)))
        tfs.append(np.fromiter(counts.values(), dtype=np.float32, count=len(counts)))
        rows.append(np.full(len(counts), row, dtype=np.int64))
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    row = np.concatenate(rows)
    col = np.concatenate(cols)
    tf = np.concatenate(tfs).astype(np.float64)
    idf32 = np.asarray(idf, dtype=np.float32)
    # bm25s: tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf), l_d a Python int, l_avg a float64, all in float64
    norm = k1 * ((1 - b) + (b * lengths[row].astype(np.float64)) / stats.avgdl)
    weights = (idf32[col].astype(np.float64) * (tf / (norm + tf))).astype(np.float32)
    return row + row0, col, weights
