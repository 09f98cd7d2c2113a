"""Fine-tuning methods -> torchtune recipe, base config and the overrides they imply.

The base config only supplies defaults (optimizer, loss, scheduler...): the model,
tokenizer and checkpointer sections are rebuilt from the checkpoint on disk.
"""

from __future__ import annotations

from kubetune.errors import BadInputError

METHODS = {
    # method: (recipe, base config, implied overrides)
    "lora": ("lora_finetune_single_device", "llama3_2/1B_lora_single_device", []),
    "dora": ("lora_finetune_single_device", "llama3_2/1B_lora_single_device",
             ["model.use_dora=True"]),
    "qlora": ("lora_finetune_single_device", "llama3_2/1B_qlora_single_device", []),
    "full": ("full_finetune_single_device", "llama3_2/1B_full_single_device", []),
}


def recipe_for(method: str) -> tuple[str, str, list[str]]:
    try:
        recipe, config, implied = METHODS[method]
    except KeyError:
        raise BadInputError(f"method {method!r} is not one of {', '.join(METHODS)}") from None
    return recipe, config, list(implied)
