"""DPO (direct preference optimization): torchtune's DPO recipe and base config for a
method on a topology, and what the launcher adapts in those recipes.

torchtune 0.6.1 ships ``lora_dpo_single_device`` and ``lora_dpo_distributed`` and
``full_dpo_distributed`` (every weight, a frozen reference copy from
``ref_checkpointer``). What they cannot run is refused before launch, naming what can:
full DPO on one process (no recipe); DoRA on one process (``lora_dpo_single_device`` never
initialises DoRA's magnitudes: they would train from uninitialised memory; the
distributed recipe does); QLoRA (neither LoRA DPO recipe handles an NF4 base: no
state-dict hooks to save it in the checkpoint's dtype, as the SFT recipes have).

The recipes' loss is the config's (``loss._component_``): torchtune's ``DPOLoss``, or
another of its preference losses with the same arguments (``RSOLoss``: the ``rso``
objective, ``kubetune.trainer.objectives.rso``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubetune.errors import BadInputError
from kubetune.trainer.objectives import preference_rows
from kubetune.trainer.objectives.objective import LoggedPart, Objective
from kubetune.trainer.performance.memory_plan import ObjectiveLoad
from kubetune.trainer.request.topology import Topology

if TYPE_CHECKING:  # light to import: `kubetune size` and --help read the objective
    from omegaconf import DictConfig

    from kubetune.trainer.data.dataset_check import DatasetSample

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
# What a DPO recipe logs beside its loss: how often the policy prefers the chosen answer
# more than the reference does, and by how much (its implicit reward's margin).
REWARD_ACCURACY, REWARD_MARGIN = "rewards/accuracies", "rewards/margins"


class DPO(Objective):
    name = "dpo"
    recipes = RECIPES
    # kubetune's held-out loop measures SFT's cross-entropy over tokens and labels, and
    # torchtune's DPO recipes have no held-out loop of their own.
    held_out_metrics = None
    logged_parts = (LoggedPart(REWARD_ACCURACY, "reward acc", "reward_accuracy", 2),
                    LoggedPart(REWARD_MARGIN, "margin", "reward_margin", 4))
    summary_section = "preference"
    packs = False  # torchtune's preference datasets refuse to ("Packed is ... not supported")

    implied = _IMPLIED

    def recipe_table(self, method: str, one_process: bool) -> tuple[str, str]:
        return _RECIPES[(method == "full", one_process)]

    def check_method(self, method: str, topology: Topology | None = None) -> None:
        """Refuse a method torchtune's DPO recipes cannot train on ``topology`` (a `tune
        run` of a DPO recipe with ``model.use_dora=True`` on one process, ...)."""
        one = topology is None or topology.world_size == 1
        why = {"qlora": "torchtune's LoRA DPO recipes do not handle an NF4-quantized base",
               "dora": "lora_dpo_single_device does not initialise DoRA's magnitudes" if one
               else None,
               "full": "torchtune has full_dpo_distributed only" if one else None}.get(method)
        if why:
            raise BadInputError(f"DPO with method {method}{' on 1 process' if one else ''}: "
                                f"{why}; available: {AVAILABLE}")

    def fewest_processes(self, method: str) -> int:
        return 2 if method == "full" else 1  # full DPO has a distributed recipe only

    def memory_load(self, method: str, teacher_dims: dict | None = None) -> ObjectiveLoad:
        # Each row a pair, chosen and rejected run through the model together; full DPO
        # holds a frozen reference copy of the weights (LoRA's reference is the base with
        # its adapters off).
        return ObjectiveLoad(sequences_per_row=2, reference_copy=method == "full")

    def choose_builder(self, dataset_cfg: "DictConfig", found: "DatasetSample",
                       builder_named: bool, spellings: dict[str, str]) -> str | None:
        return choose_builder(dataset_cfg, found, builder_named, spellings)

    def loss_summed_over(self, recipe: str, world_size: int) -> int:
        return world_size if recipe in LOSS_SUMMED_OVER_RANKS else 1

    def without_held_out(self, cfg: "DictConfig", notes: list[str]) -> list[str]:
        return without_held_out(cfg, notes)


OBJECTIVE = DPO()


def without_held_out(cfg: "DictConfig", notes: list[str]) -> list[str]:
    """A DPO run trains on every training row and measures no held-out loss: kubetune's
    held-out loop measures SFT's cross-entropy over tokens and labels, and torchtune's DPO
    recipes have none of their own. The held-out set the plan chose is dropped, saying so;
    with none, the line says so too (``notes``: the plan's lines so far, its own line about
    the held-out set replaced)."""
    from kubetune.trainer.validation import held_out_set

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


def choose_builder(dataset_cfg: "DictConfig", found: "DatasetSample", builder_named: bool,
                   spellings: dict[str, str] | None = None) -> str | None:
    """Point a DPO run's dataset section at our preference builder where the user named
    no builder of their own; the line saying so. Data that is not preference-shaped is
    refused naming the columns DPO needs."""
    from kubetune.trainer.data import column_map
    from kubetune.trainer.request.spelling import spelling

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
