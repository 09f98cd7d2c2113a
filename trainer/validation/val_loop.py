"""The held-out loss: the recipe's own loss and label shift over held-out rows, on every
rank together, with nothing of training's state moved.

Each rank takes a disjoint shard of the rows (rank r: rows r, r + world, ...); a rank
whose shard is one short gets a row whose labels are all masked, so every rank runs the
same number of batches and FSDP's collectives pair up. The loss is the sum of the token
losses over all ranks divided by the labelled tokens over all ranks (both all-reduced),
so it does not depend on how the rows are split. It runs under ``torch.no_grad`` with the
model in eval mode, and forks the RNGs (torch CPU and CUDA, ``random``, numpy) and each
module's train flag around it: a run trains bit-identically with and without it.

The label shift is the train step's (torchtune 0.6.1's recipes): labels move one to the
left and the recipe's ``ignore_labels_cache`` fills the last place; the model's output may
be chunked (``set_num_output_chunks``) and the loss (``CEWithChunkedOutputLoss``) takes it
as the recipe's train step passes it.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Callable, Iterator, Sequence

import torch


def shard(rows: int, rank: int, world: int) -> list[int | None]:
    """Row indices for ``rank``, then ``None`` (a label-less pad row) up to the count every
    rank gets."""
    mine: list[int | None] = list(range(rank, rows, world))
    per_rank = -(-rows // world)
    return mine + [None] * (per_rank - len(mine))


def _row(dataset: Any, index: int | None, ignore_index: int) -> dict:
    if index is not None:
        sample = dataset[index]
        return {"tokens": list(sample["tokens"]), "labels": list(sample["labels"])}
    pad = dataset[0]  # the first row's tokens, nothing to score: same shapes, no label
    return {"tokens": list(pad["tokens"]), "labels": [ignore_index] * len(pad["labels"])}


def batches(dataset: Any, indices: Sequence[int | None], batch_size: int,
            collate: Callable[[list[dict]], dict], ignore_index: int) -> Iterator[dict]:
    """The shard's rows in order, ``batch_size`` at a time, through the recipe's collate."""
    for start in range(0, len(indices), batch_size):
        yield collate([_row(dataset, i, ignore_index)
                       for i in indices[start:start + batch_size]])


@contextlib.contextmanager
def training_state_kept(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Eval mode and no gradients inside; every RNG and module flag as it was after."""
    import numpy as np

    modes = [(module, module.training) for module in model.modules()]
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cuda = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            model.eval()
            yield
    finally:
        for module, training in modes:
            module.training = training
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def shifted_labels(recipe: Any, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch moved to the recipe's device and its labels popped, shifted as the
    recipe's train step shifts them: (labels, labelled tokens)."""
    from torchtune import utils

    utils.batch_to_device(batch, recipe._device)
    labels = batch.pop("labels")
    labels = torch.hstack((labels[..., 1:], recipe.ignore_labels_cache[: labels.shape[0]]))
    return labels, (labels != recipe._loss_fn.ignore_index).sum()


def token_sum(mean: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """A batch's summed token loss from its mean; a batch with nothing to score (pad
    rows) adds 0, not the loss's 0/0."""
    zero = torch.zeros((), dtype=torch.float64, device=mean.device)
    return torch.where(tokens > 0, mean.double() * tokens, zero)


def batch_loss(recipe: Any, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, labelled tokens) of one batch, as the recipe's train step
    computes its loss."""
    labels, tokens = shifted_labels(recipe, batch)
    logits = recipe._model(**batch)
    if not isinstance(logits, list):  # a chunked output's loss takes the chunks as they are
        labels = labels.reshape(-1)
        logits = logits.reshape(-1, logits.size(-1))
    return token_sum(recipe._loss_fn(logits, labels), tokens), tokens


def batch_count(rows: int, batch_size: int, world: int) -> int:
    """Batches each rank runs for ``rows`` held-out rows."""
    return -(-len(shard(rows, 0, world)) // max(1, batch_size))


def held_out_loss(recipe: Any, dataset: Any, batch_size: int,
                  collate: Callable[[list[dict]], dict], rank: int, world: int,
                  progress: Any = None) -> tuple[float, int]:
    """The mean token loss over every rank's shard, and the tokens it is over;
    ``progress`` (a ``PhaseProgress``) is advanced a batch at a time."""
    import torch.distributed as dist

    device = recipe._device
    ignore_index = recipe._loss_fn.ignore_index
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    token_sum = torch.zeros((), dtype=torch.int64, device=device)
    with training_state_kept(recipe._model, device):
        for batch in batches(dataset, shard(len(dataset), rank, world), batch_size, collate,
                             ignore_index):
            total, tokens = batch_loss(recipe, batch)
            loss_sum += total
            token_sum += tokens
            if progress is not None:
                progress.advance()
    if world > 1 and dist.is_available() and dist.is_initialized():
        both = torch.stack([loss_sum, token_sum.double()])
        dist.all_reduce(both)
        loss_sum, token_sum = both[0], both[1].long()
    tokens = int(token_sum.item())
    return (float(loss_sum.item()) / tokens if tokens else float("nan")), tokens
