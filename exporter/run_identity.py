"""What the exported run was, as the manifest and the model card say it: the objective
(SFT, DPO, RSO, distillation), the method, the reference (DPO) or teacher (distillation) and
the held-out numbers, read from the trainer's ``summary.json`` (its ``objective`` and
``validation`` sections; ``kubetune.workspace.held_out_keys`` names the numbers)."""

from __future__ import annotations

from typing import Any, Mapping

from kubetune.workspace import held_out_keys

# How the card's title names what was done to the base.
TITLE_KINDS = {"sft": "fine-tune", "dpo": "DPO fine-tune", "rso": "RSO fine-tune",
               "distill": "distillation"}
OBJECTIVE_NAMES = {"sft": "supervised fine-tuning (SFT)",
                   "dpo": "direct preference optimization (DPO) on chosen/rejected pairs",
                   "rso": "preference optimization with RSO's hinge loss on chosen/rejected "
                          "pairs",
                   "distill": "knowledge distillation from a teacher's logits"}
_VAL_KEYS = ("source", "split", "rows", "base_val_loss", "best_val_loss", "best_step",
             "last_val_loss", "last_step")


def objective(summary: Mapping[str, Any]) -> str:
    """The run's objective; "sft" for a run whose summary names none (an older trainer)."""
    found = (summary.get("objective") or {}).get("name")
    return found if isinstance(found, str) else "sft"


def title_kind(summary: Mapping[str, Any]) -> str:
    return TITLE_KINDS.get(objective(summary), "fine-tune")


def held_out(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The held-out numbers: loss base/best/last and the objective's own."""
    v = summary.get("validation")
    if not isinstance(v, Mapping):
        return None
    out = {key: v.get(key) for key in _VAL_KEYS}
    out.update(held_out_keys.in_summary(dict(v)))
    return out


def manifest_fields(summary: Mapping[str, Any], method: str) -> dict[str, Any]:
    """The manifest's ``objective`` (name, method, recipe, loss, reference or teacher) and
    ``held_out``."""
    section = dict(summary.get("objective") or {})
    section.setdefault("name", objective(summary))
    section["method"] = method
    return {"objective": section, "held_out": held_out(summary)}


def _model(entry: Any) -> str:
    if not isinstance(entry, Mapping):
        return "?"
    named = entry.get("name")
    where = entry.get("checkpoint_dir")
    return f"`{named}`" + (f" (`{where}`)" if where else "") if named else f"`{where}`"


def card_lines(summary: Mapping[str, Any]) -> list[str]:
    """The card's lines on the objective and its reference or teacher."""
    name = objective(summary)
    section = summary.get("objective") or {}
    lines = [f"- objective: {OBJECTIVE_NAMES.get(name, name)}"]
    reference = section.get("reference")
    if isinstance(reference, Mapping):  # a preference run's
        lines.append(f"- reference model: {reference.get('kind')}, {_model(reference)}")
    if section.get("teacher"):  # a distillation run's
        lines.append(f"- teacher: {_model(section.get('teacher'))}")
    return lines


def held_out_lines(summary: Mapping[str, Any]) -> list[str]:
    """The objective's own held-out numbers (a DPO run's rewards, a distillation's KD
    term): base, best and last."""
    lines = []
    own = held_out_keys.in_summary(dict(summary.get("validation") or {}))
    for number in held_out_keys.ALL:
        if number.key in own:
            at = {when: "?" if value is None else f"{value:.{number.digits}f}"
                  for when, value in own[number.key].items()}
            lines.append(f"- held-out {number.label}: base {at['base']}, best {at['best']} "
                         f"(at the lowest held-out loss), last {at['last']}")
    return lines
