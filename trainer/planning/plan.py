"""Plan a training run: one fully merged torchtune config, the recipe, the process
topology and the command, from a `tune run` request and what is really on disk and in
the machine. Every check a user's input can fail runs here, before anything starts."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError
from kubetune.workspace import TOKEN_CACHE_PATH, TRAINER_CONFIG_NAME, Workspace
from kubetune.workspace.initializer_manifest import InitializerManifest
from kubetune.workspace.trainer_output import parse_config, read_config_text
from kubetune.trainer.config import builder_settings, config_keys, lora_scale
from kubetune.trainer.objectives import distill, dpo, dpo_held_out
from kubetune.trainer.data import (csv_text, dataset_check, dataset_location, dataset_shape,
                                   step_count)
from kubetune.trainer.performance import hardware, host_memory, speed
from kubetune.trainer.planning import chat_template_plan, model_shaped
from kubetune.trainer.validation import heldout_set
from kubetune.trainer.request import methods, topology
from kubetune.trainer.request.settings import (DEFAULT_GRACE_PERIOD_S,
                                               DEFAULT_SAVE_EVERY_N_STEPS, LauncherSettings)
from kubetune.trainer.checkpointing import epoch_saves, resume
from kubetune.model_family.architecture import HF_CHECKPOINTER
from kubetune.trainer.checkpointing.checkpoint_model import (SPECIAL_TOKENS_FILE, CheckpointModel,
                                               read_checkpoint_model)
from kubetune.trainer.config.recipe_config import (apply_overrides, configs_dir, load_config, resolve_config,
                                   resolve_recipe)
from kubetune.trainer.request.tune_command import TuneRunRequest
from kubetune.trainer.config.saved_config import without_credentials
from kubetune.trainer.config.component_params import component_params
from kubetune.trainer.config.validate import (check_choices, check_nf4, check_paths,
                                              check_tokenizer, check_values,
                                              lora_rank_excess)

log = logging.getLogger("trainer")

@dataclass
class RunPlan:
    request: TuneRunRequest
    cfg: DictConfig
    recipe_path: Path
    distributed: bool
    topology: topology.Topology
    method: str
    checkpoint: CheckpointModel
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


def _override_keys(overrides: list[str]) -> set[str]:
    return {arg.lstrip("~").split("=", 1)[0] for arg in overrides}


def _config_for(name: str) -> tuple[DictConfig, list[str]]:
    """Load ``name``; a controller-composed name torchtune lacks falls back to its variant."""
    try:
        return load_config(name), []
    except BadInputError:
        family_size, _, variant = name.partition("/")
        for suffix in sorted(methods.VARIANT_TEMPLATES, key=len, reverse=True):
            if variant.endswith(suffix) and "/" in name:
                template = methods.VARIANT_TEMPLATES[suffix]
                return load_config(template), [
                    f"config {name}: torchtune has none by that name; using {template}'s "
                    "defaults (the model comes from the checkpoint either way)"]
        raise


def _model_section(cfg: DictConfig, checkpoint: CheckpointModel, method: str,
                   config_name: str) -> list[str]:
    arch = checkpoint.architecture
    model_cfg = cfg.get("model") or OmegaConf.create({})
    lora = method != "full"
    component = arch.component(lora)
    notes = []
    if model_cfg.get("_component_") != component:
        notes.append(f"model: config {config_name} names {model_cfg.get('_component_')}; "
                     f"the checkpoint's config.json is {arch.family} "
                     f"({arch.summary}): using {component}, tokenizer "
                     f"{checkpoint.tokenizer.component}, checkpointer {arch.checkpointer} "
                     f"(model_type {arch.model_type})")
    new_model = {"_component_": component, **arch.dims}
    if lora:
        new_model.update({k: model_cfg[k] for k in arch.lora_keys if k in model_cfg})
        if model_cfg.get("apply_lora_to_output") and "apply_lora_to_output" not in new_model:
            notes.append(f"model.apply_lora_to_output: {arch.family} ties its output to the "
                         "embeddings, and torchtune's LoRA builder for it trains no output "
                         "LoRA: the other modules get theirs")
        new_model["quantize_base"] = method == "qlora"
        new_model["use_dora"] = method == "dora"
    cfg.model = OmegaConf.create(new_model)
    return notes


def _checkpointer_sections(cfg: DictConfig, checkpoint: CheckpointModel,
                           user_keys: set[str]) -> None:
    """Every checkpointer the config has (the policy's ``checkpointer``; DPO's
    ``ref_checkpointer``, a teacher's...) fitted to its checkpoint on disk: the one given,
    unless the user named another directory for that section."""
    _checkpointer_section(cfg, "checkpointer", checkpoint)
    for name in [k for k in cfg.keys() if str(k).endswith("_checkpointer")]:
        # A teacher is another model, never the one given: `_teacher` fits it.
        if not isinstance(cfg.get(name), DictConfig) or name == distill.TEACHER_SECTION:
            continue
        named = f"{name}.checkpoint_dir" in user_keys
        other = read_checkpoint_model(Path(cfg[name].checkpoint_dir)) if named else checkpoint
        _checkpointer_section(cfg, str(name), other)


def _checkpointer_section(cfg: DictConfig, name: str, checkpoint: CheckpointModel) -> None:
    ckpt_cfg = cfg.get(name) or OmegaConf.create({})
    ckpt_cfg._component_ = ckpt_cfg.get("_component_",
                                        "torchtune.training.FullModelHFCheckpointer")
    if checkpoint.architecture.checkpointer != HF_CHECKPOINTER:  # a family of ours
        ckpt_cfg._component_ = checkpoint.architecture.checkpointer
    ckpt_cfg.checkpoint_dir = str(checkpoint.model_dir)
    ckpt_cfg.checkpoint_files = checkpoint.weight_files
    ckpt_cfg.model_type = checkpoint.architecture.model_type
    ckpt_cfg.output_dir = "${output_dir}"
    ckpt_cfg.recipe_checkpoint = None
    cfg[name] = ckpt_cfg


def _given_tokenizer_fits(given: Path, ours: Path, model_dir: Path) -> bool:
    """Whether a ``tokenizer.path`` the request names replaces the checkpoint's own file.
    A path into the model directory that is not there is a runtime's default for another
    model's layout (the drop-in runtimes send Llama's ``original/tokenizer.model``; a
    Phi-3 or Gemma checkpoint keeps its tokenizer.model at the top); a file elsewhere is
    the user's own tokenizer and wins when it is the kind the checkpoint's reads."""
    if given.name != ours.name:
        return False
    inside = model_dir.resolve() in given.resolve().parents
    return given.is_file() or not inside


# The tokenizer files a request may name, in each builder's spelling (phi4_tokenizer's
# vocab_path / merges_path, the others' path / merges_file): a runtime written for one
# model family names them for its own.
_TOKENIZER_FILES = {"tokenizer file": ("path", "vocab_path"),
                    "merges file": ("merges_file", "merges_path")}


def _tokenizer_files(new_tok: dict, tok_cfg: DictConfig, checkpoint: CheckpointModel,
                     user_keys: set[str]) -> set[str]:
    """Put the tokenizer files the request names into ``new_tok`` where they fit the
    checkpoint's tokenizer, under its builder's key; one line for each one that does
    not. Returns the override keys taken (checked here, not as unknown keys)."""
    taken = set()
    family = checkpoint.architecture.family
    for what, spellings in _TOKENIZER_FILES.items():
        named = [k for k in spellings if f"tokenizer.{k}" in user_keys and tok_cfg.get(k)]
        taken |= {f"tokenizer.{k}" for k in named}
        if not named:
            continue
        given = Path(str(tok_cfg.get(named[0])))
        ours = next((k for k in spellings if k in new_tok), None)
        if ours and _given_tokenizer_fits(given, Path(new_tok[ours]), checkpoint.model_dir):
            new_tok[ours] = str(given)
        elif ours:
            log.info("tokenizer.%s %s does not fit a %s checkpoint: using %s", named[0],
                     given, family, new_tok[ours])
        else:
            log.info("tokenizer.%s %s: a %s checkpoint's tokenizer (%s) reads no %s: left "
                     "out", named[0], given, family, new_tok["_component_"], what)
    return taken


def _tokenizer_overrides(new_tok: dict, tok_cfg: DictConfig, user_keys: set[str],
                         taken: set[str]) -> None:
    """The request's other ``tokenizer.*`` keys act on the rebuilt section: a builder it
    names replaces the checkpoint's (said in one line), and each key it sets is kept; a key
    the builder does not take is refused by ``config_keys.check_rebuilt_sections``."""
    named = {k.split(".", 2)[1] for k in user_keys
             if k.startswith("tokenizer.") and k.count(".") == 1}
    theirs = tok_cfg.get("_component_") if "_component_" in named else None
    if theirs and str(theirs) != new_tok["_component_"]:
        log.info("tokenizer._component_ %s: used instead of the checkpoint's %s (its files "
                 "from the request's tokenizer.* keys)", theirs, new_tok["_component_"])
        new_tok.clear()
        new_tok.update({"_component_": str(theirs), "max_seq_len": tok_cfg.get("max_seq_len")})
        taken = set()  # their builder reads the files they name, as they name them
    done = {"_component_", "max_seq_len"} | {k.split(".", 1)[1] for k in taken}
    params = component_params(new_tok["_component_"])
    takes = None if params is None or params.var_kwargs else set(params.defaults)
    for key in sorted(named - done):
        # A key the builder does not take stays out, for check_rebuilt_sections's line.
        if key in tok_cfg and (takes is None or key in takes):
            new_tok[key] = tok_cfg[key]


def _tokenizer_section(cfg: DictConfig, checkpoint: CheckpointModel,
                       user_keys: set[str]) -> set[str]:
    """The checkpoint's tokenizer; returns the override keys it took (see
    ``_tokenizer_files``)."""
    tok_cfg = cfg.get("tokenizer") or OmegaConf.create({})
    tokenizer = checkpoint.tokenizer
    # A base config's own path points at torchtune's download location: only a path the
    # request names can replace the checkpoint's.
    new_tok = {"_component_": tokenizer.component, **tokenizer.args,
               "max_seq_len": tok_cfg.get("max_seq_len")}
    taken = _tokenizer_files(new_tok, tok_cfg, checkpoint, user_keys)
    if tok_cfg.get("prompt_template"):
        new_tok["prompt_template"] = tok_cfg.prompt_template
    _tokenizer_overrides(new_tok, tok_cfg, user_keys, taken)
    if tokenizer.special_tokens and "special_tokens_path" not in new_tok:
        new_tok["special_tokens_path"] = f"{cfg.output_dir}/{SPECIAL_TOKENS_FILE}"
    limit = checkpoint.max_seq_len
    if new_tok["max_seq_len"] is not None and int(new_tok["max_seq_len"]) > limit:
        log.info("tokenizer.max_seq_len %s exceeds the checkpoint's max_position_embeddings: "
                 "using %d", new_tok["max_seq_len"], limit)
        new_tok["max_seq_len"] = limit
    cfg.tokenizer = OmegaConf.create(new_tok)
    check_tokenizer(cfg.tokenizer, {f"{cfg.output_dir}/{SPECIAL_TOKENS_FILE}"})
    return taken


OUR_METRIC_LOGGER = "kubetune.trainer.metric_logging.metric_logger.JsonLinesMetricLogger"


def _user_config_file(name: str) -> bool:
    try:
        return configs_dir() not in resolve_config(name).resolve().parents
    except BadInputError:
        return False  # a controller-composed name: the fallback is shipped too


def _metric_logger_section(cfg: DictConfig, user_keys: set[str], config_name: str) -> list[str]:
    """Our JSON-lines logger always; a logger the user chose (an override, or their own
    config file) is kept and fed the same records. A shipped config's default DiskLogger
    is not the user's choice and is left out."""
    theirs = cfg.get("metric_logger")
    ours = OmegaConf.create({"_component_": OUR_METRIC_LOGGER, "log_dir": "${output_dir}"})
    chosen = any(k == "metric_logger" or k.startswith("metric_logger.") for k in user_keys) \
        or _user_config_file(config_name)
    notes = []
    if (isinstance(theirs, DictConfig) and chosen
            and theirs.get("_component_") not in (None, OUR_METRIC_LOGGER)):
        # Resolved here: ${output_dir} must mean the run's output_dir once nested.
        ours.also = OmegaConf.to_container(theirs, resolve=True)
        notes.append(f"metric_logger: {theirs._component_} kept; {cfg.output_dir}/"
                     "metrics.jsonl is written beside it")
        notes += _drop_foreign_logger_keys(ours.also, user_keys)
    cfg.metric_logger = ours
    return notes


def _drop_foreign_logger_keys(also: DictConfig, user_keys: set[str]) -> list[str]:
    """``metric_logger._component_=...MLFlowLogger`` over a shipped config keeps that
    config's ``log_dir`` (its DiskLogger's), which MLFlowLogger does not take: the recipe
    would fail on its first line. Keys the user did not set and the chosen logger does
    not accept are left out, said in a note."""
    params = component_params(str(also.get("_component_")))
    if params is None or params.var_kwargs:
        return []
    foreign = [k for k in also if k != "_component_" and k not in params.defaults
               and f"metric_logger.{k}" not in user_keys]
    for key in foreign:
        del also[key]
    return [f"metric_logger.{key} (the config's) left out: {also._component_} takes no "
            f"{key}" for key in foreign]


# What torchtune's LoRA configs schedule with. Its full fine-tuning configs name no scheduler,
# so a warm-up length given there (`--warmup-steps`) would leave a section the recipe cannot
# instantiate.
WARMUP_SCHEDULER = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"
WARMUP_KEY = "lr_scheduler.num_warmup_steps"


def _lr_scheduler_section(cfg: DictConfig) -> list[str]:
    section = cfg.get("lr_scheduler")
    if not isinstance(section, DictConfig) or "_component_" in section:
        return []
    section._component_ = WARMUP_SCHEDULER
    return [f"lr_scheduler: the config names none; using {WARMUP_SCHEDULER} for the settings "
            f"given ({', '.join(k for k in section if k != '_component_')})"]


def _token_cache_dir(workspace: Workspace, output_dir: Path) -> str:
    """The volume's place for tokenized datasets (where ``kubetune.token_cache_dir``,
    KUBETUNE_TOKEN_CACHE_DIR's override, names none): under the workspace root, or, with
    no workspace (a laptop's `kubetune train --output-dir ./out`), beside the output
    directory as the workspace would have it."""
    root = workspace.root if workspace.root.is_dir() else output_dir.resolve().parent
    return str(root / TOKEN_CACHE_PATH)


def _kubetune_section(cfg: DictConfig, workspace: Workspace) -> None:
    section = cfg.get("kubetune") or OmegaConf.create({})
    if section.get("grace_period_s") is None:
        section.grace_period_s = DEFAULT_GRACE_PERIOD_S
    if section.get("save_every_n_steps") is None:
        section.save_every_n_steps = DEFAULT_SAVE_EVERY_N_STEPS
    if section.get("token_cache_dir") is None:
        section.token_cache_dir = _token_cache_dir(workspace, Path(cfg.output_dir))
    cfg.kubetune = section


def check_request(request: TuneRunRequest) -> list[str]:
    """The checks of `plan` that need no checkpoint and no data, for a caller that has
    neither yet (`kubetune local` before its initializers): the recipe and config exist,
    the overrides parse and apply, their keys, choices and numbers; return the warnings.
    ``model.*`` keys are checked against the config's model builder, whose LoRA
    parameters every family's builder shares (the rebuilt model keeps only those)."""
    recipe_path, _ = resolve_recipe(request.recipe)
    base, notes = _config_for(request.config)
    cfg = apply_overrides(base, request.overrides)
    check_choices(cfg)
    check_paths(cfg)
    in_order = [arg.lstrip("~").split("=", 1)[0] for arg in request.overrides]
    notes += config_keys.check(in_order, base, cfg, Path(recipe_path), configs_dir())
    check_values(cfg, request.spellings)
    if _builder_named(_override_keys(request.overrides), request.config):
        notes += builder_settings.fit(cfg, _override_keys(request.overrides),
                                      request.spellings, _user_config_file(request.config))
    return notes


def _builder_named(user_keys: set[str], config_name: str) -> bool:
    """The user chose the dataset builder: the plan will not replace it by the data's
    shape (``dataset_shape``), so what it takes can be checked before the data is read."""
    return bool({"dataset", "dataset._component_"} & user_keys) \
        or _user_config_file(config_name)


def plan(request: TuneRunRequest, workspace: Workspace,
         settings: LauncherSettings | None = None,
         resolved: topology.Topology | None = None) -> RunPlan:
    """The run ``request`` asks for; ``resolved``: the topology its recipe was chosen for
    (`kubetune train`), else the plan resolves it from the request and ``PET_*``.

    The phases, in the order their errors show: torchtune's config + overrides, where it
    runs (device, dtype, topology), what the checkpoint says (model, tokenizer,
    checkpointer sections and the key checks), where the data is, the speed defaults,
    our own sections, and resuming an earlier run."""
    settings = settings or LauncherSettings()
    recipe_path, supports_distributed = resolve_recipe(request.recipe)
    base, notes = _config_for(request.config)
    cfg = apply_overrides(base, request.overrides)
    user_keys = _override_keys(request.overrides)
    check_choices(cfg)
    check_paths(cfg)

    cfg.output_dir = str(cfg.get("output_dir") or workspace.output_dir)
    model_dir = Path(OmegaConf.select(cfg, "checkpointer.checkpoint_dir") or workspace.model_dir)
    checkpoint = read_checkpoint_model(model_dir)
    method = methods.method_of(cfg.get("model"), request.recipe)

    hw, distributed, topo = _place(cfg, request, recipe_path, supports_distributed, method,
                                   settings, resolved, notes)
    notes += _fit_to_checkpoint(cfg, base, request, recipe_path, checkpoint, method, user_keys)
    teacher = None
    if isinstance(cfg.get(distill.TEACHER_SECTION), DictConfig):  # a KD config, any recipe
        teacher, teacher_notes = _teacher(cfg, checkpoint, user_keys, workspace)
        notes += teacher_notes
    notes += model_shaped.fit(cfg, checkpoint, method, request.config, user_keys,
                              topo.world_size, hardware.gpu_memory_bytes()
                              if hw.device.startswith("cuda") else None)
    checkpoint_bytes = host_memory.checkpoint_bytes(checkpoint.model_dir,
                                                    checkpoint.weight_files)
    if teacher is not None:  # each process loads the teacher's checkpoint too
        checkpoint_bytes += host_memory.checkpoint_bytes(teacher.model_dir,
                                                         teacher.weight_files)
    too_small = host_memory.note(topo.nproc_per_node, checkpoint_bytes,
                                 host_memory.container_memory_bytes())
    notes += [too_small] if too_small else []
    cfg.log_peak_memory_stats = hw.device.startswith("cuda")
    if hw.device == "cpu" and cfg.get("enable_activation_offloading"):
        cfg.enable_activation_offloading = False
        notes.append("activation offloading needs CUDA: off on cpu")
    builder_named = _builder_named(user_keys, request.config)
    users_config = _user_config_file(request.config)
    if builder_named:  # before the data is read: a setting it cannot take is named first
        notes += builder_settings.fit(cfg, user_keys, request.spellings, users_config)
    found = _locate_data(cfg, workspace, notes, builder_named, request.spellings,
                         dpo.is_dpo(request.recipe) or dpo.is_dpo(Path(recipe_path).stem))
    notes += chat_template_plan.plan(cfg, checkpoint.model_dir, found, request.spellings)
    compile_before = bool(cfg.get("compile"))
    sizes_before = speed.batch_sizes(cfg)
    notes += _speed_defaults(cfg, user_keys, hw, topo, found, checkpoint, method,
                             checkpoint_bytes)

    notes += _our_sections(cfg, base, request, user_keys, workspace, checkpoint,
                           compile_before, sizes_before)
    epoch_saves.plan(cfg, method, user_keys)
    notes += _objective_and_held_out(cfg, request, recipe_path, topo, workspace, found,
                                     user_keys, users_config)
    check_values(cfg, request.spellings)
    if found is not None:
        # The rows trained on: a held-out fraction's are not.
        trained = cfg.kubetune.data
        no_step = step_count.check_makes_a_step(cfg, trained.rows, trained.rows_exact,
                                                topo.world_size, request.spellings)
        if no_step:
            raise BadInputError(no_step)
    fingerprint, resumed = _resume(cfg, notes, _inputs(
        checkpoint.model_dir, workspace.dataset_dir,
        teacher.model_dir if teacher is not None else None))
    return RunPlan(request=request, cfg=cfg, recipe_path=Path(recipe_path),
                   distributed=distributed, topology=topo, method=method,
                   checkpoint=checkpoint, fingerprint=fingerprint, resumed_from=resumed,
                   notes=notes)


def _objective_and_held_out(cfg: DictConfig, request: TuneRunRequest, recipe_path,
                            topo: topology.Topology, workspace: Workspace, found,
                            user_keys: set[str], users_config: bool) -> list[str]:
    """What the objective's recipe logs, the held-out set, and the dataset keys fitted to
    what its builders take (``dataset_val``'s too, now that it exists)."""
    if Path(recipe_path).stem in dpo.LOSS_SUMMED_OVER_RANKS and topo.world_size > 1:
        cfg.metric_logger.loss_summed_over = topo.world_size  # the 1-process loss's meaning
    notes = heldout_set.plan(cfg, workspace.dataset_dir, found, request.spellings)
    if dpo.is_dpo(Path(recipe_path).stem):
        notes += dpo_held_out.plan(cfg)
    return notes + builder_settings.fit(cfg, user_keys, request.spellings, users_config)


def _our_sections(cfg: DictConfig, base: DictConfig, request: TuneRunRequest,
                  user_keys: set[str], workspace: Workspace, checkpoint: CheckpointModel,
                  compile_before: bool, sizes_before: tuple) -> list[str]:
    """The context limit, the metric logger and the ``kubetune`` section: what the recipe
    process reads about how the user's request became this config."""
    limit_chosen = "tokenizer.max_seq_len" in user_keys or OmegaConf.select(
        base, "tokenizer.max_seq_len", default=None) is not None
    if not limit_chosen and cfg.tokenizer.get("max_seq_len") is None:
        # Unlimited, a sample longer than the model's context crashes the recipe mid-run.
        cfg.tokenizer.max_seq_len = checkpoint.max_seq_len
    notes = _metric_logger_section(cfg, user_keys, request.config)
    _kubetune_section(cfg, workspace)
    cfg.kubetune.count_cut_samples = not limit_chosen
    # A warm-up the user chose stays; the config's is capped to the run's length in the
    # recipe process, where that is known exactly (`recipe_process/warmup_cap.py`).
    cfg.kubetune.cap_warmup = not (WARMUP_KEY in user_keys
                                   or _user_config_file(request.config))
    # Compile switched on by our speed default, not asked for: its fallback's line says so.
    cfg.kubetune.compile_default = bool(cfg.get("compile")) and not compile_before
    # The sizes as the config and arguments gave them, where a speed rule runs them as
    # others (the same effective batch): a line about them then speaks in the user's.
    changed = speed.batch_sizes(cfg) != sizes_before
    cfg.kubetune.asked_sizes = list(sizes_before) if changed else None
    return notes


def _place(cfg: DictConfig, request: TuneRunRequest, recipe_path, supports_distributed: bool,
           method: str, settings: LauncherSettings, resolved: topology.Topology | None,
           notes: list[str]):
    """Device and dtype for this machine, and the topology the recipe runs on (one process
    for a single-device recipe)."""
    hw = hardware.choose(cfg.get("device"), cfg.get("dtype"))
    notes += hw.notes
    cfg.device, cfg.dtype = hw.device, hw.dtype

    distributed = request.recipe.endswith("_distributed") or "distributed" in recipe_path.stem
    topo = resolved if resolved is not None else topology.resolve(
        request, hw.device, settings, cuda_device_count=hardware.cuda_device_count)
    if distributed and not supports_distributed:
        raise BadInputError(f"recipe {request.recipe} cannot run distributed")
    notes += methods.check_recipe(request.recipe, method, topo)
    if not distributed:
        topo = topology.Topology(1, 1, 0, None)
    if dpo.is_dpo(Path(recipe_path).stem):
        dpo.check_method(method, topo, request.spellings)
    if distill.is_distill(Path(recipe_path).stem):
        distill.check_method(method)
    return hw, distributed, topo


def _teacher(cfg: DictConfig, student: CheckpointModel, user_keys: set[str],
             workspace: Workspace) -> tuple[CheckpointModel, list[str]]:
    """A distillation run's teacher: its checkpointer and model sections fitted to the
    teacher on disk (the one named, else the workspace's), its vocabulary the student's."""
    teacher = read_checkpoint_model(distill.teacher_dir(cfg, user_keys, workspace.teacher_dir))
    _checkpointer_section(cfg, distill.TEACHER_SECTION, teacher)
    return teacher, distill.fit_teacher(cfg, student, teacher)


def _fit_to_checkpoint(cfg: DictConfig, base: DictConfig, request: TuneRunRequest, recipe_path,
                       checkpoint: CheckpointModel, method: str, user_keys: set[str]) -> list[str]:
    """The model, scheduler, checkpointer and tokenizer sections rebuilt for the checkpoint,
    with the override keys and values checked against what will be built."""
    notes = _model_section(cfg, checkpoint, method, request.config)
    if method != "full":
        notes += lora_scale.keep_alpha_ratio(cfg, base, user_keys, request.config)
    notes += _lr_scheduler_section(cfg)
    in_order = [arg.lstrip("~").split("=", 1)[0] for arg in request.overrides]
    notes += config_keys.check(in_order, base, cfg, Path(recipe_path), configs_dir())
    check_values(cfg, request.spellings)
    if method != "full":
        excess = lora_rank_excess(cfg.model, checkpoint.architecture.dims, request.spellings)
        if excess and "model.lora_rank" in user_keys:
            raise BadInputError(excess)
        if excess:  # the config's default, sized for bigger models: the user chose nothing
            notes.append(f"{excess} (the rank is config {request.config}'s default)")
    if method == "qlora":
        check_nf4(checkpoint.architecture.dims)
    _checkpointer_sections(cfg, checkpoint, user_keys)
    taken = _tokenizer_section(cfg, checkpoint, user_keys)
    config_keys.check_rebuilt_sections([k for k in in_order if k not in taken], cfg)
    return notes


def _locate_data(cfg: DictConfig, workspace: Workspace, notes: list[str], builder_named: bool,
                 spellings: dict[str, str], preference: bool = False):
    """Point the dataset at local files, choose the builder for their shape where the
    user named none, and check them; the sample found, if any."""
    if "dataset" not in cfg:
        return None
    notes += dataset_location.locate(cfg.dataset, workspace.dataset_dir)
    if isinstance(cfg.dataset, DictConfig) and dataset_check.sample_files(cfg.dataset):
        dataset_check.check_split(cfg.dataset, spellings=spellings)
    found = dataset_check.sample(cfg.dataset)  # the training split's rows only
    if found is not None:
        if preference and isinstance(cfg.dataset, DictConfig):
            chosen = dpo.choose_builder(cfg.dataset, found, builder_named, spellings)
            notes += [chosen] if chosen else []
        elif dataset_shape.may_detect(cfg.dataset, builder_named):
            notes.append(dataset_shape.choose(cfg.dataset, found, spellings))
        dataset_shape.reads_chat(cfg.dataset)
        csv_text.read_as_text(cfg.dataset, found)
        dataset_check.check_columns(cfg.dataset, found, spellings)
    return found


def _speed_defaults(cfg: DictConfig, user_keys: set[str], hw, topo: topology.Topology, found,
                    checkpoint: CheckpointModel, method: str, checkpoint_bytes: int) -> list[str]:
    """Packing, compile and the memory plan, where the user said nothing."""
    max_seq_len = int(cfg.tokenizer.get("max_seq_len") or min(checkpoint.max_seq_len, 2048))
    return speed.apply(
        cfg, user_keys, hw.device, topo.world_size,
        dataset_check.mean_chars(cfg.dataset, found) if found else None,
        found.total_rows if found else None, max_seq_len, method=method,
        dims=checkpoint.architecture.shape,
        gpu_memory_bytes=hardware.gpu_memory_bytes() if hw.device.startswith("cuda") else None,
        nodes=topo.nnodes, checkpoint_bytes=checkpoint_bytes)


def _not_resumed(earlier: resume.ResumeRecord, cfg: DictConfig) -> str:
    """Why a restart does not continue the checkpoint it finds: never silently."""
    saved = parse_config(read_config_text(Path(cfg.output_dir), TRAINER_CONFIG_NAME))
    changes = resume.config_changes(saved, without_credentials(cfg)) if saved else ""
    where = Path(cfg.output_dir) / (earlier.checkpoint or earlier.epoch_dir)
    return (f"not resuming from {where} ({earlier.epochs_run} epoch(s) + "
            f"{earlier.steps_in_epoch} step(s), global step {earlier.global_step}): the "
            "config changed since it was saved"
            f"{f' ({changes})' if changes else ''}; starting over (the same config as then "
            "would resume)")


def _inputs(model_dir: Path, dataset_dir: Path, teacher_dir: Path | None = None) -> str:
    """What the initializers fetched into ``model_dir``, ``dataset_dir`` and a
    distillation run's ``teacher_dir``, by content ("" where none left a manifest: a
    directory given by hand): another teacher is another run, never a resumed one."""
    trees = [("model", model_dir), ("dataset", dataset_dir)]
    trees += [("teacher", teacher_dir)] if teacher_dir is not None else []
    digests = [(name, InitializerManifest.read(tree).content_digest()) for name, tree in trees]
    return " ".join(f"{name}={digest}" for name, digest in digests if digest)


def _resume(cfg: DictConfig, notes: list[str], inputs: str):
    """The run's fingerprint (the config and ``inputs``), and the earlier run of the same
    one to resume, if any."""
    cfg.resume_from_checkpoint = False
    fingerprint = resume.fingerprint(cfg, inputs)
    cfg.kubetune.fingerprint = fingerprint
    cfg.kubetune.inputs = inputs  # the next run in this output_dir says which changed
    earlier = resume.read_record(Path(cfg.output_dir))
    resumed = resume.apply(cfg, Path(cfg.output_dir), fingerprint)
    if resumed is None and earlier is not None and earlier.fingerprint != fingerprint:
        notes.append(_not_resumed(earlier, cfg))
    if resumed is not None:
        cfg.kubetune.resume_steps_in_epoch = resumed.steps_in_epoch
        notes.append(f"resuming from {Path(cfg.output_dir) / resumed.epoch_dir}: "
                     f"{resumed.epochs_run} epoch(s) + {resumed.steps_in_epoch} step(s) done "
                     f"(global step {resumed.global_step}, saved on {resumed.reason})")
    return fingerprint, resumed
