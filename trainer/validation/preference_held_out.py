"""Held-out preference pairs measured as torchtune's DPO recipes measure a training step:
the recipe's own ``concatenated_forward`` for the policy and the reference (the policy with
its adapters off: ``disable_adapter``, as the LoRA recipes do; the recipe's frozen
``_ref_model`` in full DPO) and the recipe's own ``_loss_fn`` (``DPOLoss``, or whichever
loss the config names), over held-out pairs instead of a training batch.

Each evaluation gives the mean DPO loss over the pairs (``val_loss``: the number the best
checkpoint and early stopping read), the reward accuracy (torchtune's strict
``chosen > rejected``), the mean margin and the mean chosen and rejected rewards. At the
base (step 0) the policy is its reference: every reward is 0, so the margin is 0, the
accuracy 0 and the loss ln 2, by construction; the change from there is the signal.

Pairs are sharded over the ranks as ``val_loop`` shards rows (every rank runs the same
batches: FSDP's collectives pair up), a rank one short padded with its first pair weighted
0; the sums are all-reduced, so the numbers do not depend on how pairs are split. Training
state is kept as ``val_loop.training_state_kept`` keeps it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterator, Sequence

import torch

from kubetune.trainer.validation import val_loop
from kubetune.workspace.held_out_keys import (CHOSEN_REWARD, PAIRS, REJECTED_REWARD,
                                              REWARD_ACCURACY, REWARD_MARGIN)


def collate(recipe: Any) -> Callable[[list[dict]], Any]:
    """torchtune's DPO collate, as the recipes build their loader with it."""
    from torchtune.data import CROSS_ENTROPY_IGNORE_IDX, padded_collate_dpo

    return functools.partial(padded_collate_dpo, padding_idx=recipe._tokenizer.pad_id,
                             ignore_idx=CROSS_ENTROPY_IGNORE_IDX)


def batches(dataset: Any, indices: Sequence[int | None], batch_size: int,
            collate_fn: Callable[[list[dict]], Any]) -> Iterator[tuple[Any, torch.Tensor]]:
    """(collated pairs, weight per pair: 0 for a pad) ``batch_size`` at a time."""
    for start in range(0, len(indices), batch_size):
        part = indices[start:start + batch_size]
        rows = [dataset[0 if i is None else i] for i in part]
        weights = torch.tensor([0.0 if i is None else 1.0 for i in part], dtype=torch.float64)
        yield collate_fn(rows), weights


def _forward(recipe: Any, model: Any, batch: Any, reference: bool) -> tuple[Any, Any]:
    """(chosen, rejected) summed log-probs through the recipe's own forward."""
    forward = recipe.concatenated_forward
    if reference and "activations_handling" in inspect.signature(forward).parameters:
        out = forward(model, batch, activations_handling=False)  # full DPO's reference
    else:
        out = forward(model, batch)
    return out[0], out[1]


def _reference(recipe: Any, batch: Any) -> tuple[Any, Any]:
    ref_model = getattr(recipe, "_ref_model", None)
    if ref_model is not None:  # full DPO: a frozen copy
        return _forward(recipe, ref_model, batch, reference=True)
    from torchtune.modules.peft import disable_adapter

    with disable_adapter(recipe._model):  # LoRA DPO: the base, adapters off
        return _forward(recipe, recipe._model, batch, reference=True)


def pair_sums(recipe: Any, batch: Any, weights: torch.Tensor) -> torch.Tensor:
    """[loss, correct, margin, chosen, rejected, pairs] summed over the batch's real
    pairs (float64)."""
    policy_chosen, policy_rejected = _forward(recipe, recipe._model, batch, reference=False)
    ref_chosen, ref_rejected = _reference(recipe, batch)
    losses, chosen, rejected = recipe._loss_fn(policy_chosen, policy_rejected, ref_chosen,
                                               ref_rejected)
    w = weights.to(losses.device)
    columns = [losses, (chosen > rejected).double(), chosen - rejected, chosen, rejected,
               torch.ones_like(losses)]
    return torch.stack([(c.double() * w).sum() for c in columns])


def labelled_tokens(batch: Any, weights: torch.Tensor) -> int:
    """Labelled tokens of the batch's real pairs (chosen and rejected answers)."""
    from torchtune.data import CROSS_ENTROPY_IGNORE_IDX

    labels = batch[1]
    half = labels.shape[0] // 2
    per_row = (labels != CROSS_ENTROPY_IGNORE_IDX).sum(-1).double().cpu()
    both = per_row[:half] + per_row[half:]
    return int((both * weights).sum().item())


def measure(recipe: Any, dataset: Any, batch_size: int, rank: int, world: int,
            progress: Any = None) -> dict[str, float | int]:
    """The held-out pairs' numbers, over every rank's shard."""
    import torch.distributed as dist

    device = recipe._device
    sums = torch.zeros(6, dtype=torch.float64, device=device)
    tokens = 0
    collate_fn = collate(recipe)
    with val_loop.training_state_kept(recipe._model, device):
        for batch, weights in batches(dataset, val_loop.shard(len(dataset), rank, world),
                                      batch_size, collate_fn):
            sums += pair_sums(recipe, batch, weights)
            tokens += labelled_tokens(batch, weights)
            if progress is not None:
                progress.advance()
    both = torch.cat([sums, torch.tensor([float(tokens)], dtype=torch.float64,
                                         device=device)])
    if world > 1 and dist.is_available() and dist.is_initialized():
        dist.all_reduce(both)
    loss, correct, margin, chosen, rejected, pairs, tokens_all = both.tolist()
    mean = (lambda total: total / pairs) if pairs else (lambda total: float("nan"))
    return {"val_loss": mean(loss), "val_tokens": int(tokens_all),
            REWARD_ACCURACY.key: mean(correct),
            REWARD_MARGIN.key: mean(margin), CHOSEN_REWARD.key: mean(chosen),
            REJECTED_REWARD.key: mean(rejected),
            PAIRS: int(pairs)}


class ChosenSide:
    """Pairs read as rows of their chosen side (``tokens``, ``labels``): the held-out
    answers' prompts and references (the chosen answer is the reference)."""

    def __init__(self, pairs: Any) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        pair = self.pairs[index]
        return {"tokens": list(pair["chosen_input_ids"]), "labels": list(pair["chosen_labels"])}
