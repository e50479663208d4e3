"""Dense retrieval by exact search: every document embedding scored against the query (cosine or dot)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from twostage.indexer.errors import DataError
from twostage.indexer.records import Document, RankedList, check_k, top_k


class DenseRetriever:
    """Exact (brute-force) dense search over precomputed document embeddings. Scores: higher is better."""

    def __init__(self, encoder: Any, doc_ids: Sequence[str], embeddings: np.ndarray) -> None:
        if len(doc_ids) != len(embeddings):
            raise DataError(f"{len(doc_ids)} document ids but {len(embeddings)} embeddings")
        if not np.isfinite(embeddings).all():
            raise DataError("document embeddings contain NaN or infinite values")
        self.encoder = encoder
        self.doc_ids = np.asarray(doc_ids, dtype=object)
        self.embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)

    @classmethod
    def build(cls, documents: Iterable[Document], encoder: Any, *, batch_size: int = 32,
              show_progress: bool = False) -> DenseRetriever:
        docs = list(documents)
        if not docs:
            raise DataError("cannot build a dense index over an empty corpus")
        emb = encoder.encode([d.full_text for d in docs], kind="document", batch_size=batch_size,
                             show_progress=show_progress, allow_empty=True)
        return cls(encoder, [d.id for d in docs], emb)

    def search_vectors(self, queries: np.ndarray, k: int) -> list[RankedList]:
        k = check_k(k)
        scores = np.asarray(queries, dtype=np.float32) @ self.embeddings.T
        out = []
        for row in scores:
            rows, s = top_k(row, k)
            out.append(RankedList(self.doc_ids[rows], s))
        return out

    def scores(self, query: str) -> np.ndarray:
        """Similarity of every document to ``query`` (corpus order)."""
        return self.embeddings @ self.encoder.encode([query], kind="query")[0]

    def search(self, query: str, k: int = 10) -> RankedList:
        return self.search_vectors(self.encoder.encode([query], kind="query"), k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 10, *, batch_size: int = 64,
                     show_progress: bool = False) -> list[RankedList]:
        vectors = self.encoder.encode(list(queries), kind="query", batch_size=batch_size, show_progress=show_progress)
        return self.search_vectors(vectors, k)
