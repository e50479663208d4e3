"""Training the cross-encoder on groups (:class:`~twostage.retriever.examples.PairExample`: query, positive, hard
negatives), run by the shared loop (:func:`twostage.models.fit.fit`: seeding, AdamW, schedule, checkpoints and
resume, best epoch on dev).

Losses (``scores`` are the raw logits of one group, positive first):
- ``bce``: binary cross-entropy of every pair against 1 (positive) or 0 (negative), averaged over pairs;
- ``listwise``: softmax cross-entropy over each group, the positive being the right answer:
  L = -log( exp(s_pos) / sum_j exp(s_j) ).

Groups come from a split's qrels, negatives mined from the first stages the reranker will see (BM25 and/or a
dense model, ``mine_from``) with the false-negative guard of :mod:`twostage.retriever.mining`, and optionally from
(title, text) pairs of the corpus (weak supervision: the title is the query, its own text the positive, BM25
neighbours of the title the negatives).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from twostage.indexer.beir import BeirDataset
from twostage.indexer.corpus import Corpus
from twostage.indexer.errors import ConfigError, DataError
from twostage.indexer.records import Judgment, Qrels, Query
from twostage.models.fit import FitResult, LoopConfig, fit
from twostage.reranker.cross_encoder import CrossEncoder
from twostage.retriever.bm25 import BM25Retriever
from twostage.retriever.examples import PairExample
from twostage.retriever.mining import MiningConfig, mine_hard_negatives
from twostage.retriever.training_data import positives

logger = logging.getLogger(__name__)

Scorer = Callable[[str], np.ndarray]  # query text -> score of every corpus document (corpus order)
SOURCES = ("bm25", "dense")


@dataclass(frozen=True)
class RerankerConfig(LoopConfig):
    """How the reranker trains. The defaults are the measured SciFact recipe (benchmarks/results/ablation-scifact):
    what ``twostage train-reranker`` with no flags, ``bench --train-split`` and ``train_reranker_on`` all use."""

    epochs: int = 2
    groups_per_batch: int = 8
    negatives: int = 7
    loss: str = "listwise"
    lr: float = 5e-5
    max_length: int = 128
    mine_from: tuple[str, ...] = ("bm25", "dense")  # negatives are split evenly between these first stages
    title_groups: int = 1500  # (title, text) weak-supervision groups drawn from the corpus
    title_negatives: int = 3
    groups_per_pass: int = 0  # > 0: a batch's groups this many a forward pass (the same gradient, less memory)
    max_positives: int = 0  # at most this many groups a query, the highest-graded documents first (0: one per judgment)
    max_pairs: int = 0  # at most this many (query, positive) groups (retriever.training_data.within_budget; 0: all)
    mining: MiningConfig = field(default_factory=lambda: MiningConfig(num_negatives=7, depth=50, skip_top=0))

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        bad = [s for s in self.mine_from if s not in SOURCES]
        if bad or not self.mine_from:
            raise ConfigError(f"mine_from must name some of {', '.join(SOURCES)}, got {', '.join(bad) or 'none'}")
        if self.epochs <= 0 or self.groups_per_batch <= 0 or self.negatives <= 0 or self.lr <= 0:
            raise ConfigError("epochs, groups_per_batch, negatives and lr must be positive")
        if self.groups_per_pass < 0:
            raise ConfigError(f"groups_per_pass must be >= 0 (0: the whole batch at once), got {self.groups_per_pass}")


def _listwise(scores: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(scores, torch.zeros(len(scores), dtype=torch.long, device=scores.device))


def _bce(scores: torch.Tensor) -> torch.Tensor:
    labels = torch.zeros_like(scores)
    labels[:, 0] = 1.0
    return F.binary_cross_entropy_with_logits(scores, labels)


LOSSES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"listwise": _listwise, "bce": _bce}


def group_loss(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """``scores`` (groups, 1 + m) raw logits with the positive in column 0; ``kind`` one of :data:`LOSSES`."""
    return LOSSES[kind](scores)


def mix_negatives(queries: Sequence[Query], qrels: Qrels, corpus: Corpus, scorers: Mapping[str, Scorer],
          config: RerankerConfig, count: int) -> dict[str, list[str]]:
    """query id -> ``count`` negatives, taken in turn from each scorer's mined candidates, no repeats."""
    per_source = []
    for name, scorer in scorers.items():
        mining = MiningConfig(**{**asdict(config.mining), "num_negatives": count, "seed": config.seed})
        frame = mine_hard_negatives(queries, qrels, corpus.ids, scorer, mining)
        per_source.append({q: list(g["doc_id"]) for q, g in frame.groupby("query_id", sort=False)})
        logger.info("mined %d negatives from %s", len(frame), name)
    rng = random.Random(config.seed)
    out = {}
    for q in queries:
        relevant = qrels.relevant(q.id)
        lists = [src.get(q.id, []) for src in per_source]
        picked: list[str] = []
        for i in range(max((len(x) for x in lists), default=0)):
            for x in lists:
                if i < len(x) and x[i] not in picked and len(picked) < count:
                    picked.append(x[i])
        while len(picked) < count:  # too few past the guard: fill with random documents
            d = corpus[rng.randrange(len(corpus))].id
            if d not in relevant and d not in picked:
                picked.append(d)
        out[q.id] = picked
    return out


def _scorers(corpus: Corpus, config: RerankerConfig, scorers: Mapping[str, Scorer] | None) -> dict[str, Scorer]:
    given = dict(scorers or {})
    if "bm25" in config.mine_from and "bm25" not in given:
        given["bm25"] = BM25Retriever.build(corpus).scores
    missing = [s for s in config.mine_from if s not in given]
    if missing:
        raise ConfigError(f"mining from {', '.join(missing)} needs that first stage: pass a bi-encoder "
                          "(--retriever-model) to mine dense negatives")
    return {s: given[s] for s in config.mine_from}


def groups_from_split(ds: BeirDataset, split: str, config: RerankerConfig, queries: Sequence[Query] | None = None,
                      scorers: Mapping[str, Scorer] | None = None) -> list[PairExample]:
    """One group per relevant (query, document); ``config.negatives`` mined from ``config.mine_from``."""
    sp = ds.split(split)
    corpus = ds.corpus
    queries = list(queries if queries is not None else sp.queries)
    negs = mix_negatives(queries, sp.qrels, corpus, _scorers(corpus, config, scorers), config, config.negatives)
    groups = [PairExample(q.text, corpus.get(d).full_text, tuple(corpus.get(n).full_text for n in negs[q.id]))
              for q in queries for d in positives(sp.qrels, q.id, config.max_positives, config.seed) if d in corpus]
    if not groups:
        raise DataError(f"{ds.root}/{split}: no training group (no relevant document in the corpus)")
    return groups


def title_groups(corpus: Corpus, n: int, config: RerankerConfig, bm25: BM25Retriever | None = None,
                 min_chars: int = 20) -> list[PairExample]:
    """Weak supervision: ``n`` documents (seeded sample) as (title, own text, texts of BM25 neighbours)."""
    docs = [d for d in corpus if len(d.title.strip()) >= min_chars and len(d.text.strip()) >= min_chars]
    if not docs:
        raise DataError("no document has both a title and a text: (title, text) groups need both")
    rng = np.random.default_rng(config.seed)
    picked = [docs[i] for i in sorted(rng.choice(len(docs), size=min(n, len(docs)), replace=False))]
    queries = [Query(f"title:{d.id}", d.title) for d in picked]
    qrels = Qrels(Judgment(q.id, d.id, 1) for q, d in zip(queries, picked))
    scorer = (bm25 or BM25Retriever.build(corpus)).scores
    negs = mix_negatives(queries, qrels, corpus, {"bm25": scorer}, config, config.title_negatives)
    return [PairExample(d.title, d.text, tuple(corpus.get(x).text or corpus.get(x).full_text for x in negs[q.id]))
            for q, d in zip(queries, picked)]


class RerankerTask:
    """The cross-encoder's part of a training run: seeded shuffles of the groups, a group loss over raw logits."""

    def __init__(self, model: CrossEncoder, groups: Sequence[PairExample], config: RerankerConfig) -> None:
        if not groups:
            raise DataError("no training group")
        self.model, self.groups, self.config = model, list(groups), config
        model.allow_untrained_head = True
        model.head_trained = True  # what it saves from here on is trained (dev scoring needs it too)
        model.max_length = min(model.max_length, config.max_length)

    def identity(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "groups": len(self.groups)}

    def start(self, device: torch.device) -> list[torch.nn.Module]:
        return []

    def plan(self, epoch: int) -> list[list[int]]:
        order = np.random.default_rng(self.config.seed + epoch).permutation(len(self.groups)).tolist()
        size = self.config.groups_per_batch
        return [order[i:i + size] for i in range(0, len(order), size)]

    def passes(self, batch: list[int]) -> list[tuple[list[int], float]]:
        """The group loss is a mean over groups: ``groups_per_pass`` groups at a time, weighted by their share."""
        size = self.config.groups_per_pass or len(batch)
        return [(batch[i:i + size], len(batch[i:i + size]) / len(batch)) for i in range(0, len(batch), size)]

    def loss(self, batch: list[int]) -> torch.Tensor:
        groups = [self.groups[i] for i in batch]
        queries = [g.anchor for g in groups for _ in range(1 + len(g.negatives))]
        docs = [d for g in groups for d in (g.positive, *g.negatives)]
        logits = self.model(self.model.tokenize(queries, docs)).float()
        sizes = [1 + len(g.negatives) for g in groups]
        if len(set(sizes)) == 1:
            return group_loss(logits.reshape(len(groups), -1), self.config.loss)
        return torch.stack([group_loss(s[None], self.config.loss) for s in torch.split(logits, sizes)]).mean()


def train_reranker(model: CrossEncoder, groups: Sequence[PairExample], config: RerankerConfig, out: str | Path, *,
                   dev: Callable[[CrossEncoder], float] | None = None, resume: bool = True,
                   show_progress: bool = False, info: dict[str, Any] | None = None) -> FitResult:
    """Train and save to ``out`` (the best epoch on ``dev`` when given).

    With ``resume``, a checkpoint in ``OUT.train/last`` of the same configuration and groups is continued.
    """
    return fit(RerankerTask(model, groups, config), config, out, dev=dev, resume=resume,
               show_progress=show_progress, info=info, desc="train reranker")
