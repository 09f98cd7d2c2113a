"""The merged config as written where others read it (the output volume, a user's own
metric logger): the user and password of every URL in a value masked.

An override may carry credentials (``metric_logger.tracking_uri=http://user:pass@host``);
the recipe needs them as given, the saved copy that the exporter, the report and anyone
with the volume read does not. That copy also holds what the recipe ran where it fitted a
planned value (``record_ran``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from kubetune.redact import strip_userinfo


def masked(value: Any) -> Any:
    """``value`` (a string, or dicts and lists of them) with every URL's user and password
    masked: for any record of config values written where others read it."""
    if isinstance(value, str):
        return strip_userinfo(value)
    if isinstance(value, dict):
        return {key: masked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [masked(item) for item in value]
    return value


def without_credentials(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` whose string values hold no URL credentials (interpolations
    kept as written)."""
    return OmegaConf.create(masked(OmegaConf.to_container(cfg, resolve=False)))


def has_credentials(cfg: DictConfig) -> bool:
    """Whether any value of ``cfg`` holds a URL's user or password."""
    return (OmegaConf.to_container(without_credentials(cfg), resolve=False)
            != OmegaConf.to_container(cfg, resolve=False))


# Where the saved config says which of its values the recipe fitted, and from what.
FITTED_KEY = "fitted"


def record_ran(config_path: Path, key: str, ran: Any) -> None:
    """The saved config at ``config_path`` made to hold ``ran`` at ``key`` (dotted): the
    value the recipe ran where it fitted the planned one (a warm-up capped to the run's
    steps, an evaluation cadence resolved), so the exporter's card and anyone reading the
    volume see what ran. The planned value stays under ``kubetune.fitted`` (``as_planned``
    puts it back where a config is compared with a new plan)."""
    from kubetune.atomic_write import write_atomic

    if not config_path.is_file():
        return
    saved = OmegaConf.create(config_path.read_text())
    planned = OmegaConf.select(saved, key, default=None)
    if planned == ran:
        return
    fitted = list(OmegaConf.to_container(saved, resolve=False).get("kubetune", {})
                  .get(FITTED_KEY) or [])
    earlier = next((entry for entry in fitted if entry.get("key") == key), None)
    if earlier is None:
        fitted.append({"key": key, "planned": planned, "ran": ran})
    else:
        earlier["ran"] = ran  # the first planned value is the plan's
    OmegaConf.update(saved, key, ran, merge=False)
    OmegaConf.update(saved, f"kubetune.{FITTED_KEY}", fitted, merge=False)
    write_atomic(config_path, OmegaConf.to_yaml(saved))


def as_planned(saved: dict) -> dict:
    """A saved config (a dict, as ``parse_config`` reads it) with the recipe's fits undone:
    the plan it was written from, for comparing with a new plan (a fit is not a change
    the user made)."""
    fitted = (saved.get("kubetune") or {}).get(FITTED_KEY) or []
    if not fitted:
        return saved
    cfg = OmegaConf.create(saved)
    for entry in fitted:
        OmegaConf.update(cfg, entry["key"], entry["planned"], merge=False)
    cfg.kubetune.pop(FITTED_KEY)
    return OmegaConf.to_container(cfg, resolve=False)
