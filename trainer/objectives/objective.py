"""What an objective answers, for every part of kubetune that needs to know what a run
optimises (``Objective``): the one door. An objective is one instance of a subclass, in a
module of its own, listed once in ``registry``; nothing downstream tells objectives apart
by a recipe's name, a loss's path or a config section: it asks the run's ``Objective``,
resolved once (``registry.resolve``) and stored on the plan and in the saved config
(``kubetune.objective``).

Light to import (no omegaconf, no torch): `kubetune size` and every command's ``--help``
read it in the initializer image; what fits a config imports the torch stack's parts
inside the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubetune.trainer.performance.memory_plan import ObjectiveLoad
from kubetune.trainer.request.topology import Topology

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel
    from kubetune.trainer.data.dataset_check import DatasetSample

# The objective's key in the merged config's ``kubetune`` section: where the recipe
# process, the launcher and a restart read which objective the run trains.
CONFIG_KEY = "objective"


@dataclass(frozen=True)
class LoggedPart:
    """A number an objective's recipe logs beside its loss, and how we show it."""

    key: str  # as the recipe logs it (a metrics.jsonl key)
    label: str  # on the progress line
    status: str  # in the TrainJob status, and summary.json's first_<status> / last_<status>
    digits: int  # decimals on the progress line

    def shown(self, record: dict) -> str | None:
        if self.key not in record:
            return None
        return f"{self.label} {float(record[self.key]):.{self.digits}f}"


@dataclass
class Fitted:
    """What an objective's ``fit_models`` put in the config: its lines, and the other
    model a run loads besides the policy (a teacher), whose files the plan counts."""

    notes: list[str] = field(default_factory=list)
    teacher: "CheckpointModel | None" = None


class Objective:
    """An objective's answers; the defaults are supervised fine-tuning's."""

    name: str = ""
    # The recipes (names) that train it: a drop-in `tune run` of one is this objective.
    recipes: tuple[str, ...] = ()
    # What the held-out loop measures on held-out data (``recipe_process.held_out_measure``
    # reads this, never the name): "cross_entropy" (the token loss over labels),
    # "preference" (a preference loss, reward accuracy, margin and rewards over held-out
    # pairs) or "cross_entropy_and_kd" (the student's token loss with the KD term beside
    # it). The plan fits the held-out section to it (``fit_held_out``).
    held_out_metrics: str = "cross_entropy"
    # What its recipes log beside the loss (shown on the progress line, the status, the
    # report and summary.json's ``summary_section``).
    logged_parts: tuple[LoggedPart, ...] = ()
    summary_section: str | None = None
    packs: bool = True  # its rows may be packed (torchtune's preference data never is)
    needs_teacher: bool = False  # a second model, fetched into <workspace>/teacher
    # Checkpointer sections the objective fits itself (not to the policy's checkpoint).
    own_checkpointers: tuple[str, ...] = ()

    # What a base config of its recipes leaves to the method (DoRA: ``model.use_dora``).
    implied: dict[str, list[str]] = {}

    def recipe_for(self, method: str, topology: Topology | None = None,
                   spellings: dict[str, str] | None = None) -> tuple[str, str, list[str]]:
        """The recipe, base config and implied overrides for ``method`` on ``topology``:
        the method checked (``check_method``; ``spellings``: how the user sets things, for
        a refusal's hint), then the objective's ``recipe_table``."""
        from kubetune.trainer.request import methods

        if method not in methods.METHODS:
            return methods.recipe_for(method, topology)  # a bad method: its line names them
        self.check_method(method, topology, spellings)
        recipe, config = self.recipe_table(method, topology is None or topology.world_size == 1)
        return recipe, config, list(self.implied.get(method, []))

    def recipe_table(self, method: str, one_process: bool) -> tuple[str, str]:
        """The recipe and base config that train ``method`` on one process or several."""
        raise NotImplementedError

    def check_method(self, method: str, topology: Topology | None = None,
                     spellings: dict[str, str] | None = None) -> None:
        """Refuse, in one line naming what can run (and how more processes are asked for
        where the user is: ``spellings``), a method its recipes cannot train."""

    def fewest_processes(self, method: str) -> int:
        """The fewest processes a recipe of this objective trains ``method`` on."""
        return 1

    def memory_load(self, method: str, teacher_dims: dict | None = None) -> ObjectiveLoad:
        """What the objective adds to the memory a run of ``method`` needs (`kubetune
        size` and the plan's memory plan alike)."""
        return ObjectiveLoad()

    def teacher_overrides(self, teacher_dir: Path) -> list[str]:
        """The trainer arguments that point the config at a teacher in ``teacher_dir``."""
        return []

    def fit_loss(self, cfg: "DictConfig", user_keys: set[str]) -> list[str]:
        """The objective's loss in ``cfg`` where the user chose none; the lines saying so."""
        return []

    def fit_models(self, cfg: "DictConfig", student: "CheckpointModel", user_keys: set[str],
                   workspace_teacher: Path) -> Fitted:
        """The sections of the models the run loads besides the policy (a teacher), fitted
        to their checkpoints on disk (the policy's own and a reference copy's are the
        plan's)."""
        return Fitted()

    def choose_builder(self, dataset_cfg: "DictConfig", found: "DatasetSample",
                       builder_named: bool, spellings: dict[str, str]) -> str | None:
        """Point the dataset section at the builder for the data's shape where the user
        named none; the line saying so, or None."""
        from kubetune.trainer.data import dataset_shape

        if dataset_shape.may_detect(dataset_cfg, builder_named):
            return dataset_shape.choose(dataset_cfg, found, spellings)
        return None

    def loss_summed_over(self, recipe: str, world_size: int) -> int:
        """How many processes' losses ``recipe`` sums into the loss it logs (1: a mean)."""
        return 1

    def fit_held_out(self, cfg: "DictConfig", notes: list[str]) -> list[str]:
        """The held-out set the plan chose (``dataset_val``), fitted to what
        ``held_out_metrics`` measures; the plan's lines so far (``notes``) and any saying
        so."""
        return notes

    def described(self, cfg: "DictConfig") -> dict[str, Any]:
        """What summary.json's ``objective`` says of the run beyond its name, method,
        recipe and loss: the model it compares against (a reference, a teacher) and its
        own settings."""
        return {}


def checkpoint_named(cfg: "DictConfig", section: str) -> dict[str, Any] | None:
    """A checkpointer section's model, for ``described``: its directory and the repo it
    came from."""
    from omegaconf import OmegaConf

    from kubetune.workspace.model_files import original_repo_id

    where = OmegaConf.select(cfg, f"{section}.checkpoint_dir", default=None)
    if where is None:
        return None
    return {"checkpoint_dir": str(where), "name": original_repo_id(Path(str(where)))}
