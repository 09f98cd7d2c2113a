"""Where a request's config comes from: torchtune's config by name (a controller-composed
name torchtune lacks falls back to its variant's), or the user's own file; the keys the
request overrides; whether the user chose the dataset builder."""

from __future__ import annotations

from omegaconf import DictConfig

from kubetune.errors import BadInputError
from kubetune.trainer.config.recipe_config import configs_dir, load_config, resolve_config
from kubetune.trainer.request import methods

def override_keys(overrides: list[str]) -> set[str]:
    """The config keys ``overrides`` set (or remove: ``~key``)."""
    return {arg.lstrip("~").split("=", 1)[0] for arg in overrides}


def config_for(name: str) -> tuple[DictConfig, list[str]]:
    """Load ``name``; a controller-composed name torchtune lacks falls back to its variant."""
    try:
        return load_config(name), []
    except BadInputError:
        family_size, _, variant = name.partition("/")
        for suffix in sorted(methods.VARIANT_TEMPLATES, key=len, reverse=True):
            if variant.endswith(suffix) and "/" in name:
                template = methods.VARIANT_TEMPLATES[suffix]
                return load_config(template), [
                    f"config {name}: torchtune has none by that name; using {template}'s "
                    "defaults (the model comes from the checkpoint either way)"]
        raise


def user_config_file(name: str) -> bool:
    """Whether config ``name`` is the user's own file, not one torchtune ships."""
    try:
        return configs_dir() not in resolve_config(name).resolve().parents
    except BadInputError:
        return False  # a controller-composed name: the fallback is shipped too


def builder_named(user_keys: set[str], config_name: str) -> bool:
    """The user chose the dataset builder: the plan will not replace it by the data's
    shape (``dataset_shape``), so what it takes can be checked before the data is read."""
    return bool({"dataset", "dataset._component_"} & user_keys) \
        or user_config_file(config_name)
