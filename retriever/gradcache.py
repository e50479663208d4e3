"""GradCache (Gao et al., 2021): contrastive loss over a large batch in the memory of a small one.

1. Embed every text of the batch in mini-batches with no autograd graph, keeping each mini-batch's RNG
   state so dropout can be replayed.
2. Compute the loss on those embeddings (as leaves) and its gradient with respect to each embedding.
3. When the trainer calls ``loss.backward()``, re-embed each mini-batch with a graph (same RNG, so the same
   dropout masks) and back-propagate the cached embedding gradients into the model.

The loss value and the parameter gradients equal those of the plain loss on the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from twostage.indexer.errors import ConfigError
from twostage.retriever.losses import MultipleNegativesRankingLoss


class _RandState:
    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


class CachedMultipleNegativesRankingLoss(torch.nn.Module):
    """:class:`~twostage.retriever.losses.MultipleNegativesRankingLoss` computed with GradCache.

    Input: the ``model`` (a BiEncoder) and texts: ``anchors`` (B queries), ``positives`` (B documents) and
    ``negatives`` (B lists of m documents each, m >= 0). Same formula as the plain loss; memory is that of
    ``mini_batch_size`` texts at a time, whatever B is.
    """

    def __init__(self, model: Any, mini_batch_size: int = 32, scale: float = 20.0, symmetric: bool = False) -> None:
        super().__init__()
        if mini_batch_size <= 0:
            raise ConfigError(f"mini_batch_size must be positive, got {mini_batch_size}")
        self.model = model
        self.mini_batch_size = mini_batch_size
        self.inner = MultipleNegativesRankingLoss(scale=scale, symmetric=symmetric)

    def _embed_without_graph(self, texts: Sequence[str], kind: str) -> tuple[torch.Tensor, list[tuple[list[str], _RandState]]]:
        reps, chunks = [], []
        with torch.no_grad():
            for start in range(0, len(texts), self.mini_batch_size):
                chunk = list(texts[start:start + self.mini_batch_size])
                state = _RandState()
                reps.append(self.model(self.model.tokenize(chunk, kind)))
                chunks.append((chunk, state))
        return torch.cat(reps), chunks

    def forward(self, anchors: Sequence[str], positives: Sequence[str],
                negatives: Sequence[Sequence[str]] | None = None) -> torch.Tensor:
        m = len(negatives[0]) if negatives else 0
        if negatives and any(len(n) != m for n in negatives):
            raise ConfigError("every example needs the same number of hard negatives")
        columns = [(list(anchors), "query"), (list(positives), "document")]
        columns += [([n[j] for n in negatives], "document") for j in range(m)] if negatives else []
        device = self.model.device.type
        autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        reps, plans = [], []
        for texts, kind in columns:
            r, chunks = self._embed_without_graph(texts, kind)
            reps.append(r.detach().requires_grad_())
            plans.append((kind, chunks))
        negs = torch.stack(reps[2:], dim=1) if m else None
        with torch.enable_grad():
            loss = self.inner(reps[0], reps[1], negs)
            loss.backward()
        grads = [r.grad for r in reps]
        out = loss.detach().requires_grad_()

        def replay(grad_output: torch.Tensor) -> None:
            with torch.enable_grad(), torch.autocast(device, enabled=autocast[0], dtype=autocast[1]):
                for (kind, chunks), grad in zip(plans, grads):
                    offset = 0
                    for chunk, state in chunks:
                        saved = _RandState()
                        state.restore()
                        emb = self.model(self.model.tokenize(chunk, kind))
                        saved.restore()
                        g = grad[offset:offset + len(chunk)] * grad_output
                        (emb.float() * g).sum().backward()
                        offset += len(chunk)

        out.register_hook(replay)
        return out
