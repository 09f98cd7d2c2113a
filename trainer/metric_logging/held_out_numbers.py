"""An objective's own held-out numbers (``held_out_keys``: a DPO run's reward accuracy and
margins, a distillation run's KD term) as ``summary.json``, the report, the model card and
the finished run's status give them: at the base (step 0), at the best evaluation (the
lowest ``val_loss``) and at the last."""

from __future__ import annotations

from typing import Any, Mapping

from kubetune.workspace import held_out_keys
from kubetune.workspace.validation_record import ValidationRecord

# Why a DPO run's base numbers read as they do: the report says it beside them.
PREFERENCE_BASE_NOTE = (
    "At the base (step 0) the policy is its own reference, so every reward and the margin "
    "are 0 by construction, the loss is ln 2 (0.6931) and the reward accuracy is 0 under "
    "torchtune's strict comparison (chosen > rejected); the change from there is the "
    "signal.")
WHEN = ("base", "best", "last")


def summary_fields(record: ValidationRecord) -> dict[str, Any]:
    """``base_<stem>``, ``best_<stem>``, ``last_<stem>`` of each number the evaluations
    hold (none for SFT)."""
    evaluations = {"base": record.base, "best": record.best, "last": record.last}
    found = {n for e in evaluations.values() if e for n in held_out_keys.present(e)}
    fields: dict[str, Any] = {}
    for number in held_out_keys.ALL:
        if number not in found:
            continue
        for when, evaluation in evaluations.items():
            value = (evaluation or {}).get(number.key)
            fields[f"{when}_{number.stem}"] = float(value) if value is not None else None
    return fields


def numbers_in(v: Mapping[str, Any]) -> list[held_out_keys.HeldOutNumber]:
    """The numbers a ``summary.json`` ``validation`` section holds."""
    return [n for n in held_out_keys.ALL if any(v.get(f"{w}_{n.stem}") is not None
                                                 for w in WHEN)]


def _value(v: Mapping[str, Any], when: str, number: held_out_keys.HeldOutNumber) -> str:
    value = v.get(f"{when}_{number.stem}")
    return "?" if value is None else f"{float(value):.{number.digits}f}"


def change_text(v: Mapping[str, Any]) -> str | None:
    """``reward acc 0.00 -> 0.83, margin 0.0000 -> 0.4123, ...`` (base -> last), or None."""
    parts = [f"{n.label} {_value(v, 'base', n)} -> {_value(v, 'last', n)}"
             for n in numbers_in(v)]
    return ", ".join(parts) if parts else None


def is_preference(v: Mapping[str, Any]) -> bool:
    return held_out_keys.REWARD_ACCURACY in numbers_in(v)


def table_cells(v: Mapping[str, Any], when: str) -> list[str]:
    """The report table's extra cells of one row (base, best or last)."""
    return [_value(v, when, n) for n in numbers_in(v)]


def table_heads(v: Mapping[str, Any]) -> list[str]:
    return [f"held-out {n.label}" for n in numbers_in(v)]
