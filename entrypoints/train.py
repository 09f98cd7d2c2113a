"""`kubetune train` (direct use) and `run_tune` (the `tune run` Kubeflow Trainer sends).

Only the click surface: `kubetune.trainer.request.train_options` turns the options into the
overrides of the `tune run` request they stand for, `kubetune.trainer.planning.train_plan`
plans that request, and both run through the same launcher. The options'
variables (``KUBETUNE_EPOCHS``, ``KUBETUNE_LORA_RANK``, ...) are read by these click
options on every path: `tune run` and `kubetune local` take no such flags, so they read
the environment through ``environment_settings``.
"""

from __future__ import annotations

import logging
from dataclasses import fields

import click
from click.core import ParameterSource

from kubetune.entrypoints.extras import require
from kubetune.entrypoints.options import (dataset_dir_option, method_option, model_dir_option,
                                          objective_option, output_dir_option)
from kubetune.entrypoints.step import step_command
from kubetune import env
from kubetune.errors import BadInputError
from kubetune.suggest import closest
from kubetune.workspace import workspace
from kubetune.trainer.request.train_options import (DATASET_TYPES, TrainOptions,
                                                    setting_overrides, spellings_of)

log = logging.getLogger("trainer")
_OPTION_FIELDS = {f.name for f in fields(TrainOptions)}


def environment_settings(method: str | None = None
                         ) -> tuple[list[str], str | None, dict[str, str]]:
    """The overrides the `kubetune train` settings set in this process's environment stand
    for (none for a variable left unset), read by `kubetune train`'s own click options;
    KUBETUNE_METHOD's value (None: unset); and option name -> the variable that set it
    (hints then name the variable). ``method``: the one the caller runs, whose LoRA
    settings apply only to LoRA methods (default: KUBETUNE_METHOD's, else LoRA's)."""
    try:
        ctx = train.make_context("train", [])
    except click.ClickException as exc:  # a bad value in a variable: click names it
        from kubetune.entrypoints.cli import usage_message

        raise BadInputError(usage_message(exc)) from None
    given = {name: value for name, value in ctx.params.items()
             if ctx.get_parameter_source(name) == ParameterSource.ENVIRONMENT}
    named_method = given.pop("method", None)
    given.pop("objective", None)  # the run's objective (`named_objective`), not an override
    options = TrainOptions(method=method or named_method or "lora",
                           **{k: v for k, v in given.items() if k in _OPTION_FIELDS})
    set_by = {param.name: param.envvar for param in train.params
              if param.name in given and isinstance(param.envvar, str)}
    return setting_overrides(options, given.get("train_overrides_text")), named_method, set_by


def setting_variables_set() -> list[str]:
    """The variables of `kubetune train`'s settings (not the method, nor the workspace's
    directories) that this process's environment sets."""
    ctx = train.make_context("train", [], resilient_parsing=True)
    return sorted(param.envvar for param in train.params
                  if (param.name in _OPTION_FIELDS - {"method"}
                      or param.name == "train_overrides_text")
                  and ctx.get_parameter_source(param.name) == ParameterSource.ENVIRONMENT)


def run_tune(argv: list[str], dry_run: bool = False) -> int:
    """Run ``tune run <argv...>`` as Kubeflow Trainer composes it; the settings of the
    environment's ``KUBETUNE_*`` variables apply before the command's own overrides."""
    require("train", "tune run")
    # The torch stack (omegaconf, torchtune) only now: `--help` works in every image.
    from kubetune.trainer import launch
    from kubetune.trainer.planning.plan import plan
    from kubetune.trainer.request.tune_command import parse_tune_run

    request = parse_tune_run(argv)
    from_env, named_method, set_by = environment_settings()
    if from_env:
        log.info("settings from the environment: %s (the command's own key=value "
                 "arguments win)", " ".join(from_env))
    request.spellings = spellings_of(set_by, request.overrides)
    request.overrides = [*from_env, *request.overrides]
    # KUBETUNE_OBJECTIVE where set, else the recipe's: the plan resolves it, once.
    request.objective = named_objective()
    plan_ = plan(request, workspace())
    if named_method is not None and named_method != plan_.method:
        raise BadInputError(f"{env.METHOD}={named_method}, but the command runs "
                            f"{request.recipe} as {plan_.method}: the recipe and its "
                            f"arguments choose the method in `tune run`; unset {env.METHOD} "
                            f"or set it to {plan_.method}")
    return launch.run(plan_, dry_run=dry_run)


def named_objective() -> str | None:
    """The objective this process's environment names (KUBETUNE_OBJECTIVE, read by `kubetune
    train`'s own option), or None where it names none."""
    ctx = train.make_context("train", [], resilient_parsing=True)
    if ctx.get_parameter_source("objective") != ParameterSource.ENVIRONMENT:
        return None
    return ctx.params["objective"]


def run_train(model_dir: str | None = None, dataset_dir: str | None = None,
              output_dir: str | None = None, method: str | None = None,
              overrides: tuple[str, ...] = (), dry_run: bool = False,
              train_overrides_text: str | None = None,
              set_by: dict[str, str] | None = None, **options) -> int:
    """Fine-tune the model in ``model_dir`` on ``dataset_dir``; checkpoints to ``output_dir``.

    Reads what `kubetune train` reads, as it does: an argument given (not None) wins, then
    its variable (``KUBETUNE_MODEL_DIR``, ``KUBETUNE_LORA_RANK``, ...; docs/env.md), then
    the default; so a wrapper calling ``run_train()`` in a pod gets the runtime's and the
    TrainJob's settings. ``options``: `kubetune train`'s (``TrainOptions``' fields, e.g.
    ``lora_rank=8``); ``train_overrides_text``: space-separated overrides applied before
    ``overrides`` (``KUBETUNE_TRAIN_OVERRIDES``); ``set_by``: option name -> the variable or
    option that set it (hints name it)."""
    require("train", "kubetune train")
    from kubetune.trainer import launch
    from kubetune.trainer.planning.train_plan import plan_training

    given = {"model_dir": model_dir, "dataset_dir": dataset_dir, "output_dir": output_dir,
             "method": method, "train_overrides_text": train_overrides_text, **options}
    values, from_env = _with_environment(given)
    plan_ = plan_training(
        TrainOptions(method=values.pop("method"),
                     **{k: v for k, v in values.items() if k in _OPTION_FIELDS}),
        values["model_dir"], values["dataset_dir"], values["output_dir"],
        values["train_overrides_text"], overrides, set_by={**from_env, **(set_by or {})})
    return launch.run(plan_, dry_run=dry_run)


def _with_environment(given: dict) -> tuple[dict, dict[str, str]]:
    """``given`` with each value left None read as `kubetune train`'s own option reads it
    (its variable, else its default); and option name -> the variable that set it."""
    try:
        ctx = train.make_context("train", [])
    except click.ClickException as exc:  # a bad value in a variable: click names it
        from kubetune.entrypoints.cli import usage_message

        raise BadInputError(usage_message(exc)) from None
    values, from_env = dict(given), {}
    for param in train.params:
        if param.name in ("overrides", "dry_run") or values.get(param.name) is not None:
            continue
        values[param.name] = ctx.params.get(param.name)
        if ctx.get_parameter_source(param.name) == ParameterSource.ENVIRONMENT \
                and isinstance(param.envvar, str):
            from_env[param.name] = param.envvar
    return values, from_env


def _set_by(ctx: click.Context) -> dict[str, str]:
    """Option name -> the environment variable or option (as typed) that gave its value:
    a hint about the value then names what the user set."""
    named = {}
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if source is ParameterSource.ENVIRONMENT and isinstance(param.envvar, str):
            named[param.name] = param.envvar
        elif source is ParameterSource.COMMANDLINE and param.opts:
            named[param.name] = param.opts[0]
    return named


def _opt(flag: str, name: str, help_text: str, **kwargs):
    return click.option(flag, envvar=name, default=None, show_envvar=True, help=help_text,
                        **kwargs)


def _switch(flag: str, name: str, help_text: str, default_text: str = "the recipe's"):
    return click.option(f"--{flag}/--no-{flag}", envvar=name, default=None, show_envvar=True,
                        help=f"{help_text} (default: {default_text})")


class _TrainCommand(click.Command):
    """Overrides are free ``key=value`` arguments (hence ``ignore_unknown_options``), but
    an argument that starts with ``-`` is a mistyped option: click's usage error (exit 2,
    with its "did you mean"), not an override the plan would reject as exit 65."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for arg in ctx.params.get("overrides") or ():
            if arg.startswith("-"):
                name = arg.split("=", 1)[0]
                options = [flag for param in self.get_params(ctx)
                           for flag in (*param.opts, *param.secondary_opts)
                           if flag.startswith("--")]
                guess = closest(name, set(options))
                raise click.NoSuchOption(name, possibilities=[guess] if guess else None, ctx=ctx)
        return rest


@click.command("train", cls=_TrainCommand, context_settings={"ignore_unknown_options": True})
@model_dir_option
@dataset_dir_option
@output_dir_option
@method_option("Fine-tuning method")
@objective_option("What the method optimises: sft (imitate the answers), dpo (prefer the "
                  "chosen answer of preference pairs over the rejected; rso: the same with "
                  "torchtune's hinge loss) or distill (also match the logits of the teacher "
                  "in <workspace>/teacher)")
@_opt("--epochs", env.EPOCHS, "Epochs (default: the recipe's)", type=int)
@_opt("--max-steps", env.MAX_STEPS, "Maximum optimizer steps per epoch", type=int)
@_opt("--batch-size", env.BATCH_SIZE, "Per-device batch size", type=int)
@_opt("--gradient-accumulation-steps", env.GRADIENT_ACCUMULATION_STEPS,
      "Batches per optimizer step", type=int)
@_opt("--dtype", env.DTYPE, "bf16 or fp32 (bf16 falls back to fp32 where unsupported)",
      type=click.Choice(["bf16", "fp32"]))
@_opt("--learning-rate", env.LEARNING_RATE, "Peak learning rate", type=float)
@_opt("--optimizer", env.OPTIMIZER, "adamw, adam, sgd or a dotted class path")
@_opt("--lr-scheduler", env.LR_SCHEDULER, "cosine, linear, constant or a dotted path")
@_opt("--warmup-steps", env.WARMUP_STEPS, "Learning-rate warm-up steps", type=int)
@_opt("--max-seq-len", env.MAX_SEQ_LEN, "Maximum tokens per sample (and pack)", type=int)
@_switch("packing", env.PACKING, "Pack short samples into max-seq-len sequences",
         "on for CUDA with many short samples, off on CPU")
@_switch("activation-checkpointing", env.ACTIVATION_CHECKPOINTING,
         "Recompute activations in backward")
@_switch("activation-offloading", env.ACTIVATION_OFFLOADING,
         "Offload activations to CPU (CUDA only)")
@_switch("compile", env.COMPILE, "torch.compile the model and loss",
         "on for CUDA, off on CPU")
@_opt("--lora-rank", env.LORA_RANK, "LoRA rank", type=int)
@_opt("--lora-alpha", env.LORA_ALPHA, "LoRA alpha", type=float)
@_opt("--lora-dropout", env.LORA_DROPOUT, "LoRA dropout", type=float)
@_opt("--lora-target-modules", env.LORA_TARGET_MODULES,
      "Comma-separated: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head "
      f"or all-linear (also settable as JSON in {env.LORA_CONFIG})")
@_opt("--lora-config", env.LORA_CONFIG,
      'LoRA settings as PEFT-style JSON, e.g. {"r": 8, "lora_alpha": 16, "target_modules": '
      '["q_proj", "v_proj"]}; the --lora-* options win over it')
@click.option("--train-overrides", "train_overrides_text", envvar=env.TRAIN_OVERRIDES,
              default=None, show_envvar=True,
              help="Space-separated key=value overrides, applied before OVERRIDES")
@_opt("--dataset-type", env.DATASET_TYPE,
      "instruct or chat (default: recognised from the data's columns)",
      type=click.Choice(sorted(DATASET_TYPES)))
@_opt("--column-map", env.COLUMN_MAP, "Role to column, e.g. input=question,output=answer "
      "(chat: messages=<column>; plain text: text=<column>)")
@_opt("--split", env.DATASET_SPLIT, "Dataset split, e.g. train or train[:90%]")
@_opt("--system-prompt", env.SYSTEM_PROMPT, "System prompt prepended to every sample")
@_switch("train-on-input", env.TRAIN_ON_INPUT, "Also compute the loss on the prompt")
@_opt("--conversation-column", env.CONVERSATION_COLUMN, "Chat: the conversations' column")
@_opt("--conversation-style", env.CONVERSATION_STYLE, "Chat: openai or sharegpt")
@_opt("--seed", env.SEED, "Random seed", type=int)
@_opt("--save-every-n-steps", env.SAVE_EVERY_N_STEPS,
      "Also save a resumable checkpoint every N steps (default: each epoch)", type=int)
@_switch("merged-epochs", env.MERGED_EPOCHS,
         "LoRA: every epoch's save also holds the merged model, not only the last",
         "the adapter and recipe state per epoch")
@_opt("--grace-period", env.GRACE_PERIOD_S,
      "Seconds to save a checkpoint after SIGTERM (default 30)", type=float)
@_opt("--chat-template", env.CHAT_TEMPLATE,
      "Chat data's format: base (the base model's own chat template) or torchtune "
      "(torchtune's format); default base where the base model has one",
      type=click.Choice(["base", "torchtune"]))
@_opt("--token-cache-dir", env.TOKEN_CACHE_DIR,
      "Where the tokenized dataset is cached (default: <workspace>/cache/tokens, or "
      "cache/tokens beside the output directory without a workspace)")
@_opt("--val-fraction", env.VAL_FRACTION,
      "Hold out this fraction (more than 0, at most 0.5) of the training split, chosen by "
      "content, where the data ships no validation or test split", type=float)
@_opt("--val-every-n-steps", env.VAL_EVERY_N_STEPS,
      "Validation loss every N optimizer steps (default: about ten per run; 0: none)",
      type=int)
@_opt("--early-stop-patience", env.EARLY_STOP_PATIENCE,
      "Stop after N evaluations without a lower validation loss (default 0: never)",
      type=int)
@_opt("--val-prompts", env.VAL_PROMPTS,
      "Held-out prompts answered by the base and the tuned model in the run report "
      "(default 3; 0: none)", type=int)
@click.option("--dry-run", is_flag=True,
              help="Print the recipe, the merged config and the command, then exit.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@step_command("trainer")
def train(**options) -> int:
    """Fine-tune a model directly (without `tune run`).

    OVERRIDES are key=value torchtune config overrides, applied last (also from
    KUBETUNE_TRAIN_OVERRIDES, space-separated).
    """
    return run_train(set_by=_set_by(click.get_current_context()), **options)
