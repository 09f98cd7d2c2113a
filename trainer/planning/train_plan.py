"""`kubetune train`'s plan: its options (``request.train_options``' overrides) on the
topology of ``PET_*``, with the recipe the method needs there, chosen as the controller
would, then planned like any `tune run` request (``plan``).

It sits here, not beside the options: choosing the recipe needs the machine's GPUs
(``performance.hardware``) and the plan needs every room below this one, while the
options stay a leaf `kubetune train --help` reads without omegaconf."""

from __future__ import annotations

from pathlib import Path

from kubetune.workspace import Workspace, workspace
from kubetune.trainer.performance import hardware
from kubetune.trainer.planning.plan import RunPlan, plan
from kubetune.trainer.request import topology
from kubetune.trainer.objectives import registry
from kubetune.trainer.request.settings import LauncherSettings
from kubetune.trainer.request.train_options import (TrainOptions, spellings_of,
                                                    split_overrides, train_overrides)
from kubetune.trainer.request.tune_command import TuneRunRequest

# Every base config `methods.recipe_for` picks says `device: cuda`: the device the topology
# counts processes for (``auto``: one per GPU, or one without GPUs).
BASE_CONFIG_DEVICE = "cuda"


def _requested_device(args: list[str]) -> str:
    """The device the last ``device=`` override names, else the base configs'."""
    named = [arg.split("=", 1)[1].strip() for arg in args if arg.startswith("device=")]
    return named[-1] if named and named[-1] else BASE_CONFIG_DEVICE


def plan_training(options: TrainOptions, model_dir: str, dataset_dir: str, output_dir: str,
                  overrides_text: str | None = None, overrides: tuple[str, ...] = (),
                  settings: LauncherSettings | None = None,
                  set_by: dict[str, str] | None = None) -> RunPlan:
    """Plan fine-tuning the model in ``model_dir`` on ``dataset_dir`` into ``output_dir``:
    ``overrides_text`` (space-separated) applies after the options, ``overrides`` last;
    ``set_by``: option name -> the variable or option the user set it with (its hints
    name that).

    The topology is resolved here, once: it picks the recipe, and the plan runs on it."""
    settings = settings or LauncherSettings()
    extra = split_overrides(overrides_text)
    user_args = [*train_overrides(options), *extra, *overrides]
    # `kubetune train` takes no torchrun options: the topology is the PET_* variables', for
    # the device the run asks for (a `device=cpu` override on a GPU host is one process).
    topo = topology.resolve(None, _requested_device(user_args), settings,
                            cuda_device_count=hardware.cuda_device_count)
    recipe, config, implied = registry.get(options.objective).recipe_for(options.method, topo)
    args = [f"output_dir={output_dir}", f"checkpointer.checkpoint_dir={model_dir}", *implied,
            *user_args]
    shared = workspace()
    steps = Workspace(shared.root, dataset_dir=Path(dataset_dir), model_dir=Path(model_dir),
                      output_dir=Path(output_dir), export_dir=shared.export_dir)
    request = TuneRunRequest(recipe=recipe, config=config, overrides=args,
                             spellings=spellings_of(set_by or {}, [*extra, *overrides]),
                             objective=options.objective)
    return plan(request, steps, settings, topo)
