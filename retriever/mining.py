"""Hard-negative mining: documents a first stage ranks high for a query that are not judged relevant.

For each query the candidates are the ranks ``[skip_top, depth)`` of a retriever (BM25 or dense), minus the
judged positives, minus any candidate scoring above ``max_ratio`` x the score of the weakest positive (a
guard against unjudged relevant documents, "false negatives"). ``num_negatives`` are drawn from what is left,
at random (seeded) or from the top. Results go to parquet so a run can be reused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from twostage.indexer.atomic import write_parquet
from twostage.indexer.errors import ConfigError
from twostage.indexer.records import Qrels, Query, top_k

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MiningConfig:
    num_negatives: int = 1
    depth: int = 100
    skip_top: int = 3
    max_ratio: float = 0.95
    sample: str = "random"  # or "top"
    seed: int = 42

    def __post_init__(self) -> None:
        if self.sample not in ("random", "top"):
            raise ConfigError(f"sample must be 'random' or 'top', got {self.sample!r}")
        if not 0 <= self.skip_top < self.depth or self.num_negatives <= 0:
            raise ConfigError("mining needs 0 <= skip_top < depth and num_negatives > 0")


def mine_hard_negatives(queries: Sequence[Query], qrels: Qrels, doc_ids: Sequence[str],
                        scores: Callable[[str], np.ndarray], config: MiningConfig = MiningConfig()) -> pd.DataFrame:
    """Rows (query_id, doc_id, rank, score, positive_score) of the mined negatives, best rank first.

    ``scores(query_text)`` gives the score of every document in ``doc_ids`` order (e.g.
    ``BM25Retriever.scores`` or ``DenseRetriever.scores``).
    """
    rng = np.random.default_rng(config.seed)
    row_of = {d: i for i, d in enumerate(doc_ids)}
    ids = np.asarray(doc_ids, dtype=object)
    rows = []
    for q in queries:
        positives = qrels.relevant(q.id)
        s = scores(q.text)
        pos_scores = [s[row_of[d]] for d in positives if d in row_of]
        guard = config.max_ratio * min(pos_scores) if pos_scores and min(pos_scores) > 0 else np.inf
        ranked, ranked_scores = top_k(s, config.depth)
        cands = [(r, int(i), float(v)) for r, (i, v) in enumerate(zip(ranked, ranked_scores))
                 if r >= config.skip_top and ids[i] not in positives and v <= guard]
        if config.sample == "random" and len(cands) > config.num_negatives:
            picks = sorted(rng.choice(len(cands), size=config.num_negatives, replace=False))
            cands = [cands[p] for p in picks]
        for r, i, v in cands[: config.num_negatives]:
            rows.append({"query_id": q.id, "doc_id": ids[i], "rank": r + 1, "score": v,
                         "positive_score": float(min(pos_scores)) if pos_scores else float("nan")})
    frame = pd.DataFrame(rows, columns=["query_id", "doc_id", "rank", "score", "positive_score"])
    logger.info("mined %d negatives for %d queries", len(frame), frame["query_id"].nunique() if len(frame) else 0)
    return frame


def save_negatives(frame: pd.DataFrame, path: str | Path) -> None:
    """Write the negatives to parquet through a temporary file and a rename."""
    write_parquet(path, frame)


def load_negatives(path: str | Path) -> dict[str, list[str]]:
    """query id -> mined negative doc ids, in the order they were mined."""
    frame = pd.read_parquet(path)
    missing = {"query_id", "doc_id"} - set(frame.columns)
    if missing:
        raise ConfigError(f"{path}: not a negatives file (missing columns {', '.join(sorted(missing))})")
    out: dict[str, list[str]] = {}
    for q, d in zip(frame["query_id"].astype(str), frame["doc_id"].astype(str)):
        out.setdefault(q, []).append(d)
    return out
