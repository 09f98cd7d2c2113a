"""A distillation run's held-out numbers: the student's cross-entropy (``val_loss``, as
SFT's, which the best checkpoint and early stopping read) and beside it the KD term, the
recipe's own ``_kd_loss_fn`` between the student's and the frozen teacher's logits over
the same held-out rows, as the KD recipes' ``_loss_step`` computes both from one student
forward. Sharding, padding, the label shift and the kept training state are
``val_loop``'s; both means are over the labelled tokens of every rank.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from kubetune.trainer.validation import val_loop
from kubetune.workspace.held_out_keys import KD_LOSS



def holds_teacher(recipe: Any) -> bool:
    """Whether the recipe measures a KD term: it holds a teacher and a KD loss."""
    return getattr(recipe, "_teacher_model", None) is not None \
        and getattr(recipe, "_kd_loss_fn", None) is not None


def batch_losses(recipe: Any, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed token CE, summed token KD, labelled tokens) of one batch."""
    labels, tokens = val_loop.shifted_labels(recipe, batch)
    logits = recipe._model(**batch)
    teacher_logits = recipe._teacher_model(**batch)
    if not isinstance(logits, list):
        labels = labels.reshape(-1)
        logits = logits.reshape(-1, logits.size(-1))
        teacher_logits = teacher_logits.reshape(-1, teacher_logits.size(-1))
    ce = recipe._loss_fn(logits, labels)
    kd = recipe._kd_loss_fn(logits, teacher_logits, labels)
    return val_loop.token_sum(ce, tokens), val_loop.token_sum(kd, tokens), tokens


def measure(recipe: Any, dataset: Any, batch_size: int, collate: Callable[[list[dict]], dict],
            rank: int, world: int, progress: Any = None) -> dict[str, float | int]:
    """The student's held-out CE and KD term, over every rank's shard."""
    import torch.distributed as dist

    device = recipe._device
    ignore_index = recipe._loss_fn.ignore_index
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    with val_loop.training_state_kept(recipe._model, device):
        for batch in val_loop.batches(dataset, val_loop.shard(len(dataset), rank, world),
                                      batch_size, collate, ignore_index):
            ce, kd, tokens = batch_losses(recipe, batch)
            sums += torch.stack([ce, kd, tokens.double()])
            if progress is not None:
                progress.advance()
    if world > 1 and dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums)
    ce, kd, tokens = sums.tolist()
    return {"val_loss": ce / tokens if tokens else float("nan"), "val_tokens": int(tokens),
            KD_LOSS.key: kd / tokens if tokens else float("nan")}
