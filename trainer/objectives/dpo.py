"""DPO (direct preference optimization): torchtune's DPO recipe and base config for a
method on a topology, and what the launcher adapts in those recipes.

torchtune 0.6.1 ships ``lora_dpo_single_device`` and ``lora_dpo_distributed`` and
``full_dpo_distributed`` (every weight, a frozen reference copy from
``ref_checkpointer``). What they cannot run is refused before launch, naming what can:
full DPO on one process (no recipe); DoRA on one process (``lora_dpo_single_device`` never
initialises DoRA's magnitudes: they would train from uninitialised memory; the
distributed recipe does); QLoRA (neither LoRA DPO recipe handles an NF4 base: no
state-dict hooks to save it in the checkpoint's dtype, as the SFT recipes have).
"""

from __future__ import annotations

from omegaconf import DictConfig

from kubetune.errors import BadInputError
from kubetune.trainer.data import column_map
from kubetune.trainer.data.dataset_check import DatasetSample
from kubetune.trainer.objectives import preference_rows
from kubetune.trainer.request import process_hint
from kubetune.trainer.request.spelling import spelling
from kubetune.trainer.request.topology import Topology

PREFERENCE_BUILDER = "kubetune.trainer.objectives.preference_data.preference_dataset"
# (method is full, one process?) -> (recipe, base config).
_RECIPES = {
    (False, True): ("lora_dpo_single_device", "llama3_1/8B_lora_dpo_single_device"),
    (False, False): ("lora_dpo_distributed", "llama3_1/8B_lora_dpo"),
    (True, False): ("full_dpo_distributed", "llama3_1/8B_full_dpo"),
}
RECIPES = tuple(recipe for recipe, _ in _RECIPES.values())
_IMPLIED = {"dora": ["model.use_dora=True"]}
# {more}: how the user on their path asks for two processes (``process_hint``).
AVAILABLE = "lora on 1 process or more, dora and full on 2+ processes ({more})"
# lora_dpo_distributed all-reduces its logged loss with a sum (its reward metrics with a
# mean; full_dpo_distributed averages both): the loss a user reads is divided by the
# processes so that it means on N what it means on 1.
LOSS_SUMMED_OVER_RANKS = ("lora_dpo_distributed",)


def is_dpo(recipe: str) -> bool:
    """Whether ``recipe`` (a name or a path's stem) is one of torchtune's DPO recipes."""
    return any(recipe == r or recipe.endswith("/" + r + ".py") or recipe.endswith(r)
               for r in RECIPES)


def recipe_for(method: str, topology: Topology | None = None,
               spellings: dict[str, str] | None = None) -> tuple[str, str, list[str]]:
    """The DPO recipe, base config and implied overrides for ``method`` on ``topology``."""
    check_method(method, topology, spellings)
    one = topology is None or topology.world_size == 1
    recipe, config = _RECIPES[(method == "full", one)]
    return recipe, config, list(_IMPLIED.get(method, []))


def check_method(method: str, topology: Topology | None,
                 spellings: dict[str, str] | None = None) -> None:
    """Refuse a method torchtune's DPO recipes cannot train on ``topology`` (a `tune run`
    of a DPO recipe with ``model.use_dora=True`` on one process, ...); the hint names how
    more processes are asked for where the user is (``spellings``: `kubetune local`'s
    ``--nproc``, else ``PET_NPROC_PER_NODE``)."""
    one = topology is None or topology.world_size == 1
    why = {"qlora": "torchtune's LoRA DPO recipes do not handle an NF4-quantized base",
           "dora": "lora_dpo_single_device does not initialise DoRA's magnitudes" if one
           else None,
           "full": "torchtune has full_dpo_distributed only" if one else None}.get(method)
    if why:
        raise BadInputError(f"DPO with method {method}{' on 1 process' if one else ''}: "
                            f"{why}; available: "
                            f"{AVAILABLE.format(more=process_hint.more_processes(spellings))}")


# Builders the plan replaces with ours where data is preference-shaped: a DPO config's
# default, and torchtune's generic builder (ours takes its arguments and reads its shape
# too, and also TRL's and HH-RLHF's, on which torchtune's fails mid-run).
REPLACEABLE = ("torchtune.datasets.preference_dataset",)


def choose_builder(dataset_cfg: DictConfig, found: DatasetSample, builder_named: bool,
                   spellings: dict[str, str] | None = None) -> str | None:
    """Point a DPO run's dataset section at our preference builder where the user named
    no builder of their own; the line saying so. Data that is not preference-shaped is
    refused naming the columns DPO needs."""
    component = str(dataset_cfg.get("_component_", ""))
    if builder_named and component not in REPLACEABLE:
        return None
    mapping = column_map.read(dataset_cfg)
    # A row with a missing answer is one of the rows dropped and counted, not another
    # shape: the data is preference data when any sampled row is.
    shapes = sorted({s for s in (preference_rows.shape_name(row, mapping)
                                 for row in found.rows) if s})
    if not shapes:
        raise BadInputError(
            f"dataset {found.files[0].name} has columns {', '.join(found.columns)}: DPO "
            "needs preference data, columns chosen and rejected (with prompt, or as whole "
            "conversations sharing their start), as text or lists of messages; or map "
            "yours: set " + column_map.write(spelling(spellings or {}, column_map.KEY),
                                             {"chosen": "<column>", "rejected": "<column>"}))
    if str(dataset_cfg.get("packed", False)).lower() == "true":
        raise BadInputError("dataset.packed=True: torchtune's DPO recipes do not pack "
                            "preference pairs; remove it (or --no-packing)")
    dataset_cfg._component_ = PREFERENCE_BUILDER
    dataset_cfg.pop("packed", None)
    return (f"dataset: preference data, {shapes[0]} -> {PREFERENCE_BUILDER}; "
            "trains on the answers (the shared prompt masked)")
