"""The systems the harness can evaluate, by name. Each is built from the corpus and answers ``search``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from indexer.corpus import Corpus
from indexer.errors import ConfigError
from indexer.records import RankedList
from retriever.bm25 import BM25Config, BM25Retriever


@runtime_checkable
class SearchSystem(Protocol):
    """Anything that ranks the corpus for a query text: the harness's plug-in point."""

    def search(self, query: str, k: int) -> RankedList: ...


SystemFactory = Callable[[Corpus], SearchSystem]

SYSTEMS: dict[str, SystemFactory] = {
    "bm25": lambda corpus: BM25Retriever.build(corpus),
    "rank-bm25": lambda corpus: BM25Retriever.build(corpus, BM25Config(engine="rank-bm25")),
}
DESCRIPTIONS = {
    "bm25": "BM25 (Lucene formula, k1=1.5, b=0.75, stemming + stopwords), bm25s engine",
    "rank-bm25": "the same BM25 computed by rank-bm25 (reference engine, slow)",
}


def resolve_systems(spec: str | Sequence[str]) -> list[str]:
    """``"all"``, ``"bm25,rank-bm25"`` or a list of names -> list of known names, in order, no repeats."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    names = [n for n in names if n]
    if names == ["all"]:
        return list(SYSTEMS)
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise ConfigError(f"unknown system(s) {', '.join(unknown) or '(none given)'}; known: all, {', '.join(SYSTEMS)}")
    return list(dict.fromkeys(names))
