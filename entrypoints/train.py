"""`kubetune train` (direct use) and `run_tune` (the `tune run` Kubeflow Trainer sends).

`kubetune train` turns its options into the same `key=value` overrides a TrainJob's args
carry, picks the recipe for the method and the topology (``PET_*``) as the controller
would, and runs it through the same launcher as `tune run`.
"""

from __future__ import annotations

import difflib
import json
import shlex
from pathlib import Path

import click

from kubetune.entrypoints.options import dataset_dir_option, model_dir_option, output_dir_option
from kubetune.entrypoints.step import step_command
from kubetune import env
from kubetune.errors import BadInputError
from kubetune.workspace import Workspace, workspace
from kubetune.trainer import launch, topology
from kubetune.trainer.methods import METHOD_NAMES, recipe_for
from kubetune.trainer.tune_command import TuneRunRequest, parse_tune_run


def run_tune(argv: list[str], dry_run: bool = False) -> int:
    """Run ``tune run <argv...>`` as Kubeflow Trainer composes it."""
    return launch.run(launch.plan(parse_tune_run(argv), workspace()), dry_run=dry_run)


OPTIMIZERS = {"adamw": "torch.optim.AdamW", "adam": "torch.optim.Adam", "sgd": "torch.optim.SGD"}
COSINE = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"
SCHEDULERS = {"cosine": COSINE, "constant": COSINE,
              "linear": "kubetune.trainer.schedules.linear_schedule_with_warmup"}
DATASET_TYPES = {"instruct": "torchtune.datasets.instruct_dataset",
                 "chat": "torchtune.datasets.chat_dataset"}
# PEFT / Hugging Face module names -> torchtune's.
_ATTENTION_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj",
                      "o_proj": "output_proj", "output_proj": "output_proj"}
_MLP_MODULES = {"gate_proj", "up_proj", "down_proj", "mlp", "w1", "w2", "w3"}
_OUTPUT_MODULES = {"lm_head", "output"}


def lora_target_overrides(modules: list[str]) -> list[str]:
    attention, mlp, output = [], False, False
    for name in (m.strip() for m in modules if m.strip()):
        if name in _ATTENTION_MODULES:
            attention.append(_ATTENTION_MODULES[name])
        elif name in _MLP_MODULES:
            mlp = True
        elif name in _OUTPUT_MODULES:
            output = True
        elif name == "all-linear":
            attention += ["q_proj", "k_proj", "v_proj", "output_proj"]
            mlp = output = True
        else:
            raise BadInputError(f"LoRA target module {name!r} is not one of q_proj, k_proj, "
                                "v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head, "
                                "all-linear")
    if not attention:
        raise BadInputError("LoRA target modules must include an attention projection "
                            "(q_proj, k_proj, v_proj or o_proj)")
    unique = list(dict.fromkeys(attention))
    return [f"model.lora_attn_modules=[{','.join(unique)}]",
            f"model.apply_lora_to_mlp={mlp}", f"model.apply_lora_to_output={output}"]


def lora_config_overrides(text: str) -> list[str]:
    """The PEFT-style JSON form: LORA_CONFIG='{"r": 4, "lora_alpha": 16}'."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise BadInputError(f"{env.LORA_CONFIG} is not a JSON object ({exc}): e.g. "
                            '{"r": 8, "lora_alpha": 16}') from None
    keys = {"r": "model.lora_rank", "lora_rank": "model.lora_rank",
            "lora_alpha": "model.lora_alpha", "alpha": "model.lora_alpha",
            "lora_dropout": "model.lora_dropout", "dropout": "model.lora_dropout",
            "use_dora": "model.use_dora"}
    # JSON types are exact: "8" is not a rank, and would reach the recipe as a string.
    kinds = {"model.lora_rank": (int,), "model.lora_alpha": (int, float),
             "model.lora_dropout": (int, float), "model.use_dora": (bool,)}
    out = []
    for key, value in data.items():
        if key in ("target_modules", "lora_target_modules"):
            modules = value if isinstance(value, list) else str(value).split(",")
            out += lora_target_overrides([str(m) for m in modules])
        elif key in keys:
            kind = kinds[keys[key]]
            if not isinstance(value, kind) or (bool not in kind and isinstance(value, bool)):
                raise BadInputError(f"{env.LORA_CONFIG} {key}={json.dumps(value)}: must be "
                                    f"{'true or false' if bool in kind else 'a number'}, "
                                    'e.g. {"r": 8, "lora_alpha": 16}')
            out.append(f"{keys[key]}={value}")
        else:
            raise BadInputError(f"{env.LORA_CONFIG} key {key!r} is not one of r, lora_alpha, "
                                "lora_dropout, target_modules, use_dora")
    return out


def _column_map(text: str) -> str:
    """JSON ({"input": "question"}) or input=question,output=answer -> a config value."""
    text = text.strip()
    try:
        mapping = json.loads(text) if text.startswith("{") else dict(
            pair.split("=", 1) for pair in text.split(",") if pair.strip())
    except ValueError:
        raise BadInputError(f"column map {text!r}: use input=question,output=answer or "
                            'JSON {"input": "question"}') from None
    return "{" + ", ".join(f"'{k.strip()}': '{str(v).strip()}'" for k, v in mapping.items()) + "}"


def train_overrides(options: dict) -> list[str]:
    """The `key=value` overrides that ``options`` (click's, or defaults) stand for."""
    o = options
    args: list[str] = []

    def put(key: str, value) -> None:
        if value is not None:
            args.append(f"{key}={value}")

    put("epochs", o.get("epochs"))
    put("max_steps_per_epoch", o.get("max_steps"))
    put("batch_size", o.get("batch_size"))
    put("gradient_accumulation_steps", o.get("gradient_accumulation_steps"))
    put("dtype", o.get("dtype"))
    put("seed", o.get("seed"))
    if o.get("optimizer"):
        put("optimizer", OPTIMIZERS.get(o["optimizer"], o["optimizer"]))
    put("optimizer.lr", o.get("learning_rate"))
    if o.get("lr_scheduler"):
        put("lr_scheduler._component_", SCHEDULERS.get(o["lr_scheduler"], o["lr_scheduler"]))
        if o["lr_scheduler"] == "constant":
            put("lr_scheduler.num_cycles", 0.0)
    put("lr_scheduler.num_warmup_steps", o.get("warmup_steps"))
    put("tokenizer.max_seq_len", o.get("max_seq_len"))
    put("dataset.packed", o.get("packing"))
    put("enable_activation_checkpointing", o.get("activation_checkpointing"))
    put("enable_activation_offloading", o.get("activation_offloading"))
    put("compile", o.get("compile"))
    if o.get("method", "lora") != "full":
        if o.get("lora_config"):
            args += lora_config_overrides(o["lora_config"])
        put("model.lora_rank", o.get("lora_rank"))
        put("model.lora_alpha", o.get("lora_alpha"))
        put("model.lora_dropout", o.get("lora_dropout"))
        if o.get("lora_target_modules"):
            args += lora_target_overrides(o["lora_target_modules"].split(","))
    dataset_type = o.get("dataset_type") or "instruct"
    if dataset_type not in DATASET_TYPES:
        raise BadInputError(f"dataset type {dataset_type!r} is not one of instruct, chat")
    put("dataset", DATASET_TYPES[dataset_type])
    put("dataset.split", o.get("split"))
    if o.get("column_map"):
        put("dataset.column_map", _column_map(o["column_map"]))
    if dataset_type == "chat":
        put("dataset.conversation_column", o.get("conversation_column") or "messages")
        put("dataset.conversation_style", o.get("conversation_style") or "openai")
        put("dataset.new_system_prompt", o.get("system_prompt"))
    else:
        put("dataset.new_system_prompt", o.get("system_prompt"))
    put("dataset.train_on_input", o.get("train_on_input"))
    put("kubetune.save_every_n_steps", o.get("save_every_n_steps"))
    put("kubetune.grace_period_s", o.get("grace_period"))
    return args


def split_overrides(text: str | None) -> list[str]:
    """``KUBETUNE_TRAIN_OVERRIDES``: overrides as a shell would split them."""
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise BadInputError(f"{env.TRAIN_OVERRIDES} cannot be split into key=value overrides "
                            f"({exc}): quote each value whole, e.g. "
                            "dataset.new_system_prompt='Answer briefly.'") from None


def run_train(model_dir: str, dataset_dir: str, output_dir: str, method: str = "lora",
              overrides: tuple[str, ...] = (), dry_run: bool = False,
              train_overrides_text: str | None = None, **options) -> int:
    """Fine-tune the model in ``model_dir`` on ``dataset_dir``; checkpoints to ``output_dir``.

    ``train_overrides_text``: space-separated overrides applied before ``overrides``
    (``KUBETUNE_TRAIN_OVERRIDES``)."""
    topo = topology.resolve(TuneRunRequest("", ""), "cuda")
    recipe, config, implied = recipe_for(method, topo)
    extra = split_overrides(train_overrides_text)
    args = [f"output_dir={output_dir}", f"checkpointer.checkpoint_dir={model_dir}", *implied,
            *train_overrides({"method": method, **options}), *extra, *overrides]
    ws = workspace()
    ws = Workspace(ws.root, dataset_dir=Path(dataset_dir), model_dir=Path(model_dir),
                   output_dir=Path(output_dir), export_dir=ws.export_dir)
    request = TuneRunRequest(recipe=recipe, config=config, overrides=args)
    return launch.run(launch.plan(request, ws), dry_run=dry_run)


def _opt(flag: str, name: str, help_text: str, **kwargs):
    return click.option(flag, envvar=name, default=None, show_envvar=False,
                        help=f"{help_text} [env: {name}]", **kwargs)


def _switch(flag: str, name: str, help_text: str, default_text: str = "the recipe's"):
    return click.option(f"--{flag}/--no-{flag}", envvar=name, default=None,
                        help=f"{help_text} (default: {default_text}) [env: {name}]")


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
                raise click.NoSuchOption(
                    name, possibilities=difflib.get_close_matches(name, options), ctx=ctx)
        return rest


@click.command("train", cls=_TrainCommand, context_settings={"ignore_unknown_options": True})
@model_dir_option
@dataset_dir_option
@output_dir_option
@click.option("--method", envvar=env.METHOD, default="lora", show_default=True,
              type=click.Choice(METHOD_NAMES), help=f"Fine-tuning method [env: {env.METHOD}]")
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
@_switch("packing", env.PACKING, "Pack short samples into max-seq-len sequences")
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
              default=None, help="Space-separated key=value overrides, applied before "
              f"OVERRIDES [env: {env.TRAIN_OVERRIDES}]")
@_opt("--dataset-type", env.DATASET_TYPE, "instruct or chat",
      type=click.Choice(sorted(DATASET_TYPES)))
@_opt("--column-map", env.COLUMN_MAP, "Role to column, e.g. input=question,output=answer")
@_opt("--split", env.DATASET_SPLIT, "Dataset split, e.g. train or train[:90%]")
@_opt("--system-prompt", env.SYSTEM_PROMPT, "System prompt prepended to every sample")
@_switch("train-on-input", env.TRAIN_ON_INPUT, "Also compute the loss on the prompt")
@_opt("--conversation-column", env.CONVERSATION_COLUMN, "Chat: the conversations' column")
@_opt("--conversation-style", env.CONVERSATION_STYLE, "Chat: openai or sharegpt")
@_opt("--seed", env.SEED, "Random seed", type=int)
@_opt("--save-every-n-steps", env.SAVE_EVERY_N_STEPS,
      "Also save a resumable checkpoint every N steps (default: each epoch)", type=int)
@_opt("--grace-period", env.GRACE_PERIOD_S,
      "Seconds to save a checkpoint after SIGTERM (default 30)", type=float)
@click.option("--dry-run", is_flag=True,
              help="Print the recipe, the merged config and the command, then exit.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@step_command("trainer")
def train(**options) -> int:
    """Fine-tune a model directly (without `tune run`).

    OVERRIDES are key=value torchtune config overrides, applied last (also from
    KUBETUNE_TRAIN_OVERRIDES, space-separated).
    """
    return run_train(**options)
