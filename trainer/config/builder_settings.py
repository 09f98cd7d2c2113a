"""A dataset builder receives only the keys its signature takes.

torchtune calls ``dataset._component_`` with every key of the section, so a setting made
for torchtune's builders (``KUBETUNE_SYSTEM_PROMPT`` -> ``new_system_prompt``,
``KUBETUNE_COLUMN_MAP`` -> ``column_map``, ``packed``...) reaches a user's builder too, and
its ``**kwargs`` hands it to ``datasets.load_dataset``, which fails on it in the recipe
(exit 70). A key counts as taken when the builder names the parameter, or when it is one of
``load_dataset``'s keys and the builder has ``**kwargs`` to pass them on. Any other key:

- set by the user (an option, a variable, an override, their own config file): refused in
  one line (exit 65) that names the setting as they wrote it and the builder;
- ours or a shipped config's default (``packed: False``, a default turned on by the speed
  rules): left out, said in a note when it asked for something.

``packed=False`` the user set is left out too: it asks the builder for nothing.
"""

from __future__ import annotations

from omegaconf import DictConfig

from kubetune.errors import BadInputError
from kubetune.trainer.config.component_params import ComponentParams, component_params
from kubetune.trainer.config.config_keys import LOAD_DATASET_KEYS
from kubetune.trainer.request.spelling import spelling

SECTIONS = ("dataset", "dataset_val")


def takes(params: ComponentParams, key: str) -> bool:
    """Whether a builder with ``params`` accepts ``key``."""
    # `source` is load_dataset's first argument: a builder forwarding **kwargs to
    # torchtune's (which names it) takes it as it takes load_dataset's keywords.
    return key in params.defaults or (params.var_kwargs and (key in LOAD_DATASET_KEYS
                                                             or key == "source"))


def builder_takes(section: object, key: str) -> bool:
    """Whether the builder ``section`` names takes ``key``; False where that cannot be
    read: a default of ours is then not added."""
    if not isinstance(section, DictConfig) or "_component_" not in section:
        return False
    params = component_params(str(section["_component_"]))
    return params is not None and takes(params, key)


def _refusal(name: str, key: str, component: str, how: str) -> str:
    if name.startswith("KUBETUNE_"):
        drop = "unset it"
    elif name.startswith("-"):
        drop = "leave the option out"
    else:
        drop = f"remove {how}"
    return (f"{name}: {component} takes no {key}; {drop}, or accept {key} in the "
            "builder")


def fit(cfg: DictConfig, user_keys: set[str], spellings: dict[str, str],
        users_config: bool) -> list[str]:
    """Leave each dataset section with only the keys its builder takes, or raise for a
    key the user set that it does not (``users_config``: the config file is the user's
    own, so its keys are theirs). Returns the notes on keys left out."""
    notes: list[str] = []
    for top in SECTIONS:
        section = cfg.get(top)
        if not isinstance(section, DictConfig) or "_component_" not in section:
            continue
        component = str(section["_component_"])
        params = component_params(component)
        if params is None:
            continue  # its source cannot be read: nothing can be told
        for key in [str(k) for k in section.keys() if k != "_component_"]:
            if takes(params, key):
                continue
            value = section.get(key)
            asked = value not in (None, False) and not (key == "packed" and not value)
            path = f"{top}.{key}"
            if asked and (path in user_keys or users_config):
                said = spelling(spellings, path)
                raise BadInputError(_refusal(said.name, key, component, path))
            del section[key]
            if asked:
                notes.append(f"{path}={value} left out: {component} takes no {key}")
    return notes
