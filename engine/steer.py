"""Result lists a user steers: more like these documents, less like those, diverse, grouped by a metadata field.

These are a search call's options (:data:`STEERING`), beside the stage knobs; :class:`Steering` holds them checked.

**More like these, less like those** (Rocchio's relevance feedback, 1971). The dense query moves towards the mean of
the liked documents' vectors and away from the mean of the unliked ones, keeping its length::

    q' = q + like * mean(liked) - unlike * mean(unliked),   rescaled to |q|

and BM25's query gains the liked documents' ``terms`` strongest terms (their BM25 weight in the document, averaged
over the liked ones), the strongest weighted ``term_weight`` against a query term's 1 and the others in proportion
(:data:`FEEDBACK`). The reranker reads the query text as before. ``similar(id)`` is a document as the query: its vector and
its strongest terms alone. The weights were chosen on dev (``benchmarks/experiments/steering.py``).

**Diversity**, maximal marginal relevance (Carbonell & Goldstein, 1998) over the candidates' vectors, after the
reranker (relevance is the best score the engine has). Hits are chosen greedily, each time the candidate with the
highest::

    mmr(d) = (1 - diversity) * minmax(relevance)(d) - diversity * max over hits h chosen before of redundancy(d, h)
    redundancy(d, h) = max(0, cos(d, h) - FLOOR) / (1 - FLOOR)

and that value is its score (it never rises from one hit to the next). ``diversity=0`` is relevance alone. Below the
floor two documents count as different: on dev, plain cosine (floor 0) pushed down the relevant documents of the
query's own topic along with the copies (SciFact: nDCG@10 -0.024 at diversity 0.5), while a floor of 0.8 removes
near-copies and close paraphrases at no measurable cost (benchmarks/results/steering-choice*.md).

**Grouping**: at most ``group_size`` hits per value of a metadata field, the groups ordered by their best hit, a
hit without the field a group of its own; ``k`` and ``offset`` then count groups, so pages never split one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from twostage.engine.fusion import minmax
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import RankedList, check_encodable

if TYPE_CHECKING:
    from twostage.engine.source import CandidateSource

STEERING = ("like", "unlike", "diversity", "group_by", "group_size", "explain", "include_feedback")



@dataclass(frozen=True)
class FeedbackWeights:
    """Relevance feedback's weights: Rocchio's ``like`` (beta) and ``unlike`` (gamma) against the query vector's 1;
    the liked documents' ``terms`` strongest terms added to BM25's query, the strongest weighted ``term_weight``."""

    like: float = 1.5
    unlike: float = 0.3  # a fifth of like, Rocchio's ratio (the residual protocol measures like alone)
    terms: int = 10
    term_weight: float = 3.0


FEEDBACK = FeedbackWeights()  # like and term_weight chosen on dev: benchmarks/results/steering-choice*.md
DEFAULT_DIVERSITY = 0.5  # diversity=True; chosen on dev: benchmarks/results/steering-choice*.md
FLOOR = 0.8  # the cosine below which two hits are not redundant at all; chosen on dev (ibid.)
MAX_EXAMPLES = 100  # liked + unliked documents one call may name


@dataclass(frozen=True)
class Steering:
    """One call's steering options, checked. ``similar``: the liked document is the query (no query text)."""

    like: tuple[str, ...] = ()
    unlike: tuple[str, ...] = ()
    diversity: float = 0.0
    group_by: str | None = None
    group_size: int = 1
    explain: bool = False
    include_feedback: bool = False
    similar: bool = False

    @property
    def feedback(self) -> bool:
        return bool(self.like or self.unlike)

    @property
    def excluded(self) -> frozenset[str]:
        """The documents left out of the hits: the examples, unless asked for."""
        return frozenset() if self.include_feedback else frozenset(self.like + self.unlike)

    @property
    def reorders(self) -> bool:
        """Whether the whole window is needed before the cut to a page (diversity, grouping)."""
        return self.diversity > 0 or self.group_by is not None


def split_steering(knobs: Mapping[str, Any]) -> tuple[Steering, dict[str, Any]]:
    """One call's options as its :class:`Steering` and the stage knobs left."""
    names = (*STEERING, "similar")  # similar: set by search.similar, not a user's option
    rest = {k: v for k, v in knobs.items() if k not in names}
    given = {k: v for k, v in knobs.items() if k in names and v is not None}
    like, unlike = _ids(given.get("like"), "like"), _ids(given.get("unlike"), "unlike")
    if len(like) + len(unlike) > MAX_EXAMPLES:
        raise ConfigError(f"like and unlike name {len(like) + len(unlike)} documents; at most {MAX_EXAMPLES}")
    both = sorted(set(like) & set(unlike))
    if both:
        raise ConfigError(f"document {both[0]!r} is in both like and unlike; name it in one")
    diversity = given.get("diversity", 0.0)
    if isinstance(diversity, bool):
        diversity = DEFAULT_DIVERSITY if diversity else 0.0
    if isinstance(diversity, bool) or not isinstance(diversity, (int, float)) or not 0 <= diversity <= 1 \
            or math.isnan(diversity):
        raise ConfigError(f"diversity must be a number in [0, 1] (0: relevance alone), got {diversity!r}")
    group_by = given.get("group_by")
    if group_by is not None and (not isinstance(group_by, str) or not group_by.strip()):
        raise ConfigError(f"group_by must name a metadata field, got {group_by!r}")
    group_size = given.get("group_size", 1)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not 1 <= group_size <= 1000:
        raise ConfigError(f"group_size must be an integer in [1, 1000], got {group_size!r}")
    if "group_size" in given and group_by is None:
        raise ConfigError("group_size needs group_by (the metadata field hits are grouped by)")
    flags = {}
    for name in ("explain", "include_feedback", "similar"):
        value = given.get(name, False)
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        flags[name] = value
    return Steering(like, unlike, float(diversity), group_by, group_size, **flags), rest


def _ids(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{name} takes a list of document ids, got {type(value).__name__}")
    for i in value:
        if not isinstance(i, str) or not i:
            raise ConfigError(f"{name}: document ids are non-empty strings, got {i!r}")
        check_encodable(i, f"{name} id {i[:40]!r}")
    return tuple(dict.fromkeys(value))


# ---- more like these, less like those ----------------------------------------------------------------------
@dataclass(frozen=True)
class Expansion:
    """BM25's query grown by feedback: ``terms`` (analysed) with their weights, added to the query's own terms
    (``query_text``), or alone (a document as the query)."""

    terms: Mapping[str, float]
    query_text: bool = True


def rocchio(queries: np.ndarray | None, liked: np.ndarray, unliked: np.ndarray, n: int) -> np.ndarray:
    """The query vectors moved towards ``liked``'s mean and away from ``unliked``'s (each (m, dim), m >= 0), each
    rescaled to its length before; ``queries`` None (a document as the query): ``liked``'s mean, ``n`` times."""
    if queries is None:
        mean = liked.mean(axis=0, dtype=np.float64)
        return np.repeat(mean[None, :], n, axis=0).astype(np.float32)
    q = np.asarray(queries, dtype=np.float64)
    moved = q.copy()
    if len(liked):
        moved += FEEDBACK.like * liked.mean(axis=0, dtype=np.float64)
    if len(unliked):
        moved -= FEEDBACK.unlike * unliked.mean(axis=0, dtype=np.float64)
    before, after = np.linalg.norm(q, axis=1, keepdims=True), np.linalg.norm(moved, axis=1, keepdims=True)
    return (moved * np.where(after > 0, before / np.maximum(after, 1e-12), 1.0)).astype(np.float32)


def expansion(per_document: Sequence[Mapping[str, float]], m: int, weight: float) -> dict[str, float]:
    """The ``m`` terms with the highest mean weight over the liked documents (each document's terms and their BM25
    weight in it), weighted ``weight`` for the strongest and the others in proportion."""
    if not per_document or m <= 0 or weight <= 0:
        return {}
    total: dict[str, float] = {}
    for terms in per_document:
        for t, w in terms.items():
            total[t] = total.get(t, 0.0) + w / len(per_document)
    best = sorted(total.items(), key=lambda tw: (-tw[1], tw[0]))[:m]
    top = best[0][1] if best else 0.0
    return {t: weight * w / top for t, w in best if w > 0} if top > 0 else {}


# ---- diversity ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Diversified:
    """A list re-ordered by MMR: its ids and MMR scores, and for each id the parts of its score (its relevance, the
    relevance's min and max over the list, its redundancy and the hit it is most like)."""

    ranked: RankedList
    parts: Mapping[str, tuple[float, float, float, float, str | None]]


def mmr(ranked: RankedList, vectors: np.ndarray, diversity: float, limit: int | None = None) -> Diversified:
    """``ranked`` re-ordered by maximal marginal relevance (the module's formula), its first ``limit`` hits (all when
    None: greedy choice makes every shorter list a prefix of a longer one, so pages agree); ``vectors`` one per id,
    in its order (normalised here for the cosine)."""
    n = len(ranked)
    m = n if limit is None else min(n, limit)
    if m == 0:
        return Diversified(RankedList(ranked.ids[:0], np.zeros(0)), {})
    rel = np.asarray(ranked.scores, dtype=np.float64)
    keep = (1.0 - diversity) * minmax(rel)
    v = np.asarray(vectors, dtype=np.float64)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    redundancy = np.zeros(n)
    nearest = np.full(n, -1, dtype=np.int64)
    left = np.ones(n, dtype=bool)
    lo, hi = float(rel.min()), float(rel.max())
    order, scores = [], []
    parts: dict[str, tuple[float, float, float, float, str | None]] = {}
    for _ in range(m):
        value = np.where(left, keep - diversity * redundancy, -np.inf)
        pick = int(np.argmax(value))  # ties: the earlier, more relevant one
        order.append(pick)
        scores.append(float(value[pick]))
        like = str(ranked.ids[nearest[pick]]) if nearest[pick] >= 0 else None
        parts[str(ranked.ids[pick])] = (float(rel[pick]), lo, hi, float(redundancy[pick]), like)
        left[pick] = False
        sims = np.maximum(v @ v[pick] - FLOOR, 0.0) / (1.0 - FLOOR)
        closer = sims > redundancy
        nearest[closer] = pick
        redundancy = np.where(closer, sims, redundancy)
    return Diversified(RankedList(ranked.ids[np.array(order)], np.array(scores, dtype=np.float64)), parts)


# ---- grouping ------------------------------------------------------------------------------------------
def group_key(value: Any) -> str | None:
    """A metadata value as a group's key (None: the field is absent, the hit is a group of its own)."""
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, default=str)


def grouped(ranked: RankedList, values: Sequence[Any], group_size: int) -> list[list[int]]:
    """The positions in ``ranked`` of each group's hits (at most ``group_size``, best first), the groups ordered by
    their best hit; ``values`` each hit's value of the field (None: a group of its own)."""
    groups: dict[str, list[int]] = {}
    order: list[list[int]] = []
    for pos, value in enumerate(values):
        key = group_key(value)
        if key is None:
            order.append([pos])
            continue
        members = groups.get(key)
        if members is None:
            members = groups[key] = [pos]
            order.append(members)
        elif len(members) < group_size:
            members.append(pos)
    return order


# ---- the steps the search path calls (``engine``: a CandidateSource) ---------------------------------------------
@dataclass(frozen=True)
class Feedback:
    """Relevance feedback as the first stages use it: the liked and unliked documents' vectors (rows), and BM25's
    query expansion (None: BM25 does not run, or nothing is liked)."""

    liked: np.ndarray
    unliked: np.ndarray
    expansion: Expansion | None


def feedback(engine: CandidateSource, steer: Steering, stage: str) -> Feedback:
    """The liked and unliked documents' vectors, and BM25's expansion by the liked ones' strongest terms."""
    lexical_stage = stage in ("bm25", "hybrid") and bool(steer.like)
    found = engine.example_features(list(steer.like + steer.unlike), FEEDBACK.terms if lexical_stage else 0)
    for name, group in (("like", steer.like), ("unlike", steer.unlike)):
        missing = next((d for d in group if d not in found), None)
        if missing is not None:
            raise ConfigError(f"{name}: document {missing!r} is not in the engine (deleted, or never added); "
                              "name documents the engine holds")
    dim = len(next(iter(found.values()))[0])

    def stacked(group: tuple[str, ...]) -> np.ndarray:
        return np.stack([found[d][0] for d in group]) if group else np.zeros((0, dim), dtype=np.float32)

    lexical = None
    if lexical_stage:
        lexical = Expansion(expansion([found[d][1] for d in steer.like], FEEDBACK.terms, FEEDBACK.term_weight),
                            query_text=not steer.similar)
    return Feedback(stacked(steer.like), stacked(steer.unlike), lexical)


def diversify(engine: CandidateSource, finals: list[RankedList], reads: list[dict[str, tuple[str, ...]]] | None,
              diversity: float, limit: int | None = None) -> list[Diversified]:
    """Each list's first ``limit`` hits (None: all) by maximal marginal relevance over its documents' vectors (a
    passage engine: each document's best passage)."""
    keys = [[reads[q][str(d)][0] if reads is not None else str(d) for d in f.ids] for q, f in enumerate(finals)]
    found = engine.vectors_by_id(sorted({key for ks in keys for key in ks}))
    return [mmr(f, np.stack([found[key] for key in ks]) if ks else np.zeros((0, 1), np.float32), diversity, limit)
            for f, ks in zip(finals, keys)]


def group_pages(engine: CandidateSource, finals: list[RankedList], steer: Steering, offset: int,
                k: int) -> tuple[list[RankedList], list[dict[str, Any]], list[bool]]:
    """Each list's page of ``k`` groups from the ``offset``-th (:func:`grouped`), each hit's value of the field, and
    whether more groups follow."""
    assert steer.group_by is not None
    ids = sorted({str(d) for f in finals for d in f.ids})
    values = {d.id: d.metadata.get(steer.group_by) for d in engine.documents(ids)}
    pages, groups, more = [], [], []
    for f in finals:
        order = grouped(f, [values[str(d)] for d in f.ids], steer.group_size)
        rows = np.array([p for g in order[offset:offset + k] for p in g], dtype=np.int64)
        pages.append(RankedList(f.ids[rows], f.scores[rows]))
        groups.append({str(f.ids[p]): values[str(f.ids[p])] for p in rows.tolist()})
        more.append(offset + k < len(order))
    return pages, groups, more
