"""BM25: the lexical first stage. bm25s by default (sparse, precomputed); rank-bm25 as the reference.

The default engine's weights are computed here from the corpus's postings (:mod:`twostage.retriever.bm25_stats`,
bit for bit bm25s's own weights, tested) and scored by bm25s. bm25s cannot index with statistics given from outside
(a shard) nor keep the term counts an update needs, and computing them here indexes in one pass over the corpus.

Both engines score with the Lucene BM25 formula and the same :class:`~twostage.retriever.analyzer.Analyzer`, so
they rank a corpus the same way; the scores differ by the constant factor ``k1 + 1`` that Lucene drops.

    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    score(q, d) = sum over query terms t of idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
"""

from __future__ import annotations

import logging
import math
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from twostage.indexer.atomic import atomic_directory, from_json_dict, to_json_dict
from twostage.indexer.docstore import IdMap
from twostage.indexer.errors import ConfigError, DataError, IndexFormatError
from twostage.indexer.records import Document, RankedList, check_k, top_k
from twostage.retriever.analyzer import Analyzer, AnalyzerConfig
from twostage.retriever.bm25_stats import CorpusStats, Postings, read_bm25_files, write_bm25_files

logger = logging.getLogger(__name__)

ENGINES = ("bm25s", "rank-bm25")


@dataclass(frozen=True)
class BM25Config:
    """BM25 parameters (Lucene's defaults) and the engine that computes them."""

    k1: float = 1.5
    b: float = 0.75
    engine: str = "bm25s"
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown BM25 engine {self.engine!r}; use one of {', '.join(ENGINES)}")
        if not (self.k1 >= 0 and 0 <= self.b <= 1):
            raise ConfigError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")


class _Engine(Protocol):
    def score(self, terms: list[str]) -> np.ndarray: ...

    def add_weighted(self, out: np.ndarray, weights: Mapping[str, float]) -> None: ...

    def weights_at(self, terms: Sequence[str], rows: np.ndarray) -> np.ndarray: ...

    def terms_at(self, rows: np.ndarray, cover: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]: ...


class Bm25sEngine:
    """bm25s's eager scoring: term x document BM25 weights precomputed into a CSC matrix; a query sums a few columns.

    The weights are computed here (:class:`Postings`, bit for bit bm25s's) and the columns summed here in bm25s's
    order (each query term's column in turn, float32), so scores equal bm25s's to the bit (tested against bm25s's own
    index) without importing bm25s to search: its import pulls numba and scipy, half a second of every cold search.
    ``vocab_dict`` and ``scores`` keep bm25s's names and layout (its files are ours, :mod:`bm25_stats`)."""

    def __init__(self, vocab: dict[str, int], arrays: dict[str, np.ndarray], num_docs: int,
                 counts: np.ndarray | None = None) -> None:
        self.vocab_dict = vocab
        self.scores: dict[str, Any] = {**arrays, "num_docs": num_docs}
        self._data, self._indices, self._indptr = arrays["data"], arrays["indices"], arrays["indptr"]
        self._counts = counts  # each posting's term count (the postings', when kept), for terms_at
        self._num_docs = num_docs
        self._rows_view: memoryview | None = None  # the postings' rows for bisection, on first use (weights_at)
        self._by_row: tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None = None  # on first use (terms_at)
        self._by_row_lock = threading.Lock()

    @classmethod
    def from_arrays(cls, config: BM25Config, vocab: dict[str, int], arrays: dict[str, np.ndarray],
                    num_docs: int, counts: np.ndarray | None = None) -> Bm25sEngine:
        """Scoring over CSC weight arrays (data, indices, indptr) computed here (:class:`Postings`), and their term
        counts when kept."""
        return cls(vocab, arrays, num_docs, counts)

    def _postings(self, term: str) -> tuple[int, int] | None:
        """Where ``term``'s column lies in the postings (None: unknown, or bm25s's empty term, which has none)."""
        column = self.vocab_dict.get(term)
        if column is None or column >= len(self._indptr) - 1:
            return None
        return int(self._indptr[column]), int(self._indptr[column + 1])

    def score(self, terms: list[str]) -> np.ndarray:
        out = np.zeros(self._num_docs, dtype=np.float32)
        for term in terms:  # a repeated query term counts again, as in bm25s
            span = self._postings(term)
            if span is not None:
                a, z = span
                out[self._indices[a:z]] += self._data[a:z]  # a column's rows are distinct: one float32 addition each
        return out

    def add_weighted(self, out: np.ndarray, weights: Mapping[str, float]) -> None:
        """Add ``weight x`` each term's column to ``out`` (float32; terms the corpus lacks add nothing)."""
        for term, weight in weights.items():
            span = self._postings(term)
            if span is not None:
                a, z = span
                out[self._indices[a:z]] += np.float32(weight) * self._data[a:z]

    def weights_at(self, terms: Sequence[str], rows: np.ndarray) -> np.ndarray:
        """Each term's BM25 weight in each of the documents ``rows`` (terms x rows, float64; 0.0 where it does not
        occur): its posting, found by bisection in the term's column (its rows are ascending). A few terms and rows
        at a time (a document's terms): bisected in Python, which costs less than NumPy's calls on such sizes."""
        if self._rows_view is None:
            self._rows_view = np.ascontiguousarray(self._indices).data
        view, data = self._rows_view, self._data
        wanted = [int(r) for r in np.asarray(rows).tolist()]
        out = np.zeros((len(terms), len(wanted)))
        for i, term in enumerate(terms):
            span = self._postings(term)
            if span is None:
                continue
            a, z = span
            for j, row in enumerate(wanted):
                at = bisect_left(view, row, a, z)
                if at < z and view[at] == row:
                    out[i, j] = data[at]
        return out

    def terms_at(self, rows: np.ndarray, cover: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """Every term of the documents ``rows``, its highest BM25 weight in them (float64), its count summed over
        ``cover`` (some of ``rows``; zeros when the counts were not kept) and its document frequency. The postings
        are read by row through their transpose (each row's columns, and where its postings lie), made on the first
        call: one stable sort of the postings' rows, 12 bytes a posting (SciFact, 1.0M postings: 0.09 s, 12 MB)."""
        if self._by_row is None:
            with self._by_row_lock:
                if self._by_row is None:
                    order = np.argsort(self._indices, kind="stable")
                    columns = np.repeat(np.arange(len(self._indptr) - 1, dtype=np.int32), np.diff(self._indptr))
                    starts = np.zeros(self._num_docs + 1, dtype=np.int64)
                    np.cumsum(np.bincount(self._indices, minlength=self._num_docs), out=starts[1:])
                    names = [""] * (len(self._indptr) - 1)
                    for term, column in self.vocab_dict.items():
                        if column < len(names):
                            names[column] = term
                    self._by_row = (starts, columns[order], order, names)
        starts, columns, order, names = self._by_row
        rows = np.asarray(rows, dtype=np.int64)
        lengths = starts[rows + 1] - starts[rows]
        at = np.repeat(starts[rows] - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
        by_column = np.argsort(columns[at], kind="stable")
        at = at[by_column]
        cols = columns[at]
        first = np.flatnonzero(np.concatenate(([True], cols[1:] != cols[:-1]))) if len(cols) else \
            np.zeros(0, dtype=np.int64)
        found = cols[first].astype(np.int64)
        best = np.maximum.reduceat(self._data[order[at]], first).astype(np.float64) if len(first) else np.zeros(0)
        tf = np.zeros(len(found), dtype=np.int64)
        if self._counts is not None and len(first):
            covered = set(np.asarray(cover, dtype=np.int64).tolist())  # a few rows: a set beats np.isin's sort
            in_cover = np.repeat(np.array([r in covered for r in rows.tolist()], dtype=bool), lengths)[by_column]
            tf = np.add.reduceat(np.where(in_cover, np.asarray(self._counts)[order[at]], 0).astype(np.int64), first)
        return [names[c] for c in found.tolist()], best, tf, self._indptr[found + 1] - self._indptr[found]


class RankBm25Engine:
    """rank-bm25's BM25Okapi with Lucene's idf (no negative idf, no epsilon floor): the reference engine."""

    def __init__(self, doc_terms: list[list[str]], k1: float, b: float) -> None:
        from rank_bm25 import BM25Okapi

        class LuceneBM25Okapi(BM25Okapi):  # type: ignore[misc]
            def _calc_idf(self, nd: dict[str, int]) -> None:
                n = self.corpus_size
                self.idf = {w: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for w, df in nd.items()}

        # rank-bm25 divides by the mean length; a corpus of empty documents would divide by zero.
        self.model = LuceneBM25Okapi(doc_terms, k1=k1, b=b)
        self._scale = 1.0 / (k1 + 1.0)

    def score(self, terms: list[str]) -> np.ndarray:
        return (np.asarray(self.model.get_scores(terms)) * self._scale).astype(np.float32)

    def add_weighted(self, out: np.ndarray, weights: Mapping[str, float]) -> None:
        for term, weight in weights.items():
            out += np.float32(weight) * self.score([term])

    def weights_at(self, terms: Sequence[str], rows: np.ndarray) -> np.ndarray:
        return np.array([self.score([t])[np.asarray(rows, dtype=np.int64)] for t in terms], dtype=np.float64)

    def terms_at(self, rows: np.ndarray, cover: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        terms = sorted({t for r in rows.tolist() for t in self.model.doc_freqs[r]})
        tf = np.array([sum(self.model.doc_freqs[r].get(t, 0) for r in np.asarray(cover).tolist()) for t in terms],
                      dtype=np.int64)
        best = self.weights_at(terms, rows).max(axis=1) if terms else np.zeros(0)
        return terms, best, tf, np.zeros(len(terms), dtype=np.int64)  # df: unused (the reference keeps no postings)


class BM25Retriever:
    """A BM25 index over a corpus. Build it with :meth:`build`, keep it with :meth:`save` / :meth:`load`.

    >>> bm25 = BM25Retriever.build(corpus)            # any iterable of Documents
    >>> result = bm25.search("what causes rain", k=10)
    >>> result.ids, result.scores                     # arrays, best first

    Documents that share no term with the query are not returned, so fewer than ``k`` may come back.
    """

    def __init__(self, config: BM25Config, doc_ids: Sequence[str] | IdMap, engine: _Engine,
                 postings: Postings | None = None, where: str = "the BM25 index") -> None:
        self.config = config
        # row -> id, one Arrow array (indexing gives NumPy object arrays): no Python string held per document
        self.doc_ids = doc_ids if isinstance(doc_ids, IdMap) else IdMap.of(doc_ids)
        self.analyzer = Analyzer(config.analyzer)
        self._engine = engine
        self.postings = postings  # the term counts the weights came from (bm25s engine; None in older saved indexes)
        self._where = where
        self._avgdl: float | None = None  # the postings' average length, on first use (strongest_terms)

    @classmethod
    def build(
        cls, documents: Iterable[Document], config: BM25Config | None = None, *, show_progress: bool = False,
        stats: CorpusStats | None = None,
    ) -> BM25Retriever:
        """Index ``documents``. ``stats``: score with these corpus statistics instead of the documents' own (a shard
        of a larger corpus, :mod:`twostage.retriever.bm25_stats`; bm25s engine only)."""
        from tqdm.auto import tqdm

        config = config or BM25Config()
        if stats is not None and config.engine != "bm25s":
            raise ConfigError("corpus statistics from outside need the bm25s engine")
        if _detects(config):
            documents = list(documents)
            config = with_corpus_languages(config, [documents])
        analyzer = Analyzer(config.analyzer)
        ids: list[str] = []
        analysed: list[tuple[list[str], str]] = []
        for doc in tqdm(documents, desc="bm25", unit="doc", disable=not show_progress):
            ids.append(doc.id)
            analysed.append(analyzer.analyse(doc.full_text))
        _check_terms(len(ids), sum(len(t) for t, _ in analysed), stats)
        if config.engine == "rank-bm25":  # (the reference: one set of statistics, whatever the languages)
            logger.info("BM25 (rank-bm25) indexed %d documents", len(ids))
            return cls(config, ids, RankBm25Engine([t for t, _ in analysed], config.k1, config.b))
        return cls._of(config, ids, Postings.of_chunks([analysed]), stats)

    @classmethod
    def build_chunked(cls, chunks: Callable[[], Iterable[Sequence[Document]]], config: BM25Config | None = None, *,
                      stats: CorpusStats | None = None) -> BM25Retriever:
        """Index a corpus given a chunk of documents at a time, so no more than one chunk's texts are held at once
        (``chunks()`` is called once, or twice when the corpus's languages are to be detected first). ``stats`` as
        in :meth:`build`. Scores equal :meth:`build`'s."""
        config = config or BM25Config()
        if config.engine != "bm25s":
            raise ConfigError("a chunked BM25 build needs the bm25s engine")
        if _detects(config):
            config = with_corpus_languages(config, chunks())
        analyzer = Analyzer(config.analyzer)
        ids: list[str] = []

        def analysed() -> Iterable[list[tuple[list[str], str]]]:
            for docs in chunks():
                ids.extend(d.id for d in docs)
                yield [analyzer.analyse(d.full_text) for d in docs]

        postings = Postings.of_chunks(analysed())
        _check_terms(len(ids), int(postings.lengths.sum(dtype=np.int64)), stats)
        return cls._of(config, ids, postings, stats)

    def updated(self, keep: np.ndarray, documents: Sequence[Document], *,
                stats: CorpusStats | None = None) -> BM25Retriever:
        """A new index over the documents ``keep`` marks (a boolean per row, order kept) and then ``documents``,
        from the stored postings: only the new documents are analysed (:meth:`Postings.updated`). ``stats`` as in
        :meth:`build`. Needs :attr:`postings` (an index saved before they were kept has none: rebuild it)."""
        config = self._config_after(documents)
        postings = self._postings_after(keep, documents, Analyzer(config.analyzer))
        ids = self.doc_ids.kept_then(keep, [d.id for d in documents])
        _check_terms(len(ids), int(postings.lengths.sum(dtype=np.int64)), stats)
        return self._of(config, ids, postings, stats)

    def stats_after(self, keep: np.ndarray, documents: Sequence[Document]) -> CorpusStats:
        """The corpus statistics of the documents :meth:`updated` would index (a shard's part of the global ones)."""
        return self._postings_after(keep, documents, Analyzer(self._config_after(documents).analyzer)).stats()

    def _config_after(self, documents: Sequence[Document]) -> BM25Config:
        """The settings after adding ``documents``: a language new to the corpus (in enough of them) joins its
        languages (auto analysis)."""
        if self.config.analyzer.language != "auto" or not documents:
            return self.config
        return with_corpus_languages(self.config, [documents], self.config.analyzer.languages)

    def _postings_after(self, keep: np.ndarray, documents: Sequence[Document],
                        analyzer: Analyzer | None = None) -> Postings:
        if self.postings is None:
            raise ConfigError("this BM25 index keeps no postings (saved by an older version or built with rank-bm25); "
                              "build it again")
        self.postings.check(self._where)
        analyze = analyzer or self.analyzer
        return self.postings.updated(keep, [analyze.analyse(d.full_text) for d in documents])

    @classmethod
    def _of(cls, config: BM25Config, ids: Sequence[str] | IdMap, postings: Postings,
            stats: CorpusStats | None) -> BM25Retriever:
        data = postings.weights(stats, config.k1, config.b)
        engine = Bm25sEngine.from_arrays(config, postings.vocab(), {"data": data, "indices": postings.rows,
                                                                    "indptr": postings.indptr}, postings.num_docs,
                                         postings.counts)
        logger.info("BM25 indexed %d documents", len(ids))
        return cls(config, ids, engine, postings)

    def __len__(self) -> int:
        return len(self.doc_ids)

    def _terms(self, query: str) -> list[str]:
        if not isinstance(query, str):
            raise ConfigError(f"a query must be a string, got {type(query).__name__}")
        if not query.strip():
            raise ConfigError("the query is empty; give it some words")
        return self.analyzer(query)

    def scores(self, query: str, extra: Mapping[str, float] | None = None) -> np.ndarray:
        """BM25 score of every document for ``query`` (float32, corpus order), plus ``extra``: analysed terms with a
        weight each (a query expanded by relevance feedback)."""
        terms = self._terms(query)
        out = self._engine.score(terms) if terms else np.zeros(len(self), dtype=np.float32)
        if extra:
            self._engine.add_weighted(out, extra)
        return out

    def term_scores(self, weights: Mapping[str, float]) -> np.ndarray:
        """BM25 score of every document for analysed terms with a weight each (a document as the query)."""
        out = np.zeros(len(self), dtype=np.float32)
        self._engine.add_weighted(out, weights)
        return out

    def query_terms(self, query: str) -> list[str]:
        """The analysed terms of ``query`` (a repeated term counts each time it occurs)."""
        return self._terms(query)

    def term_weights(self, terms: Sequence[str], row: int) -> list[float]:
        """The BM25 weight of each term in the document at ``row`` (0.0 where it does not occur): a document's score
        for a query is the sum over the query's terms."""
        if not 0 <= row < len(self):
            raise IndexError(f"BM25 row {row} is outside the index of {len(self)} documents")
        return self._engine.weights_at(terms, np.array([row]))[:, 0].tolist() if len(terms) else []

    def strongest_terms(self, rows: Sequence[int] | np.ndarray, m: int,
                        cover: Sequence[int] | np.ndarray | None = None) -> dict[str, float]:
        """The ``m`` strongest terms of a document: its ``rows`` here (its row, or its passages' rows), each term
        weighted by its highest BM25 weight in them, best first (ties: alphabetical). The terms are the best among
        the ``2 m`` ranked first by the weight this index would give the whole document (its count over ``cover``,
        rows whose texts cover the document's words once: the passages that do not overlap; all of ``rows`` by
        default; each term's document frequency here, the document's length against the average), which on dev
        chose better feedback terms than the highest passage weight alone. An index saved without its postings'
        counts ranks by the highest weight alone."""
        rows = np.asarray(rows, dtype=np.int64)
        cover = rows if cover is None else np.asarray(cover, dtype=np.int64)
        every = np.concatenate([rows, cover])
        if len(every) and (every.min() < 0 or every.max() >= len(self)):
            bad = every[(every < 0) | (every >= len(self))][0]
            raise IndexError(f"BM25 row {bad} is outside the index of {len(self)} documents")
        if m <= 0 or not len(rows):
            return {}
        terms, weights, tf, df = self._engine.terms_at(rows, cover)
        some = np.flatnonzero(weights > 0)
        p = self.postings
        if p is not None and len(some) > m:  # the 2 m first by the whole document's weight
            order = np.argsort(-self._document_weights(tf[some], df[some], int(tf.sum())), kind="stable")
            some = some[order[:2 * m]]
        elif len(some) > m:  # those that can be among the first m (ties at the m-th weight included)
            some = some[weights[some] >= np.partition(weights[some], len(some) - m)[len(some) - m]]
        best = sorted(((terms[i], float(weights[i])) for i in some.tolist()), key=lambda tw: (-tw[1], tw[0]))
        return dict(best[:m])

    def _document_weights(self, tf: np.ndarray, df: np.ndarray, length: int) -> np.ndarray:
        """BM25's weight of terms of document frequency ``df`` occurring ``tf`` times in a document of ``length``
        terms (the postings' statistics: every document's, whatever its language)."""
        p = self.postings
        assert p is not None
        n = max(p.num_docs, 1)
        idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        if self._avgdl is None:
            self._avgdl = max(float(np.asarray(p.lengths).sum(dtype=np.int64)) / n, 1e-9)
        k1, b = self.config.k1, self.config.b
        f = tf.astype(np.float64)
        return idf * f / (f + k1 * (1 - b + b * length / self._avgdl))

    def search(self, query: str, k: int = 10) -> RankedList:
        """The ``k`` best documents for ``query``; equal scores keep corpus order."""
        k = check_k(k)
        rows, scores = top_k(self.scores(query), k, positive_only=True)
        return RankedList(self.doc_ids[rows], scores)

    def search_batch(self, queries: Sequence[str], k: int = 10, *, show_progress: bool = False) -> list[RankedList]:
        from tqdm.auto import tqdm

        k = check_k(k)
        return [self.search(q, k) for q in tqdm(queries, desc="bm25", unit="q", disable=not show_progress)]

    def save(self, path: str | Path) -> None:
        """Write the index to a directory atomically (built aside, then renamed into place); see
        :mod:`twostage.retriever.bm25_stats` for the files."""
        with atomic_directory(path) as tmp:
            self.write_files(tmp)

    def write_files(self, directory: Path) -> None:
        """Write the index's files into the existing ``directory`` (the caller makes the write atomic)."""
        if not isinstance(self._engine, Bm25sEngine):
            raise ConfigError("only the bm25s engine can be saved; rank-bm25 is the in-memory reference engine")
        write_bm25_files(Path(directory), self._engine, self.doc_ids, to_json_dict(self.config), self.postings)

    @classmethod
    def load(cls, path: str | Path) -> BM25Retriever:
        """Open a saved index; the manifest and every file's checksum are checked before any array is read."""
        raw, doc_ids, vocab, arrays, postings = read_bm25_files(path)
        try:
            config = from_json_dict(BM25Config, raw, "BM25 settings")
        except (TypeError, ValueError) as exc:
            raise IndexFormatError(f"{path}: the BM25 settings in manifest.json are invalid ({exc}); rebuild it") from None
        return cls(config, doc_ids, Bm25sEngine.from_arrays(config, vocab, arrays, len(doc_ids),
                   None if postings is None else postings.counts), postings, str(path))


def _detects(config: BM25Config) -> bool:
    """Whether the corpus's languages are to be found before indexing (auto analysis, none found yet)."""
    return config.analyzer.language == "auto" and not config.analyzer.languages


def with_corpus_languages(config: BM25Config, chunks: Iterable[Sequence[Document]],
                          previous: Sequence[str] = ()) -> BM25Config:
    """``config`` with its analysis's languages: ``previous`` and those the documents of ``chunks`` are in
    (:func:`~twostage.retriever.languages.corpus_languages`)."""
    from twostage.retriever.languages import corpus_languages

    found = corpus_languages((d.full_text for docs in chunks for d in docs), previous)
    return replace(config, analyzer=replace(config.analyzer, languages=found))


def _check_terms(num_docs: int, total_length: int, stats: CorpusStats | None) -> None:
    if not num_docs:
        raise DataError("cannot build a BM25 index over an empty corpus")
    if stats is None and total_length == 0:
        raise DataError(f"no document of the {num_docs} has a single term after analysis; is the corpus text empty?")
