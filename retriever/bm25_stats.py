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
    import scipy.sparse as sp

    if stats.num_docs <= 0 or stats.total_length <= 0:
        raise DataError("BM25 statistics over no terms: the corpus has no text")
    vocab: dict[str, int] = {}
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    tfs: list[np.ndarray] = []
    lengths = np.empty(len(doc_terms), dtype=np.int64)
    for row, terms in enumerate(doc_terms):
        counts = Counter(terms)
        lengths[row] = len(terms)
        cols.append(np.fromiter((vocab.setdefault(t, len(vocab)) for t in counts), dtype=np.int64, count=len(counts)))
        tfs.append(np.fromiter(counts.values(), dtype=np.float32, count=len(counts)))
        rows.append(np.full(len(counts), row, dtype=np.int64))
    missing = [t for t in vocab if stats.doc_freqs.get(t, 0) <= 0]
    if missing:
        raise DataError(f"the BM25 statistics do not cover the term {missing[0]!r}; compute them over every document")
    idf = np.array([math.log(1 + (stats.num_docs - stats.doc_freqs[t] + 0.5) / (stats.doc_freqs[t] + 0.5))
                    for t in vocab], dtype=np.float32)
    row = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    col = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    tf = np.concatenate(tfs).astype(np.float64) if tfs else np.zeros(0)
    # bm25s: tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf), l_d a Python int, l_avg a float64, all in float64
    norm = k1 * ((1 - b) + (b * lengths[row].astype(np.float64)) / stats.avgdl)
    weights = (idf[col].astype(np.float64) * (tf / (norm + tf))).astype(np.float32)
    matrix = sp.csc_matrix((weights, (row, col)), shape=(len(doc_terms), len(vocab)), dtype=np.float32)
    vocab.setdefault("", len(vocab))  # bm25s's empty term: in the vocabulary, without a column
    return vocab, matrix.data, matrix.indices, matrix.indptr
