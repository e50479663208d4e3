"""GradCache (Gao et al., 2021): contrastive loss over a large batch in the memory of a small one.

1. Embed every text of the batch in mini-batches with no autograd graph, keeping each mini-batch's RNG
   state so dropout can be replayed.
2. Compute the loss on those embeddings (as leaves) and its gradient with respect to each embedding.
3. When the trainer calls ``loss.backward()``, re-embed each mini-batch with a graph (same RNG, so the same
   dropout masks) and back-propagate the cached embedding gradients into the model.

The loss value and the parameter gradients equal those of the plain loss on the whole batch. Two losses use it:
a bi-encoder's in-batch negatives (:class:`CachedMultipleNegativesRankingLoss`) and a late-interaction model's
(:class:`CachedMaxSimLoss`, whose mini-batches give token vectors of their own lengths, padded and masked).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from twostage.indexer.errors import ConfigError
from twostage.retriever.losses import MaxSimLoss, MaxSimMarginMSELoss, MultipleNegativesRankingLoss

# (texts, kind) -> (the differentiable output: (n, d) or (n, L, d); the mask of the tokens that count (n, L) or None)
Embed = Callable[[list[str], str], tuple[torch.Tensor, "torch.Tensor | None"]]


class _RandState:
    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def _pad_cat(parts: Sequence[torch.Tensor], fill: Any) -> torch.Tensor:
    """Mini-batches' rows joined, their token dimension (dim 1) padded to the longest with ``fill``."""
    longest = max(p.shape[1] for p in parts)
    padded = []
    for p in parts:
        shape = list(p.shape)
        shape[1] = longest - p.shape[1]
        padded.append(torch.cat([p, torch.full(shape, fill, dtype=p.dtype, device=p.device)], dim=1))
    return torch.cat(padded)


class _Column:
    """One column of a batch (the queries, the positives...) embedded in mini-batches without a graph."""

    def __init__(self, embed: Embed, texts: Sequence[str], kind: str, size: int) -> None:
        self.embed, self.kind, self.chunks = embed, kind, []
        outs, masks = [], []
        with torch.no_grad():
            for start in range(0, len(texts), size):
                chunk = list(texts[start:start + size])
                state = _RandState()
                out, mask = embed(chunk, kind)
                outs.append(out)
                masks.append(mask)
                self.chunks.append((chunk, state, tuple(out.shape)))
        tokens = [m for m in masks if m is not None]  # token vectors: padded to one length, the padding masked out
        self.leaf = (_pad_cat(outs, 0.0) if tokens else torch.cat(outs)).detach().requires_grad_()
        self.mask = _pad_cat(tokens, False) if tokens else None

    def replay(self, grad_output: torch.Tensor) -> None:
        """Re-embed each mini-batch with a graph and back-propagate its part of the cached gradient."""
        grad, offset = self.leaf.grad, 0
        if grad is None:  # the loss did not read this column
            return
        for chunk, state, shape in self.chunks:
            saved = _RandState()
            state.restore()
            out, _ = self.embed(chunk, self.kind)
            saved.restore()
            part = grad[(slice(offset, offset + shape[0]),) + tuple(slice(0, s) for s in shape[1:])]
            (out.float() * part * grad_output).sum().backward()
            offset += shape[0]


def _cached(columns: Sequence[_Column], loss_of: Callable[[], torch.Tensor], device: str) -> torch.Tensor:
    """The loss over the columns' cached embeddings, whose backward pass replays the columns into the model under
    the autocast of this forward pass."""
    autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
    with torch.enable_grad():
        loss = loss_of()
        loss.backward()
    out = loss.detach().requires_grad_()

    def replay(grad_output: torch.Tensor) -> None:
        with torch.enable_grad(), torch.autocast(device, enabled=autocast[0], dtype=autocast[1]):
            for column in columns:
                column.replay(grad_output)

    out.register_hook(replay)
    return out


def _check_size(mini_batch_size: int) -> int:
    if mini_batch_size <= 0:
        raise ConfigError(f"mini_batch_size must be positive, got {mini_batch_size}")
    return mini_batch_size


class CachedMultipleNegativesRankingLoss(torch.nn.Module):
    """:class:`~twostage.retriever.losses.MultipleNegativesRankingLoss` computed with GradCache.

    Input: the ``model`` (a BiEncoder) and texts: ``anchors`` (B queries), ``positives`` (B documents) and
    ``negatives`` (B lists of m documents each, m >= 0). Same formula as the plain loss; memory is that of
    ``mini_batch_size`` texts at a time, whatever B is.
    """

    def __init__(self, model: Any, mini_batch_size: int = 32, scale: float = 20.0, symmetric: bool = False) -> None:
        super().__init__()
        self.model = model
        self.mini_batch_size = _check_size(mini_batch_size)
        self.inner = MultipleNegativesRankingLoss(scale=scale, symmetric=symmetric)

    def _embed(self, texts: list[str], kind: str) -> tuple[torch.Tensor, None]:
        return self.model(self.model.tokenize(texts, kind)), None

    def forward(self, anchors: Sequence[str], positives: Sequence[str],
                negatives: Sequence[Sequence[str]] | None = None) -> torch.Tensor:
        m = len(negatives[0]) if negatives else 0
        if negatives and any(len(n) != m for n in negatives):
            raise ConfigError("every example needs the same number of hard negatives")
        texts = [(list(anchors), "query"), (list(positives), "document")]
        texts += [([n[j] for n in negatives], "document") for j in range(m)] if negatives else []
        columns = [_Column(self._embed, t, kind, self.mini_batch_size) for t, kind in texts]

        def loss_of() -> torch.Tensor:
            negs = torch.stack([c.leaf for c in columns[2:]], dim=1) if m else None
            return self.inner(columns[0].leaf, columns[1].leaf, negs)

        return _cached(columns, loss_of, self.model.device.type)


class CachedMaxSimLoss(torch.nn.Module):
    """A late-interaction loss (:class:`~twostage.retriever.losses.MaxSimLoss`, or
    :class:`~twostage.retriever.losses.MaxSimMarginMSELoss` when distilling) computed with GradCache.

    Input: the ``model`` (a LateEncoder), ``queries`` (B texts) and ``documents`` (the B positives, then the
    hard negatives, as the plain loss reads them), plus the plain loss's extra inputs (a distilled set's margins).
    Same formula and gradients as the plain loss; the encoder's memory is that of ``mini_batch_size`` texts at a
    time. The scores themselves are still computed over the whole batch at once, (B, N, Lq, Ld) similarities.
    """

    def __init__(self, model: Any, inner: MaxSimLoss | MaxSimMarginMSELoss, mini_batch_size: int = 32) -> None:
        super().__init__()
        self.model, self.inner = model, inner
        self.mini_batch_size = _check_size(mini_batch_size)

    def forward(self, queries: Sequence[str], documents: Sequence[str], *extra: torch.Tensor) -> torch.Tensor:
        q, d = (_Column(self.model.train_tokens, list(texts), kind, self.mini_batch_size)
                for texts, kind in ((queries, "query"), (documents, "document")))
        return _cached((q, d), lambda: self.inner(q.leaf, q.mask, d.leaf, d.mask, *extra), self.model.device.type)
