"""The lexical analyzer: text -> terms (lowercase, tokenise, drop English stopwords, Snowball-stem)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from twostage.indexer.errors import ConfigError, MissingDependencyError

# Lucene's EnglishAnalyzer stop set (the classic 33 words), the list BM25 baselines use.
ENGLISH_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no",
    "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this",
    "to", "was", "will", "with",
)  # fmt: skip


@dataclass(frozen=True)
class AnalyzerConfig:
    """How text becomes terms. Saved next to every lexical index so queries are analysed the same way.

    ``stopwords``: ``"en"`` for :data:`ENGLISH_STOPWORDS`, ``None`` for none, or an explicit word list.
    ``stemmer``: a Snowball language name understood by PyStemmer (``"english"``) or ``None``.
    ``token_pattern``: the regular expression of one token (on the lowercased text when ``lowercase``).
    """

    lowercase: bool = True
    stopwords: str | tuple[str, ...] | None = "en"
    stemmer: str | None = "english"
    token_pattern: str = r"(?u)\b\w\w+\b"


class Analyzer:
    """Turns text into a list of terms; the same analyzer serves documents and queries."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        try:
            self._pattern = re.compile(self.config.token_pattern)
        except re.error as exc:
            raise ConfigError(f"analyzer token_pattern {self.config.token_pattern!r} is not a valid regex: {exc}") from None
        sw = self.config.stopwords
        if sw == "en":
            self._stopwords = frozenset(ENGLISH_STOPWORDS)
        elif sw is None:
            self._stopwords = frozenset()
        elif isinstance(sw, str):
            raise ConfigError(f"unknown stopword list {sw!r}; use 'en', None or a list of words")
        else:
            self._stopwords = frozenset(w.lower() if self.config.lowercase else w for w in sw)
        self._stem = None
        if self.config.stemmer:
            try:
                import Stemmer
            except ImportError:  # pragma: no cover - a declared dependency
                raise MissingDependencyError("stemming needs PyStemmer: pip install PyStemmer") from None
            try:
                self._stem = Stemmer.Stemmer(self.config.stemmer).stemWords
            except KeyError:
                raise ConfigError(
                    f"unknown stemmer language {self.config.stemmer!r}; one of: {', '.join(Stemmer.algorithms())}"
                ) from None

    def __call__(self, text: str) -> list[str]:
        if not isinstance(text, str):
            raise TypeError(f"analyzer input must be str, got {type(text).__name__}")
        if self.config.lowercase:
            text = text.lower()
        tokens = [t for t in self._pattern.findall(text) if t not in self._stopwords]
        return self._stem(tokens) if self._stem is not None else tokens

    def term_spans(self, text: str, query: str) -> list[tuple[int, int]]:
        """Where the query's terms occur in ``text``: (start, end) of every token of ``text`` that analyses to one
        of the query's terms (so "running" marks "runs" when stemming), in order."""
        terms = set(self(query))
        if not terms or not text:
            return []
        lowered = text.lower() if self.config.lowercase else text
        source = lowered if len(lowered) == len(text) else text  # offsets must be the original text's
        matches = [(m.start(), m.end(), m.group().lower() if self.config.lowercase else m.group())
                   for m in self._pattern.finditer(source)]
        matches = [m for m in matches if m[2] not in self._stopwords]
        tokens = [m[2] for m in matches]
        stems = self._stem(tokens) if self._stem is not None else tokens
        return [(start, end) for (start, end, _), stem in zip(matches, stems) if stem in terms]

    def analyze_many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self(t) for t in texts]
