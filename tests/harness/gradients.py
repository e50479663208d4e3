"""GradCache's check, shared by the bi-encoder's and the late-interaction model's tests: the cached loss gives the
plain loss's value and parameter gradients."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def assert_same_step(run: Callable[[bool], tuple[torch.nn.Module, torch.Tensor]]) -> None:
    """``run(cached)`` builds a model and its loss (plain or through GradCache); both backward passes must agree."""

    def step(cached: bool) -> tuple[float, dict[str, torch.Tensor]]:
        model, loss = run(cached)
        loss.backward()
        return loss.item(), {k: v.grad.clone() for k, v in model.named_parameters() if v.grad is not None}

    plain_loss, plain = step(False)
    cached_loss, cached = step(True)
    assert cached_loss == pytest.approx(plain_loss, abs=1e-5)
    assert plain.keys() == cached.keys() and len(plain) > 10
    for k in plain:
        torch.testing.assert_close(cached[k], plain[k], atol=1e-5, rtol=1e-4)
