"""Adapting both models to a corpus without any labels: ``twostage adapt`` and :func:`adapt`.

1. Pseudo-queries are made from the documents (:mod:`twostage.retriever.pseudo_queries`: titles, rare-word
   sentences with the sentence cut out of the positive, keyword queries); a seeded part is held out as dev.
2. The bi-encoder trains on them with in-batch negatives plus hard negatives mined from BM25 (the false-negative
   guard drops candidates that score nearly as high as the source document); with more than one epoch the epoch is
   chosen on the dev pseudo-queries. The adapted bi-encoder is kept only where the dev pseudo-queries score it at
   least as high as the base model; else the base is kept (and the rest of the run uses it).
3. The reranker (from the same base) trains listwise on groups of (pseudo-query, source document, negatives mined
   from BM25 and the adapted bi-encoder); its epoch and its blend with the engine's hybrid first stage (fused as
   the recipe says) are chosen on the dev pseudo-queries; a reranker whose chosen weight is 0 (it did not beat the
   first stage there) is not kept.

:attr:`AdaptResult.notes` says, a line per stage, what was kept and why (the build summary prints them).

Output: ``OUT/retriever`` and ``OUT/reranker`` (model directories: ``SearchEngine.build(retriever=, reranker=)``,
every ``--retriever-model`` / ``--reranker-model`` takes them) and ``OUT/adapt.json`` (the recipe, the counts, the
dev scores and the time of each phase). Each model trains through the shared loop, so a killed run resumes from
its last checkpoint when started again with the same arguments; once both models are saved, the training work
(``OUT/*.train`` checkpoints, mined negatives: about 600 MB with MiniLM) is removed unless ``keep_checkpoints``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from twostage.engine.settings import EngineSettings
from twostage.engine.training import choose_blend, dev_scorer, retriever_dev, temporary_engine
from twostage.indexer.atomic import to_json_dict, write_json
from twostage.indexer.corpus import Corpus, CorpusSource, load_corpus
from twostage.indexer.errors import ConfigError
from twostage.reranker.training import RerankerConfig, mix_negatives, train_reranker
from twostage.retriever.bm25 import BM25Retriever
from twostage.retriever.examples import PairExample
from twostage.retriever.mining import MiningConfig, mine_hard_negatives
from twostage.retriever.pseudo_queries import PseudoQueryConfig, as_queries_and_qrels, make_pseudo_queries
from twostage.retriever.recipe import DevMetric
from twostage.retriever.trainer import TrainConfig, train
from twostage.retriever.training_data import TrainingSet, hold_out

logger = logging.getLogger(__name__)

DEV_POOL = 20  # the dev engine holds each dev pseudo-query's BM25 top-N and its source document


@dataclass(frozen=True)
class AdaptRecipe:
    """How ``twostage adapt`` trains; the defaults are the measured recipe (benchmarks/results/adapt-*/summary.md)."""

    queries: PseudoQueryConfig = field(default_factory=PseudoQueryConfig)
    max_documents: int = 2500  # pseudo-queries come from at most this many documents (a seeded sample)
    dev_queries: int = 200  # pseudo-queries held out to choose epochs and blends
    # GradCache (16 texts a pass) and 2 reranker groups a pass: the same gradients as one pass, in ~1.6 GB not ~4.2
    # (MiniLM, 128 tokens; benchmarks/results/first_hour_adapt.md)
    retriever: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=1, lr=2e-5, bf16=False,
                                                                       mini_batch_size=16))
    retriever_negatives: int = 1
    train_max_length: int = 128  # tokens per text while training (the saved models keep the base's limit)
    mining: MiningConfig = field(default_factory=lambda: MiningConfig(depth=50, skip_top=0, max_ratio=0.9))
    reranker: RerankerConfig | None = field(default_factory=lambda: RerankerConfig(
        epochs=1, bf16=False, title_groups=0, negatives=7, groups_per_pass=2))
    reranker_groups: int = 800  # training groups for the reranker (a seeded sample of the pseudo-queries)
    # How the adapted engine fuses BM25 and dense. Not chosen on the dev pseudo-queries: they are nearly solved by
    # BM25 (nDCG@10 0.98-1.00 on SciFact's), so they pick BM25's side whatever the real queries need. The blend at
    # 0.5 is the choice on the labelled queries we may tune on (SciFact train, the sample's train split).
    fusion: str = "wsum"
    dense_weight: float = 0.5

    def __post_init__(self) -> None:
        if self.max_documents <= 0 or self.dev_queries < 0 or self.reranker_groups <= 0:
            raise ConfigError("max_documents and reranker_groups must be positive, dev_queries >= 0")
        replace(EngineSettings(), fusion=self.fusion, dense_weight=self.dense_weight)  # checks both


@dataclass(frozen=True)
class AdaptResult:
    retriever: str
    reranker: str | None
    settings: EngineSettings  # the search settings for an engine over the adapted models (the recipe's fusion)
    seconds: dict[str, float]
    dev: dict[str, float]
    checkpoints_removed_mb: float = 0.0
    notes: tuple[str, ...] = ()  # a line per stage: what was kept, and why


def _sample_docs(corpus: Corpus, n: int, seed: int) -> list[Any]:
    if len(corpus) <= n:
        return list(corpus)
    pick = np.random.default_rng(seed).choice(len(corpus), size=n, replace=False)
    return [corpus[int(i)] for i in sorted(pick)]


def adapt(corpus: CorpusSource | Corpus, out: str | Path, *, base: str = "all-MiniLM-L6-v2",
          recipe: AdaptRecipe = AdaptRecipe(), dev_metric: DevMetric, show_progress: bool = False,
          device: str = "auto", keep_checkpoints: bool = False) -> AdaptResult:
    """Train ``OUT/retriever`` and ``OUT/reranker`` on ``corpus`` alone (see the module's docstring), each epoch and
    blend chosen on held-out pseudo-queries by ``dev_metric`` (``twostage.adapt`` gives nDCG@10). ``device``:
    where the models train and encode (cpu, cuda, cuda:N, auto; twostage.models.device). The checkpoints are
    removed at the end unless ``keep_checkpoints``."""
    from twostage.models.device import release_freed_memory, resolve_device
    from twostage.models.fit import seed_everything
    from twostage.reranker.cross_encoder import CrossEncoder
    from twostage.retriever.biencoder import BiEncoder
    from twostage.retriever.dense import DenseRetriever

    where = resolve_device(device)  # cuda on a machine without it: one ConfigError, before anything is written
    recipe = replace(recipe, retriever=replace(recipe.retriever, device=where),
                     reranker=None if recipe.reranker is None else replace(recipe.reranker, device=where))
    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    dev_scores: dict[str, float] = {}
    seed = recipe.queries.seed

    t = time.perf_counter()
    pseudo = make_pseudo_queries(_sample_docs(corpus, recipe.max_documents, seed), recipe.queries)
    n_dev = min(recipe.dev_queries, len(pseudo) // 5)
    train_q, dev_q = hold_out(pseudo, n_dev / len(pseudo), seed) if n_dev else (pseudo, [])
    bm25 = BM25Retriever.build(corpus)
    queries, qrels = as_queries_and_qrels(train_q)
    mining = replace(recipe.mining, num_negatives=max(1, recipe.retriever_negatives), seed=seed)
    frame = mine_hard_negatives(queries, qrels, corpus.ids, bm25.scores, mining)
    negatives = {q: list(g["doc_id"]) for q, g in frame.groupby("query_id", sort=False)}
    seconds["queries_and_mining_s"] = time.perf_counter() - t
    k = recipe.retriever_negatives
    full = [PairExample(p.text, p.positive, tuple(corpus.get(d).full_text for d in negatives.get(p.id, [])[:k]))
            for p in train_q if len(negatives.get(p.id, ())) >= k]
    rest = [PairExample(p.text, p.positive) for p in train_q if len(negatives.get(p.id, ())) < k]
    sets = [TrainingSet("pseudo+negatives", "mnrl", tuple(full))] if full else []
    if rest:
        sets.append(TrainingSet("pseudo/in-batch", "mnrl", tuple(rest)))
    logger.info("%d pseudo-queries (%d with a hard negative), %d held out as dev", len(train_q), len(full), len(dev_q))

    t = time.perf_counter()
    base_model = BiEncoder.load(base, device=where)
    model = BiEncoder.load(base, max_length=min(recipe.train_max_length, base_model.config.max_length), device=where)
    dev_queries, dev_qrels = as_queries_and_qrels(dev_q)
    # each dev pseudo-query's source document its one relevant; searched as the engine serves (engine.training)
    dev = retriever_dev(corpus, dev_metric, DEV_POOL, device=where, show_progress=show_progress)(
        dev_queries, dev_qrels, bm25)

    if dev_q:
        dev_scores["retriever_base"] = dev(base_model)
    # with one epoch there is nothing to choose: the adapted model is scored once, against the base, below
    per_epoch = dev if dev_q and recipe.retriever.epochs > 1 else None
    fit_started = time.perf_counter()
    result = train(model, sets, recipe.retriever, out / "retriever", dev=per_epoch,
                   show_progress=show_progress, info={"kind": "adapt", "base": base, "pseudo_queries": len(train_q),
                                                      "recipe": to_json_dict(recipe)})
    fit_wall = time.perf_counter() - fit_started
    trained = BiEncoder.load(out / "retriever", max_length=base_model.config.max_length, device=where)
    trained.save(out / "retriever", training=result.training)  # searches with the base's token limit
    kept: Any = out / "retriever"
    notes: list[str] = []
    if dev_q:
        dev_scores["retriever"] = dev(trained)
        ours, theirs = dev_scores["retriever"], dev_scores["retriever_base"]
        if ours < theirs:  # never a retriever its own dev scores worse than the one it replaces
            kept, trained = base, base_model
            notes.append(f"retriever: the base {base} kept: on the dev pseudo-queries it scored {theirs:.3f}, the "
                         f"adapted one {ours:.3f} (left unused in {out / 'retriever'})")
        else:
            notes.append(f"retriever: adapted ({ours:.3f} on the dev pseudo-queries, the base {theirs:.3f})")
    del model
    release_freed_memory()  # the dev searches' encodings
    # the loop's own clock counts an earlier run's training when this one resumed it
    seconds["train_retriever_s"] = result.seconds
    seconds["retriever_dev_s"] = time.perf_counter() - t - fit_wall

    settings = replace(EngineSettings(), fusion=recipe.fusion, dense_weight=recipe.dense_weight)
    reranker_dir = None
    if recipe.reranker is not None:  # the corpus is encoded for the reranker's dense negatives and its dev
        t = time.perf_counter()
        dense = DenseRetriever.build(corpus, trained, show_progress=show_progress)
        seconds["encode_corpus_s"] = time.perf_counter() - t
        release_freed_memory()
        t = time.perf_counter()
        config = recipe.reranker
        picked = [train_q[int(i)] for i in sorted(np.random.default_rng(seed).permutation(len(train_q))
                                                   [:recipe.reranker_groups])]
        rq, rqrels = as_queries_and_qrels(picked)
        negs = mix_negatives(rq, rqrels, corpus, {"bm25": bm25.scores, "dense": dense.scores}, config, config.negatives)
        groups = [PairExample(p.text, corpus.get(p.doc_id).full_text, tuple(corpus.get(n).full_text for n in negs[p.id]))
                  for p in picked]
        # epochs and the blend are chosen through an engine with the adapted retriever and these settings, on the
        # first stage it searches (the others use the same blend)
        seed_everything(config.seed)
        model_ce = CrossEncoder.load(base, allow_untrained_head=True, device=where)
        reranker_dir = out / "reranker"
        with temporary_engine(corpus, kept, settings, device=where, show_progress=show_progress) as engine:
            release_freed_memory()  # the passages' encoding
            dev_fn = dev_scorer(engine, dev_queries, dev_qrels, settings.rerank_depth, dev_metric,
                                ("hybrid",)) if dev_q else None
            fit_started = time.perf_counter()
            res = train_reranker(model_ce, groups, config, reranker_dir, dev=dev_fn, show_progress=show_progress,
                                 info={"kind": "adapt", "base": base, "groups": len(groups)})
            fit_wall = time.perf_counter() - fit_started
            if res.best_dev is not None:
                dev_scores["reranker"] = res.best_dev
            if dev_fn is not None:
                chosen = choose_blend(res, engine, dev_queries, dev_qrels, settings.rerank_depth, dev_metric,
                                      ("hybrid",), home=corpus, show_progress=show_progress)
                dev_scores["reranker_blend"] = float(chosen.training["interpolation"]["alpha"])
        seconds["train_reranker_s"] = res.seconds
        seconds["reranker_mining_and_blend_s"] = time.perf_counter() - t - fit_wall
        verdict = reranker_verdict(dev_scores)
        if verdict:
            notes.append(f"reranker: {verdict}")
        if dev_scores.get("reranker_blend") == 0.0:  # it did not beat the first stage: not kept
            reranker_dir = None
    removed = 0.0 if keep_checkpoints else remove_training_work(out)
    write_json(out / "adapt.json", {"base": base, "documents": len(corpus), "pseudo_queries": len(train_q),
                                    "dev_queries": len(dev_q), "recipe": to_json_dict(recipe), "seconds": seconds,
                                    "dev": dev_scores, "settings": to_json_dict(settings),
                                    "kept": {"retriever": str(kept), "reranker": str(reranker_dir or "")},
                                    "notes": notes, "checkpoints_removed_mb": round(removed, 1)})
    return AdaptResult(str(kept), str(reranker_dir) if reranker_dir else None, settings, seconds,
                       dev_scores, removed, tuple(notes))


def reranker_verdict(dev: dict[str, float]) -> str:
    """What the dev pseudo-queries made of the adapted reranker, in one sentence (empty without one)."""
    alpha = dev.get("reranker_blend")
    if alpha is None:
        return ""
    first = f"the adapted retriever {dev['retriever']:.3f}" if "retriever" in dev else "no dev score"
    if alpha == 0.0:
        return (f"not kept: on the dev pseudo-queries it did not beat the first stage ({first}, the reranker "
                f"alone {dev.get('reranker', float('nan')):.3f}); the engine has no second stage. A reranker trained "
                "on labelled pairs (docs/models.md) is the way to one that helps")
    return (f"kept: it reorders the hybrid top with weight {alpha:g}, chosen on the dev pseudo-queries ({first}, the "
            f"reranker alone {dev.get('reranker', float('nan')):.3f})")


def remove_training_work(models: Path) -> float:
    """Remove what training left beside the saved models (checkpoints, mined negatives); the MB removed."""
    import shutil

    freed = 0.0
    for work in sorted(models.glob("*.train")) + sorted(models.glob("*.negatives.parquet")):
        freed += disk_mb(work)
        shutil.rmtree(work) if work.is_dir() else work.unlink()
    return freed


def disk_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6
