"""Find a torchtune recipe and config by name, and merge ``key=value`` overrides.

Override semantics are torchtune's (``key=value``, ``~key`` removes, ``comp=dotted.path``
replaces a component's ``_component_``), with two repairs: values may contain ``=``
(system prompts do), which torchtune's own parser rejects, and free-text values (system
prompt, split) are kept as strings rather than parsed as YAML.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError

# Free text, taken as written: parsed as YAML, "Answer: briefly" would become a mapping.
LITERAL_KEYS = {"new_system_prompt", "split"}
# Keys that hold a component even where the config has none yet: `dataset_val=<builder>`
# (torchtune main's key) then names its _component_, as `dataset=<builder>` does.
COMPONENT_KEYS = {"dataset_val"}


def _torchtune_dir() -> Path:
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        raise BadInputError("torchtune is not installed: install kubetune[train]")
    return Path(list(spec.submodule_search_locations)[0])


@functools.lru_cache(maxsize=1)
def _registry():
    # torchtune's recipe registry is what `tune run` itself resolves names with. It is
    # loaded from its file: importing the torchtune package costs seconds (torch, torchao)
    # that the launcher would add to every start.
    path = _torchtune_dir() / "_recipe_registry.py"
    spec = importlib.util.spec_from_file_location("kubetune_torchtune_registry", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_all_recipes()


def _recipes_root() -> Path:
    # Beside the torchtune package, where torchtune's own `tune run` looks (the directory
    # refuses to be imported as a package).
    return _torchtune_dir().parent / "recipes"


def configs_dir() -> Path:
    """Where torchtune's shipped configs live."""
    return _recipes_root() / "configs"


def resolve_recipe(name: str) -> tuple[Path, bool]:
    """Return the recipe's script path and whether it supports distributed runs."""
    for recipe in _registry():
        if recipe.name == name:
            return _recipes_root() / recipe.file_path, recipe.supports_distributed
    path = Path(name)
    if path.suffix == ".py" and path.is_file():
        return path.resolve(), True
    raise BadInputError(
        f"unknown recipe {name!r}: name one of torchtune's recipes (see `tune ls`) or a .py file"
    )


def resolve_config(name: str) -> Path:
    """Return the YAML file for a built-in config name (``llama3_2/1B_lora``) or a path."""
    for recipe in _registry():
        for config in recipe.configs:
            if config.name == name:
                return _recipes_root() / "configs" / config.file_path
    path = Path(name)
    if path.is_file():
        return path
    raise BadInputError(
        f"unknown config {name!r}: name one of torchtune's configs (see `tune ls`) or a YAML file"
    )


def load_config(name: str) -> DictConfig:
    path = resolve_config(name)
    try:
        return OmegaConf.load(path)
    except Exception as exc:  # OmegaConf raises a zoo of parser errors
        raise BadInputError(f"config {path}: not valid YAML ({exc})") from None


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """Apply torchtune-style ``key=value`` overrides to ``cfg`` (a copy is returned)."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    dotlist = []
    literal: list[tuple[str, str]] = []
    for arg in overrides:
        if arg.startswith("~"):
            key = arg[1:].split("=", 1)[0]
            if not _remove(cfg, key):
                raise BadInputError(f"override {arg!r}: no key {key!r} in the config to remove")
            continue
        if "=" not in arg:
            raise BadInputError(f"override {arg!r}: config overrides take the form key=value")
        key, value = arg.split("=", 1)
        if key.rsplit(".", 1)[-1] in LITERAL_KEYS:
            literal.append((key, value))
            continue
        node = OmegaConf.select(cfg, key, default=None)
        if (isinstance(node, DictConfig) and "_component_" in node) or (
                key in COMPONENT_KEYS and node is None):
            key = f"{key}._component_"
        dotlist.append(f"{key}={value}")
    try:
        cli = OmegaConf.from_dotlist(dotlist)
    except Exception as exc:
        raise BadInputError(f"config overrides could not be parsed: {exc}") from None
    merged = OmegaConf.merge(cfg, cli)
    for key, value in literal:
        OmegaConf.update(merged, key, value, merge=False, force_add=True)
    return merged


def set_value(cfg: DictConfig, key: str, value) -> None:
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def _remove(cfg: DictConfig, dotpath: str) -> bool:
    *parents, leaf = dotpath.split(".")
    node = cfg
    for part in parents:
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node[part]
    if isinstance(node, DictConfig) and leaf in node:
        del node[leaf]
        return True
    return False
