"""How a hit's score was made (``search(..., explain=True)``): the parts, and the arithmetic that puts them together.

A hit's score is built in up to four steps, each recorded here with the numbers it used, so that
:meth:`Explanation.recomposed` computes the score again from them alone:

1. **first stage**: one stage's own score (``bm25`` or ``dense``), or the fusion of both: ``rrf``, the sum over stages
   of ``1 / (k_rrf + rank)``, or ``blend``, the sum of ``weight * minmax(score)`` over each stage's candidates;
2. **reranker** (when it read the hit): ``blend * minmax(rerank) + (1 - blend) * minmax(first stage)`` over the
   documents it read (or its own score, with no blend); a hit below the rerank depth follows the reranked ones:
   ``lowest reranked score - 1 - its position among those below``;
3. **diversity** (when asked): ``(1 - diversity) * minmax(relevance) - diversity * redundancy``, the relevance being
   step 2's score and the redundancy its highest similarity with a hit chosen before it (its cosine above the floor,
   :data:`twostage.engine.steer.FLOOR`, scaled to [0, 1]).

BM25's part lists the query terms the document matched (feedback terms too) with their share of its BM25 score, and
a calibrated reranker adds the probability of relevance; neither takes part in the arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


def scaled(value: float, low: float, high: float) -> float:
    """min-max scaling of one value (0 when the range is empty), as :func:`twostage.engine.fusion.minmax`."""
    return 0.0 if high == low else (value - low) / (high - low)


@dataclass(frozen=True)
class StagePart:
    """One first stage's part in a hit's first-stage score. ``score`` None: the stage did not find the hit.
    ``low``/``high``: the stage's scores' range over its candidates (blend's min-max); ``contribution``: what it
    adds to the fusion. ``terms``: BM25's matched terms and each one's share of its score."""

    name: str
    score: float | None
    rank: int | None
    weight: float
    low: float
    high: float
    contribution: float
    terms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class RerankPart:
    """The reranker's part: its score of the hit, the blend against the first stage (None: its score alone), and the
    ranges min-max scaling used over the documents it read. ``below``: a hit under the rerank depth, its position
    among those (from 0), placed under ``floor``, the lowest reranked score."""

    score: float | None
    blend: float | None
    rerank_range: tuple[float, float] = (0.0, 0.0)
    first_range: tuple[float, float] = (0.0, 0.0)
    below: int | None = None
    floor: float = 0.0


@dataclass(frozen=True)
class DiversityPart:
    """Maximal marginal relevance's part: the weight of diversity, the hit's relevance (the score before) and its
    range over the candidates, its redundancy and the hit chosen before it that it is most like."""

    diversity: float
    relevance: float
    low: float
    high: float
    redundancy: float
    most_like: str | None


@dataclass(frozen=True)
class Explanation:
    """How one hit's score was made. ``fusion``: ``rrf``, ``blend``, or the one stage (``bm25``, ``dense``) that
    ranked alone; ``k_rrf``: rrf's constant; ``probability``: a calibrated reranker's probability of relevance."""

    score: float
    fusion: str
    stages: tuple[StagePart, ...]
    k_rrf: float = 60.0
    rerank: RerankPart | None = None
    diversity: DiversityPart | None = None
    probability: float | None = None
    maxsim: RerankPart | None = None  # late interaction's part, between the first stage and the reranker

    @property
    def first_stage(self) -> float:
        """The first-stage score from its parts."""
        if self.fusion in ("rrf", "blend"):
            return sum(s.contribution for s in self.stages)
        return next(s.score for s in self.stages if s.name == self.fusion and s.score is not None)

    def recomposed(self) -> float:
        """The score computed again from the parts (equal to :attr:`score` up to float32 rounding)."""
        value = self.first_stage
        for r in (self.maxsim, self.rerank):
            if r is None:
                continue
            if r.below is not None:
                value = r.floor - 1.0 - r.below
            elif r.blend is None:
                assert r.score is not None
                value = r.score
            else:
                assert r.score is not None
                value = r.blend * scaled(r.score, *r.rerank_range) + (1 - r.blend) * scaled(value, *r.first_range)
        d = self.diversity
        if d is not None:
            value = (1 - d.diversity) * scaled(value, d.low, d.high) - d.diversity * d.redundancy
        return float(value)

    def lines(self) -> list[str]:
        """The explanation in words, one line a step, as ``twostage search --explain`` prints it."""
        out = []
        for s in self.stages:
            found = "not found" if s.score is None else f"{s.score:.4f} (rank {s.rank})"
            line = f"{s.name}: {found}"
            if self.fusion == "rrf" and s.score is not None:
                line += f" -> 1/({self.k_rrf:g}+{s.rank}) = {s.contribution:.5f}"
            elif self.fusion == "blend" and s.score is not None:
                line += (f" -> {s.weight:g} x minmax in [{s.low:.4f}, {s.high:.4f}] = {s.contribution:.4f}")
            out.append(line)
            if s.terms:
                out.append("  terms: " + ", ".join(f"{t} {w:.3f}" for t, w in s.terms))
        fused = {"rrf": "rrf sum", "blend": "blend sum"}.get(self.fusion, f"{self.fusion} alone")
        out.append(f"first stage ({fused}): {self.first_stage:.5f}")
        for name, r, before in (("maxsim", self.maxsim, "first stage"),
                                ("reranker", self.rerank, "maxsim" if self.maxsim is not None else "first stage")):
            if r is None:
                continue
            if r.below is not None:
                out.append(f"below the {name} depth: lowest {name} score {r.floor:.4f} - 1 - {r.below}")
            elif r.blend is None:
                out.append(f"{name}: {r.score:.4f} (its score alone)")
            else:
                out.append(f"{name}: {r.score:.4f} -> {r.blend:g} x minmax({name} in [{r.rerank_range[0]:.4f}, "
                           f"{r.rerank_range[1]:.4f}]) + {1 - r.blend:g} x minmax({before} in "
                           f"[{r.first_range[0]:.5f}, {r.first_range[1]:.5f}])")
        if self.probability is not None:
            out.append(f"probability of relevance: {self.probability:.3f}")
        d = self.diversity
        if d is not None:
            like = f" (most like {d.most_like})" if d.most_like is not None else ""
            out.append(f"diversity {d.diversity:g}: {1 - d.diversity:g} x minmax(relevance {d.relevance:.4f} in "
                       f"[{d.low:.4f}, {d.high:.4f}]) - {d.diversity:g} x redundancy {d.redundancy:.3f}{like}")
        out.append(f"score: {self.recomposed():.6f}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with ``lines`` (the words) beside the numbers."""
        data = asdict(self)
        data["first_stage"] = self.first_stage
        data["lines"] = self.lines()
        return data
