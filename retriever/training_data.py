"""Training examples for the bi-encoder and the batches they are served in.

Builders turn the data users have into examples: BEIR qrels (query, relevant document, mined negatives),
(title, text) pairs of any corpus, NLI (entailment positive, contradiction hard negative), scored pairs (STS).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.corpus import Corpus
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.jsonl import iter_jsonl
from twostage.indexer.records import Qrels, Query
from twostage.retriever.examples import PairExample, ScoredPair
from twostage.retriever.objectives import OBJECTIVES

logger = logging.getLogger(__name__)

__all__ = [  # the records live in twostage.retriever.examples; importable from here too
    "PairExample", "PairScorer", "ScoredPair", "TrainingSet", "hold_out", "nli_triplets", "no_duplicate_batches",
    "pairs_from_qrels", "pairs_from_titles", "round_robin", "scored_pairs", "with_margins",
]


@dataclass(frozen=True)
class TrainingSet:
    """Examples trained with one objective; batches are drawn from one set at a time."""

    name: str
    objective: str
    examples: tuple[PairExample, ...] | tuple[ScoredPair, ...]
    num_labels: int = 0  # softmax only

    def __post_init__(self) -> None:
        objective = OBJECTIVES.get(self.objective)
        if objective is None:
            raise ConfigError(f"unknown objective {self.objective!r}; use one of {', '.join(OBJECTIVES)}")
        if not self.examples:
            raise DataError(f"training set {self.name!r} is empty")
        bad = next((i for i, e in enumerate(self.examples) if not isinstance(e, objective.example)), None)
        if bad is not None:
            raise DataError(f"training set {self.name!r}: example #{bad} is not a {objective.example.__name__}")
        problem = objective.check(self.examples)
        if problem:
            raise DataError(f"training set {self.name!r}: {problem}")


def positives(qrels: Qrels, query_id: str, limit: int = 0, seed: int = 0) -> list[str]:
    """The documents judged relevant to a query: all of them in id order (``limit`` 0), or at most ``limit``, the
    highest grades first (NFCorpus grades 2 above 1), a seeded draw among equal grades."""
    relevant = sorted(qrels.relevant(query_id))
    if not limit or len(relevant) <= limit:
        return relevant
    grades = qrels.grades(query_id)
    draw = np.random.default_rng([seed, zlib.crc32(query_id.encode("utf-8"))]).permutation(len(relevant))
    order = sorted(range(len(relevant)), key=lambda i: (-grades[relevant[i]], draw[i]))
    return sorted(relevant[i] for i in order[:limit])


@dataclass(frozen=True)
class Sampled:
    """What a training budget kept of a split (:func:`within_budget`): ``queries`` of ``of_queries`` training queries,
    at most ``positives_per_query`` relevant documents each (0: all), ``pairs`` (query, positive) pairs in all, under
    the budget of ``max_pairs``."""

    max_pairs: int
    queries: int
    of_queries: int
    positives_per_query: int
    pairs: int


def within_budget(queries: Sequence[Query], qrels: Qrels, max_pairs: int, max_positives: int = 0,
                  seed: int = 0) -> tuple[list[Query], int, Sampled | None]:
    """The training queries and positives a query that make at most ``max_pairs`` (query, positive) pairs (0: no
    budget): every query with ``max_positives`` when that fits; else the same positives for each query (the highest
    grades first: :func:`positives`): ``max_positives`` when it names a number, else as many as the budget gives
    each query (at least one), and, if still too many, a seeded sample of the queries (their order kept). Returns
    (queries, positives a query, what was sampled: None when everything fits)."""
    if max_pairs < 0:
        raise ConfigError(f"max_pairs must be >= 0 (0: no budget), got {max_pairs}")
    queries = list(queries)

    def pairs(qs: Sequence[Query], cap: int) -> list[int]:
        return [len(positives(qrels, q.id, cap, seed)) for q in qs]

    if not max_pairs or not queries or sum(pairs(queries, max_positives)) <= max_pairs:
        return queries, max_positives, None
    of_queries, cap = len(queries), max_positives or max(1, max_pairs // len(queries))
    counts = pairs(queries, cap)
    if sum(counts) > max_pairs:  # a seeded draw of the queries, up to the budget
        kept, total = set(), 0
        for i in np.random.default_rng(seed).permutation(len(queries)):
            if counts[i] and total + counts[i] <= max_pairs:
                kept.add(int(i))
                total += counts[i]
        queries, counts = [q for i, q in enumerate(queries) if i in kept], [c for i, c in enumerate(counts) if i in kept]
    return queries, cap, Sampled(max_pairs, len(queries), of_queries, cap, sum(counts))


def pairs_from_qrels(corpus: Corpus, queries: Sequence[Query], qrels: Qrels, *,
                     negatives: Mapping[str, Sequence[str]] | None = None, num_negatives: int = 0,
                     name: str = "qrels", max_positives: int = 0, seed: int = 0) -> TrainingSet:
    """One (query, relevant document [, hard negatives]) example per relevant judgment (at most ``max_positives``
    a query, the highest grades first: :func:`positives`; 0: all).

    Judgments naming documents missing from the corpus are skipped and counted in a warning; a query
    without enough mined negatives is skipped and counted too.
    """
    examples, missing, short = [], 0, 0
    for q in queries:
        negs: tuple[str, ...] = ()
        if num_negatives:
            ids = [d for d in (negatives or {}).get(q.id, ()) if d in corpus][:num_negatives]
            if len(ids) < num_negatives:
                short += 1
                continue
            negs = tuple(corpus.get(d).full_text for d in ids)
        for doc_id in positives(qrels, q.id, max_positives, seed):
            if doc_id not in corpus:
                missing += 1
                continue
            examples.append(PairExample(q.text, corpus.get(doc_id).full_text, negs))
    if missing:
        logger.warning("%s: %d relevant documents are not in the corpus and were skipped", name, missing)
    if short:
        logger.warning("%s: %d queries had fewer than %d mined negatives and were skipped", name, short, num_negatives)
    if not examples:
        raise DataError(f"{name}: no training example: the qrels name no known document of the corpus")
    return TrainingSet(name, "mnrl", tuple(examples))


PairScorer = Callable[[Sequence[tuple[str, str]]], np.ndarray]


def with_margins(training_set: TrainingSet, teacher: PairScorer, name: str | None = None, *,
                 cache: str | Path | None = None, teacher_name: str = "", objective: str = "margin_mse",
                 chunk: int = 2048) -> TrainingSet:
    """``training_set`` (examples with hard negatives) as a distillation set (``objective``: ``margin_mse`` for a
    bi-encoder, ``maxsim_margin_mse`` for a late-interaction model): the teacher scores every (anchor, positive) and
    (anchor, negative) pair once, and each negative gets the margin teacher(anchor, positive) - teacher(anchor,
    negative).

    ``cache``: a parquet file of the teacher's scores (:func:`teacher_scores`), written after every ``chunk`` pairs;
    a run started again with the same teacher scores only the pairs it lacks.
    """
    examples = [e for e in training_set.examples if isinstance(e, PairExample)]
    if len(examples) != len(training_set.examples) or any(not e.negatives for e in examples):
        raise DataError(f"training set {training_set.name!r}: distillation needs (anchor, positive, negatives) examples")
    pairs = sorted({(e.anchor, t) for e in examples for t in (e.positive, *e.negatives)})
    score = teacher_scores(pairs, teacher, cache, teacher_name, chunk)
    out = tuple(PairExample(e.anchor, e.positive, e.negatives,
                            tuple(score[(e.anchor, e.positive)] - score[(e.anchor, n)] for n in e.negatives))
                for e in examples)
    return TrainingSet(name or f"{training_set.name}+margins", objective, out)


def teacher_scores(pairs: Sequence[tuple[str, str]], teacher: PairScorer, cache: str | Path | None = None,
                   teacher_name: str = "", chunk: int = 2048) -> dict[tuple[str, str], float]:
    """The teacher's score of every pair, those in ``cache`` (a parquet file: the sha1 of each pair, the teacher's
    name, its score) read back when its teacher is ``teacher_name``; the rest scored in chunks of ``chunk`` pairs,
    the cache rewritten (atomically) after each."""
    import hashlib

    import pandas as pd

    from twostage.indexer.atomic import write_parquet

    def key(pair: tuple[str, str]) -> str:
        return hashlib.sha1(f"{len(pair[0])}:{pair[0]}{pair[1]}".encode("utf-8", "surrogatepass")).hexdigest()

    known: dict[str, float] = {}
    if cache is not None and Path(cache).is_file():
        try:
            frame = pd.read_parquet(cache)
            if {"key", "teacher", "score"} <= set(frame.columns) and (frame["teacher"] == teacher_name).all():
                known = dict(zip(frame["key"].astype(str), frame["score"].astype(float)))
            else:
                logger.info("%s: scores of another teacher; scoring again", cache)
        except (OSError, ValueError) as exc:
            logger.info("%s: unreadable (%s); scoring again", cache, exc)
    keys = [key(p) for p in pairs]
    todo = [i for i, k in enumerate(keys) if k not in known]
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        got = np.asarray(teacher([pairs[i] for i in part]), dtype=np.float64).reshape(-1)
        if len(got) != len(part) or not np.isfinite(got).all():
            raise DataError(f"the teacher returned {len(got)} scores (finite: {np.isfinite(got).all()}) "
                            f"for {len(part)} pairs")
        known.update((keys[i], float(v)) for i, v in zip(part, got))
        if cache is not None:
            write_parquet(cache, pd.DataFrame({"key": list(known), "teacher": teacher_name,
                                               "score": list(known.values())}))
    return {p: known[k] for p, k in zip(pairs, keys)}


def pairs_from_titles(corpus: Iterable, name: str = "title-text", min_chars: int = 20) -> TrainingSet:
    """(title, text) pairs of a corpus: weak supervision, the title acting as the query."""
    examples = tuple(PairExample(d.title, d.text) for d in corpus
                     if len(d.title.strip()) >= min_chars and len(d.text.strip()) >= min_chars)
    return TrainingSet(name, "mnrl", examples)


def nli_triplets(paths: Sequence[str | Path], name: str = "nli") -> TrainingSet:
    """NLI as (premise, entailed hypothesis, contradicting hypothesis) for MNRL with a hard negative.

    Rows need ``premise``/``hypothesis``/``label`` (snli: entailment/neutral/contradiction) or
    ``sentence1``/``sentence2``/``entailment`` (SICK: ENTAILMENT/NEUTRAL/CONTRADICTION).
    """
    by_premise: dict[str, dict[str, list[str]]] = {}
    for path in paths:
        for number, row in iter_jsonl(path):
            premise = row.get("premise", row.get("sentence1"))
            hypothesis = row.get("hypothesis", row.get("sentence2"))
            label = str(row.get("label", row.get("entailment", ""))).lower()
            if not isinstance(premise, str) or not isinstance(hypothesis, str):
                raise DataError(f"{path}:{number}: an NLI row needs premise and hypothesis strings")
            by_premise.setdefault(premise, {}).setdefault(label, []).append(hypothesis)
    examples = tuple(PairExample(p, pos, (neg,)) for p, groups in by_premise.items()
                     for pos, neg in zip(groups.get("entailment", []), groups.get("contradiction", [])))
    return TrainingSet(name, "mnrl", examples)


def scored_pairs(path: str | Path, *, score_key: str = "score", max_score: float = 5.0, name: str = "sts") -> TrainingSet:
    """STS-style pairs (sentence1, sentence2, score in [0, max_score]) scaled to [0, 1] for CosineSimilarityLoss."""
    pairs = []
    for number, row in iter_jsonl(path):
        try:
            pairs.append(ScoredPair(str(row["sentence1"]), str(row["sentence2"]), float(row[score_key]) / max_score))
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{path}:{number}: expected sentence1, sentence2 and a numeric {score_key!r}") from None
    return TrainingSet(name, "cosine", tuple(pairs))


def hold_out(items: Sequence[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """(kept, held out): a seeded random ``fraction`` of ``items`` (at least one when > 0), order preserved."""
    if not fraction:
        return list(items), []
    if not 0 < fraction < 1:
        raise ConfigError(f"the held-out fraction must be in (0, 1), got {fraction}")
    order = np.random.default_rng(seed).permutation(len(items))
    n = max(1, int(round(fraction * len(items))))
    return [items[i] for i in sorted(order[n:])], [items[i] for i in sorted(order[:n])]


def no_duplicate_batches(examples: Sequence[PairExample | ScoredPair], batch_size: int, seed: int) -> list[list[int]]:
    """Shuffled batches (lists of example indices) in which no text occurs twice.

    An example whose text is already in the open batch waits for the next one, so an in-batch negative
    is never a copy of the positive. The order depends only on ``seed``.
    """
    if batch_size <= 0:
        raise ConfigError(f"batch_size must be positive, got {batch_size}")
    order = list(np.random.default_rng(seed).permutation(len(examples)))
    batches: list[list[int]] = []
    while order:
        batch: list[Any] = []
        seen: set[Any] = set()
        waiting: list[Any] = []
        for i in order:
            texts = examples[i].texts()
            if len(batch) < batch_size and not seen.intersection(texts):
                batch.append(int(i))
                seen.update(texts)
            else:
                waiting.append(i)
        batches.append(batch)
        order = waiting
    return batches


def round_robin(per_set: Sequence[list[list[int]]]) -> list[tuple[int, list[int]]]:
    """Interleave the batches of several sets: (set index, batch), one set at a time, until all are used."""
    out, cursors = [], [0] * len(per_set)
    while any(c < len(b) for c, b in zip(cursors, per_set)):
        for s, batches in enumerate(per_set):
            if cursors[s] < len(batches):
                out.append((s, batches[cursors[s]]))
                cursors[s] += 1
    return out
