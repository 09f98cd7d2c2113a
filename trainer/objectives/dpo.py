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

from typing import TYPE_CHECKING, Any

from kubetune.errors import BadInputError
from kubetune.trainer.objectives import preference_rows
from kubetune.trainer.objectives.objective import LoggedPart, Objective, checkpoint_named
from kubetune.trainer.performance.memory_plan import ObjectiveLoad
from kubetune.trainer.request import process_hint
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
# {more}: how the user on their path asks for two processes (``process_hint``).
AVAILABLE = "lora on 1 process or more, dora and full on 2+ processes ({more})"
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
    # torchtune's DPO recipes have no held-out loop of their own: ours measures held-out
    # pairs as a training step does (``validation.preference_held_out``).
    held_out_metrics = "preference"
    logged_parts = (LoggedPart(REWARD_ACCURACY, "reward acc", "reward_accuracy", 2),
                    LoggedPart(REWARD_MARGIN, "margin", "reward_margin", 4))
    summary_section = "preference"
    packs = False  # torchtune's preference datasets refuse to ("Packed is ... not supported")

    implied = _IMPLIED

    def recipe_table(self, method: str, one_process: bool) -> tuple[str, str]:
        return _RECIPES[(method == "full", one_process)]

    def check_method(self, method: str, topology: Topology | None = None,
                     spellings: dict[str, str] | None = None) -> None:
        """Refuse a method torchtune's DPO recipes cannot train on ``topology`` (a `tune
        run` of a DPO recipe with ``model.use_dora=True`` on one process, ...); the hint
        names how more processes are asked for where the user is (``spellings``:
        `kubetune local`'s ``--nproc``, else ``PET_NPROC_PER_NODE``)."""
        one = topology is None or topology.world_size == 1
        why = {"qlora": "torchtune's LoRA DPO recipes do not handle an NF4-quantized base",
               "dora": "lora_dpo_single_device does not initialise DoRA's magnitudes" if one
               else None,
               "full": "torchtune has full_dpo_distributed only" if one else None}.get(method)
        if why:
            raise BadInputError(f"DPO with method {method}{' on 1 process' if one else ''}: "
                                f"{why}; available: "
                                f"{AVAILABLE.format(more=process_hint.more_processes(spellings))}")

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

    def fit_held_out(self, cfg: "DictConfig", notes: list[str]) -> list[str]:
        from kubetune.trainer.objectives import dpo_held_out

        return notes + dpo_held_out.plan(cfg, self.name, PREFERENCE_BUILDER, REPLACEABLE)

    def described(self, cfg: "DictConfig") -> dict[str, Any]:
        from omegaconf import OmegaConf

        separate = checkpoint_named(cfg, "ref_checkpointer")
        reference = {**separate, "kind": "a frozen copy"} if separate else {
            **(checkpoint_named(cfg, "checkpointer") or {}),
            "kind": "the base model (the policy with its adapters off)"}
        return {"reference": reference, "beta": OmegaConf.select(cfg, "loss.beta", default=None)}


OBJECTIVE = DPO()


# Builders the plan replaces with ours where data is preference-shaped: a DPO config's
# default, and torchtune's generic builder (ours takes its arguments and reads its shape
# too, and also TRL's and HH-RLHF's, on which torchtune's fails mid-run).
REPLACEABLE = ("torchtune.datasets.preference_dataset",)


def choose_builder(dataset_cfg: "DictConfig", found: "DatasetSample", builder_named: bool,
                   spellings: dict[str, str] | None = None) -> str | None:
    """Point a DPO run's dataset section at our preference builder where the user named
    no builder of their own; the line saying so. Data that is not preference-shaped is
    refused naming the columns DPO needs."""
    from kubetune.trainer.data import column_map
    from kubetune.trainer.request.spelling import spelling

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
