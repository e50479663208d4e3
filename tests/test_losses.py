"""Each loss against its formula evaluated by hand on tiny vectors."""

import math

import pytest
import torch

from twostage.indexer.errors import ConfigError
from twostage.retriever.losses import (
    ContrastiveLoss,
    CosineSimilarityLoss,
    MarginMSELoss,
    MultipleNegativesRankingLoss,
    SoftmaxLoss,
    TripletLoss,
)

R = 1 / math.sqrt(2)
A = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
P = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # cos(a1,p1)=1, cos(a1,p2)=R, cos(a2,p1)=0, cos(a2,p2)=R


def ce(scores, target):
    return -scores[target] + math.log(sum(math.exp(s) for s in scores))


def test_mnrl_in_batch():
    got = MultipleNegativesRankingLoss(scale=1.0)(A, P)
    expected = (ce([1, R], 0) + ce([0, R], 1)) / 2
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_mnrl_scale_and_hard_negatives():
    n = torch.tensor([[[0.0, 1.0]], [[-1.0, 0.0]]])  # one hard negative each: cos(a1,n1)=0, cos(a1,n2)=-1, cos(a2,n1)=1, cos(a2,n2)=0
    got = MultipleNegativesRankingLoss(scale=2.0)(A, P, n)
    expected = (ce([2, 2 * R, 0, -2], 0) + ce([0, 2 * R, 2, 0], 1)) / 2
    assert got.item() == pytest.approx(expected, abs=1e-6)


def test_mnrl_symmetric():
    got = MultipleNegativesRankingLoss(scale=1.0, symmetric=True)(A, P)
    forward = (ce([1, R], 0) + ce([0, R], 1)) / 2
    backward = (ce([1, 0], 0) + ce([R, R], 1)) / 2  # p1 vs (a1, a2); p2 vs (a1, a2)
    assert got.item() == pytest.approx((forward + backward) / 2, abs=1e-6)


def test_triplet_euclidean_and_cosine():
    a, p, n = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[3.0, 0.0]])
    assert TripletLoss(margin=5.0)(a, p, n).item() == pytest.approx(1 - 3 + 5)
    assert TripletLoss(margin=1.0)(a, p, torch.tensor([[9.0, 0.0]])).item() == 0.0
    a, p, n = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 1.0]])
    assert TripletLoss(margin=1.0, distance="cosine")(a, p, n).item() == pytest.approx((1 - R) - 1 + 1.0, abs=1e-6)


def test_contrastive():
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    v = torch.tensor([[1.0, 1.0], [1.0, 1.0]])  # d = 1 - R for both
    d = 1 - R
    got = ContrastiveLoss(margin=0.5)(u, v, torch.tensor([1, 0]))
    assert got.item() == pytest.approx((d**2 + max(0.5 - d, 0) ** 2) / 2, abs=1e-6)
    far = ContrastiveLoss(margin=0.1)(u, v, torch.tensor([0, 0]))
    assert far.item() == 0.0  # dissimilar pairs already past the margin


def test_softmax_loss_on_u_v_abs_diff():
    loss = SoftmaxLoss(dim=2, num_labels=3)
    with torch.no_grad():
        loss.classifier.weight.zero_()
        loss.classifier.bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
        loss.classifier.weight[0, 4] = 1.0  # logit 0 reads |u - v| first coordinate
    u, v = torch.tensor([[3.0, 0.0]]), torch.tensor([[1.0, 0.0]])  # |u - v| = (2, 0): logits (2, 1, 2)
    assert loss(u, v, torch.tensor([1])).item() == pytest.approx(ce([2, 1, 2], 1), abs=1e-6)


def test_cosine_similarity_loss():
    u, v = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    got = CosineSimilarityLoss()(u, v, torch.tensor([0.5, 1.0]))
    assert got.item() == pytest.approx(((0 - 0.5) ** 2 + (R - 1) ** 2) / 2, abs=1e-6)


def test_losses_backpropagate():
    a = torch.randn(4, 8, requires_grad=True)
    MultipleNegativesRankingLoss()(a, torch.randn(4, 8), torch.randn(4, 2, 8)).backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()


def test_margin_mse_matches_its_formula():
    n = torch.tensor([[[0.0, 1.0], [-1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])  # two negatives per anchor
    margins = torch.tensor([[1.0, 3.0], [0.5, -0.5]])
    # cos(a1,p1)=1, cos(a1,n)=0,-1 ; cos(a2,p2)=R, cos(a2,n)=0,1
    student = [[2 * (1 - 0), 2 * (1 + 1)], [2 * (R - 0), 2 * (R - 1)]]
    expected = sum((s - m) ** 2 for row_s, row_m in zip(student, margins.tolist()) for s, m in zip(row_s, row_m)) / 4
    got = MarginMSELoss(scale=2.0)(A, P, n, margins)
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # zero when the student's margins are the teacher's
    assert MarginMSELoss(scale=2.0)(A, P, n, torch.tensor(student)).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ConfigError, match="margins"):
        MarginMSELoss()(A, P, n, margins[:, :1])
