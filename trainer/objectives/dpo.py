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
from kubetune.trainer.request.spelling import spelling
from kubetune.trainer.request.topology import Topology
from kubetune.trainer.validation import held_out_set

PREFERENCE_BUILDER = "kubetune.trainer.objectives.preference_data.preference_dataset"
# (method is full, one process?) -> (recipe, base config).
_RECIPES = {
    (False, True): ("lora_dpo_single_device", "llama3_1/8B_lora_dpo_single_device"),
    (False, False): ("lora_dpo_distributed", "llama3_1/8B_lora_dpo"),
    (True, False): ("full_dpo_distributed", "llama3_1/8B_full_dpo"),
}
RECIPES = tuple(recipe for recipe, _ in _RECIPES.values())
_IMPLIED = {"dora": ["model.use_dora=True"]}
AVAILABLE = ("lora on 1 process or more, dora on 2+ processes (PET_NPROC_PER_NODE=2), "
             "full on 2+ processes")
# lora_dpo_distributed all-reduces its logged loss with a sum (its reward metrics with a
# mean; full_dpo_distributed averages both): the loss a user reads is divided by the
# processes so that it means on N what it means on 1.
LOSS_SUMMED_OVER_RANKS = ("lora_dpo_distributed",)


def is_dpo(recipe: str) -> bool:
    """Whether ``recipe`` (a name or a path's stem) is one of torchtune's DPO recipes."""
    return any(recipe == r or recipe.endswith("/" + r + ".py") or recipe.endswith(r)
               for r in RECIPES)


def recipe_for(method: str, topology: Topology | None = None) -> tuple[str, str, list[str]]:
    """The DPO recipe, base config and implied overrides for ``method`` on ``topology``."""
    check_method(method, topology)
    one = topology is None or topology.world_size == 1
    recipe, config = _RECIPES[(method == "full", one)]
    return recipe, config, list(_IMPLIED.get(method, []))


def check_method(method: str, topology: Topology | None) -> None:
    """Refuse a method torchtune's DPO recipes cannot train on ``topology`` (a `tune run`
    of a DPO recipe with ``model.use_dora=True`` on one process, ...)."""
    one = topology is None or topology.world_size == 1
    why = {"qlora": "torchtune's LoRA DPO recipes do not handle an NF4-quantized base",
           "dora": "lora_dpo_single_device does not initialise DoRA's magnitudes" if one
           else None,
           "full": "torchtune has full_dpo_distributed only" if one else None}.get(method)
    if why:
        raise BadInputError(f"DPO with method {method}{' on 1 process' if one else ''}: "
                            f"{why}; available: {AVAILABLE}")


def without_held_out(cfg: DictConfig, notes: list[str]) -> list[str]:
    """A DPO run trains on every training row and measures no held-out loss: kubetune's
    held-out loop measures SFT's cross-entropy over tokens and labels, and torchtune's DPO
    recipes have none of their own. The held-out set the plan chose is dropped, saying so;
    with none, the line says so too (``notes``: the plan's lines so far, its own line about
    the held-out set replaced)."""
    why = ("validation: none under DPO (kubetune measures held-out SFT loss; torchtune's DPO "
           "recipes have no held-out loop)")
    validation = (cfg.get("kubetune") or {}).get("validation")
    if validation is None:
        # No held-out set: the SFT hint to hold a fraction out would only lead to this line.
        return held_out_set.without_held_out_clause(notes) + [why]
    for key in ("dataset_val", "run_val_every_n_steps"):
        cfg.pop(key, None)
    cfg.kubetune.pop("validation", None)
    cfg.kubetune.pop("holdout", None)
    held = {"split": f"split '{validation.get('split')}'", "config": "dataset_val",
            "fraction": "a held-out fraction"}.get(validation.get("source"), "held-out data")
    return held_out_set.without_held_out_clause(notes) + [
        f"{why}: {held} not used, training on every row of the training split"]


# Builders the plan replaces with ours where data is preference-shaped: a DPO config's
# default, and torchtune's generic builder (ours takes its arguments and reads its shape
# too, and also TRL's and HH-RLHF's, on which torchtune's fails mid-run).
_REPLACEABLE = ("torchtune.datasets.preference_dataset",)


def choose_builder(dataset_cfg: DictConfig, found: DatasetSample, builder_named: bool,
                   spellings: dict[str, str] | None = None) -> str | None:
    """Point a DPO run's dataset section at our preference builder where the user named
    no builder of their own; the line saying so. Data that is not preference-shaped is
    refused naming the columns DPO needs."""
    component = str(dataset_cfg.get("_component_", ""))
    if builder_named and component not in _REPLACEABLE:
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
