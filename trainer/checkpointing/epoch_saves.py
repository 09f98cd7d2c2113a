"""What a LoRA run's saves hold (issue 52 §7): the merged model at the last save only.

torchtune's LoRA recipes write, at every save, the adapter, the recipe state and a merged
copy of the whole model: for a 1B-shaped run about 2.5 GB per epoch beside 0.17 GB of
adapter (docs/trainer.md, "Disk per epoch"). The last save keeps the merged model: the
exporter's merged export copies it, and its logits check compares base + adapter against
it. Every earlier save (each non-final epoch's, each resumable step or signal save) holds
the adapter and the recipe state only, all a resume reads; an export of such an epoch
(``--checkpoint best``) merges base + adapter itself (`kubetune.exporter.adapter_merge`).

``KUBETUNE_MERGED_EPOCHS=true`` keeps torchtune's way. DoRA, QLoRA and full fine-tunes
keep it always (a DoRA or QLoRA merge is not the plain sum the exporter applies; a full
fine-tune's weights are its result), as does a run that sets torchtune's own
``save_adapter_weights_only``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from omegaconf import DictConfig

SETTING = "merged_epochs"  # in the config's kubetune section
TORCHTUNE_KEY = "save_adapter_weights_only"


def plan(cfg: DictConfig, method: str, user_keys: set[str]) -> None:
    """Set ``kubetune.merged_epochs``: False (earlier saves without the merged model) for
    a LoRA run whose user chose nothing else."""
    asked = cfg.kubetune.get(SETTING)
    if method != "lora":
        cfg.kubetune[SETTING] = True
    elif asked is None:
        cfg.kubetune[SETTING] = TORCHTUNE_KEY in user_keys


@contextlib.contextmanager
def adapter_only_unless_final(recipe: Any, settings: dict, final: bool) -> Iterator[None]:
    """Around one call of the recipe's ``save_checkpoint``: a save that is not the run's
    last writes no merged model, where the plan said so (``settings``: the kubetune
    section). torchtune's recipes read the flag at each save (and then skip the merge)."""
    if final or settings.get(SETTING) is not False \
            or not hasattr(recipe, "_save_adapter_weights_only"):
        yield
        return
    before = recipe._save_adapter_weights_only
    recipe._save_adapter_weights_only = True
    try:
        yield
    finally:
        recipe._save_adapter_weights_only = before
