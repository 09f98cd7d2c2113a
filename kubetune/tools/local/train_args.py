"""The trainer arguments `kubetune local` runs with: the demo's defaults, then the user's.

The demo's defaults are sized for the embedded tiny model and the tiny addition dataset
(a learning rate of 3e-3 suits a 2-layer, 64-wide model and would wreck a real one; ten
warm-up steps suit a run of a few dozen steps). So each default belongs to the demo part it
was sized for, and applies only while that part is in use:

- the tiny model's (`DEMO_MODEL_ARGS`): learning rate, LoRA rank/alpha and LoRA on the
  output layer; gone with ``--model``;
- the demo dataset's (`DEMO_DATASET_ARGS`): its builder and split, and the run's length
  (epochs, batch size, warm-up, measured in that dataset's steps); gone with ``--dataset``;
- `COMMON_ARGS` (a fixed seed: a local try-out is repeatable) apply to every run.

The trainer settings of the environment (``KUBETUNE_LORA_RANK=2``, as `kubetune train`
and `tune run` read them) win over these defaults, and the user's ``key=value`` arguments
over both, key by key: a default is dropped when the user
sets the same key (``dataset`` and ``dataset._component_`` are one key, as torchtune's
override parser reads them) or deletes it or its section (``~key``); every other default
stays. LoRA-only defaults are left out for ``--method full``, whose model takes no rank.
"""

from __future__ import annotations

# No alpha: the trainer keeps the config's alpha/rank ratio (2) for rank 8, and for any
# rank the user sets instead.
DEMO_MODEL_ARGS = ["optimizer.lr=3e-3", "model.lora_rank=8", "model.apply_lora_to_output=True"]
DEMO_DATASET_ARGS = ["dataset=torchtune.datasets.instruct_dataset", "dataset.split=train",
                     "epochs=3", "batch_size=8", "gradient_accumulation_steps=1",
                     "lr_scheduler.num_warmup_steps=10"]
COMMON_ARGS = ["seed=0"]
# The whole demo's: enough steps for the loss to fall clearly, in seconds on two CPU cores.
DEMO_TRAIN_ARGS = DEMO_DATASET_ARGS + DEMO_MODEL_ARGS + COMMON_ARGS
_LORA_ONLY_PREFIX = "model.lora_"
_LORA_ONLY = {"model.apply_lora_to_output", "model.apply_lora_to_mlp"}


def arg_key(arg: str) -> str:
    """The config key an override sets: ``dataset`` for ``dataset._component_=x`` too."""
    key = arg.lstrip("~").split("=", 1)[0]
    return key.removesuffix("._component_")


def _lora_only(arg: str) -> bool:
    key = arg_key(arg)
    return key.startswith(_LORA_ONLY_PREFIX) or key in _LORA_ONLY


def merge(defaults: list[str], user_args: list[str]) -> list[str]:
    """``defaults`` the user did not set or delete, then ``user_args`` as given."""
    set_keys = {arg_key(a) for a in user_args if not a.startswith("~")}
    deleted = {arg_key(a) for a in user_args if a.startswith("~")}

    def overridden(arg: str) -> bool:
        key = arg_key(arg)
        return key in set_keys or any(key == d or key.startswith(d + ".") for d in deleted)

    return [a for a in defaults if not overridden(a)] + list(user_args)


def demo_defaults(demo_model: bool, demo_dataset: bool, method: str) -> list[str]:
    """The defaults that apply to a run with these demo parts and ``method``."""
    defaults = (DEMO_DATASET_ARGS if demo_dataset else []) + \
        (DEMO_MODEL_ARGS if demo_model else []) + COMMON_ARGS
    if method == "full":
        defaults = [a for a in defaults if not _lora_only(a)]
    return defaults


def effective_train_args(user_args: list[str], demo_model: bool, demo_dataset: bool,
                         method: str, setting_args: list[str] = ()) -> list[str]:
    """What the trainer gets: the demo defaults that apply, the overrides of the
    environment's settings (``setting_args``) winning over them, the user's args over
    both."""
    settings_first = merge(demo_defaults(demo_model, demo_dataset, method), list(setting_args))
    return merge(settings_first, user_args)
