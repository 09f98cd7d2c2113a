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

# What Kubeflow Trainer's torch plugin picks (getRecipeAndConfig): (method, one device?) ->
# (recipe, config suffix) on one node; on several nodes it always picks full fine-tuning's
# multi-node recipe. DoRA is LoRA to the controller (it reads only LoRA and QLoRA args).
_CONTROLLER = {
    ("lora", True): ("lora_finetune_single_device", "_lora_single_device"),
    ("dora", True): ("lora_finetune_single_device", "_lora_single_device"),
    ("qlora", True): ("lora_finetune_single_device", "_qlora_single_device"),
    ("full", True): ("full_finetune_single_device", "_full_single_device"),
    ("lora", False): ("lora_finetune_distributed", "_lora"),
    ("dora", False): ("lora_finetune_distributed", "_lora"),
    ("qlora", False): ("lora_finetune_distributed", "_qlora"),
    ("full", False): ("full_finetune_distributed", "_full"),
}
MULTINODE = ("full_finetune_distributed", "_full_multinode")
# Every fine-tuning recipe the choice above names.
RECIPES = tuple(sorted({recipe for recipe, _ in _CONTROLLER.values()} | {MULTINODE[0]}))

# The config suffixes the controller composes (<family>/<size><suffix>), each with a config
# torchtune ships for it: the base config `kubetune train` runs, and the one used when a
# composed name does not exist (e.g. a QLoRA config for a size torchtune has none for).
VARIANT_TEMPLATES = {
    "_lora_single_device": "llama3_2/1B_lora_single_device",
    "_qlora_single_device": "llama3_2/1B_qlora_single_device",
    "_full_single_device": "llama3_2/1B_full_single_device",
    "_lora": "llama3_2/1B_lora",
    "_qlora": "llama3_2/1B_lora",
    "_full": "llama3_2/1B_full",
    "_full_multinode": "llama3_3/70B_full_multinode",
}
# What a base config leaves to the method: it says neither DoRA nor, for the distributed
# LoRA config the controller composes for QLoRA, the quantized base.
_IMPLIED = {("dora", True): ["model.use_dora=True"], ("dora", False): ["model.use_dora=True"],
            ("qlora", False): ["model.quantize_base=True"]}


def controller_choice(method: str, nnodes: int, one_device: bool) -> tuple[str, str]:
    """The recipe and config suffix the controller picks for ``method`` (read from a
    TrainJob's args) on ``nnodes`` nodes; ``one_device``: one process (or GPU) per node."""
    if nnodes > 1:
        return MULTINODE
    return _CONTROLLER[(method, one_device)]


def recipe_for(method: str, topology: Topology | None = None) -> tuple[str, str, list[str]]:
    """The recipe, base config and implied overrides `kubetune train` runs ``method`` with
    on ``topology``: the controller's choice, except that on several nodes LoRA and DoRA run
    torchtune's distributed LoRA recipe (the controller has only full fine-tuning there)."""
    if method not in METHOD_NAMES:
        raise BadInputError(f"method {method!r} is not one of {', '.join(METHOD_NAMES)}")
    one_device = topology is None or topology.world_size == 1
    nnodes = topology.nnodes if topology is not None else 1
    if nnodes > 1:
        check_multinode(method)
    recipe, suffix = controller_choice(method, nnodes if method == "full" else 1, one_device)
    return recipe, VARIANT_TEMPLATES[suffix], list(_IMPLIED.get((method, one_device), []))


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


# What entrypoints/local.py lists as its --method choices.
METHODS = METHOD_NAMES


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
