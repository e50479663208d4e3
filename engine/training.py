"""Training the models for an engine: the retriever's epoch, the reranker's epoch and its blend with each first
stage are chosen on held-out queries through the engine's own search path, so what is tuned is what the engine
serves.

The retriever's checkpoint after each epoch is the dense retriever of a temporary engine over the dev queries'
pool (each one's BM25 top ``dev_candidates`` and its relevant documents; the whole corpus would be encoded once per
epoch), built with the engine's settings (passages as served) in fp32, and searched by the engine's dense stage
(:func:`retriever_dev`).

The dev queries are searched by a :class:`~twostage.engine.search_engine.SearchEngine` (a temporary one, built
with the retriever and the engine's settings: passages, whole-read threshold, fusion), viewed with the model being
trained as its reranker (:meth:`~twostage.engine.search.SearchMethods.with_reranker`). The epoch is chosen by the
reranker alone over each first stage's top ``depth``; the blend by trying every weight of
:data:`~twostage.engine.fusion.GRID` through the same path (the pairs scored once, remembered across the
weights), keeping the smallest within one standard error of the best (:func:`one_se_blend`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from twostage.engine.fusion import GRID, InterpolationChoice, one_se_blend, reorders
from twostage.engine.search import SearchMethods
from twostage.engine.settings import FIRST_STAGES, EngineSettings
from twostage.indexer.beir import BeirDataset
from twostage.indexer.corpus import Corpus, CorpusSource
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Qrels, Query, RankedList, top_k
from twostage.models.device import cpu_precision
from twostage.models.fit import FitResult, seed_everything
from twostage.reranker.cross_encoder import CrossEncoder
from twostage.reranker.training import RerankerConfig, groups_from_split, title_groups, train_reranker
from twostage.retriever.bm25 import BM25Retriever
from twostage.retriever.recipe import DevFactory, DevMetric, RetrieverRecipe, train_retriever
from twostage.retriever.training_data import PairScorer, hold_out, within_budget

logger = logging.getLogger(__name__)


@contextmanager
def temporary_engine(corpus: CorpusSource, retriever: str | Path, settings: EngineSettings | None = None, *,
                     device: str = "auto", show_progress: bool = False) -> Iterator[Any]:
    """A search engine over ``corpus`` with ``retriever`` and no reranker, in a temporary directory removed after."""
    from twostage.engine.search_engine import SearchEngine

    tmp = tempfile.mkdtemp(prefix="twostage-dev-")
    try:
        engine = SearchEngine.build(corpus, f"{tmp}/engine", retriever=retriever, settings=settings or EngineSettings(),
                                    device=device, show_progress=show_progress)
        try:
            yield engine
        finally:
            engine.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def dev_pool(corpus: Corpus, queries: Sequence[Query], qrels: Qrels, bm25: BM25Retriever | None,
             pool_depth: int) -> list[str]:
    """The documents a checkpoint's dev score ranks, sorted by id: the union of each dev query's BM25 top
    ``pool_depth`` (``bm25``, or one built over ``corpus``) and its relevant documents in ``corpus``."""
    lexical = bm25 if bm25 is not None else BM25Retriever.build(corpus)
    pool: set[str] = set()
    for q in queries:
        pool.update(lexical.search(q.text, pool_depth).ids)
        pool.update(d for d in qrels.relevant(q.id) if d in corpus)
    return sorted(pool)


def retriever_dev(corpus: Corpus, metric: DevMetric, pool_depth: int, settings: EngineSettings | None = None, *,
                  device: str = "auto", show_progress: bool = False) -> DevFactory:
    """The score a retriever's checkpoint is chosen by: ``metric`` (its mean over the queries) of the dense lists
    a temporary engine with that checkpoint answers, over the union of each dev query's BM25 top ``pool_depth``
    and its relevant documents, built with ``settings`` (the engine defaults) in fp32."""

    def factory(queries: Sequence[Query], qrels: Qrels, bm25: BM25Retriever | None) -> Callable[[Any], float]:
        documents = [corpus.get(d) for d in dev_pool(corpus, queries, qrels, bm25, pool_depth)]
        served = replace(settings or EngineSettings(), precision="fp32", first_stage="dense", rerank=False)

        def dev(model: Any) -> float:
            with tempfile.TemporaryDirectory(prefix="twostage-checkpoint-") as tmp:
                model.save(f"{tmp}/retriever")
                with temporary_engine(documents, f"{tmp}/retriever", served, device=device,
                                      show_progress=show_progress) as engine:
                    lists = engine.as_retriever().search_batch([q.text for q in queries], 10)
            return float(np.mean(metric(qrels, dict(zip([q.id for q in queries], lists)))))

        return dev

    return factory


def late_dev(corpus: Corpus, metric: DevMetric, pool_depth: int) -> DevFactory:
    """The score a late-interaction checkpoint is chosen by: ``metric`` (its mean over the queries) of the lists
    MaxSim alone ranks over the same pool as :func:`retriever_dev` (each dev query's BM25 top ``pool_depth`` and its
    relevant documents), whole documents as far as the model reads them."""
    from twostage.indexer.tokens import maxsim

    def factory(queries: Sequence[Query], qrels: Qrels, bm25: BM25Retriever | None) -> Callable[[Any], float]:
        ids = np.array(dev_pool(corpus, queries, qrels, bm25, pool_depth), dtype=object)
        texts = [corpus.get(d).full_text for d in ids]

        def dev(model: Any) -> float:
            tokens = model.encode_tokens(texts, kind="document")
            bounds = np.concatenate([[0], np.cumsum([len(t) for t in tokens])])
            flat = np.concatenate(tokens)
            lists = {}
            for q, vectors in zip(queries, model.encode_tokens([q.text for q in queries], kind="query")):
                scores = maxsim(vectors, flat, bounds)
                rows, top = top_k(scores, 10)
                lists[q.id] = RankedList(ids[rows], top)
            return float(np.mean(metric(qrels, lists)))

        return dev

    return factory


def train_retriever_on(data: str | Path | BeirDataset, split: str, base: str, out: str | Path,
                       recipe: RetrieverRecipe | None = None, *, dev_metric: DevMetric | None = None,
                       settings: EngineSettings | None = None, teacher: PairScorer | None = None,
                       teacher_name: str = "", show_progress: bool = False) -> FitResult:
    """Train a retriever from ``base`` on a BEIR split (:func:`twostage.retriever.recipe.train_retriever`).

    With ``recipe.dev_fraction``, held-out train queries pick the best epoch by ``dev_metric(qrels, lists)`` of the
    engine's dense search with each checkpoint (:func:`retriever_dev`, ``settings``: the engine defaults; a
    late-interaction model, ``recipe.late``, by MaxSim over the same pool: :func:`late_dev`).
    ``teacher`` scores (query, document) pairs for MarginMSE distillation (e.g. a cross-encoder's logits).
    """
    recipe = recipe or RetrieverRecipe()
    if recipe.dev_fraction and dev_metric is None:
        raise ConfigError(f"dev_fraction {recipe.dev_fraction} holds queries out to choose the best checkpoint: give "
                          "dev_metric (e.g. twostage.eval.metrics.ndcg10_by_query), or set dev_fraction 0")
    ds = data if isinstance(data, BeirDataset) else BeirDataset(data)
    if dev_metric is None:
        dev = None
    elif recipe.late:
        dev = late_dev(ds.corpus, dev_metric, recipe.dev_candidates)
    else:
        dev = retriever_dev(ds.corpus, dev_metric, recipe.dev_candidates, settings, device=recipe.train.device)
    return train_retriever(ds, split, base, out, recipe, dev=dev, teacher=teacher, teacher_name=teacher_name,
                           show_progress=show_progress)


class ScoreMemo:
    """A reranker that remembers the score of every (query, text) pair it was asked for: the blend selection
    searches the same queries at every weight, and each pair is scored by the model once."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: dict[tuple[str, str], float] = {}

    def predict(self, pairs: Sequence[tuple[str, str]], *, batch_size: int = 32) -> np.ndarray:
        todo = list(dict.fromkeys(p for p in pairs if p not in self.cache))
        if todo:
            scores = np.asarray(self.model.predict(todo, batch_size=batch_size), dtype=np.float32)
            self.cache.update(zip(todo, scores.tolist()))
        return np.array([self.cache[p] for p in pairs], dtype=np.float32)


def dev_lists(engine: SearchMethods, reranker: Any, queries: Sequence[Query], first_stage: str, depth: int,
              blend: float | None) -> dict[str, RankedList]:
    """Each dev query's list as the engine answers it with ``reranker`` reading the top ``depth`` of
    ``first_stage`` at ``blend`` (None: the reranker alone)."""
    view = engine.with_reranker(reranker).with_settings(first_stage=first_stage, rerank_depth=depth,
                                                           rerank_blend=blend, rerank=True)
    lists = view.as_retriever().search_batch([q.text for q in queries], depth)
    return dict(zip([q.id for q in queries], lists))


def dev_scorer(engine: SearchMethods, queries: Sequence[Query], qrels: Qrels, depth: int, metric: DevMetric,
               first_stages: Sequence[str] = FIRST_STAGES) -> Callable[[Any], float]:
    """The dev score a training run picks its epoch by: ``metric`` of the reranker alone over each first stage's
    top ``depth`` as ``engine`` searches, averaged over ``first_stages``."""
    if not queries:
        raise ConfigError("choosing the reranker's epoch needs held-out queries")

    def dev(model: Any) -> float:
        return float(np.mean([np.mean(metric(qrels, dev_lists(engine, model, queries, fs, depth, None)))
                              for fs in first_stages]))

    return dev


def blend_curve(engine: SearchMethods, reranker: Any, queries: Sequence[Query], qrels: Qrels, first_stage: str,
                depth: int, metric: DevMetric, grid: Sequence[float] = GRID, *,
                on_weight: Callable[[], Any] | None = None) -> list[tuple[float, np.ndarray]]:
    """Each weight of ``grid`` with ``metric``'s value for every one of ``queries`` (in their order): ``engine``'s
    lists with ``reranker`` reading the top ``depth`` of ``first_stage`` at that weight (:func:`dev_lists`);
    ``on_weight`` is called after each weight."""
    curve: list[tuple[float, np.ndarray]] = []
    for a in grid:
        lists = dev_lists(engine, reranker, queries, first_stage, depth, float(a))
        curve.append((float(a), np.asarray(metric(qrels, lists), dtype=np.float64)))
        if on_weight is not None:
            on_weight()
    return curve


def select_blend(engine: SearchMethods, model: Any, queries: Sequence[Query], qrels: Qrels, depth: int,
                 metric: DevMetric, first_stages: Sequence[str] = FIRST_STAGES,
                 grid: Sequence[float] = GRID, *, show_progress: bool = False) -> InterpolationChoice:
    """The blend with each first stage (and over their mean) chosen on dev ``queries``: every weight of ``grid``
    searched through ``engine`` with ``model`` reading the top ``depth``; ``metric`` gives one value per query
    (:func:`one_se_blend` chooses by their spread too)."""
    if not queries:
        raise ConfigError("choosing the blend needs held-out queries")
    from tqdm.auto import tqdm

    memo = ScoreMemo(model)
    with tqdm(total=len(first_stages) * len(grid), desc="choose blend", unit="blend",
              disable=not show_progress) as bar:  # every weight searches every dev query again
        curves = {fs: blend_curve(engine, memo, queries, qrels, fs, depth, metric, grid, on_weight=bar.update)
                  for fs in first_stages}
    mean = [(float(a), np.mean([curve[i][1] for curve in curves.values()], axis=0)) for i, a in enumerate(grid)]

    def means(curve: list[tuple[float, np.ndarray]]) -> tuple[tuple[float, float], ...]:
        return tuple((a, float(np.mean(v))) for a, v in curve)

    return InterpolationChoice(one_se_blend(mean), means(mean),
                               tuple((name, one_se_blend(curve), means(curve)) for name, curve in curves.items()))


# the candidates MaxSim may read, tried on dev by the one command (twostage.eval.workflows.choose_maxsim): the
# engine's own maxsim_depth and twice it (MaxSim's time grows with it)
MAXSIM_DEPTHS = (EngineSettings().maxsim_depth, 2 * EngineSettings().maxsim_depth)


def maxsim_curve(engine: SearchMethods, queries: Sequence[Query], qrels: Qrels, metric: DevMetric,
                 grid: Sequence[float] = GRID, *, show_progress: bool = False) -> list[tuple[float, np.ndarray]]:
    """Each weight of ``grid`` with ``metric``'s value for every one of ``queries`` (in their order): the top 10 of
    ``engine`` (which has token vectors) with MaxSim blended at that weight after the first stage, reading its
    ``maxsim_depth`` (0.0: the first stage alone), the reranker off."""
    if not queries:
        raise ConfigError("choosing MaxSim's blend needs held-out queries")
    if engine.manifest.late is None:
        raise ConfigError("choosing MaxSim's blend needs an engine with token vectors (twostage late)")
    from tqdm.auto import tqdm

    texts, ids = [q.text for q in queries], [q.id for q in queries]
    curve: list[tuple[float, np.ndarray]] = []
    for a in tqdm(grid, desc="choose MaxSim blend", unit="blend", disable=not show_progress):
        view = engine.with_settings(maxsim=bool(reorders(float(a))), maxsim_blend=float(a), rerank=False)
        lists = view.as_retriever(rerank=False).search_batch(texts, 10)
        curve.append((float(a), np.asarray(metric(qrels, dict(zip(ids, lists))), dtype=np.float64)))
    return curve


def choose_blend(result: FitResult, engine: SearchMethods, queries: Sequence[Query], qrels: Qrels, depth: int,
                 metric: DevMetric, first_stages: Sequence[str] = FIRST_STAGES, *, home: Corpus,
                 show_progress: bool = False) -> FitResult:
    """Choose the trained reranker's blends (:func:`select_blend`), then fit the calibration of its score on the
    same dev queries' reranked top ``depth`` at the chosen blend (:mod:`twostage.engine.calibration`), and record
    both with the model in ``result.model_dir`` (an engine built with it writes them into its manifest), with a
    sketch of the ``home`` corpus ``engine`` holds (an engine over another corpus serves the reranker off:
    :func:`twostage.engine.knobs.resolved_blends`); the returned result's training record holds them."""
    from twostage.engine.calibration import fit_calibration
    from twostage.engine.knobs import RERANK_HOME
    from twostage.indexer.corpus_sketch import home_record

    trained = CrossEncoder.load(result.model_dir)
    choice = select_blend(engine, trained, queries, qrels, depth, metric, first_stages, show_progress=show_progress)
    first = engine.settings.first_stage if engine.settings.first_stage in choice.alphas() else first_stages[0]
    view = engine.with_reranker(trained).with_settings(first_stage=first, rerank_depth=depth,
                                                        rerank_blend=choice.alpha,
                                                        rerank_blend_by_first_stage=choice.alphas())
    training = {**result.training, "interpolation": asdict(choice),
                RERANK_HOME: home_record(home.ids)}
    if not reorders(choice.alphas().get(first, choice.alpha)):  # switched off: no pair is scored to calibrate
        logger.info("the reranker is switched off (weight 0.0 after %s): its score is not calibrated", first)
        result = replace(result, training=training)
        trained.save(result.model_dir, training=result.training)
        return result
    try:
        calibration = fit_calibration(view, queries, qrels)
        training["calibration"] = asdict(calibration)
    except ConfigError as exc:  # e.g. no relevant document among the dev candidates: no calibration, said so
        logger.warning("the reranker's score is not calibrated: %s", exc)
    result = replace(result, training=training)
    trained.save(result.model_dir, training=result.training)
    return result


def train_reranker_on(data: str | Path | BeirDataset, split: str, base: str, out: str | Path,
                      config: RerankerConfig | None = None, *, dev_fraction: float = 0.0,
                      rerank_depth: int = EngineSettings().rerank_depth, dev_metric: DevMetric | None = None,
                      retriever: str | Path | None = None, settings: EngineSettings | None = None,
                      resume: bool = True, show_progress: bool = False, command: str | None = None) -> FitResult:
    """Train a reranker from ``base`` on a BEIR split.

    ``retriever`` (a bi-encoder's name or directory; the base model when none is given) mines the dense negatives
    and is the dev engine's retriever. With ``dev_fraction``, held-out train queries pick the best epoch by
    ``dev_metric(qrels, lists)`` of the reranker alone over the top ``rerank_depth`` of each first stage, then the
    blend with each first stage, both searched by an engine with ``settings`` (the engine defaults) over the
    split's corpus: what is chosen is what an engine built with these models serves.
    """
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.dense import DenseRetriever

    config = config or RerankerConfig()
    ds = data if isinstance(data, BeirDataset) else BeirDataset(data)
    sp = ds.split(split)
    corpus = ds.corpus
    queries, dev_queries = hold_out(list(sp.queries), dev_fraction, config.seed)
    queries, cap, sampled = within_budget(queries, sp.qrels, config.max_pairs, config.max_positives, config.seed)
    config = replace(config, max_positives=cap)
    bm25 = BM25Retriever.build(corpus)
    scorers: dict[str, Any] = {"bm25": bm25.scores}
    bi_encoder = str(retriever) if retriever is not None else base
    if "dense" in config.mine_from:
        if retriever is None:
            logger.info("mining dense negatives with the base model %s (pass a fine-tuned bi-encoder to use it)",
                        base)
        encoder = BiEncoder.load(bi_encoder, precision=cpu_precision(config.bf16))
        scorers["dense"] = DenseRetriever.build(corpus, encoder, show_progress=show_progress).scores
    groups = groups_from_split(ds, split, config, queries, scorers)
    if config.title_groups:
        groups += title_groups(corpus, config.title_groups, config, bm25)
    qrels = sp.qrels.subset(q.id for q in dev_queries)
    seed_everything(config.seed)  # the new head's weights are the seed's
    model = CrossEncoder.load(base, allow_untrained_head=True)
    info = {"data": str(ds.root), "split": split, "base": base, "train_queries": len(queries),
            "dev_queries": [q.id for q in dev_queries], "title_groups": config.title_groups, "command": command,
            **({"sampled": asdict(sampled)} if sampled is not None else {})}
    if not dev_queries or dev_metric is None:
        return train_reranker(model, groups, config, out, resume=resume, show_progress=show_progress, info=info)
    with temporary_engine(corpus, bi_encoder, settings, device=config.device, show_progress=show_progress) as engine:
        dev = dev_scorer(engine, dev_queries, qrels, rerank_depth, dev_metric)
        result = train_reranker(model, groups, config, out, dev=dev, resume=resume, show_progress=show_progress,
                                info=info)
        return choose_blend(result, engine, dev_queries, qrels, rerank_depth, dev_metric, home=corpus,
                            show_progress=show_progress)
