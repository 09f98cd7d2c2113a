"""One line before the first step where the data makes fewer optimizer steps than a useful
run needs, saying how many will run and which setting gives more; the config is never
changed (torchtune's own defaults stay what they are).

Met so far: torchtune's DPO configs bring ``gradient_accumulation_steps: 8``, which made 57
pairs one optimizer step; the LoRA configs' ``batch_size: 8`` with an inherited
accumulation of 8 made 300 SFT rows four. The count is the recipe's own, after its setup:
batches per epoch from its data loader (per process, ``drop_last`` included), over the
accumulation, times the epochs. A run whose ``max_steps_per_epoch`` cuts it shorter chose
its length, and gets no line.
"""

from __future__ import annotations

import logging
from typing import Any

from kubetune.trainer.request import passed_env

log = logging.getLogger("trainer")

USEFUL_STEPS = 10  # fewer: a handful of updates, the learning rate mostly in its warm-up


def _unit(dataset: Any) -> str:
    from torchtune.datasets import PackedDataset

    if isinstance(dataset, PackedDataset):
        return "packs"
    return "preference pairs" if type(dataset).__name__ in ("CachedPairs", "PreferenceDataset") \
        else "rows"


def note(examples: int, unit: str, batches: int, batch_size: int, accumulation: int,
         processes: int, epochs: int, max_steps_per_epoch: int | None) -> str | None:
    """The line, or None where the data makes enough steps (or the user capped them)."""
    per_epoch = batches // max(1, accumulation)
    steps = per_epoch * epochs
    capped = max_steps_per_epoch is not None and max_steps_per_epoch < per_epoch
    if capped or steps >= USEFUL_STEPS:
        return None
    per_step = batch_size * accumulation * processes
    fixes = []
    if accumulation > 1:
        fixes.append(f"gradient_accumulation_steps=1 makes {batches * epochs}")
    elif batch_size > 1 and batches > 0:
        smaller = max(1, batch_size // 4)
        fixes.append(f"batch_size={smaller} makes about "
                     f"{batches * batch_size // smaller * epochs}")
    more = -(-USEFUL_STEPS // max(1, per_epoch)) if per_epoch else None
    if more:
        fixes.append(f"epochs={more} makes {per_epoch * more}")
    return (f"data: {examples} {unit} make {steps} optimizer step{'s' if steps != 1 else ''} "
            f"(batch_size={batch_size} x gradient_accumulation_steps={accumulation} x "
            f"{processes} process{'es' if processes != 1 else ''} = {per_step} per step, "
            f"{epochs} epoch{'s' if epochs != 1 else ''}): "
            + ("; ".join(fixes) if fixes else "add rows") + " (nothing changed: set one to "
            "train more steps)")


def warn(recipe: Any, cfg: Any) -> None:
    """Before the first step (rank 0), from the recipe's own loader and settings."""
    loader = getattr(recipe, "_dataloader", None)
    if not passed_env.is_primary() or loader is None:
        return
    import torch.distributed as dist

    processes = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    line = note(len(loader.dataset), _unit(loader.dataset), len(loader),
                int(cfg.get("batch_size") or 1),
                int(getattr(recipe, "_gradient_accumulation_steps", 1) or 1), processes,
                int(getattr(recipe, "total_epochs", 1) or 1),
                getattr(recipe, "max_steps_per_epoch", None))
    if line is not None:
        log.warning(line)
