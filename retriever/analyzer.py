"""The lexical analyzer: text -> terms.

Two analyses. An engine built before languages (``language=None``, the fields ``lowercase`` ... ``token_pattern``)
keeps the English one it was built with: lowercase, ``\\w\\w+`` tokens, English stopwords, Snowball English.
Every other analysis knows scripts: words by Unicode classes (letters, digits and their combining marks, so Hindi's
vowel signs stay inside their words), NFKC and case folding, Han / Kana / Hangul runs as overlapping character
bigrams plus single characters (Lucene's CJK analysis), Thai / Lao / Khmer / Myanmar runs as character bigrams
and trigrams (no segmenter: on XQuAD-R th dev 0.813, against 0.803 with single characters and 0.797 with
PyThaiNLP's dictionary segmenter, a 22 MB install); then the
text's language (given, or detected among the corpus's languages: :mod:`twostage.retriever.languages`) picks the
Snowball stemmer and the stopwords.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from twostage.indexer.errors import ConfigError, MissingDependencyError

# Lucene's EnglishAnalyzer stop set (the classic 33 words), the list BM25 baselines use.
ENGLISH_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no",
    "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this",
    "to", "was", "will", "with",
)  # fmt: skip

_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u30fc"  # (U+30FC, the prolonged sound mark, is "Common")
_SEA = r"\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
_WORD = rf"[[\p{{L}}\p{{N}}\p{{M}}\p{{Pc}}]--[{_CJK}{_SEA}]]+"
# words shorter than this are dropped (English keeps the rule of its legacy analysis, `\w\w+`: on XQuAD-R en dev,
# 0.869 with it against 0.867 without; every other language measured keeps single characters)
MIN_CHARS = {"en": 2}


@functools.cache
def _cjk_char() -> Any:
    import regex  # type: ignore[import-untyped]  # no types shipped

    return regex.compile(rf"[{_CJK}]", regex.V1)


@functools.cache
def _ascii_words(least: int) -> re.Pattern[str]:
    """_WORD on ASCII text, words of ``least`` characters or more (runs between other characters are whole)."""
    return re.compile(rf"[A-Za-z0-9_]{{{least},}}")


_FOLDABLE = re.compile(r"[^\W\d_]")  # a letter (folding applies to tokens of Latin, Greek or Cyrillic letters)


QUERY_CACHE = 256  # queries whose terms term_spans keeps (a batch holds at most 256)


@dataclass(frozen=True)

class AnalyzerConfig:
    """How text becomes terms. Saved next to every lexical index so queries are analysed the same way.

    ``language``: ``"auto"`` (each text's language detected among ``languages``), a language code (``"de"``,
    ``"zh"``: every text analysed as that language), or None: the English analysis of engines built before
    languages, described by the four fields below it (kept so those engines search as they always did).
    ``languages``: with ``"auto"``, the corpus's languages, found when the index is built (most frequent first).
    ``drop_stopwords``: drop the language's stopwords (bm25s's lists, where it has one). ``min_chars``: drop words
    of fewer characters (None: the language's own, :data:`MIN_CHARS`; CJK and Thai n-grams are always kept). ``fold_accents``: ``café`` and ``cafe`` become one
    term (Latin, Greek and Cyrillic words), after stemming.

    The legacy fields: ``stopwords_list`` ``"en"`` for :data:`ENGLISH_STOPWORDS`, ``None`` for none, or an explicit
    word list; ``stemmer`` a Snowball language name understood by PyStemmer (``"english"``) or ``None``;
    ``token_pattern`` the regular expression of one token (on the lowercased text when ``lowercase``).
    """

    lowercase: bool = True
    stopwords: str | tuple[str, ...] | None = "en"
    stemmer: str | None = "english"
    token_pattern: str = r"(?u)\b\w\w+\b"
    language: str | None = None
    languages: tuple[str, ...] = ()
    drop_stopwords: bool = True
    min_chars: int | None = None
    fold_accents: bool = False

    def __post_init__(self) -> None:
        from twostage.retriever.languages import check_language

        if self.language is not None:
            check_language(self.language, "the analyzer's language")
        if not isinstance(self.languages, tuple) or not all(isinstance(c, str) for c in self.languages):
            raise ConfigError(f"the analyzer's languages must be a list of language codes, got {self.languages!r}")
        for code in self.languages:
            check_language(code, "the analyzer's languages")
        if self.min_chars is not None and (isinstance(self.min_chars, bool) or not isinstance(self.min_chars, int)
                                           or not 1 <= self.min_chars <= 10):
            raise ConfigError(f"the analyzer's min_chars must be None or an integer in [1, 10], got {self.min_chars!r}")

    @property
    def described(self) -> str:
        """The analysis in words, for ``info`` and ``/stats``."""
        if self.language is None:
            return "en (the English analysis of engines built before languages)"
        if self.language == "auto":
            return f"auto ({', '.join(self.languages) or 'no language found yet'})"
        return self.language


def for_language(language: str | None) -> AnalyzerConfig:
    """The analysis a new index gets for ``language`` (``"auto"`` or a code; None: the legacy English one)."""
    return AnalyzerConfig() if language is None else AnalyzerConfig(language=language)


class Analyzer:
    """Turns text into a list of terms; the same analyzer serves documents and queries."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        if self.config.language is None:
            self._legacy_setup()
        else:
            import regex  # type: ignore[import-untyped]  # no types shipped

            self._tokens = regex.compile(rf"([{_CJK}]+)|([{_SEA}]+)|({_WORD})", regex.V1)
            self._runs = regex.compile(rf"[{_CJK}{_SEA}]", regex.V1)
            self._word = regex.compile(_WORD, regex.V1)

    # ---- the analysis of engines built before languages ---------------------------------------------------------
    def _legacy_setup(self) -> None:
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

    def _legacy(self, text: str) -> list[str]:
        if self.config.lowercase:
            text = text.lower()
        tokens = [t for t in self._pattern.findall(text) if t not in self._stopwords]
        return self._stem(tokens) if self._stem is not None else tokens

    def _legacy_spans(self, text: str, terms: set[str]) -> list[tuple[int, int]]:
        lowered = text.lower() if self.config.lowercase else text
        source = lowered if len(lowered) == len(text) else text  # offsets must be the original text's
        matches = [(m.start(), m.end(), m.group().lower() if self.config.lowercase else m.group())
                   for m in self._pattern.finditer(source)]
        matches = [m for m in matches if m[2] not in self._stopwords]
        tokens = [m[2] for m in matches]
        stems = self._stem(tokens) if self._stem is not None else tokens
        return [(start, end) for (start, end, _), stem in zip(matches, stems) if stem in terms]

    # ---- the analysis that knows scripts and languages ----------------------------------------------------------
    def language_of(self, text: str) -> str:
        """The language ``text`` is analysed as ("en" for the legacy analysis)."""
        language = self.config.language
        if language is None:
            return "en"
        if language != "auto":
            return language
        from twostage.retriever.languages import detect

        return detect(text, self.config.languages)

    def _words(self, text: str, language: str) -> list[tuple[str, int, int]]:
        """(term, start, end) of every token of ``text``, in order: words normalised, filtered and stemmed by
        ``language``; CJK runs as their characters and bigrams, Thai-like runs as their bigrams and trigrams."""
        from twostage.retriever.languages import stemmer, stopwords

        stop = stopwords(language) if self.config.drop_stopwords else frozenset()
        least = self.config.min_chars or MIN_CHARS.get(language, 1)
        if text.isascii():  # the common case (a hit's text to highlight): no CJK or Thai run, words of ASCII letters
            words = [(w, m.start(), m.end()) for m in _ascii_words(least).finditer(text)
                     if (w := m.group().lower()) not in stop]
            grams: list[tuple[str, int, int]] = []
        else:
            words, grams = self._unicode_tokens(text, stop, least)
        stem = stemmer(language)
        if stem is not None and words:  # (Snowball Arabic stems some words to nothing: those are dropped)
            words = [(s, a, b) for s, (_, a, b) in zip(stem([w for w, _, _ in words]), words) if s]
        if self.config.fold_accents:
            words = [(_fold(w), a, b) for w, a, b in words]
        return words + grams if grams else words

    def _unicode_tokens(self, text: str, stop: frozenset[str], least: int) -> tuple[list[tuple[str, int, int]],
                                                                                   list[tuple[str, int, int]]]:
        """The words (normalised, ``stop`` and words under ``least`` characters dropped, not yet stemmed) and the
        CJK / Thai-like n-grams of ``text``, each with its (start, end)."""
        words: list[tuple[str, int, int]] = []
        grams: list[tuple[str, int, int]] = []
        for m in self._tokens.finditer(text):
            cjk, sea, word = m.groups()
            if cjk:
                at = m.start()
                for i, ch in enumerate(cjk):
                    grams.append((ch, at + i, at + i + 1))
                    if i:
                        grams.append((cjk[i - 1:i + 1], at + i - 1, at + i + 1))
                continue
            if sea:
                at = m.start()
                if len(sea) <= 2:  # the run is its one n-gram
                    grams.append((sea, at, at + len(sea)))
                    continue
                for i in range(len(sea) - 1):
                    grams.append((sea[i:i + 2], at + i, at + i + 2))
                    if i + 3 <= len(sea):
                        grams.append((sea[i:i + 3], at + i, at + i + 3))
                continue
            term = word.lower() if word.isascii() else unicodedata.normalize("NFKC", word).casefold()
            if len(term) >= least and term not in stop:
                words.append((term, m.start(), m.end()))
        return words, grams

    # ---- the analyzer -------------------------------------------------------------------------------------------
    def __call__(self, text: str) -> list[str]:
        return self.analyse(text)[0]

    def analyse(self, text: str) -> tuple[list[str], str]:
        """The terms of ``text`` and the language it was analysed as (one detection for both; ``en`` for the legacy
        analysis)."""
        if not isinstance(text, str):
            raise TypeError(f"analyzer input must be str, got {type(text).__name__}")
        if self.config.language is None:
            return self._legacy(text), "en"
        language = self.language_of(text)
        return self._terms(text, language), language

    def _terms(self, text: str, language: str) -> list[str]:
        if text.isascii():  # the common cases first, without offsets: the same terms as _words
            return self._plain_terms(_ascii_words(self.config.min_chars or MIN_CHARS.get(language, 1))
                                     .findall(text.lower()), language)
        if not self._runs.search(text):  # no CJK or Thai-like run: words of the normalised text
            least = self.config.min_chars or MIN_CHARS.get(language, 1)
            return self._plain_terms([w for w in self._word.findall(unicodedata.normalize("NFKC", text).casefold())
                                      if len(w) >= least], language)
        return [t for t, _, _ in self._words(text, language)]

    def _plain_terms(self, words: list[str], language: str) -> list[str]:
        from twostage.retriever.languages import stemmer, stopwords

        if self.config.drop_stopwords:
            stop = stopwords(language)
            words = [w for w in words if w not in stop]
        stem = stemmer(language)
        if stem is not None and words:
            words = [w for w in stem(words) if w]
        return [_fold(w) for w in words] if self.config.fold_accents else words

    def term_spans(self, text: str, query: str) -> list[tuple[int, int]]:
        """Where the query's terms occur in ``text``: (start, end) of every token of ``text`` that analyses to one
        of the query's terms (so "running" marks "runs" when stemming), in order, overlapping spans (a CJK run's
        characters and bigrams) merged."""
        language, terms = self._query_terms(query)
        if self.config.language is None:
            return self._legacy_spans(text, set(terms)) if terms and text else []
        if not terms or not text:
            return []
        spans = sorted((a, b) for t, a, b in self._words(text, language) if t in terms)
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        cjk = _cjk_char()
        if any(len(t) > 1 and cjk.match(t) for t in terms):
            # a lone CJK character (在, 何) matched by itself marks noise where the query has longer runs: a
            # reader sees its words (bigrams and longer), as a search page marks them
            merged = [(a, b) for a, b in merged if b - a > 1 or not cjk.match(text, a)]
        return merged

    def _query_terms(self, query: str) -> tuple[str, frozenset[str]]:
        """The language and terms of a query whose hits are being highlighted, analysed once for all of its hits
        (the last :data:`QUERY_CACHE` queries kept: a batch's hits highlight the same few queries many times)."""
        cache = self.__dict__.setdefault("_query_cache", {})
        found = cache.get(query)
        if found is None:
            if self.config.language is None:
                found = ("en", frozenset(self(query)))
            else:
                language = self.language_of(query)
                found = (language, frozenset(self._terms_as(query, language)))
            if len(cache) >= QUERY_CACHE:
                cache.clear()
            cache[query] = found
        return found

    def _terms_as(self, text: str, language: str) -> list[str]:
        return [t for t, _, _ in self._words(text, language)]

    def analyze_many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self(t) for t in texts]

    def with_languages(self, languages: tuple[str, ...]) -> Analyzer:
        """This analysis with ``languages`` as the corpus's (auto only)."""
        return Analyzer(replace(self.config, languages=languages))


def _fold(word: str) -> str:
    """``word`` without its combining accents when it is of Latin, Greek or Cyrillic letters."""
    if word.isascii() or not _FOLDABLE.match(word):
        return word
    import regex  # type: ignore[import-untyped]  # no types shipped

    if not regex.match(r"[\p{Latin}\p{Greek}\p{Cyrillic}]", word):
        return word
    return unicodedata.normalize("NFC", "".join(c for c in unicodedata.normalize("NFD", word)
                                                 if not unicodedata.combining(c)))
