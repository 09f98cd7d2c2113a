"""The sections kubetune adds to a run's config: our metric logger (beside a logger the
user chose), the context limit where none was chosen, and the ``kubetune`` section the
recipe process reads about how the request became this config."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.workspace import TOKEN_CACHE_PATH, Workspace
from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel
from kubetune.trainer.config.component_params import component_params
from kubetune.trainer.performance import speed
from kubetune.trainer.planning.checkpoint_fit import WARMUP_KEY
from kubetune.trainer.planning.config_source import user_config_file
from kubetune.trainer.request.settings import DEFAULT_GRACE_PERIOD_S, DEFAULT_SAVE_EVERY_N_STEPS
from kubetune.trainer.request.tune_command import TuneRunRequest

OUR_METRIC_LOGGER = "kubetune.trainer.metric_logging.metric_logger.JsonLinesMetricLogger"


def _metric_logger_section(cfg: DictConfig, user_keys: set[str], config_name: str) -> list[str]:
    """Our JSON-lines logger always; a logger the user chose (an override, or their own
    config file) is kept and fed the same records. A shipped config's default DiskLogger
    is not the user's choice and is left out."""
    theirs = cfg.get("metric_logger")
    ours = OmegaConf.create({"_component_": OUR_METRIC_LOGGER, "log_dir": "${output_dir}"})
    chosen = any(k == "metric_logger" or k.startswith("metric_logger.") for k in user_keys) \
        or user_config_file(config_name)
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


def our_sections(cfg: DictConfig, base: DictConfig, request: TuneRunRequest,
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
                                   or user_config_file(request.config))
    # Compile switched on by our speed default, not asked for: its fallback's line says so.
    cfg.kubetune.compile_default = bool(cfg.get("compile")) and not compile_before
    # The sizes as the config and arguments gave them, where a speed rule runs them as
    # others (the same effective batch): a line about them then speaks in the user's.
    changed = speed.batch_sizes(cfg) != sizes_before
    cfg.kubetune.asked_sizes = list(sizes_before) if changed else None
    return notes
