"""The training-example records both models train on.

:class:`PairExample` is the one (query, positive, hard negatives) record: the bi-encoder's contrastive
objectives and the cross-encoder's groups both read it. :class:`ScoredPair` is a labelled pair of texts (STS
similarity, a contrastive 0/1, an NLI class).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PairExample:
    """A query (or any anchor), one positive and any number of hard negatives.

    ``margins`` (objective ``margin_mse`` only): a teacher's score of (anchor, positive) minus its score of
    (anchor, negative j), one per negative.
    """

    anchor: str
    positive: str
    negatives: tuple[str, ...] = ()
    margins: tuple[float, ...] = ()

    def texts(self) -> tuple[str, ...]:
        return (self.anchor, self.positive, *self.negatives)


@dataclass(frozen=True)
class ScoredPair:
    """Two texts and a label: a similarity in [0, 1] (cosine), 0/1 (contrastive) or a class id (softmax)."""

    text1: str
    text2: str
    label: float

    def texts(self) -> tuple[str, ...]:
        return (self.text1, self.text2)
