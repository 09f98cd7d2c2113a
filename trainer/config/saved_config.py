"""The merged config as written where others read it (the output volume, a user's own
metric logger): the user and password of every URL in a value masked.

An override may carry credentials (``metric_logger.tracking_uri=http://user:pass@host``);
the recipe needs them as given, the saved copy that the exporter, the report and anyone
with the volume read does not.
"""

from __future__ import annotations

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
