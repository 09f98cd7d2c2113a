"""Plan a training run: one fully merged torchtune config, the recipe, the process
topology and the command, from a `tune run` request and what is really on disk and in
the machine. Every check a user's input can fail runs here, before anything starts; each
part of the config is fitted by the module whose job it is (the package's map)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError
from kubetune.workspace import Workspace
from kubetune.trainer.checkpointing import epoch_saves, resume
from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel, read_checkpoint_model
from kubetune.trainer.config import builder_settings, config_keys
from kubetune.trainer.config.recipe_config import apply_overrides, configs_dir, resolve_recipe
from kubetune.trainer.config.validate import check_choices, check_paths, check_values
from kubetune.trainer.data import (csv_text, dataset_check, dataset_location, dataset_shape,
                                   step_count)
from kubetune.trainer.objectives import registry
from kubetune.trainer.objectives.objective import CONFIG_KEY, Objective
from kubetune.trainer.objectives.registry import SFT
from kubetune.trainer.performance import hardware, host_memory, speed
from kubetune.trainer.planning import chat_template_plan, model_shaped
from kubetune.trainer.planning.checkpoint_fit import fit_to_checkpoint
from kubetune.trainer.planning.config_source import (builder_named, config_for, override_keys,
                                                     user_config_file)
from kubetune.trainer.planning.our_sections import our_sections
from kubetune.trainer.planning.resume_plan import inputs_digest, resume_or_start
from kubetune.trainer.planning.settings_line import settings_line
from kubetune.trainer.request import methods, topology
from kubetune.trainer.request.settings import DEFAULT_GRACE_PERIOD_S, LauncherSettings
from kubetune.trainer.request.tune_command import TuneRunRequest
from kubetune.trainer.validation import held_out_set


@dataclass
class RunPlan:
    request: TuneRunRequest
    cfg: DictConfig
    recipe_path: Path
    distributed: bool
    topology: topology.Topology
    method: str
    checkpoint: CheckpointModel
    objective: Objective = SFT
    fingerprint: str = ""
    resumed_from: resume.ResumeRecord | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def grace_period_s(self) -> float:
        return float(OmegaConf.select(self.cfg, "kubetune.grace_period_s")
                     or DEFAULT_GRACE_PERIOD_S)

    @property
    def is_primary_node(self) -> bool:
        return self.topology.node_rank == 0 or not self.distributed

    def command(self, config_path: Path) -> list[str]:
        bootstrap = ["-m", "kubetune.trainer.recipe_process.bootstrap", str(self.recipe_path), "--config",
                     str(config_path)]
        # -P: nothing imported from the working directory (a clone named `kubetune` there
        # would shadow the installed package); child_env sets it for torchrun's workers.
        if self.distributed and self.topology.needs_torchrun:
            return [sys.executable, "-P", "-m", "torch.distributed.run",
                    *self.topology.torchrun_args(), *bootstrap]
        return [sys.executable, "-P", *bootstrap]

    def worker_env(self) -> dict[str, str]:
        """What the command's process needs in its environment beyond the launcher's: a
        distributed recipe run as a one-process group gets torchrun's variables from us."""
        if self.distributed and not self.topology.needs_torchrun:
            return self.topology.one_process_env()
        return {}


def check_request(request: TuneRunRequest) -> list[str]:
    """The checks of `plan` that need no checkpoint and no data, for a caller that has
    neither yet (`kubetune local` before its initializers): the recipe and config exist,
    the overrides parse and apply, their keys, choices and numbers; return the warnings.
    ``model.*`` keys are checked against the config's model builder, whose LoRA
    parameters every family's builder shares (the rebuilt model keeps only those)."""
    recipe_path, _ = resolve_recipe(request.recipe)
    base, notes = config_for(request.config)
    cfg = apply_overrides(base, request.overrides)
    check_choices(cfg)
    check_paths(cfg)
    in_order = [arg.lstrip("~").split("=", 1)[0] for arg in request.overrides]
    notes += config_keys.check(in_order, base, cfg, Path(recipe_path), configs_dir())
    check_values(cfg, request.spellings)
    user_keys = override_keys(request.overrides)
    if builder_named(user_keys, request.config):
        notes += builder_settings.fit(cfg, user_keys, request.spellings,
                                      user_config_file(request.config))
    return notes


@dataclass
class _Merged:
    """The request's config merged, before the checkpoint, the machine and the data."""

    base: DictConfig
    cfg: DictConfig
    recipe_path: Path
    supports_distributed: bool
    user_keys: set[str]
    objective: Objective
    notes: list[str]


def _merged(request: TuneRunRequest, workspace: Workspace) -> _Merged:
    """torchtune's config and the overrides, checked; the run's objective resolved once
    (the one the request names, else its recipe's)."""
    recipe_path, supports_distributed = resolve_recipe(request.recipe)
    objective = registry.resolve(request.objective, Path(recipe_path).stem)
    base, notes = config_for(request.config)
    cfg = apply_overrides(base, request.overrides)
    check_choices(cfg)
    check_paths(cfg)
    cfg.output_dir = str(cfg.get("output_dir") or workspace.output_dir)
    return _Merged(base, cfg, Path(recipe_path), supports_distributed,
                   override_keys(request.overrides), objective, notes)


def plan(request: TuneRunRequest, workspace: Workspace,
         settings: LauncherSettings | None = None,
         resolved: topology.Topology | None = None) -> RunPlan:
    """The run ``request`` asks for; ``resolved``: the topology its recipe was chosen for
    (`kubetune train`), else the plan resolves it from the request and ``PET_*``.

    The phases, in the order their errors show: torchtune's config + overrides, where it
    runs (device, dtype, topology), what the checkpoint says (model, tokenizer,
    checkpointer sections and the key checks; the objective's other models), where the
    data is, the speed defaults, our own sections, and resuming an earlier run."""
    m = _merged(request, workspace)
    cfg, notes, objective = m.cfg, m.notes, m.objective
    model_dir = Path(OmegaConf.select(cfg, "checkpointer.checkpoint_dir") or workspace.model_dir)
    checkpoint = read_checkpoint_model(model_dir)
    method = methods.method_of(cfg.get("model"), request.recipe)
    hw, distributed, topo = _place(cfg, request, m, method, settings or LauncherSettings(),
                                   resolved)
    notes += fit_to_checkpoint(cfg, m.base, request, m.recipe_path, checkpoint, method,
                               m.user_keys, objective)
    fitted = objective.fit_models(cfg, checkpoint, m.user_keys, workspace.teacher_dir)
    notes += fitted.notes
    notes += model_shaped.fit(cfg, checkpoint, method, request.config, m.user_keys,
                              topo.world_size, hardware.gpu_memory_bytes()
                              if hw.device.startswith("cuda") else None)
    loaded = [checkpoint, *([fitted.teacher] if fitted.teacher is not None else [])]
    # Each process loads every model's checkpoint (a teacher's too).
    checkpoint_bytes = sum(host_memory.checkpoint_bytes(c.model_dir, c.weight_files)
                           for c in loaded)
    too_small = host_memory.note(topo.nproc_per_node, checkpoint_bytes,
                                 host_memory.container_memory_bytes())
    notes += [too_small] if too_small else []
    cfg.log_peak_memory_stats = hw.device.startswith("cuda")
    if hw.device == "cpu" and cfg.get("enable_activation_offloading"):
        cfg.enable_activation_offloading = False
        notes.append("activation offloading needs CUDA: off on cpu")
    notes += _data_and_sections(request, workspace, m, checkpoint, method, hw, topo,
                                checkpoint_bytes, fitted.teacher)
    notes.append(settings_line(cfg, m.base, method, request.config, m.user_keys,
                               request.spellings, hw.notes))
    fingerprint, resumed = resume_or_start(cfg, notes, inputs_digest(
        checkpoint.model_dir, workspace.dataset_dir,
        fitted.teacher.model_dir if fitted.teacher is not None else None))
    return RunPlan(request=request, cfg=cfg, recipe_path=m.recipe_path,
                   distributed=distributed, topology=topo, method=method,
                   checkpoint=checkpoint, objective=objective, fingerprint=fingerprint,
                   resumed_from=resumed, notes=notes)


def _data_and_sections(request: TuneRunRequest, workspace: Workspace, m: _Merged,
                       checkpoint: CheckpointModel, method: str, hw,
                       topo: topology.Topology, checkpoint_bytes: int,
                       teacher: CheckpointModel | None) -> list[str]:
    """The data located and its builder chosen, the chat format, the speed defaults, our
    sections (the objective stored), the held-out set, and whether the rows make a step."""
    cfg, user_keys, notes = m.cfg, m.user_keys, []
    named = builder_named(user_keys, request.config)
    users_config = user_config_file(request.config)
    if named:  # before the data is read: a setting it cannot take is named first
        notes += builder_settings.fit(cfg, user_keys, request.spellings, users_config)
    found = _locate_data(cfg, workspace, notes, named, request.spellings, m.objective)
    notes += chat_template_plan.plan(cfg, checkpoint.model_dir, found, request.spellings)
    compile_before = bool(cfg.get("compile"))
    sizes_before = speed.batch_sizes(cfg)
    notes += _speed_defaults(cfg, user_keys, hw, topo, found, checkpoint, method,
                             checkpoint_bytes, m.objective, teacher)
    notes += our_sections(cfg, m.base, request, user_keys, workspace, checkpoint,
                          compile_before, sizes_before)
    cfg.kubetune[CONFIG_KEY] = m.objective.name
    epoch_saves.plan(cfg, method, user_keys)
    notes += _objective_and_held_out(cfg, request, m, topo, workspace, found, users_config)
    check_values(cfg, request.spellings)
    if found is not None:
        # The rows trained on: a held-out fraction's are not.
        trained = cfg.kubetune.data
        no_step = step_count.check_makes_a_step(cfg, trained.rows, trained.rows_exact,
                                                topo.world_size, request.spellings)
        if no_step:
            raise BadInputError(no_step)
    return notes


def _objective_and_held_out(cfg: DictConfig, request: TuneRunRequest, m: _Merged,
                            topo: topology.Topology, workspace: Workspace, found,
                            users_config: bool) -> list[str]:
    """What the objective's recipe logs, the held-out set (fitted to what the objective
    measures on it), and the dataset keys fitted to what its builders take
    (``dataset_val``'s too, now that it exists)."""
    summed = m.objective.loss_summed_over(m.recipe_path.stem, topo.world_size)
    if summed > 1:
        cfg.metric_logger.loss_summed_over = summed  # the 1-process loss's meaning
    notes = held_out_set.plan(cfg, workspace.dataset_dir, found, request.spellings)
    notes = m.objective.fit_held_out(cfg, notes)
    return notes + builder_settings.fit(cfg, m.user_keys, request.spellings, users_config)


def _place(cfg: DictConfig, request: TuneRunRequest, m: _Merged, method: str,
           settings: LauncherSettings, resolved: topology.Topology | None):
    """Device and dtype for this machine, and the topology the recipe runs on (one process
    for a single-device recipe), the method checked against the objective's recipes."""
    hw = hardware.choose(cfg.get("device"), cfg.get("dtype"))
    m.notes.extend(hw.notes)
    cfg.device, cfg.dtype = hw.device, hw.dtype

    distributed = request.recipe.endswith("_distributed") or "distributed" in m.recipe_path.stem
    topo = resolved if resolved is not None else topology.resolve(
        request, hw.device, settings, cuda_device_count=hardware.cuda_device_count)
    if distributed and not m.supports_distributed:
        raise BadInputError(f"recipe {request.recipe} cannot run distributed")
    m.notes.extend(methods.check_recipe(request.recipe, method, topo))
    if not distributed:
        topo = topology.Topology(1, 1, 0, None)
    m.objective.check_method(method, topo, request.spellings)
    return hw, distributed, topo


def _locate_data(cfg: DictConfig, workspace: Workspace, notes: list[str], named: bool,
                 spellings: dict[str, str], objective: Objective):
    """Point the dataset at local files, choose the builder for their shape (the
    objective's) where the user named none, and check them; the sample found, if any."""
    if "dataset" not in cfg:
        return None
    notes += dataset_location.locate(cfg.dataset, workspace.dataset_dir)
    if isinstance(cfg.dataset, DictConfig) and dataset_check.sample_files(cfg.dataset):
        dataset_check.check_split(cfg.dataset, spellings=spellings)
    found = dataset_check.sample(cfg.dataset)  # the training split's rows only
    if found is not None:
        if isinstance(cfg.dataset, DictConfig):
            chosen = objective.choose_builder(cfg.dataset, found, named, spellings)
            notes += [chosen] if chosen else []
        dataset_shape.reads_chat(cfg.dataset)
        csv_text.read_as_text(cfg.dataset, found)
        dataset_check.check_columns(cfg.dataset, found, spellings)
    return found


def _speed_defaults(cfg: DictConfig, user_keys: set[str], hw, topo: topology.Topology, found,
                    checkpoint: CheckpointModel, method: str, checkpoint_bytes: int,
                    objective: Objective, teacher: CheckpointModel | None) -> list[str]:
    """Packing, compile and the memory plan, where the user said nothing."""
    max_seq_len = int(cfg.tokenizer.get("max_seq_len") or min(checkpoint.max_seq_len, 2048))
    teacher_dims = teacher.architecture.shape if teacher is not None else None
    return speed.apply(
        cfg, user_keys, hw.device, topo.world_size,
        dataset_check.mean_chars(cfg.dataset, found) if found else None,
        found.total_rows if found else None, max_seq_len, method=method,
        dims=checkpoint.architecture.shape,
        gpu_memory_bytes=hardware.gpu_memory_bytes() if hw.device.startswith("cuda") else None,
        nodes=topo.nnodes, checkpoint_bytes=checkpoint_bytes,
        load=objective.memory_load(method, teacher_dims), may_pack=objective.packs)
