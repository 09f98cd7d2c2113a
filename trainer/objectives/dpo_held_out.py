"""A preference run's (DPO, RSO) held-out set, planned: the one ``held_out_set.plan``
chose (the data's ``validation`` or ``test`` split, ``--val-fraction``, or the user's
``dataset_val``), read as preference pairs. In the recipe process each evaluation measures those pairs as the
DPO recipe measures a step (``kubetune.trainer.validation.preference_held_out``).

The split's copy of the training section already names our preference builder
(``dpo.choose_builder`` ran on it), but carries ``packed=False`` (SFT's held-out rows are
never packed), which the preference builder would pass on to ``load_dataset``; a user's
``dataset_val`` naming torchtune's generic ``preference_dataset`` is read by ours, as the
training section is.
"""

from __future__ import annotations

from omegaconf import DictConfig

# {name}: the objective's, upper-cased (DPO, RSO); the loss is the run's own.
MEASURES = ("validation under {name}: the held-out pairs' {name} loss, reward accuracy, "
            "margin and chosen/rejected rewards, at the base, every N steps and at the end (at "
            "the base the policy is its reference: rewards and margin 0, accuracy 0)")


def plan(cfg: DictConfig, objective: str, builder: str, replaceable: tuple[str, ...]
         ) -> list[str]:
    """Fit the held-out section to the preference builder (``builder``, in place of one of
    ``replaceable``: the objective's, ``dpo``'s); the line saying what ``objective``
    measures (none without a held-out set)."""
    val = cfg.get("dataset_val")
    if not isinstance(val, DictConfig) or (cfg.get("kubetune") or {}).get("validation") is None:
        return []
    val.pop("packed", None)
    if str(val.get("_component_", "")) in replaceable:
        val._component_ = builder
    return [MEASURES.format(name=objective.upper())]
