"""Pseudo-queries: training queries made from a corpus alone, for adapting the models without labels.

Each document yields queries of these kinds, each paired with the document it came from (its one positive) and
with a *positive text* from which the query's own words were removed where that is possible, so the model
learns to match a query to the rest of the document rather than to copy text (the inverse cloze task):

- ``title``: the document's title (three words or more); the positive is its text without the title;
- ``sentence``: one sentence of the text (5 to 60 words), chosen at random among the ones with the most rare
  words (the sum of their inverse document frequencies per word, the top half); the positive is the title plus
  the text without that sentence;
- ``keywords``: the document's rarest words (3 to 6 of them, by tf-idf over the corpus, in text order); the
  positive is the whole document;
- ``passage``: one half of the text (its sentences split near the middle, which half drawn at random; 15 words or
  more each), for collections whose queries are themselves passages (ArguAna's are whole arguments); the positive
  is the title plus the other half. Not among the default kinds: ask for it (``twostage adapt --query-kinds``).

Everything is seeded: the same corpus and seed give the same queries. Ids are ``<doc id>#<kind>``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Document, Judgment, Qrels, Query
from twostage.retriever.analyzer import ENGLISH_STOPWORDS

KINDS = ("title", "sentence", "keywords", "passage")
DEFAULT_KINDS = ("title", "sentence", "keywords")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"(?u)\b[^\W\d_][\w-]*[^\W_]\b|\b[^\W\d_]\b")
_STOP = frozenset(ENGLISH_STOPWORDS) | frozenset((
    "we", "our", "was", "were", "has", "have", "had", "been", "from", "which", "who", "what", "when", "where",
    "how", "than", "also", "can", "may", "between", "both", "each", "its", "all", "any", "more", "most", "other",
    "some", "only", "over", "after", "before", "during", "about", "through", "under", "using", "used", "use",
    "however", "here", "study", "results", "result", "shown", "show", "shows", "found", "whether", "would",
    "could", "should", "those", "them", "being", "very", "well", "while", "within", "without",
))  # fmt: skip


@dataclass(frozen=True)
class PseudoQuery:
    """A query made from document ``doc_id``; ``positive`` is the text it should retrieve."""

    id: str
    doc_id: str
    kind: str
    text: str
    positive: str


@dataclass(frozen=True)
class PseudoQueryConfig:
    """Which kinds to make and how many per document (each document gives at most one query of each kind)."""

    kinds: tuple[str, ...] = DEFAULT_KINDS
    per_document: int = 1  # queries per document, kinds drawn at random among those the document can give
    seed: int = 42

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ConfigError(f"pseudo-query kinds must be some of {', '.join(KINDS)}, got {', '.join(bad) or 'none'}")
        if self.per_document <= 0:
            raise ConfigError(f"per_document must be a positive integer, got {self.per_document!r}")


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


class _Idf:
    def __init__(self, docs: Sequence[Document]) -> None:
        df: Counter[str] = Counter()
        for d in docs:
            df.update({w.lower() for w in words(d.full_text)})
        self.n = len(docs)
        self.df = df

    def __call__(self, word: str) -> float:
        return math.log(1 + self.n / (1 + self.df.get(word.lower(), 0)))


def _title(doc: Document) -> tuple[str, str] | None:
    title, text = doc.title.strip(), doc.text.strip()
    if text.lower().startswith(title.lower()):  # some collections repeat the title at the start of the text
        text = text[len(title):].strip()
    if len(words(title)) < 3 or not text:
        return None
    return title, text


def _body(doc: Document) -> list[str]:
    """The text's sentences, without a first one that repeats the title."""
    parts = sentences(doc.text)
    if doc.title and parts and parts[0].lower() == doc.title.strip().lower():
        return parts[1:]
    return parts


def _sentence(doc: Document, idf: _Idf, rng: np.random.Generator) -> tuple[str, str] | None:
    parts = _body(doc)
    if len(parts) < 2:
        return None
    scored = []
    for i, s in enumerate(parts):
        ws = [w for w in words(s) if w.lower() not in _STOP]
        if 5 <= len(words(s)) <= 60 and ws:
            scored.append((sum(idf(w) for w in ws) / len(ws), i))
    if not scored:
        return None
    scored.sort(reverse=True)
    _, pick = scored[int(rng.integers(max(1, (len(scored) + 1) // 2)))]
    rest = " ".join(s for i, s in enumerate(parts) if i != pick)
    return parts[pick], f"{doc.title} {rest}".strip()


def _keywords(doc: Document, idf: _Idf, rng: np.random.Generator) -> tuple[str, str] | None:
    seen: dict[str, tuple[int, str]] = {}
    counts: Counter[str] = Counter()
    for pos, w in enumerate(words(doc.full_text)):
        key = w.lower()
        if key in _STOP or len(key) < 3:
            continue
        counts[key] += 1
        seen.setdefault(key, (pos, w))
    if len(counts) < 3:
        return None
    ranked = sorted(counts, key=lambda k: (-(1 + math.log(counts[k])) * idf(k), seen[k][0]))
    n = int(rng.integers(3, 7))
    chosen = sorted(ranked[:n], key=lambda k: seen[k][0])
    return " ".join(seen[k][1] for k in chosen), doc.full_text


def _passage(doc: Document, rng: np.random.Generator) -> tuple[str, str] | None:
    parts = _body(doc)
    if len(parts) < 2:
        return None
    cut = len(parts) // 2 + (int(rng.integers(-1, 2)) if len(parts) >= 6 else 0)  # near the middle
    halves = (" ".join(parts[:cut]), " ".join(parts[cut:]))
    if min(len(words(h)) for h in halves) < 15:
        return None
    first = int(rng.integers(2))
    return halves[first], f"{doc.title} {halves[1 - first]}".strip()


_MAKERS: dict[str, Callable[[Document, _Idf, np.random.Generator], tuple[str, str] | None]] = {
    "title": lambda doc, idf, rng: _title(doc), "sentence": _sentence, "keywords": _keywords,
    "passage": lambda doc, idf, rng: _passage(doc, rng),
}  # one per kind of KINDS, each drawing from the one seeded rng in corpus order


def make_pseudo_queries(docs: Sequence[Document], config: PseudoQueryConfig = PseudoQueryConfig()) -> list[PseudoQuery]:
    """Queries for ``docs`` (a corpus or any sequence of documents), in corpus order."""
    if not docs:
        raise DataError("cannot make pseudo-queries from an empty corpus")
    idf = _Idf(docs)
    rng = np.random.default_rng(config.seed)
    out: list[PseudoQuery] = []
    for doc in docs:
        made = {}
        for kind in config.kinds:
            pair = _MAKERS[kind](doc, idf, rng)
            if pair is not None and pair[0].strip() and pair[1].strip():
                made[kind] = pair
        if not made:
            continue
        kinds = list(made)
        for j in sorted(rng.permutation(len(kinds))[:config.per_document]):
            text, positive = made[kinds[j]]
            out.append(PseudoQuery(f"{doc.id}#{kinds[j]}", doc.id, kinds[j], text, positive))
    if not out:
        raise DataError("no document gave a pseudo-query: documents need a title of 3+ words or a text of 2+ "
                        "sentences or 3+ distinct words")
    return out


def as_queries_and_qrels(pseudo: Sequence[PseudoQuery]) -> tuple[list[Query], Qrels]:
    """The pseudo-queries as queries with their source documents as the one relevant document each."""
    return ([Query(p.id, p.text) for p in pseudo],
            Qrels.from_judgments(Judgment(p.id, p.doc_id, 1) for p in pseudo))
