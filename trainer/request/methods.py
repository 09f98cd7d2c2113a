"""Fine-tuning method x topology -> torchtune recipe and base config, the same choice
Kubeflow Trainer's torch plugin makes, and the checks for combinations that cannot run.

The base config only supplies defaults (optimizer, loss, scheduler...): the model,
tokenizer and checkpointer sections are rebuilt from the checkpoint on disk, so one base
config per variant serves every model size.
"""

from __future__ import annotations

from kubetune.errors import BadInputError
from kubetune.trainer.request.topology import Topology
from kubetune.workspace.trainer_output import METHODS as METHOD_NAMES

# (method, distributed) -> (recipe, base config, implied overrides)
_CHOICES = {
    ("lora", False): ("lora_finetune_single_device", "llama3_2/1B_lora_single_device", []),
    ("dora", False): ("lora_finetune_single_device", "llama3_2/1B_lora_single_device",
                      ["model.use_dora=True"]),
    ("qlora", False): ("lora_finetune_single_device", "llama3_2/1B_qlora_single_device", []),
    ("full", False): ("full_finetune_single_device", "llama3_2/1B_full_single_device", []),
    ("lora", True): ("lora_finetune_distributed", "llama3_2/1B_lora", []),
    ("dora", True): ("lora_finetune_distributed", "llama3_2/1B_lora", ["model.use_dora=True"]),
    ("qlora", True): ("lora_finetune_distributed", "llama3_2/1B_lora",
                      ["model.quantize_base=True"]),
    ("full", True): ("full_finetune_distributed", "llama3_2/1B_full", []),
}

# The config suffixes the controller composes (<family>/<size><suffix>), each with a config
# torchtune ships for it: used when the composed name does not exist (e.g. a QLoRA
# config for a size torchtune has none for).
VARIANT_TEMPLATES = {
    "_lora_single_device": "llama3_2/1B_lora_single_device",
    "_qlora_single_device": "llama3_2/1B_qlora_single_device",
    "_full_single_device": "llama3_2/1B_full_single_device",
    "_lora": "llama3_2/1B_lora",
    "_qlora": "llama3_2/1B_lora",
    "_full": "llama3_2/1B_full",
    "_full_multinode": "llama3_3/70B_full_multinode",
}


def recipe_for(method: str, topology: Topology | None = None) -> tuple[str, str, list[str]]:
    """The recipe, base config and implied overrides for ``method`` on ``topology``."""
    if method not in METHOD_NAMES:
        raise BadInputError(f"method {method!r} is not one of {', '.join(METHOD_NAMES)}")
    distributed = topology is not None and topology.world_size > 1
    if topology is not None and topology.nnodes > 1:
        check_multinode(method)
    recipe, config, implied = _CHOICES[(method, distributed)]
    if method == "full" and topology is not None and topology.nnodes > 1:
        config = VARIANT_TEMPLATES["_full_multinode"]
    return recipe, config, list(implied)


def check_multinode(method: str) -> None:
    if method == "qlora":
        raise BadInputError("QLoRA cannot run on several nodes (torchtune's distributed LoRA "
                            "recipe shards NF4 weights only within a node): use lora, dora or "
                            "full, or one node")


def _truthy(value) -> bool:
    return str(value).strip().lower() == "true"


def method_of(model_cfg, recipe: str) -> str:
    """The method a recipe's model section asks for, as the controller reads the args."""
    get = model_cfg.get if model_cfg is not None else (lambda k, d=None: d)
    lora = "lora" in recipe or any(get(k) is not None for k in ("lora_attn_modules",
                                                                "lora_rank"))
    if not lora:
        return "full"
    if _truthy(get("use_dora", False)):
        return "dora"
    # torchtune's QLoRA configs name a qlora_* builder instead of setting quantize_base.
    if _truthy(get("quantize_base", False)) or (
            "qlora" in str(get("_component_", "")) and get("quantize_base") is None):
        return "qlora"
    return "lora"


# What entrypoints/local.py (and older callers) list: method -> single-device choice.
METHODS = {m: _CHOICES[(m, False)] for m in METHOD_NAMES}


def check_recipe(recipe: str, method: str, topology: Topology) -> list[str]:
    """Fail on a recipe that cannot run ``method`` on ``topology``; return notes."""
    notes: list[str] = []
    single = recipe.endswith("_single_device")
    if method != "full" and recipe.startswith("full_finetune"):
        raise BadInputError(f"recipe {recipe} trains all weights but the arguments ask for "
                            f"{method} (model.lora_* set): use lora_finetune_"
                            f"{'single_device' if topology.world_size == 1 else 'distributed'}")
    if single and topology.nnodes > 1:
        raise BadInputError(f"recipe {recipe} runs on one device but {topology.nnodes} nodes "
                            f"were requested: use {recipe.replace('_single_device', '_distributed')}"
                            " or one node")
    if topology.nnodes > 1:
        check_multinode(method)
    if single and topology.nproc_per_node > 1:
        notes.append(f"recipe {recipe} is single-device: running 1 process, not "
                     f"{topology.nproc_per_node}")
    return notes
