"""Training objectives of the bi-encoder. Each takes embeddings (not texts) and returns a scalar loss.

Notation: ``a``, ``p``, ``n`` are anchor, positive and negative embeddings, one row per example;
``cos(x, y) = x.y / (|x| |y|)``. Every loss is averaged over the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twostage.indexer.errors import ConfigError


def _check_distance(distance: str) -> str:
    if distance not in ("euclidean", "cosine"):
        raise ConfigError(f"distance must be 'euclidean' or 'cosine', got {distance!r}")
    return distance


def cosine_matrix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(n, d), (m, d) -> (n, m) cosine similarities."""
    return F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).T


class MultipleNegativesRankingLoss(torch.nn.Module):
    """In-batch negatives with optional hard negatives (InfoNCE), as in Sentence-BERT and "1B pairs".

    Input: ``anchors`` (B, d), ``positives`` (B, d), optional ``negatives`` (B, m, d): m hard negatives per
    anchor (any m >= 0). The candidates of every anchor are all B positives and all B*m negatives of the
    batch; the right one is its own positive:

        s_ij = scale * cos(a_i, c_j)                   c = [p_1 .. p_B, n_1,1 .. n_B,m]
        L_a  = -1/B sum_i log( exp(s_ii) / sum_j exp(s_ij) )

    With ``symmetric``, each positive must also find its anchor among all anchors, and the loss is
    (L_a + L_p) / 2 with L_p = -1/B sum_i log( exp(scale cos(p_i, a_i)) / sum_j exp(scale cos(p_i, a_j)) ).
    ``scale`` is the inverse temperature (20 = temperature 0.05).
    """

    def __init__(self, scale: float = 20.0, symmetric: bool = False) -> None:
        super().__init__()
        self.scale = scale
        self.symmetric = symmetric

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None = None) -> torch.Tensor:
        if anchors.shape != positives.shape:
            raise ConfigError(f"anchors {tuple(anchors.shape)} and positives {tuple(positives.shape)} differ in shape")
        candidates = positives
        if negatives is not None and negatives.numel():
            candidates = torch.cat([positives, negatives.reshape(-1, anchors.shape[-1])], dim=0)
        scores = self.scale * cosine_matrix(anchors, candidates)
        target = torch.arange(len(anchors), device=anchors.device)
        loss = F.cross_entropy(scores, target)
        if self.symmetric:
            loss = (loss + F.cross_entropy(scores[:, : len(anchors)].T, target)) / 2
        return loss


class TripletLoss(torch.nn.Module):
    """Triplet margin loss.

    Input: ``anchors``, ``positives``, ``negatives``, each (B, d).

        L = mean_i max(d(a_i, p_i) - d(a_i, n_i) + margin, 0)

    with ``d`` the Euclidean distance (default, margin 5 as in Sentence-BERT) or the cosine distance
    ``1 - cos``.
    """

    def __init__(self, margin: float = 5.0, distance: str = "euclidean") -> None:
        super().__init__()
        self.margin = margin
        self.distance = _check_distance(distance)

    def _d(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.distance == "euclidean":
            return (x - y).norm(dim=-1)
        return 1 - F.cosine_similarity(x, y, dim=-1)

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        return F.relu(self._d(anchors, positives) - self._d(anchors, negatives) + self.margin).mean()


class ContrastiveLoss(torch.nn.Module):
    """Margin contrastive loss on labelled pairs (Hadsell et al. 2006).

    Input: ``u``, ``v`` (B, d) and ``labels`` (B,) with 1 for a similar pair and 0 for a dissimilar one.

        L = mean_i [ y_i d_i^2 + (1 - y_i) max(margin - d_i, 0)^2 ],    d_i = 1 - cos(u_i, v_i)

    (or ``d_i = |u_i - v_i|`` with ``distance="euclidean"``). Similar pairs are pulled together;
    dissimilar pairs are pushed apart until they are ``margin`` away.
    """

    def __init__(self, margin: float = 0.5, distance: str = "cosine") -> None:
        super().__init__()
        self.margin = margin
        self.distance = _check_distance(distance)

    def forward(self, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        d = (u - v).norm(dim=-1) if self.distance == "euclidean" else 1 - F.cosine_similarity(u, v, dim=-1)
        y = labels.to(d.dtype)
        return (y * d.pow(2) + (1 - y) * F.relu(self.margin - d).pow(2)).mean()


class SoftmaxLoss(torch.nn.Module):
    """Sentence-BERT's classification objective (NLI): a linear classifier on (u, v, |u - v|).

    Input: ``u``, ``v`` (B, d) and integer ``labels`` (B,) in [0, num_labels).

        logits = W [u; v; |u - v|] + b,  W in R^{num_labels x 3d}
        L      = cross_entropy(logits, labels)

    The classifier's weights are trained with the encoder and discarded afterwards.
    """

    def __init__(self, dim: int, num_labels: int) -> None:
        super().__init__()
        if num_labels < 2:
            raise ConfigError(f"SoftmaxLoss needs at least 2 labels, got {num_labels}")
        self.classifier = torch.nn.Linear(3 * dim, num_labels)

    def forward(self, u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(torch.cat([u, v, (u - v).abs()], dim=-1))
        return F.cross_entropy(logits, labels.long())


class CosineSimilarityLoss(torch.nn.Module):
    """Regression of the cosine similarity on a gold score (STS).

    Input: ``u``, ``v`` (B, d) and ``scores`` (B,) already scaled to [-1, 1] or [0, 1] (e.g. STS 0-5 / 5).

        L = mean_i (cos(u_i, v_i) - score_i)^2
    """

    def forward(self, u: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(F.cosine_similarity(u, v, dim=-1), scores.to(u.dtype))


class MarginMSELoss(torch.nn.Module):
    """Distillation of a teacher's score margins (Hofstätter et al. 2020, "Margin-MSE").

    Input: ``anchors`` (B, d), ``positives`` (B, d), ``negatives`` (B, m, d) and ``margins`` (B, m): the
    teacher's (e.g. the cross-encoder's) score of (anchor, positive) minus its score of (anchor, negative j).
    The student's score is ``scale * cos`` (the same units as MultipleNegativesRankingLoss's logits):

        L = mean_ij ( scale * (cos(a_i, p_i) - cos(a_i, n_ij)) - margin_ij )^2

    Only differences are matched, so the teacher's scores need no calibration to the student's.
    """

    def __init__(self, scale: float = 20.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor,
                margins: torch.Tensor) -> torch.Tensor:
        if negatives.dim() != 3 or margins.shape != negatives.shape[:2]:
            raise ConfigError(f"negatives {tuple(negatives.shape)} must be (B, m, d) and margins {tuple(margins.shape)} (B, m)")
        a = F.normalize(anchors, dim=-1)
        pos = (a * F.normalize(positives, dim=-1)).sum(-1, keepdim=True)  # (B, 1)
        neg = torch.einsum("bd,bmd->bm", a, F.normalize(negatives, dim=-1))
        return F.mse_loss(self.scale * (pos - neg), margins.to(pos.dtype))


class MaxSimLoss(torch.nn.Module):
    """In-batch negatives over late-interaction scores (ColBERT's training objective, as PyLate's ``Contrastive``).

    Input: ``queries`` (B, Lq, d) and ``documents`` (N, Ld, d) token vectors, L2-normalised, with boolean masks
    ``query_mask`` (B, Lq) and ``document_mask`` (N, Ld) of the tokens that count; the documents are the B
    positives first (document i is query i's), then any hard negatives. A query's score for a document is MaxSim,
    what the engine ranks by:

        s_ij = sum over kept query tokens t of  max over kept document tokens u of  q_it . d_ju
        L    = -1/B sum_i log( exp(s_ii / T) / sum_j exp(s_ij / T) )

    ``temperature`` T divides the scores (1: PyLate's default; a score is a sum over up to Lq tokens).
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if not temperature > 0:
            raise ConfigError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature

    def forward(self, queries: torch.Tensor, query_mask: torch.Tensor, documents: torch.Tensor,
                document_mask: torch.Tensor) -> torch.Tensor:
        if len(documents) < len(queries):
            raise ConfigError(f"{len(queries)} queries need at least their {len(queries)} positives, got "
                              f"{len(documents)} documents")
        scores = maxsim_matrix(queries, query_mask, documents, document_mask)
        target = torch.arange(len(queries), device=queries.device)
        return F.cross_entropy(scores / self.temperature, target)


class MaxSimMarginMSELoss(torch.nn.Module):
    """Distillation of a teacher's score margins into MaxSim scores (Margin-MSE over late interaction, as ColBERTv2
    and PyLate distil a cross-encoder), plus in-batch MaxSim contrast (:class:`MaxSimLoss`) weighted by ``rank_weight``.

    Input: ``queries`` (B, Lq, d) and ``documents`` (B + B*m, Ld, d) token vectors, L2-normalised, with boolean masks,
    the documents laid out as :class:`MaxSimLoss` reads them (the B positives, then query 0's m negatives, query 1's...),
    and ``margins`` (B, m): the teacher's score of (query i, positive) minus its score of (query i, negative j).
    With s the MaxSim score (:func:`maxsim_matrix`):

        L = mean_ij ( s(q_i, p_i) - s(q_i, n_ij) - margin_ij )^2  +  rank_weight * MaxSimLoss

    Only differences are matched, so the teacher's scores need no calibration to MaxSim's (a cross-encoder's logits
    and a MaxSim sum over 32 query tokens both move by a few units between a relevant and an unrelated document).
    """

    def __init__(self, rank_weight: float = 1.0, temperature: float = 1.0) -> None:
        super().__init__()
        if rank_weight < 0:
            raise ConfigError(f"rank_weight must be >= 0, got {rank_weight}")
        if not temperature > 0:
            raise ConfigError(f"temperature must be positive, got {temperature}")
        self.rank_weight, self.temperature = rank_weight, temperature

    def forward(self, queries: torch.Tensor, query_mask: torch.Tensor, documents: torch.Tensor,
                document_mask: torch.Tensor, margins: torch.Tensor) -> torch.Tensor:
        b, m = margins.shape if margins.dim() == 2 else (-1, -1)
        if b != len(queries) or m < 1 or len(documents) != b * (1 + m):
            raise ConfigError(f"margins {tuple(margins.shape)} must be (B, m) with m >= 1 for {len(queries)} queries and "
                              f"{len(documents)} documents (B positives, then m negatives a query)")
        scores = maxsim_matrix(queries, query_mask, documents, document_mask)  # (B, B + B*m)
        rows = torch.arange(b, device=scores.device)
        positive = scores[rows, rows]  # (B,)
        negative = scores[rows[:, None], b + rows[:, None] * m + torch.arange(m, device=scores.device)]  # (B, m)
        distill = F.mse_loss(positive[:, None] - negative, margins.to(scores.dtype))
        if not self.rank_weight:
            return distill
        return distill + self.rank_weight * F.cross_entropy(scores / self.temperature, rows)


def maxsim_matrix(queries: torch.Tensor, query_mask: torch.Tensor, documents: torch.Tensor,
                  document_mask: torch.Tensor) -> torch.Tensor:
    """(B, Lq, d), (B, Lq), (N, Ld, d), (N, Ld) -> (B, N) MaxSim scores (masked tokens take no part)."""
    sims = torch.einsum("bqd,nkd->bnqk", queries, documents)
    sims = sims.masked_fill(~document_mask.bool()[None, :, None, :], float("-inf"))
    best = sims.max(dim=-1).values  # (B, N, Lq)
    best = torch.where(query_mask.bool()[:, None, :], best, torch.zeros((), dtype=best.dtype, device=best.device))
    return best.sum(dim=-1)
