"""A run that trains nothing, or trains garbage, is stopped inside the recipe process.

- No optimizer step (one row with a larger batch, accumulation over more batches than the
  data has, every sample dropped): the recipe would save the untouched base model at the
  epoch's end and the run would end "completed". The save is refused instead.
- No row to train on: every row's answer was cut away by the tokenizer's ``max_seq_len``
  (the token cache drops such rows and counts them): refused before the first step.
- A non-finite loss (``optimizer.lr=inf``, a learning rate so high it diverges): the weights
  are garbage from that step on. ``step_guard`` checks the logged loss at every step
  boundary, and every save checks the trained weights first, so non-finite weights are
  never saved (as a checkpoint, a resumable one, or the result): the last finite
  checkpoint stays the one a restart resumes from. At the process's first step, before
  any update, a non-finite loss is not divergence but the model or the data, and the line
  says so; a step with nothing to train on logs 0/0 but changes no weight: a warning.

Either ends the process with one line, ``<ErrorName>: <what to do>`` and exit 65 (bad
input: a restart would do the same), which the launcher reports as the step's error line.
"""

from __future__ import annotations

import math
from typing import Any

from kubetune.trainer.data.step_count import no_step_line

EXIT_BAD_INPUT = 65


class RunRefused(RuntimeError):
    """The run cannot give a useful result for a reason the user must fix."""


class NoStepError(RunRefused):
    pass


class NonFiniteError(RunRefused):
    pass


class NoTrainableRowsError(RunRefused):
    pass


def current_lr(recipe: Any) -> float | None:
    """The learning rate the recipe's optimizer holds now; None where it has none to read
    (an optimizer-in-backward wrapper)."""
    optimizer = getattr(recipe, "_optimizer", None)
    try:
        return float(optimizer.param_groups[0]["lr"])
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


def learning_rate(recipe: Any) -> str:
    lr = current_lr(recipe)
    return "?" if lr is None else f"{lr:g}"


def _diverged(what: str, recipe: Any) -> str:
    return (f"{what}: training diverged (optimizer.lr={learning_rate(recipe)}); lower "
            "optimizer.lr (or set clip_grad_norm) and run again; nothing after the last "
            "finite checkpoint was saved")


def _before_update(loss: Any, step: int) -> str:
    return (f"the loss is {loss} at step {step}, before any optimizer update, so not the "
            "learning rate: the model's weights or the data make it non-finite; check the "
            "checkpoint for NaN/inf weights, and try dtype=fp32")


def check_loss(recipe: Any, step: int, loss: Any, first_step: int = 0,
               tokens: int | None = None) -> str | None:
    """Stop at the first logged loss that is not a finite number. ``first_step``: the
    global step this process started from (its first step's loss is the loaded weights');
    ``tokens``: the step's trainable tokens, all ranks. A step with none logs 0/0 but
    changes nothing (its gradients are zero): returns a warning line instead."""
    try:
        finite = math.isfinite(float(loss))
    except (TypeError, ValueError):
        return None
    if finite:
        return None
    if tokens == 0:
        return (f"step {step} had no token to train on (every label of its batches is "
                "masked): it trained nothing")
    if step <= first_step + 1:
        raise NonFiniteError(_before_update(loss, step))
    raise NonFiniteError(_diverged(f"the loss is {loss} at step {step}", recipe))


def _local(tensor: Any) -> Any:
    return getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard on this process


def _full(tensor: Any) -> Any:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _finite_weights(model: Any) -> bool:
    """Whether every trained parameter is finite, and so is every LoRA layer merged (base +
    alpha/rank x B @ A, what the checkpoint's merged model will hold: finite adapters can
    still overflow there)."""
    import torch

    finite = True  # no early return: under FSDP every process must make the same gathers
    with torch.no_grad():
        for param in model.parameters():
            local = _local(param)
            if param.requires_grad and local.numel() and not bool(torch.isfinite(local).all()):
                finite = False
        for module in model.modules():
            lora_a, lora_b = getattr(module, "lora_a", None), getattr(module, "lora_b", None)
            base = getattr(module, "weight", None)
            if lora_a is None or lora_b is None or base is None:
                continue
            scale = float(getattr(module, "alpha", 1.0)) / max(1, int(getattr(module, "rank", 1)))
            try:
                delta = _full(lora_b.weight).float() @ _full(lora_a.weight).float()
                merged = _full(base).float() + scale * delta
            except Exception:  # a base we cannot upcast here (NF4): its adapters were checked
                continue
            if not bool(torch.isfinite(merged).all()):
                finite = False
    return finite


def check_before_save(recipe: Any, model: Any, asked_sizes: list[int] | None = None) -> None:
    """Refuse to save a run that made no optimizer step, or whose weights are not finite.
    ``asked_sizes``: (batch_size, gradient_accumulation_steps) as the user's config gave
    them, where the plan runs them as others (``kubetune.asked_sizes``)."""
    if recipe is None:
        return
    if int(getattr(recipe, "global_step", 0) or 0) == 0:
        raise NoStepError(_no_step(recipe, asked_sizes))
    if model is not None and not _finite_weights(model):
        raise NonFiniteError(_diverged(
            f"the weights are not finite after step {recipe.global_step}", recipe))


def _no_step(recipe: Any, asked_sizes: list[int] | None) -> str:
    loader = getattr(recipe, "_dataloader", None)
    dataset = getattr(loader, "dataset", None)
    try:
        samples = len(dataset)
    except TypeError:
        samples = -1
    batch_size = int(getattr(loader, "batch_size", None) or 1)
    accumulation = int(getattr(recipe, "_gradient_accumulation_steps", 1) or 1)
    if asked_sizes and asked_sizes[0] * asked_sizes[1] == batch_size * accumulation:
        # The same samples per step, in the sizes the user set (and would change).
        batch_size, accumulation = asked_sizes
    world_size = _world_size()
    what = "pack(s)" if getattr(dataset, "packs", None) is not None else "sample(s)"
    if samples < 0:
        return (f"the run made no optimizer step (batch_size={batch_size}, "
                f"gradient_accumulation_steps={accumulation}, {world_size} process(es)): "
                "lower batch_size or gradient_accumulation_steps, or add rows")
    return no_step_line(samples, batch_size, accumulation, world_size, what)


def _world_size() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except Exception:
        pass
    return 1
