"""Training the cross-encoder on groups of (query, positive, hard negatives).

Losses (``scores`` are the raw logits of one group, positive first):
- ``bce``: binary cross-entropy of every pair against 1 (positive) or 0 (negative), averaged over pairs;
- ``listwise``: softmax cross-entropy over each group, the positive being the right answer:
  L = -log( exp(s_pos) / sum_j exp(s_j) ).

Negatives are mined from the first stages (BM25 by default) with the false-negative guard of
:mod:`retriever.mining`. Not yet here: resume from a checkpoint, and (title, text) weak supervision.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from indexer.beir import BeirDataset
from indexer.errors import ConfigError, DataError
from reranker.cross_encoder import CrossEncoder
from retriever.bm25 import BM25Retriever
from retriever.mining import MiningConfig, mine_hard_negatives
from retriever.trainer import linear_schedule
from retriever.training_data import hold_out

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Group:
    query: str
    positive: str
    negatives: tuple[str, ...]


@dataclass(frozen=True)
class RerankerConfig:
    epochs: int = 2
    groups_per_batch: int = 8
    negatives: int = 3
    loss: str = "listwise"
    lr: float = 3e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_length: int = 256
    seed: int = 42
    bf16: bool = False
    mining: MiningConfig = field(default_factory=lambda: MiningConfig(num_negatives=3, depth=100, skip_top=0))

    def __post_init__(self) -> None:
        if self.loss not in ("bce", "listwise"):
            raise ConfigError(f"loss must be 'bce' or 'listwise', got {self.loss!r}")


def group_loss(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """``scores`` (groups, 1 + m) raw logits with the positive in column 0."""
    if kind == "listwise":
        return F.cross_entropy(scores, torch.zeros(len(scores), dtype=torch.long, device=scores.device))
    labels = torch.zeros_like(scores)
    labels[:, 0] = 1.0
    return F.binary_cross_entropy_with_logits(scores, labels)


def groups_from_split(ds: BeirDataset, split: str, config: RerankerConfig, queries: Sequence[Any] | None = None) -> list[Group]:
    """One group per relevant (query, document), negatives mined from BM25 (skipping nothing, guarded)."""
    sp = ds.split(split)
    corpus = ds.corpus
    queries = list(queries if queries is not None else sp.queries)
    bm25 = BM25Retriever.build(corpus)
    mining = MiningConfig(**{**asdict(config.mining), "num_negatives": config.negatives, "seed": config.seed})
    frame = mine_hard_negatives(queries, sp.qrels, corpus.ids, bm25.scores, mining)
    negs = {q: list(g["doc_id"]) for q, g in frame.groupby("query_id", sort=False)}
    rng = random.Random(config.seed)
    groups = []
    for q in queries:
        mined = negs.get(q.id, [])
        while len(mined) < config.negatives:  # too few past the guard: fill with random documents
            d = corpus[rng.randrange(len(corpus))].id
            if d not in sp.qrels.relevant(q.id) and d not in mined:
                mined.append(d)
        for d in sorted(sp.qrels.relevant(q.id)):
            if d in corpus:
                groups.append(Group(q.text, corpus.get(d).full_text, tuple(corpus.get(n).full_text for n in mined)))
    if not groups:
        raise DataError(f"{ds.root}/{split}: no training group (no relevant document in the corpus)")
    return groups


def train_reranker(model: CrossEncoder, groups: Sequence[Group], config: RerankerConfig, out: str | Path, *,
                   dev: Callable[[CrossEncoder], float] | None = None, show_progress: bool = False,
                   info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train and save to ``out`` (the best epoch on ``dev`` when given). Returns what was recorded."""
    from tqdm.auto import tqdm

    if not groups:
        raise DataError("no training group")
    torch.manual_seed(config.seed)
    model.allow_untrained_head = True
    model.max_length = min(model.max_length, config.max_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = (len(groups) + config.groups_per_batch - 1) // config.groups_per_batch
    total = steps_per_epoch * config.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(total, int(config.warmup_ratio * total)))
    history, best, started = [], None, time.perf_counter()
    out = Path(out)
    bar = tqdm(total=total, desc="train reranker", unit="step", disable=not show_progress)
    for epoch in range(config.epochs):
        order = np.random.default_rng(config.seed + epoch).permutation(len(groups))
        model.train()
        for start in range(0, len(order), config.groups_per_batch):
            batch = [groups[i] for i in order[start:start + config.groups_per_batch]]
            queries = [g.query for g in batch for _ in range(1 + len(g.negatives))]
            docs = [d for g in batch for d in (g.positive, *g.negatives)]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
                logits = model(model.tokenize(queries, docs)).float().reshape(len(batch), -1)
            loss = group_loss(logits, config.loss)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
        model.eval()
        model.head_trained = True
        record: dict[str, Any] = {"epoch": epoch + 1, "seconds": time.perf_counter() - started, "loss": loss.item()}
        if dev is not None:
            record["dev"] = float(dev(model))
            if best is None or record["dev"] > best:
                best = record["dev"]
                model.save(out, training={**(info or {}), "config": asdict(config), "history": history + [record]})
        history.append(record)
        logger.info("reranker epoch %d: %s", epoch + 1, record)
    bar.close()
    result = {**(info or {}), "config": asdict(config), "groups": len(groups), "history": history,
              "seconds": time.perf_counter() - started, "best_dev": best}
    if dev is None:
        model.save(out, training=result)
    return result


def train_reranker_on(data: str | Path | BeirDataset, split: str, base: str, out: str | Path,
                      config: RerankerConfig = RerankerConfig(), *, dev_fraction: float = 0.0, dev_depth: int = 30,
                      dev_metric: Callable[[Any, dict[str, Any]], float] | None = None,
                      show_progress: bool = False) -> dict[str, Any]:
    """Train a reranker from ``base`` on a BEIR split; with ``dev_fraction``, held-out train queries pick the
    best epoch by ``dev_metric(qrels, run)`` on their BM25 top ``dev_depth`` reranked."""
    from reranker.pipeline import Pipeline

    ds = data if isinstance(data, BeirDataset) else BeirDataset(data)
    sp = ds.split(split)
    queries, dev_queries = hold_out(list(sp.queries), dev_fraction, config.seed)
    groups = groups_from_split(ds, split, config, queries)
    dev = None
    if dev_queries and dev_metric is not None:
        bm25 = BM25Retriever.build(ds.corpus)
        texts = {d.id: d.full_text for d in ds.corpus}
        qrels = sp.qrels.subset(q.id for q in dev_queries)

        def dev(model: CrossEncoder) -> float:
            pipe = Pipeline(bm25, reranker=model, texts=texts, k_retrieve=dev_depth, k=min(10, dev_depth))
            return dev_metric(qrels, {q.id: pipe.ranked(q.text, dev_depth) for q in dev_queries})

    model = CrossEncoder.load(base, allow_untrained_head=True)
    info = {"data": str(ds.root), "split": split, "base": base, "train_queries": len(queries),
            "dev_queries": len(dev_queries)}
    return train_reranker(model, groups, config, out, dev=dev, show_progress=show_progress, info=info)
