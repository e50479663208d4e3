"""The retriever training recipe: BEIR qrels -> hard negatives -> contrastive training -> a saved model."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.beir import BeirDataset
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Qrels, Query, RankedList
from twostage.models.fit import FitResult
from twostage.retriever.biencoder import BiEncoder
from twostage.retriever.bm25 import BM25Retriever
from twostage.retriever.dense import DenseRetriever
from twostage.retriever.late import LateEncoder
from twostage.retriever.mining import MiningConfig, mine_hard_negatives, save_negatives
from twostage.retriever.trainer import TrainConfig, train
from twostage.retriever.training_data import (
    PairScorer,
    TrainingSet,
    hold_out,
    nli_triplets,
    pairs_from_qrels,
    pairs_from_titles,
    with_margins,
    within_budget,
)

logger = logging.getLogger(__name__)

DevMetric = Callable[[Qrels, Mapping[str, RankedList]], np.ndarray]  # one value per query (e.g. ndcg10_by_query)
# Given the held-out queries and their qrels, the score (higher is better) a checkpoint is chosen by; the engine
# layer gives the one that searches as an engine serves (twostage.engine.training.retriever_dev)
DevFactory = Callable[[Sequence[Query], Qrels, BM25Retriever | None], Callable[[BiEncoder], float]]


@dataclass(frozen=True)
class RetrieverRecipe:
    """What to train on and how. ``negatives`` hard negatives per query are mined from ``mine_from``."""

    train: TrainConfig = field(default_factory=TrainConfig)
    negatives: int = 1
    mine_from: str = "bm25"  # "bm25" or "dense" (the base model, or ``mine_with``)
    mine_with: str | None = None  # a trained bi-encoder to mine dense negatives with (a second round)
    mining: MiningConfig = field(default_factory=MiningConfig)
    title_pairs: int = 0  # add up to this many (title, text) pairs of the corpus as a second training set
    nli: tuple[str, ...] = ()  # NLI jsonl files (SNLI / SICK rows) added as (premise, entailed, contradiction)
    nli_pairs: int = 0  # at most this many NLI examples (0: all)
    dev_fraction: float = 0.0  # train queries held out for model selection
    dev_candidates: int = 30  # the dev engine holds the union of each dev query's BM25 top-N and its positives
    max_positives: int = 0  # at most this many relevant documents a query train, highest grades first (0: all)
    # at most this many (query, positive) pairs: fewer positives a query (max_positives when set), then a seeded
    # sample of the queries, recorded as ``sampled`` in the training record (training_data.within_budget; 0: every pair)
    max_pairs: int = 0
    # tokens a text while training, saved with the model, so it reads as many when served (None: the base's); 128
    # trains a MiniLM step 2.6x faster than 256 on NFCorpus (benchmarks/results/one_command_nfcorpus.md)
    max_length: int | None = None
    # train a late-interaction model (MaxSim over token vectors, objective "maxsim") from ``base`` instead of a
    # bi-encoder: the same data, negatives and loop; saved in PyLate's layout (retriever.late.LateEncoder)
    late: bool = False
    # a late-interaction model's queries padded to this many tokens with mask tokens whose vectors MaxSim keeps
    # (ColBERT's query augmentation, trained with the model; 0: queries as they are, the base bi-encoder's way)
    query_augmentation: int = 0

    def __post_init__(self) -> None:
        if self.mine_from not in ("bm25", "dense"):
            raise ConfigError(f"mine_from must be 'bm25' or 'dense', got {self.mine_from!r}")
        if not 0 <= self.dev_fraction < 1:
            raise ConfigError("dev_fraction must be in [0, 1)")
        if self.mine_with and self.mine_from != "dense":
            raise ConfigError("mine_with names a bi-encoder to mine with: it needs mine_from='dense'")
        if self.late and (self.title_pairs or self.nli):
            raise ConfigError("a late-interaction model trains on query-document pairs only: leave out title_pairs "
                              "and nli")
        if self.query_augmentation and (not self.late or self.query_augmentation < 3):
            raise ConfigError(f"query_augmentation {self.query_augmentation}: pads a late-interaction model's queries "
                              "to that many tokens; give a length of at least 3 with late=True, or 0 for none")
        if self.train.maxsim_temperature != 1.0 and not self.late:
            raise ConfigError(f"maxsim_temperature {self.train.maxsim_temperature}: divides a late-interaction "
                              "model's MaxSim scores in its loss; give it with late=True, or leave it at 1")


def _sample(training_set: TrainingSet, n: int, seed: int) -> TrainingSet:
    """At most ``n`` examples of ``training_set`` (a seeded sample, order kept); all of them when n is 0."""
    if not n or n >= len(training_set.examples):
        return training_set
    pick = np.random.default_rng(seed).permutation(len(training_set.examples))[:n]
    return replace(training_set, examples=tuple(training_set.examples[i] for i in sorted(pick)))


def train_retriever(data: str | Path | BeirDataset, split: str, base: str, out: str | Path,
                    recipe: RetrieverRecipe = RetrieverRecipe(), *, dev: DevFactory | None = None,
                    teacher: PairScorer | None = None, teacher_name: str = "", show_progress: bool = False) -> FitResult:
    """Fine-tune ``base`` on ``split`` of a BEIR directory and save the model to ``out``.

    With ``teacher`` (a function scoring (query, document) pairs, e.g. a cross-encoder's logits), the queries
    with hard negatives train with Margin-MSE distillation of the teacher's margins (a bi-encoder's cosines, or a
    late-interaction model's MaxSim scores) plus in-batch contrast weighted by ``recipe.train.margin_rank_weight``;
    the recipe needs ``negatives`` > 0 for that. The teacher's scores are kept in ``OUT.teacher.parquet`` beside
    the model as they are computed, so a run started again scores only what is missing. ``dev`` is given the
    ``recipe.dev_fraction`` of queries held out (and BM25 when it was built) and returns what scores a checkpoint
    after each epoch; :func:`twostage.engine.training.train_retriever_on` gives the engine's own dense search.
    """
    if teacher is not None and not recipe.negatives:
        raise ConfigError("distillation from a teacher needs hard negatives: set negatives > 0")
    if recipe.dev_fraction and dev is None:  # else the held-out queries would go unused
        raise ConfigError(f"dev_fraction {recipe.dev_fraction} holds queries out to choose the best checkpoint: train "
                          "with twostage.train (it searches them as an engine does), or set dev_fraction 0")
    ds = data if isinstance(data, BeirDataset) else BeirDataset(data)
    sp = ds.split(split)
    corpus = ds.corpus
    augment: dict[str, Any] = ({"expand_query": True, "query_length": recipe.query_augmentation}
                               if recipe.query_augmentation else {})
    model: Any = (LateEncoder.load(base, document_length=recipe.max_length, **augment) if recipe.late
                  else BiEncoder.load(base, max_length=recipe.max_length))
    queries, dev_queries = hold_out(list(sp.queries), recipe.dev_fraction, recipe.train.seed)
    queries, cap, sampled = within_budget(queries, sp.qrels, recipe.max_pairs, recipe.max_positives, recipe.train.seed)
    if sampled is not None:
        logger.info("training budget of %d pairs: %d of %d queries, at most %d positives each (%d pairs)",
                    sampled.max_pairs, sampled.queries, sampled.of_queries, cap, sampled.pairs)
        recipe = replace(recipe, max_positives=cap)
    out = Path(out)
    negatives = None
    bm25 = BM25Retriever.build(corpus) if recipe.mine_from == "bm25" or dev_queries else None
    if recipe.negatives:
        # the training seed draws the negatives too (as the reranker's does): one seed for every random choice
        mining = MiningConfig(**{**asdict(recipe.mining), "num_negatives": recipe.negatives, "seed": recipe.train.seed})
        if recipe.mine_from == "bm25":
            scorer = bm25.scores  # type: ignore[union-attr]
        else:
            miner = (BiEncoder.load(recipe.mine_with or base, max_length=recipe.max_length)
                     if recipe.mine_with or recipe.late else model)
            scorer = DenseRetriever.build(corpus, miner, show_progress=show_progress).scores
        frame = mine_hard_negatives(queries, sp.qrels, corpus.ids, scorer, mining)
        out.parent.mkdir(parents=True, exist_ok=True)
        save_negatives(frame, out.parent / f"{out.name}.negatives.parquet")
        negatives = {q: list(g["doc_id"]) for q, g in frame.groupby("query_id", sort=False)}
    name = f"{ds.name}/{split}"
    if negatives is None:
        sets = [pairs_from_qrels(corpus, queries, sp.qrels, name=name, max_positives=recipe.max_positives,
                                 seed=recipe.train.seed)]
    else:
        # Queries whose candidates all failed the false-negative guard still train, on in-batch negatives.
        full = [q for q in queries if len(negatives.get(q.id, ())) >= recipe.negatives]
        rest = [q for q in queries if len(negatives.get(q.id, ())) < recipe.negatives]
        if not full:
            raise DataError(f"{name}: no query kept a hard negative past the false-negative guard "
                            f"(max_ratio {recipe.mining.max_ratio}); raise it, mine deeper, or train with negatives=0")
        sets = [pairs_from_qrels(corpus, full, sp.qrels, negatives=negatives, num_negatives=recipe.negatives,
                                 name=f"{name}+negatives", max_positives=recipe.max_positives, seed=recipe.train.seed)]
        if teacher is not None:
            sets[0] = with_margins(sets[0], teacher, objective="maxsim_margin_mse" if recipe.late else "margin_mse",
                                   cache=out.parent / f"{out.name}.teacher.parquet",
                                   teacher_name=teacher_name or "given")
        if rest:
            logger.info("%d queries have no hard negative past the guard; they train on in-batch negatives", len(rest))
            sets.append(pairs_from_qrels(corpus, rest, sp.qrels, name=f"{name}/in-batch",
                                         max_positives=recipe.max_positives, seed=recipe.train.seed))
    if recipe.title_pairs:
        sets.append(_sample(pairs_from_titles(corpus), recipe.title_pairs, recipe.train.seed))
    if recipe.nli:
        sets.append(_sample(nli_triplets(recipe.nli), recipe.nli_pairs, recipe.train.seed))
    if recipe.late:  # MaxSim in place of cosines (a distilled set already reads MaxSim's margins)
        sets = [s if s.objective == "maxsim_margin_mse" else replace(s, objective="maxsim") for s in sets]
    score = dev(dev_queries, sp.qrels.subset(q.id for q in dev_queries), bm25) if dev_queries and dev else None
    info: dict[str, Any] = {"data": str(ds.root), "split": split, "base": base, "recipe": asdict(recipe),
                            "train_queries": len(queries), "dev_queries": len(dev_queries),
                            **({"sampled": asdict(sampled)} if sampled is not None else {}),
                            **({"teacher": teacher_name or "given"} if teacher is not None else {})}
    return train(model, sets, recipe.train, out, dev=score, show_progress=show_progress, info=info)
