"""The stages of a search, each a function from a candidate source, the plan and the trace so far to the next trace.

:func:`run` is the whole path: :func:`first_stage` (the query encoded, each first stage's candidates, fused),
:func:`maxsim_stage` (token vectors reorder the top ``maxsim_depth``), :func:`rerank_stage` (the cross-encoder reads
the top ``rerank_depth``, blended), :func:`diversity_stage` (maximal marginal relevance), :func:`page_stage` (the page
cut, or grouped) and, when asked, :func:`explain_stage`. A :class:`SearchTrace` is a frozen record of what each stage
computed; the hits are filled in from the documents the reranker already read (:attr:`SearchTrace.read`), and
explanations read the trace.

The source is anything that lists first-stage candidates and reads documents (:class:`~twostage.engine.source.
CandidateSource`): one engine or the merge of many shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from twostage.engine.fusion import Reranked, dense_weights, fuse, reorders, rerank_lists
from twostage.engine.knobs import blend_of, outside
from twostage.engine.plan import SearchPlan
from twostage.engine.settings import EngineSettings
from twostage.engine.source import CandidateSource, Read
from twostage.engine.steer import Diversified, Expansion, diversify, group_pages, rocchio
from twostage.engine.steer import feedback as steer_feedback
from twostage.indexer.errors import ConfigError
from twostage.indexer.filters import Where
from twostage.indexer.passages import by_document, word_starts
from twostage.indexer.records import Explanation, RankedList
from twostage.indexer.work import checkpoint

StageScores = dict[str, dict[str, float]]
@dataclass(frozen=True)
class SearchTrace:
    """What one batch's search computed, stage by stage (each list has one entry a query).

    ``stage``: the first stage that ran (bm25 when no query of the batch is in a language the dense model knows);
    ``lists``: each first stage's candidates by document; ``lexical``: BM25's as it found them (passages in a
    passage engine); ``reads``: in a passage engine the passages each document is read by (the first is the one a
    hit shows); ``fused``: the first stage, fused; ``late``: MaxSim's reordering of it; ``firsts``: what the reranker
    reads (``fused``, or MaxSim's); ``reranked``/``relevance``: the reranker's lists and probabilities;
    ``finals``: the lists before the page; ``read``: the documents the reranker read, whole with their passages
    (the hits reuse them); ``pages``/``groups``/``more``: each query's page, its hits' group values, whether a
    further page exists."""

    queries: list[str]
    languages: list[str] | None
    where: Where
    timings: dict[str, float] = field(default_factory=dict)
    loading: float = 0.0
    stage: str = ""
    dense_off: list[bool] = field(default_factory=list)
    expansion: Expansion | None = None
    lists: dict[str, list[RankedList]] = field(default_factory=dict)
    lexical: list[RankedList] | None = None
    reads: list[dict[str, tuple[str, ...]]] | None = None
    fused: list[RankedList] = field(default_factory=list)
    late: list[Reranked] | None = None
    firsts: list[RankedList] = field(default_factory=list)
    skip_rerank: list[bool] = field(default_factory=list)
    reranker: Any = None
    reranked: list[Reranked] = field(default_factory=list)
    relevance: list[dict[str, float]] = field(default_factory=list)
    read: Mapping[str, Read] = field(default_factory=dict)
    finals: list[RankedList] = field(default_factory=list)
    diversified: list[Diversified] | None = None
    pages: list[RankedList] = field(default_factory=list)
    groups: list[dict[str, Any]] | None = None
    more: list[bool] = field(default_factory=list)
    explanations: list[dict[str, Explanation]] | None = None

    @property
    def stage_scores(self) -> list[StageScores]:
        """Each query's scores by stage: each first stage's, the fused first stage's, MaxSim's, the reranker's, the
        probability of relevance (a stage that did not run is absent)."""
        out = []
        for i, (first, res) in enumerate(zip(self.fused, self.reranked)):
            scores = {name: dict(zip(map(str, ls[i].ids), ls[i].scores.astype(float).tolist()))
                      for name, ls in self.lists.items()}
            scores["first_stage"] = dict(zip(map(str, first.ids), first.scores.astype(float).tolist()))
            if self.late is not None and self.late[i].rerank_scores:
                scores["maxsim"] = dict(self.late[i].rerank_scores)
            if res.rerank_scores:
                scores["rerank"] = dict(res.rerank_scores)
            if self.relevance[i]:
                scores["relevance"] = self.relevance[i]
            out.append(scores)
        return out


Stage = Callable[[CandidateSource, SearchPlan, SearchTrace], SearchTrace]


def run(source: CandidateSource, plan: SearchPlan, queries: list[str], languages: list[str] | None,
        where: Where) -> SearchTrace:
    """Every stage in turn over ``queries``; a stopped request (its client gone, its deadline past) ends at a stage
    boundary."""
    trace = SearchTrace(queries, languages, where)
    stages: list[Stage] = [first_stage, maxsim_stage, rerank_stage, diversity_stage, page_stage]
    if plan.steer.explain:
        stages.append(explain_stage)
    for stage in stages:
        checkpoint()
        trace = stage(source, plan, trace)
    return trace


def timed(trace: SearchTrace, name: str, since: float) -> None:
    trace.timings[name] = time.perf_counter() - since


def loaded(trace: SearchTrace, since: float) -> SearchTrace:
    """The trace with the seconds since ``since`` counted as model loading (a line of its own when it is more than
    5 ms: a model loaded by this search)."""
    loading = trace.loading + time.perf_counter() - since
    if loading > 0.005:
        trace.timings["load_s"] = loading
    return replace(trace, loading=loading)


def first_stage(source: CandidateSource, plan: SearchPlan, trace: SearchTrace) -> SearchTrace:
    """The queries encoded (moved by the liked documents), each first stage's candidates, by document in a passage
    engine, the liked ones left out, fused. A query in a language the dense model does not know is searched by BM25
    alone (its model card says so)."""
    s, steer, queries = plan.settings, plan.steer, trace.queries
    dense_off = outside(s.dense_languages, trace.languages) if s.first_stage == "hybrid" else []
    stage = "bm25" if dense_off and all(dense_off) else s.first_stage  # then nothing is encoded
    feedback = steer_feedback(source, steer, stage) if steer.feedback else None
    vectors = None
    if stage in ("dense", "hybrid"):
        t = time.perf_counter()
        encoder = None if steer.similar else source.query_side  # loaded (and exported) on first use
        trace = loaded(trace, t)
        t = time.perf_counter()
        vectors = None if encoder is None else encoder.encode(queries, kind="query", batch_size=s.batch_size)
        if feedback is not None:
            vectors = rocchio(vectors, feedback.liked, feedback.unliked, len(queries))
        timed(trace, "encode_s", t)
    expansion = feedback.expansion if feedback is not None else None
    checkpoint()
    lists = source.candidates(queries, vectors, stage, plan.depth + len(steer.excluded), trace.where, trace.timings,
                              expansion)
    lexical, reads = lists.get("bm25"), None
    if s.passages.enabled:  # each stage's best passages -> documents, and the passages each one is read by
        lists, reads = by_document(lists)
    if steer.excluded:
        lists = {name: [without(r, steer.excluded).truncate(plan.depth) for r in ls] for name, ls in lists.items()}
    t = time.perf_counter()
    if stage == "hybrid":
        weights = dense_weights(s.dense_weight)
        fused = [b.truncate(plan.depth) if skip else
                 fuse([b, d], s.fusion, k_rrf=s.k_rrf, weights=weights).truncate(plan.depth)
                 for b, d, skip in zip(lists["bm25"], lists["dense"], dense_off or [False] * len(queries))]
    else:
        fused = [f.truncate(plan.depth) for f in lists[stage]]
    timed(trace, "fuse_s", t)
    return replace(trace, stage=stage, dense_off=dense_off, expansion=expansion, lists=lists, lexical=lexical,
                   reads=reads, fused=fused, firsts=fused)


def maxsim_stage(source: CandidateSource, plan: SearchPlan, trace: SearchTrace) -> SearchTrace:
    """Each list's top ``maxsim_depth`` reordered by MaxSim (blended with the first stage by ``maxsim_blend``; in a
    passage engine a document scores its best passage among those it was found by), the rest following in order.
    MaxSim steps aside for a query in a language its model's card does not list."""
    if not plan.maxsim:
        return trace
    s, queries = plan.settings, trace.queries
    t = time.perf_counter()
    encoder = source.late  # loaded on first use
    trace = loaded(trace, t)
    t = time.perf_counter()
    skip = outside(source.late_languages(), trace.languages)
    vectors = encoder.encode_tokens(queries, kind="query", batch_size=s.batch_size)
    scorer = MaxSimScorer(source, dict(zip(queries, vectors)))
    reads = trace.reads
    per_query = [lambda d, r=r: list(dict.fromkeys(r[d])) for r in reads] if reads is not None else None
    depths = [0 if skip and skip[i] else s.maxsim_depth for i in range(len(queries))]
    late = rerank_lists(scorer, queries, trace.fused, str, k=max([len(f) for f in trace.fused] + [1]),
                        rerank_depth=depths, blend=s.maxsim_blend, per_query=per_query)
    timed(trace, "maxsim_s", t)
    return replace(trace, late=late, firsts=[r.ranked for r in late])


def rerank_stage(source: CandidateSource, plan: SearchPlan, trace: SearchTrace) -> SearchTrace:
    """The reranker over each list's top ``rerank_depth`` (:func:`rerank`), cut at the plan's ``cut``; a query in a
    language the reranker does not know stays in its first-stage order."""
    t = time.perf_counter()
    reranker = source.reranker if plan.rerank else None  # loaded (and exported) on first use
    trace = loaded(trace, t)
    skip = outside(plan.settings.rerank_languages, trace.languages) if reranker is not None else []
    reranked, relevance, read = rerank(source, trace.queries, trace.firsts, trace.reads, plan.settings, reranker,
                                       plan.cut, trace.timings, skip)
    return replace(trace, skip_rerank=skip, reranker=reranker, reranked=reranked, relevance=relevance, read=read,
                   finals=[r.ranked for r in reranked])


def diversity_stage(source: CandidateSource, plan: SearchPlan, trace: SearchTrace) -> SearchTrace:
    """Maximal marginal relevance over the lists (their first ``end``, or all of them before grouping)."""
    steer = plan.steer
    if steer.diversity <= 0:
        return trace
    t = time.perf_counter()
    diversified = diversify(source, trace.finals, trace.reads, steer.diversity,
                            None if steer.group_by is not None else plan.end)
    timed(trace, "diversity_s", t)
    return replace(trace, diversified=diversified, finals=[d.ranked for d in diversified])


def page_stage(source: CandidateSource, plan: SearchPlan, trace: SearchTrace) -> SearchTrace:
    """Each query's page: ``k`` hits from ``offset``, or ``k`` groups of ``group_size`` by the ``group_by`` field."""
    if plan.steer.group_by is not None:
        pages, groups, more = group_pages(source, trace.finals, plan.steer, plan.offset, plan.k)
        return replace(trace, pages=pages, groups=groups, more=more)
    pages = [RankedList(f.ids[plan.offset:plan.end], f.scores[plan.offset:plan.end]) for f in trace.finals]
    more = [len(p) == plan.k and plan.offset + plan.k < plan.window for p in pages]
    return replace(trace, pages=pages, more=more)


def explain_stage(source: CandidateSource, plan: SearchPlan, trace: SearchTrace) -> SearchTrace:
    """How each hit's score was made (:mod:`twostage.engine.explain`)."""
    from twostage.engine.explain import explanations

    return replace(trace, explanations=explanations(source, plan, trace))


def rerank(source: CandidateSource, queries: list[str], firsts: list[RankedList],
           reads: list[dict[str, tuple[str, ...]]] | None, s: EngineSettings, reranker: Any, end: int,
           timings: dict[str, float], skip: Sequence[bool] = ()) -> tuple[list[Reranked], list[dict[str, float]],
                                                                          Mapping[str, Read]]:
    """Each query's first-stage list with its top ``rerank_depth`` read by ``reranker`` (None: as it is) and
    blended, cut to ``end``; each reranked document's probability of relevance (when calibrated), the ones below
    ``min_relevance`` dropped; and the documents read whole (with their passages), for the hits. ``reads``: in a
    passage engine, the passages each document is read by (its best passage in each first stage; the reranker's
    score is the highest of them). ``skip``: queries left in their first-stage order."""
    t = time.perf_counter()
    depths = [0 if skip and skip[i] else s.rerank_depth for i in range(len(queries))]
    alpha = blend_of(s, reranker, s.first_stage)
    if s.min_relevance and (reranker is None or s.rerank_calibration is None):
        raise ConfigError("min_relevance needs a calibrated reranker: this engine has "
                          + ("no reranker" if reranker is None else "no calibration (fit one on judged dev queries "
                             "with `twostage calibrate ENGINE --data DIR`)") + "; or search without it")
    scored = reranker is not None and (reorders(alpha) or s.min_relevance > 0)
    heads = sorted({str(d) for f, depth in zip(firsts, depths) for d in f.ids[:depth]}) if scored else []
    texts, read, per_query = texts_to_rerank(source, heads, firsts, depths, reads, s)
    reranked = rerank_lists(reranker, queries, firsts, texts.__getitem__, k=end, rerank_depth=depths,
                            blend=alpha, batch_size=s.batch_size, per_query=per_query,
                            always_score=s.min_relevance > 0)
    if scored and s.rerank_calibration is not None:  # each reranked document's probability of relevance
        relevance = [relevance_of(r.rerank_scores, s.rerank_calibration) for r in reranked]
        if s.min_relevance:
            reranked = [above(r, rel, s.min_relevance) for r, rel in zip(reranked, relevance)]
    else:
        relevance = [{} for _ in reranked]
    if scored:
        timings["rerank_s"] = time.perf_counter() - t
    return reranked, relevance, read


def texts_to_rerank(source: CandidateSource, heads: list[str], firsts: list[RankedList], depths: list[int],
                    reads: list[dict[str, tuple[str, ...]]] | None, s: EngineSettings
                    ) -> tuple[dict[str, str], dict[str, Read], list[Callable[[str], Any]] | None]:
    """What the reranker reads of the candidates ``heads``, with one read of the store: each document whole, or in a
    passage engine by its best passage in each first stage (title in front, as the first stages read it), or whole
    when it has at most ``rerank_whole_up_to`` words; the documents read whole; each query's text of a candidate."""
    if reads is None or s.rerank_whole_up_to:
        read = {entry[0].id: entry for entry in source.documents_with_passages(heads)} if heads else {}
    else:
        read = {}
    if reads is None:
        return {d: entry[0].full_text for d, entry in read.items()}, read, None
    texts: dict[str, str] = {}
    pids = {p for r, f, depth in zip(reads, firsts, depths) for d in f.ids[:depth] for p in r[str(d)]} if heads \
        else set()
    if s.rerank_whole_up_to:
        for doc, passages, _ in read.values():
            if len(word_starts(doc.text, s.passages.cjk_characters)) <= s.rerank_whole_up_to:
                texts[doc.id] = doc.full_text
            else:
                texts.update((p.id, p.full_text) for p in passages if p.id in pids)
    elif pids:
        texts = {p.id: p.full_text for p in source.passages(sorted(pids))}
    def reader(r: Mapping[str, tuple[str, ...]]) -> Callable[[str], Any]:
        return lambda d: texts[d] if d in texts else [texts[p] for p in r[d]]

    return texts, read, [reader(r) for r in reads]


class MaxSimScorer:
    """MaxSim as :func:`~twostage.engine.fusion.rerank_lists` calls a scorer: ``score(query, ids)``, the query's
    token vectors computed once for the batch."""

    def __init__(self, source: CandidateSource, vectors: Mapping[str, np.ndarray]) -> None:
        self.source, self.vectors = source, vectors

    def score(self, query: str, ids: Sequence[str]) -> np.ndarray:
        return self.source.token_scores(self.vectors[query], list(ids))


def without(ranked: RankedList, ids: frozenset[str]) -> RankedList:
    """``ranked`` less the documents in ``ids``."""
    keep = np.array([str(d) not in ids for d in ranked.ids], dtype=bool)
    return RankedList(ranked.ids[keep], ranked.scores[keep]) if len(keep) else ranked


def relevance_of(rerank_scores: Mapping[str, float], calibration: tuple[float, float]) -> dict[str, float]:
    """Each reranked document's calibrated probability of relevance (:mod:`twostage.engine.calibration`)."""
    from twostage.engine.calibration import probability

    ids = list(rerank_scores)
    return dict(zip(ids, probability(np.array([rerank_scores[d] for d in ids]), calibration).tolist()))


def above(reranked: Reranked, relevance: Mapping[str, float], threshold: float) -> Reranked:
    """``reranked`` without the documents whose probability of relevance is below ``threshold`` (the documents
    below the rerank depth have none: they go too)."""
    keep = np.array([relevance.get(str(d), -1.0) >= threshold for d in reranked.ranked.ids], dtype=bool)
    ranked = RankedList(reranked.ranked.ids[keep], reranked.ranked.scores[keep])
    return Reranked(ranked, reranked.rerank_scores)
