"""The range of each number a setting or config key may hold: one table, read by the
trainer's own check of the merged config (``kubetune.trainer.config.validate``,
``kubetune.trainer.validation.held_out_set``) and by the static check of a runtime's, a
TrainJob's or a shell's ``KUBETUNE_*`` values before any step runs
(``kubetune.tools.local.settings_check``), so the two cannot disagree. No omegaconf here:
`kubetune validate` runs without the training stack."""

from __future__ import annotations

# key -> (kind, lowest allowed, nullable). Kinds: "int" (a whole number), "float".
VALUE_RULES: dict[str, tuple[str, float, bool]] = {
    "epochs": ("int", 1, False),
    "batch_size": ("int", 1, False),
    "max_steps_per_epoch": ("int", 1, True),
    "gradient_accumulation_steps": ("int", 1, False),
    "log_every_n_steps": ("int", 1, True),
    "seed": ("int", 0, True),
    "clip_grad_norm": ("float", 0, True),
    "optimizer.lr": ("float", 0, False),
    "optimizer.weight_decay": ("float", 0, True),
    "lr_scheduler.num_warmup_steps": ("int", 0, True),
    "model.lora_rank": ("int", 1, False),
    "model.lora_alpha": ("float", 0, False),
    "model.lora_dropout": ("float", 0, False),
    "tokenizer.max_seq_len": ("int", 1, True),
    "kubetune.save_every_n_steps": ("int", 0, True),
    "kubetune.grace_period_s": ("float", 0, True),
}
# Strictly above the lowest value (a zero learning rate trains nothing).
POSITIVE = {"optimizer.lr", "model.lora_alpha"}

# The held-out data's settings (kubetune.trainer.validation.held_out_set).
FRACTION_KEY = "kubetune.val_fraction"
MAX_FRACTION = 0.5
FRACTION_RULE = f"the held-out fraction must be more than 0 and at most {MAX_FRACTION}"
# Whole numbers, 0 or more: 0 turns the feature off.
HELDOUT_COUNTS = {"run_val_every_n_steps": "10", "kubetune.early_stop_patience": "3",
                  "kubetune.val_prompts": "3"}


def number(value, kind: str):
    """``value`` as the kind a key needs; a numeric string (``lr=2e-5`` parses as one
    in YAML 1.1) is taken as its number. ValueError/TypeError when it is none."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, str):
        value = float(value.strip())
    if kind == "int":
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            value = int(value)
        if not isinstance(value, int):
            raise ValueError
        return value
    if not isinstance(value, (int, float)) or value != value:  # NaN
        raise ValueError
    return value


def rule_text(key: str) -> str:
    """What ``key`` accepts: "a whole number >= 1", "a number in [0, 1)"."""
    kind, lowest, _ = VALUE_RULES[key]
    what = "a whole number" if kind == "int" else "a number"
    bound = f"> {lowest:g}" if key in POSITIVE else f">= {lowest:g}"
    if key == "model.lora_dropout":
        bound = "in [0, 1)"
    return f"{what} {bound}"


def value_problem(key: str, value):
    """(the number ``value`` stands for, None) when ``key`` (of VALUE_RULES) may hold it;
    else (None, "must be <what it accepts>")."""
    kind, lowest, _ = VALUE_RULES[key]
    try:
        parsed = number(value, kind)
    except (TypeError, ValueError):
        return None, f"must be {rule_text(key)}"
    bad = parsed <= lowest if key in POSITIVE else parsed < lowest
    if key == "model.lora_dropout":
        bad = bad or parsed >= 1
    return (None, f"must be {rule_text(key)}") if bad else (parsed, None)


def fraction_problem(value) -> str | None:
    """None when ``value`` is a held-out fraction the trainer takes; else why not."""
    try:
        fraction = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        fraction = None
    return None if fraction is not None and 0 < fraction <= MAX_FRACTION else FRACTION_RULE


def key_problem(key: str, value) -> str | None:
    """Why ``key=value`` is refused by the trainer's range checks, or None (a key with no
    range here: None)."""
    if key in VALUE_RULES:
        return value_problem(key, value)[1]
    if key == FRACTION_KEY:
        return fraction_problem(value)
    if key in HELDOUT_COUNTS:
        try:
            parsed = number(value, "int")
        except (TypeError, ValueError):
            return "must be a whole number"
        return "must be 0 or more" if parsed < 0 else None
    return None
