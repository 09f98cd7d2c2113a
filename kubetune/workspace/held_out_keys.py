"""The numbers an evaluation records beside ``val_loss`` and ``val_tokens``, by objective,
under one name each in the validation record (``validation_record``), ``metrics.jsonl``
and the user's logger, and ``summary.json``'s ``validation`` as ``base_<stem>``,
``best_<stem>`` and ``last_<stem>``; and how every reader shows them (progress line,
TrainJob status, report, curves, the exporter's manifest and model card).

DPO (``trainer/validation/preference_held_out.py``): reward accuracy (torchtune's strict ``chosen > rejected``),
mean margin, mean chosen and rejected rewards; ``val_loss`` is the pairs' DPO loss.
Distillation (``trainer/validation/distill_held_out.py``): the KD term; ``val_loss`` is the student's
cross-entropy, as SFT's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeldOutNumber:
    key: str  # in the record and metrics.jsonl; the TrainJob status's name too
    label: str  # on the progress line and in the report
    stem: str  # summary.json's base_<stem>, best_<stem>, last_<stem>
    digits: int  # decimals shown


REWARD_ACCURACY = HeldOutNumber("val_reward_accuracy", "reward acc", "reward_accuracy", 2)
REWARD_MARGIN = HeldOutNumber("val_reward_margin", "margin", "reward_margin", 4)
CHOSEN_REWARD = HeldOutNumber("val_chosen_reward", "chosen", "chosen_reward", 4)
REJECTED_REWARD = HeldOutNumber("val_rejected_reward", "rejected", "rejected_reward", 4)
KD_LOSS = HeldOutNumber("val_kd_loss", "kd", "kd_loss", 4)
PREFERENCE = (REWARD_ACCURACY, REWARD_MARGIN, CHOSEN_REWARD, REJECTED_REWARD)
DISTILLATION = (KD_LOSS,)
ALL = PREFERENCE + DISTILLATION
# Counted, not measured: the held-out pairs an evaluation read.
PAIRS = "val_pairs"


def present(evaluation: dict) -> list[HeldOutNumber]:
    """The numbers ``evaluation`` (a record's entry or a metrics line) holds."""
    return [n for n in ALL if isinstance(evaluation.get(n.key), (int, float))
            and not isinstance(evaluation.get(n.key), bool)]


def shown(number: HeldOutNumber, value: float) -> str:
    return f"{number.label} {float(value):.{number.digits}f}"


def in_summary(validation: dict | None) -> dict[str, dict[str, float | None]]:
    """``summary.json``'s ``validation`` -> {key: {"base", "best", "last"}} of the numbers
    it holds."""
    v = validation or {}
    return {n.key: {when: v.get(f"{when}_{n.stem}") for when in ("base", "best", "last")}
            for n in ALL if any(v.get(f"{w}_{n.stem}") is not None
                                for w in ("base", "best", "last"))}
