"""Catch typos in ``key=value`` overrides before anything starts.

OmegaConf merges any key, and torchtune's recipes read only the keys they know, so
``epochz=1`` would be kept and ignored, and our model section would drop
``model.lora_rnk=5``: a run that trains with settings the user did not ask for. A key
close to a known one is a typo (exit 65, naming the key it is close to); keys under a
component (``model.``, ``dataset.``, ``optimizer.`` ...) are checked against the
parameters of the component that will really be built; any other unknown top-level key
is an error too, naming the nearest key there is (``lora_rank`` -> ``model.lora_rank``).
Only a recipe file of the user's own keeps it to a warning: it may read keys we cannot see.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from kubetune.suggest import closest
from kubetune.errors import BadInputError
from kubetune.trainer.config.component_params import component_params, missing_component

# Top-level keys the launcher itself reads or writes, whatever the recipe.
LAUNCHER_KEYS = {"kubetune", "output_dir", "device", "dtype", "metric_logger",
                 "resume_from_checkpoint", "log_peak_memory_stats", "compile", "seed",
                 # torchtune main's validation keys: the recipe process reads them
                 # (kubetune.trainer.recipe_process.held_out) where torchtune 0.6.1's do not.
                 "dataset_val", "run_val_every_n_steps"}
# Sections that are dataset components: `datasets.load_dataset`'s keys are theirs too.
DATASET_SECTIONS = {"dataset", "dataset_val"}
# Sections whose keys the launcher rebuilds from the checkpoint (tokenizer, checkpointer)
# or owns (kubetune): their keys are checked there, not here.
OWN_SECTIONS = {"kubetune", "tokenizer", "checkpointer"}
# What every torchtune dataset builder passes on to `datasets.load_dataset`.
LOAD_DATASET_KEYS = {"data_dir", "data_files", "split", "name", "revision", "cache_dir",
                     "streaming", "num_proc", "keep_in_memory", "trust_remote_code",
                     "verification_mode", "storage_options", "features", "field"}
# `cfg` itself, not `profiler_cfg` (a section's keys are not top-level ones).
_CFG_READ = re.compile(r"""(?<![\w.])cfg(?:\.get\(\s*|\[\s*)["'](\w+)["']|(?<![\w.])cfg\.(\w+)""")
_TOP_LEVEL = re.compile(r"^(\w+):", re.MULTILINE)


@functools.lru_cache(maxsize=8)
def _recipe_reads(recipe_path: str) -> frozenset[str]:
    try:
        text = Path(recipe_path).read_text(encoding="utf-8")
    except OSError:
        return frozenset()
    return frozenset(a or b for a, b in _CFG_READ.findall(text)) - {"get"}


@functools.lru_cache(maxsize=1)
def _shipped_config_keys(configs_dir: str) -> frozenset[str]:
    """Top-level keys of every config torchtune ships: a recipe may read one of them
    without a literal ``cfg.<key>`` in its file (through a helper)."""
    keys: set[str] = set()
    for path in Path(configs_dir).rglob("*.yaml"):
        try:
            keys.update(_TOP_LEVEL.findall(path.read_text(encoding="utf-8")))
        except OSError:
            continue
    return frozenset(keys)


def _component_keys(*sections) -> tuple[set[str], bool]:
    """Parameters of the components the sections name; True when any is open-ended
    (``**kwargs``) or unreadable, so that only near-misses can be called typos."""
    keys: set[str] = set()
    open_ended = False
    for section in sections:
        if not isinstance(section, DictConfig) or "_component_" not in section:
            continue
        params = component_params(str(section["_component_"]))
        if params is None or params.var_kwargs:
            open_ended = True
        if params is not None:
            keys |= set(params.defaults)
    return keys, open_ended


def check(user_keys: list[str], base: DictConfig, cfg: DictConfig, recipe_path: Path,
          configs_dir: Path) -> list[str]:
    """Raise on a typo among ``user_keys`` (override keys, as written); return warnings.

    ``base``: the config before the overrides; ``cfg``: the planned config, whose
    components are the ones that will be built.
    """
    known_top = (set(base.keys()) | LAUNCHER_KEYS | _recipe_reads(str(recipe_path))
                 | _shipped_config_keys(str(configs_dir)))
    warnings: list[str] = []
    for key in user_keys:
        if not key.lstrip("~") or "" in key.lstrip("~").split("."):
            # OmegaConf takes "model.=3" or "=3" without a word, and nothing reads it.
            raise BadInputError(f"override key {key!r} has an empty part: write "
                                "section.key=value (e.g. optimizer.lr=2e-4)")
    for key in dict.fromkeys(k.lstrip("~") for k in user_keys):
        _check_list_value(key, base, cfg)
        top, _, rest = key.partition(".")
        if top not in known_top:
            if _own_recipe(recipe_path, configs_dir):
                warnings.append(f"warning: key {key} is not in the config and no recipe "
                                "reads it: it has no effect unless your recipe does")
                continue
            guess = nearest_key(key, cfg, known_top)
            if guess is not None:
                raise BadInputError(f"unknown key {key} (did you mean {guess}?)")
            raise BadInputError(f"unknown key {key}: the config has no {top} and the recipe "
                                "reads none, so nothing would use it; check the spelling "
                                "(`tune cat <config>` lists a config's keys)")
        sub = rest.split(".", 1)[0]
        if not sub or sub == "_component_" or top in OWN_SECTIONS:
            continue
        sections = [base.get(top), cfg.get(top)]
        if top == "metric_logger" and isinstance(cfg.get(top), DictConfig):
            sections.append(cfg.metric_logger.get("also"))  # the user's logger, kept
        params, open_ended = _component_keys(*sections)
        if not params:
            continue
        if top in DATASET_SECTIONS:
            params |= LOAD_DATASET_KEYS
        if sub in params:
            continue
        guess = closest(sub, params)
        if guess is not None:
            raise BadInputError(f"unknown key {key} (did you mean {top}.{guess}?)")
        if top == "model" and not open_ended:
            component = cfg.model.get("_component_")
            raise BadInputError(f"unknown key {key}: {component} takes no {sub} "
                                f"(it takes {', '.join(sorted(params))})")
    check_components(cfg)
    return warnings


def _own_recipe(recipe_path: Path, configs_dir: Path) -> bool:
    """A recipe file of the user's, not one of torchtune's (they sit beside its configs)."""
    return Path(configs_dir).resolve().parent not in Path(recipe_path).resolve().parents


def _key_paths(node, where: str = ""):
    """Every dotted key under ``node``, and each component's parameters under its key."""
    if not isinstance(node, DictConfig):
        return
    if "_component_" in node:
        params, _ = _component_keys(node)
        yield from (f"{where}.{p}" for p in params)
    for key in node.keys():
        path = f"{where}.{key}" if where else str(key)
        yield path
        yield from _key_paths(node._get_node(key), path)


def nearest_key(key: str, cfg: DictConfig, known_top: set[str]) -> str | None:
    """The key ``key`` most likely stands for: one of the same name deeper in the config
    (``lora_rank`` -> ``model.lora_rank``), a top-level key a typo away (``epochz`` ->
    ``epochs``), else a deeper one a typo away."""
    top, _, rest = key.partition(".")
    leaf = key.rsplit(".", 1)[-1]
    paths = {p for p in _key_paths(cfg) if "_component_" not in p}
    same_name = sorted((p for p in paths if p.rsplit(".", 1)[-1] == leaf and p != key),
                       key=lambda p: (p.count("."), p))
    if same_name:
        return same_name[0]
    guess = closest(top, known_top)
    if guess is not None:
        return ".".join([guess, rest]) if rest else guess
    by_leaf = {p.rsplit(".", 1)[-1]: p for p in sorted(paths, key=len, reverse=True)}
    near = closest(leaf, set(by_leaf))
    return by_leaf[near] if near is not None else None


def _check_list_value(key: str, base: DictConfig, cfg: DictConfig) -> None:
    """A list option given one bare word (``model.lora_attn_modules=q_proj``) is a string
    that code iterating it reads letter by letter; torchtune fails late or not at all."""
    before = OmegaConf.select(base, key, default=None)
    now = OmegaConf.select(cfg, key, default=None)
    if isinstance(before, ListConfig) and isinstance(now, str):
        raise BadInputError(f"{key}={now}: must be a list, e.g. {key}=[{now}] or "
                            f"{key}=[a,b]")


def _suggest(name: str, names: set[str]) -> str | None:
    same_case = [n for n in names if n.lower() == name.lower()]
    return same_case[0] if same_case else closest(name, names)


def _components(node, where: str):
    if isinstance(node, DictConfig):
        for key in node.keys():
            value = node._get_node(key)
            path = f"{where}.{key}" if where else str(key)
            if key == "_component_" and not OmegaConf.is_interpolation(node, key):
                yield path, node.get(key)
            else:
                yield from _components(value, path)
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node):
            yield from _components(item, f"{where}[{i}]")


def check_components(cfg: DictConfig) -> None:
    """Every ``_component_`` names a class or function that exists: a misspelled one
    (``torch.optim.AdamWW``, ``torch.optim.adamw``, the module) fails inside the recipe
    after seconds of start-up, as a traceback."""
    for path, component in _components(cfg, ""):
        if not isinstance(component, str):
            continue
        missing = missing_component(component)
        if missing is None:
            if path.split(".")[0] in DATASET_SECTIONS:
                # A user's builder; a library a shipped config names (bitsandbytes' 8-bit
                # optimizer) is the plan's to replace where it is not installed.
                _check_import(path, component)
            continue
        why, names = missing
        module, _, name = component.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        hint = ""
        if names and why.startswith("no module"):
            guess = _suggest(component.split(".")[0], names)
            hint = f" (did you mean {guess}{component[len(component.split('.')[0]):]}?)" \
                if guess else ""
        elif names and why.startswith("there is no module"):
            guess = _suggest(leaf, names)
            hint = f" (did you mean {parent}.{guess}.{name}?)" if guess else ""
        elif names:
            guess = _suggest(name, names)
            hint = f" (did you mean {module}.{guess}?)" if guess else ""
        raise BadInputError(f"{path}={component}: {why}{hint}")


def _check_import(path: str, component: str) -> None:
    """A user's module (a builder) imported as the recipe will import it: one line with
    the cause where it does not import."""
    from kubetune.trainer.config.component_import import import_problem, users_module

    module = users_module(component)
    cause = import_problem(module) if module else None
    if cause is not None:
        raise BadInputError(f"{path}={component}: cannot import {module}: {cause}; install "
                            f"it in the trainer image or put its directory on the trainer's "
                            "PYTHONPATH")


def check_rebuilt_sections(user_keys: list[str], cfg: DictConfig) -> None:
    """Override keys under the sections the launcher rebuilds from the checkpoint
    (tokenizer, checkpointer), checked against the components it built: a typo there is
    dropped silently or fails in the recipe's constructor."""
    for key in dict.fromkeys(k.lstrip("~") for k in user_keys):
        top, _, rest = key.partition(".")
        sub = rest.split(".", 1)[0]
        if top not in ("tokenizer", "checkpointer") or not sub or sub == "_component_":
            continue
        params, open_ended = _component_keys(cfg.get(top))
        if not params or open_ended or sub in params:
            continue
        guess = closest(sub, params)
        hint = f"did you mean {top}.{guess}?" if guess else \
            f"{cfg[top]['_component_']} takes {', '.join(sorted(params))}"
        raise BadInputError(f"unknown key {key} ({hint})")
