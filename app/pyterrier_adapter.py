"""twostage inside PyTerrier: the engine as a retrieval transformer, its reranker as a reranking one.

>>> import pyterrier as pt
>>> from twostage.app.pyterrier_adapter import TwostageRetrieve, TwostageRerank
>>> pt.Experiment([TwostageRetrieve(engine, k=100), bm25 >> TwostageRerank(engine)], topics, qrels,
...               eval_metrics=["ndcg_cut_10"])

:class:`TwostageRetrieve` takes a queries frame (``qid``, ``query``) and returns PyTerrier's result frame
(``qid``, ``query``, ``docno``, ``score``, ``rank``), each query answered by :meth:`SearchEngine.search_batch`.
:class:`TwostageRerank` takes a result frame and scores each (query, document) pair with the cross-encoder; the
document text is the frame's ``text`` column when there is one, else the engine's stored text. Needs the
``pyterrier`` extra (``pyterrier`` 1.x; Java is not needed for these two).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyterrier as pt

__all__ = ["TwostageRerank", "TwostageRetrieve"]

RESULT_COLUMNS = ["qid", "query", "docno", "score", "rank"]


def _check_columns(inp: pd.DataFrame, needed: tuple[str, ...], who: str) -> None:
    from twostage.indexer.errors import ConfigError

    missing = [c for c in needed if c not in inp.columns]
    if missing:
        raise ConfigError(f"{who}: the input frame lacks column(s) {', '.join(missing)} (has "
                          f"{', '.join(map(str, inp.columns))})")


class TwostageRetrieve(pt.Transformer):
    """Queries -> the engine's top ``k`` documents (``where`` a filter, ``search_options`` the search knobs)."""

    def __init__(self, engine: Any, k: int = 10, where: Any = None, batch_size: int = 32,
                 **search_options: Any) -> None:
        super().__init__()
        self.engine, self.k, self.where, self.batch_size, self.search_options = \
            engine, k, where, batch_size, search_options

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        _check_columns(inp, ("qid", "query"), "TwostageRetrieve")
        rows = []
        queries = list(zip(inp["qid"].astype(str), inp["query"].astype(str)))
        for at in range(0, len(queries), self.batch_size):
            batch = queries[at:at + self.batch_size]
            results = self.engine.search_batch([q for _, q in batch], k=self.k, where=self.where,
                                               **self.search_options)
            for (qid, query), result in zip(batch, results):
                rows += [(qid, query, h.id, float(h.score), h.rank - 1) for h in result.hits]
        return pd.DataFrame(rows, columns=RESULT_COLUMNS)

    def __repr__(self) -> str:
        return f"TwostageRetrieve(k={self.k})"


class TwostageRerank(pt.Transformer):
    """A result frame -> the same documents scored by the cross-encoder (``score``), ranked again per query."""

    def __init__(self, engine: Any = None, reranker: Any = None, batch_size: int = 32) -> None:
        from twostage.indexer.errors import ConfigError

        super().__init__()
        self.engine, self.batch_size = engine, batch_size
        chosen = reranker if reranker is not None else (engine.reranker if engine is not None else None)
        if chosen is None:
            raise ConfigError("TwostageRerank needs a reranker: an engine built with one, or reranker=CrossEncoder")
        self.reranker: Any = chosen

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        import numpy as np

        from twostage.indexer.errors import ConfigError

        _check_columns(inp, ("qid", "query", "docno"), "TwostageRerank")
        if inp.empty:
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        if "text" in inp.columns:
            texts = inp["text"].astype(str).tolist()
        elif self.engine is not None:
            docs = {d.id: d.full_text for d in self.engine.documents(sorted(set(inp["docno"].astype(str))))}
            texts = [docs[str(d)] for d in inp["docno"]]
        else:
            raise ConfigError("TwostageRerank: the frame has no text column and no engine was given to read "
                              "documents from")
        scores = self.reranker.predict(list(zip(inp["query"].astype(str), texts)), batch_size=self.batch_size)
        out = inp.assign(score=np.asarray(scores, dtype=np.float64))
        out = out.sort_values(["qid", "score"], ascending=[True, False], kind="stable")
        out["rank"] = out.groupby("qid", sort=False).cumcount()
        return out.reset_index(drop=True)

    def __repr__(self) -> str:
        return "TwostageRerank()"
