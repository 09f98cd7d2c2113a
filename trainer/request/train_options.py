"""`kubetune train`'s options -> the `tune run` request they stand for: the `key=value`
overrides a TrainJob's args would carry. The click surface is `entrypoints/train.py`; the
recipe the method needs on the topology (``PET_*``), chosen as the controller would, and the
plan are ``kubetune.trainer.planning.train_plan``'s (they need the rooms above this one).

`train_overrides` is the one mapping of these settings to overrides, on every path: the
options of `kubetune train`, and their ``KUBETUNE_*`` variables where no option is given
(`tune run` and `kubetune local` read them through the same click options:
``kubetune.entrypoints.train.environment_settings``).
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass

from kubetune import env
from kubetune.errors import BadInputError

OPTIMIZERS = {"adamw": "torch.optim.AdamW", "adam": "torch.optim.Adam", "sgd": "torch.optim.SGD"}
COSINE = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"
SCHEDULERS = {"cosine": COSINE, "constant": COSINE,
              "linear": "kubetune.trainer.schedules.linear_schedule_with_warmup"}
DATASET_TYPES = {"instruct": "torchtune.datasets.instruct_dataset",
                 "chat": "torchtune.datasets.chat_dataset"}
log = logging.getLogger("trainer")
# PEFT / Hugging Face module names -> torchtune's.
_ATTENTION_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj",
                      "o_proj": "output_proj", "output_proj": "output_proj"}
# Phi-3 / Phi-4 fuse q/k/v (qkv_proj) and gate/up (gate_up_proj) in Hugging Face's
# layout: a PEFT config for them names those; torchtune trains the parts.
_FUSED_ATTENTION = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
_MLP_MODULES = {"gate_proj", "up_proj", "down_proj", "gate_up_proj", "mlp", "w1", "w2", "w3"}
_OUTPUT_MODULES = {"lm_head", "output"}


@dataclass(frozen=True)
class TrainOptions:
    """What `kubetune train` was asked for; None: the recipe's default."""
    method: str = "lora"
    objective: str = "sft"  # what the method optimises (kubetune.trainer.objectives.registry)
    epochs: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    dtype: str | None = None
    learning_rate: float | None = None
    optimizer: str | None = None
    lr_scheduler: str | None = None
    warmup_steps: int | None = None
    max_seq_len: int | None = None
    packing: bool | None = None
    activation_checkpointing: bool | None = None
    activation_offloading: bool | None = None
    compile: bool | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_target_modules: str | None = None
    lora_config: str | None = None
    dataset_type: str | None = None
    column_map: str | None = None
    split: str | None = None
    system_prompt: str | None = None
    train_on_input: bool | None = None
    conversation_column: str | None = None
    conversation_style: str | None = None
    seed: int | None = None
    save_every_n_steps: int | None = None
    merged_epochs: bool | None = None
    grace_period: float | None = None
    token_cache_dir: str | None = None
    chat_template: str | None = None
    val_fraction: float | None = None
    val_every_n_steps: int | None = None
    early_stop_patience: int | None = None
    val_prompts: int | None = None


# Options that become one override as they are: (config key, option).
_PLAIN_OVERRIDES = (
    ("epochs", "epochs"), ("max_steps_per_epoch", "max_steps"), ("batch_size", "batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"), ("dtype", "dtype"),
    ("seed", "seed"))
_MEMORY_OVERRIDES = (
    ("tokenizer.max_seq_len", "max_seq_len"), ("dataset.packed", "packing"),
    ("enable_activation_checkpointing", "activation_checkpointing"),
    ("enable_activation_offloading", "activation_offloading"), ("compile", "compile"))
_LORA_OVERRIDES = (
    ("model.lora_rank", "lora_rank"), ("model.lora_alpha", "lora_alpha"),
    ("model.lora_dropout", "lora_dropout"))

# Held-out data: planned from these keys (kubetune.trainer.validation.held_out_set);
# run_val_every_n_steps is torchtune main's own key.
_VALIDATION_OVERRIDES = (
    ("kubetune.val_fraction", "val_fraction"), ("run_val_every_n_steps", "val_every_n_steps"),
    ("kubetune.early_stop_patience", "early_stop_patience"),
    ("kubetune.val_prompts", "val_prompts"))


# Options that set one config key (the others set several, or none as given).
OPTION_KEYS = {option: key for key, option in (
    *_PLAIN_OVERRIDES, *_MEMORY_OVERRIDES, *_LORA_OVERRIDES,
    ("optimizer.lr", "learning_rate"), ("lr_scheduler.num_warmup_steps", "warmup_steps"),
    ("dataset.column_map", "column_map"), ("dataset.split", "split"),
    ("dataset.new_system_prompt", "system_prompt"), ("dataset.train_on_input", "train_on_input"),
    ("dataset.conversation_column", "conversation_column"),
    ("dataset.conversation_style", "conversation_style"),
    ("kubetune.save_every_n_steps", "save_every_n_steps"),
    ("kubetune.merged_epochs", "merged_epochs"),
    ("kubetune.grace_period_s", "grace_period"),
    ("kubetune.token_cache_dir", "token_cache_dir"), ("kubetune.chat_template", "chat_template"),
    *_VALIDATION_OVERRIDES)}


def lora_target_overrides(modules: list[str]) -> list[str]:
    """PEFT target module names -> torchtune's LoRA model overrides."""
    attention, mlp, output = [], False, False
    for name in (m.strip() for m in modules if m.strip()):
        if name in _ATTENTION_MODULES:
            attention.append(_ATTENTION_MODULES[name])
        elif name in _FUSED_ATTENTION:
            attention += _FUSED_ATTENTION[name]
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
                                "all-linear (Phi-3/Phi-4: qkv_proj, gate_up_proj)")
    if not attention:
        raise BadInputError("LoRA target modules must include an attention projection "
                            "(q_proj, k_proj, v_proj, o_proj; Phi-3/Phi-4: qkv_proj)")
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


def train_overrides(options: TrainOptions) -> list[str]:
    """The `key=value` overrides that ``options`` stand for; an option left None sets
    nothing."""
    o = options
    args: list[str] = []

    def put(key: str, value) -> None:
        if value is not None:
            args.append(f"{key}={value}")

    def put_all(table: tuple[tuple[str, str], ...]) -> None:
        for key, option in table:
            put(key, getattr(o, option))

    put_all(_PLAIN_OVERRIDES)
    if o.optimizer:
        put("optimizer", OPTIMIZERS.get(o.optimizer, o.optimizer))
    put("optimizer.lr", o.learning_rate)
    if o.lr_scheduler:
        put("lr_scheduler._component_", SCHEDULERS.get(o.lr_scheduler, o.lr_scheduler))
        if o.lr_scheduler == "constant":
            put("lr_scheduler.num_cycles", 0.0)
    put("lr_scheduler.num_warmup_steps", o.warmup_steps)
    put_all(_MEMORY_OVERRIDES)
    if o.method != "full":
        if o.lora_config:
            args += lora_config_overrides(o.lora_config)
        put_all(_LORA_OVERRIDES)
        if o.lora_target_modules:
            args += lora_target_overrides(o.lora_target_modules.split(","))
    else:
        _warn_lora_settings_unused(o)
    # No dataset type: the config's default builder stands, and the plan replaces it with
    # the one the data's columns need (`kubetune.trainer.data.dataset_shape`).
    if o.dataset_type is not None and o.dataset_type not in DATASET_TYPES:
        raise BadInputError(f"dataset type {o.dataset_type!r} is not one of instruct, chat")
    put("dataset", DATASET_TYPES.get(o.dataset_type or ""))
    put("dataset.split", o.split)
    if o.column_map:
        put("dataset.column_map", _column_map(o.column_map))
    chat = o.dataset_type == "chat"
    put("dataset.conversation_column", o.conversation_column or ("messages" if chat else None))
    put("dataset.conversation_style", o.conversation_style or ("openai" if chat else None))
    put("dataset.new_system_prompt", o.system_prompt)
    put("dataset.train_on_input", o.train_on_input)
    put("kubetune.save_every_n_steps", o.save_every_n_steps)
    put("kubetune.merged_epochs", o.merged_epochs)
    put("kubetune.grace_period_s", o.grace_period)
    put("kubetune.token_cache_dir", o.token_cache_dir)
    put("kubetune.chat_template", o.chat_template)
    put_all(_VALIDATION_OVERRIDES)
    return args


def _warn_lora_settings_unused(o: TrainOptions) -> None:
    """A runtime's LoRA defaults (its env) stay set when a TrainJob switches the method to
    full: not an error, but never without a word."""
    given = [name for name in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules",
                               "lora_config") if getattr(o, name) is not None]
    if given:
        log.warning("method full trains every weight: the LoRA settings given (%s) are not "
                    "used", ", ".join(given))


def setting_overrides(options: TrainOptions, overrides_text: str | None) -> list[str]:
    """What the settings given stand for, on a path whose command already names its config
    (`tune run`, `kubetune local`): their overrides, then ``KUBETUNE_TRAIN_OVERRIDES``'
    (``overrides_text``)."""
    return [*train_overrides(options), *split_overrides(overrides_text)]


def split_overrides(text: str | None) -> list[str]:
    """``KUBETUNE_TRAIN_OVERRIDES``: overrides as a shell would split them."""
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise BadInputError(f"{env.TRAIN_OVERRIDES} cannot be split into key=value overrides "
                            f"({exc}): quote each value whole, e.g. "
                            "dataset.new_system_prompt='Answer briefly.'") from None


def spellings_of(set_by: dict[str, str], later: list[str]) -> dict[str, str]:
    """Config key -> the variable or option that set it, from ``set_by`` (option name ->
    that setting), for the keys no override in ``later`` sets again."""
    overridden = {arg.lstrip("~").split("=", 1)[0].removesuffix("._component_")
                  for arg in later}
    return {OPTION_KEYS[option]: setting for option, setting in set_by.items()
            if option in OPTION_KEYS and OPTION_KEYS[option] not in overridden}
