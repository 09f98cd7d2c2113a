"""A micro-batch with no token to train on adds nothing to its step, instead of NaN.

torchtune's recipes weigh each micro-batch's mean loss by its token count, sum them, and
divide the gradients by the step's count (``training.scale_grads(model, 1 / num_tokens)``).
A micro-batch whose labels are all masked (every answer cut away by ``max_seq_len``) makes
the loss module divide 0 by 0: NaN, times a count of 0 is still NaN, and its gradients are
NaN too, which the optimizer writes into every weight. A step of only such micro-batches
divides by 0 again.

- The recipe's loss module is wrapped after setup: with nothing to train on it returns a
  zero that keeps the graph (zero gradients); otherwise its own result, unchanged.
- ``scale_grads`` with a non-finite scale (a step with no token: 1 / 0) scales by 0.

The token cache drops rows with nothing to train on before training; this covers datasets
it leaves as built (iterable or custom rows), whose empty rows reach the loss.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch


class EmptyBatchSafeLoss(torch.nn.Module):
    """The recipe's loss module, answering for its attributes (``ignore_index``,
    ``num_output_chunks``) as itself."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "inner":
                raise
            return getattr(self.inner, name)

    def forward(self, logits: Any, labels: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        empty = (labels == self.inner.ignore_index).all()
        # With nothing to train on, one label becomes class 0, so the inner loss divides by
        # 1 instead of 0, and its (finite) result is multiplied by 0: no NaN in the value or
        # the gradients, and no host sync to decide (a GPU keeps its queue).
        flat = labels.reshape(-1)
        first = torch.where(empty, torch.zeros_like(flat[:1]), flat[:1])
        labels = torch.cat([first, flat[1:]]).view_as(labels)
        return self.inner(logits, labels, *args, **kwargs) * ~empty


def _safe_scale_grads(original):
    @functools.wraps(original)
    def scale_grads(model, scaler):
        if isinstance(scaler, torch.Tensor):
            scaler = torch.where(torch.isfinite(scaler), scaler, torch.zeros_like(scaler))
        elif not math.isfinite(scaler):
            scaler = 0.0
        return original(model, scaler)

    scale_grads.kubetune_safe = True
    return scale_grads


def _cross_entropy(loss: Any) -> bool:
    """A loss called as ``loss(logits, labels)`` with an ``ignore_index`` (the SFT recipes'),
    not one of another shape (distillation's takes the teacher's logits too)."""
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    inner = getattr(loss, "_orig_mod", loss)  # torch.compile's wrapper of a whole loss
    return isinstance(inner, (CEWithChunkedOutputLoss, torch.nn.CrossEntropyLoss)) \
        and not isinstance(loss, EmptyBatchSafeLoss)


def install(cls: type) -> None:
    """Guard the loss of every recipe of ``cls`` after its setup, and torchtune's
    ``scale_grads`` (the recipes call it through the module)."""
    from torchtune import training

    if not getattr(training.scale_grads, "kubetune_safe", False):
        training.scale_grads = _safe_scale_grads(training.scale_grads)
    original_setup = cls.setup

    @functools.wraps(original_setup)
    def setup(self, *args, **kwargs):
        result = original_setup(self, *args, **kwargs)
        if _cross_entropy(getattr(self, "_loss_fn", None)):
            self._loss_fn = EmptyBatchSafeLoss(self._loss_fn)
        return result

    cls.setup = setup
