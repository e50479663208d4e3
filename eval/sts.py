"""Semantic textual similarity: Spearman correlation of cosine similarity with gold scores (x100)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from twostage.indexer.errors import DataError
from twostage.indexer.jsonl import iter_jsonl


def load_sts(path: str | Path, score_key: str | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """Pairs of an STS jsonl file: stsb (``score``) or SICK (``relatedness``), picked automatically."""
    s1, s2, gold = [], [], []
    for number, row in iter_jsonl(path):
        key = score_key or ("score" if "score" in row else "relatedness")
        try:
            s1.append(str(row["sentence1"]))
            s2.append(str(row["sentence2"]))
            gold.append(float(row[key]))
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{path}:{number}: expected sentence1, sentence2 and a numeric {key!r}") from None
    if not gold:
        raise DataError(f"{path}: no pairs")
    return s1, s2, np.asarray(gold)


def sts_spearman(encoder: Any, path: str | Path, *, batch_size: int = 64, score_key: str | None = None) -> float:
    """Spearman x 100 between cos(u, v) and the gold score, as in the Sentence-BERT paper."""
    from scipy.stats import spearmanr

    s1, s2, gold = load_sts(path, score_key)
    u = encoder.encode(s1, batch_size=batch_size)
    v = encoder.encode(s2, batch_size=batch_size)
    cos = (u * v).sum(1) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1)).clip(1e-12)
    return float(spearmanr(cos, gold).statistic * 100)
