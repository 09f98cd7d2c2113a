"""Which held-out set a run measures on, decided before launch.

In order: the user's own ``dataset_val`` (torchtune main's key: they asked for it by
name), else the data's own ``validation`` split, else its ``test`` split (never the split
trained on), else, when asked (KUBETUNE_VAL_FRACTION), a fraction of the training split
held out by the rows' content (``kubetune.trainer.data.held_out_rows``: every rank and resume
agree, and the recipe process drops those rows from training). The result is written
into the merged config, which is all the recipe process reads (``dataset_val``,
``run_val_every_n_steps``, ``kubetune.validation``, ``kubetune.holdout``), and the
split trained on with its rows into ``kubetune.data`` (for summary.json and the report).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from kubetune import env
from kubetune.errors import BadInputError
from kubetune.trainer.config.component_params import component_params
from kubetune.trainer.data import dataset_check, dataset_location, held_out_rows
from kubetune.trainer.data.dataset_check import DatasetSample
from kubetune.trainer.request.spelling import spelling
# The fraction's range is shared with the static check of a runtime's settings.
from kubetune.trainer.request.value_rules import (FRACTION_KEY, FRACTION_RULE,  # noqa: F401
                                                  MAX_FRACTION, fraction_problem)

# The kubetune section's keys the settings write (`kubetune train`'s options).
PATIENCE_KEY = "kubetune.early_stop_patience"
PROMPTS_KEY = "kubetune.val_prompts"
# The held-out answers' token budget each (a config key only: a demo or test on a real
# model on CPU keeps its answers short).
MAX_NEW_TOKENS_KEY = "kubetune.val_max_new_tokens"
EVERY_KEY = "run_val_every_n_steps"
DEFAULT_PROMPTS = 3
DEFAULT_MAX_NEW_TOKENS = 64
# The data's own held-out splits, the first one present wins.
HELDOUT_SPLITS = ("validation", "test")
# The dataset line's held-out clause begins with one of these (``_describe``).
_VALIDATION_ON = "; validation on"
_NO_HELD_OUT = "; no held-out set"


def _number(cfg: DictConfig, key: str, spellings: dict[str, str], kind: type,
            example: str):
    value = OmegaConf.select(cfg, key, default=None)
    if value is None:
        return None
    name = spelling(spellings, key)
    try:
        number = kind(value)
        if isinstance(value, bool) or (kind is int and number != float(value)):
            raise ValueError
    except (TypeError, ValueError):
        raise BadInputError(f"{name.assign(str(value))}: must be "
                            f"{'a whole number' if kind is int else 'a number'}, e.g. "
                            f"{name.assign(example)}") from None
    if number < 0:
        raise BadInputError(f"{name.assign(str(value))}: must be 0 or more, e.g. "
                            f"{name.assign(example)}")
    return number


def fraction_of(cfg: DictConfig, spellings: dict[str, str]) -> float | None:
    """KUBETUNE_VAL_FRACTION's value, checked: in (0, 0.5]."""
    value = OmegaConf.select(cfg, FRACTION_KEY, default=None)
    if value is None:
        return None
    name = spelling(spellings, FRACTION_KEY)
    if fraction_problem(value) is not None:
        raise BadInputError(f"{name.assign(str(value))}: {FRACTION_RULE}, e.g. "
                            f"{name.assign('0.1')}")
    return float(value)


def _as_component(node) -> DictConfig | None:
    """``dataset_val`` as one dataset component (``dataset_val=<builder>`` gives a name)."""
    if node is None:
        return None
    if isinstance(node, str):
        return OmegaConf.create({"_component_": node})
    if isinstance(node, ListConfig):
        raise BadInputError("dataset_val is a list: give one dataset component (its "
                            "_component_ and its keys), as dataset takes")
    if not isinstance(node, DictConfig) or not node.get("_component_"):
        raise BadInputError("dataset_val names no builder: set dataset_val=<builder> too, "
                            "e.g. dataset_val=torchtune.datasets.instruct_dataset")
    return node


def _rows_text(found: DatasetSample | None, rows: int | None = None) -> str:
    """``rows`` (default: all ``found`` counted), said as exactly as they were counted."""
    rows = found.total_rows if found is not None and rows is None else rows
    if found is None or rows is None:
        return "rows not counted"
    return f"{'' if found.rows_exact else 'about '}{rows} rows"


def _checked(val_cfg: DictConfig, what: str, spellings: dict[str, str]) -> DatasetSample | None:
    """The held-out set's rows, checked as the training set's are: a held-out split that
    holds no row, or not the columns the builder reads, is the user's to fix."""
    found = dataset_check.sample(val_cfg)
    if found is None:
        return None
    if found.total_rows == 0 or (found.total_rows is None and not found.rows):
        raise BadInputError(f"the held-out {what} holds no rows ({found.files[0].name}): "
                            "remove its files, or give another one (dataset_val)")
    try:
        dataset_check.check_columns(val_cfg, found, spellings)
    except BadInputError as exc:
        raise BadInputError(f"the held-out {what}: {exc.message}") from None
    return found


def _name_split(dataset) -> None:
    """``dataset.split`` written out (the builder's default, ``train``), so the merged
    config says which split is trained on; only for a builder that takes one."""
    if not isinstance(dataset, DictConfig) or dataset.get("split") is not None:
        return
    params = component_params(str(dataset.get("_component_", "")))
    if params is not None and "split" in params.defaults:
        dataset.split = str(params.defaults["split"] or "train")


def _copy_for(dataset: DictConfig, split: str) -> DictConfig:
    """The training dataset's section reading ``split``, never packed: validation's loss
    must not depend on how rows share a pack."""
    val = OmegaConf.create(OmegaConf.to_container(dataset, resolve=False))
    val.split = split
    val.packed = False
    return val


def _choose(cfg: DictConfig, dataset_dir: Path, fraction: float | None,
            spellings: dict[str, str]) -> tuple[DictConfig | None, str | None, str | None,
                                               list[str]]:
    """(dataset_val, source, held-out split name, notes)."""
    dataset = cfg.get("dataset")
    train_split = str(dataset.get("split") or "train") if isinstance(dataset, DictConfig) \
        else None
    given = _as_component(cfg.get("dataset_val"))
    if given is not None:
        notes = dataset_location.locate(given, dataset_dir, "dataset_val")
        if given.get("split") is not None:
            dataset_check.check_split(given, "dataset_val.split")
        if fraction is not None:
            notes.append(f"{spelling(spellings, FRACTION_KEY).name} not used: dataset_val "
                         "names the held-out set")
        split = given.get("split")
        return given, "config", None if split is None else str(split), notes
    if not isinstance(dataset, DictConfig):
        if fraction is not None:
            raise BadInputError(f"{spelling(spellings, FRACTION_KEY).name}: dataset is a list "
                                "of datasets; hold data out with dataset_val instead")
        return None, None, None, []
    trained = set(dataset_check.split_names(train_split))
    present = dataset_check.splits(dataset) if isinstance(
        dataset.get("data_files"), DictConfig) else set()
    held = next((s for s in HELDOUT_SPLITS if s in present and s not in trained), None)
    if held is not None:
        notes = [] if fraction is None else [
            f"{spelling(spellings, FRACTION_KEY).name} not used: the data ships a {held} "
            "split, held out instead"]
        return _copy_for(dataset, held), "split", held, notes
    if fraction is not None:
        return _copy_for(dataset, train_split), "fraction", None, []
    return None, None, None, []


def _describe(train_split: str | None, found: DatasetSample | None, source: str | None,
              held: str | None, fraction: float | None, val_found: DatasetSample | None
              ) -> tuple[str, int | None, bool, int | None]:
    """The dataset line, the training rows, whether they are exact, the held-out rows."""
    rows = None if found is None else dataset_check.split_rows(train_split, found.total_rows)
    exact = bool(found is not None and found.rows_exact)
    sliced = rows != (None if found is None else found.total_rows)
    train = f"dataset: training on split '{train_split}'"
    if source == "fraction" and rows is not None:
        counted = held_out_rows.count_held_out(found.files, fraction, rows) \
            if exact and not sliced else None
        taken = round(rows * fraction) if counted is None else counted
        about = "" if counted is not None else "about "
        line = (f"{train} ({about}{rows - taken} of its {rows} rows){_VALIDATION_ON} "
                f"a held-out {fraction:.0%} of it ({about}{taken} rows, chosen by content)")
        return line, rows - taken, counted is not None, taken
    line = f"{train} ({_rows_text(found, rows)})"
    val_rows = None if val_found is None else val_found.total_rows
    if source == "split":
        line += f"{_VALIDATION_ON} split '{held}' ({_rows_text(val_found)})"
    elif source == "config":
        where = f" split '{held}'" if held else ""
        line += f"{_VALIDATION_ON} dataset_val{where} ({_rows_text(val_found)})"
    elif source == "fraction":
        line += f"{_VALIDATION_ON} a held-out {fraction:.0%} of it (chosen by content)"
    else:
        line += (f"{_NO_HELD_OUT} (no validation or test split besides the one trained "
                 f"on; --val-fraction 0.1 or {env.VAL_FRACTION}=0.1 holds a tenth out)")
    return line, rows, exact, val_rows


def _larger_than_training(val_rows: int | None, train_rows: int | None) -> list[str]:
    if val_rows is None or train_rows is None or val_rows <= train_rows:
        return []
    return [f"warning: the held-out set ({val_rows} rows) is larger than the training set "
            f"({train_rows} rows): check that the splits are not swapped (dataset.split)"]


def plan(cfg: DictConfig, dataset_dir: Path, found: DatasetSample | None,
         spellings: dict[str, str]) -> list[str]:
    """Choose the held-out set and write it, the validation settings and the split trained
    on into ``cfg``; ``found``: the training split's sample. Returns the log lines."""
    if cfg.get("dataset") is None:
        return []
    _name_split(cfg.dataset)
    fraction = fraction_of(cfg, spellings)
    every = _number(cfg, EVERY_KEY, spellings, int, "10")
    patience = _number(cfg, PATIENCE_KEY, spellings, int, "3")
    prompts = _number(cfg, PROMPTS_KEY, spellings, int, "3")
    max_new_tokens = _number(cfg, MAX_NEW_TOKENS_KEY, spellings, int, "16")
    val_cfg, source, held, notes = _choose(cfg, dataset_dir, fraction, spellings)
    dataset = cfg.get("dataset")
    train_split = str(dataset.get("split") or "train") if isinstance(dataset, DictConfig) \
        else None
    val_found = None
    if val_cfg is not None and source != "fraction":
        what = f"split '{held}'" if source == "split" else "dataset_val"
        val_found = _checked(val_cfg, what, spellings)
    line, train_rows, exact, val_rows = _describe(train_split, found, source, held,
                                                  fraction, val_found)
    if train_split is not None:  # a list of datasets: each says its own split
        notes.append(line)
    notes += _larger_than_training(val_rows, train_rows)
    if source == "config" and found is not None and val_found is not None \
            and set(found.files) == set(val_found.files):
        notes.append(f"warning: dataset_val reads the files trained on (split "
                     f"'{train_split}'): its loss measures rows the model learns; set "
                     "dataset_val.split to a split not trained on")
    cfg.kubetune.data = {"split": train_split, "rows": train_rows, "rows_exact": exact}
    if val_cfg is None:
        if every or patience:
            notes.append("no held-out set: run_val_every_n_steps and early stopping have "
                         "nothing to measure")
        return notes
    cfg.dataset_val = val_cfg
    cfg.run_val_every_n_steps = every
    cfg.kubetune.validation = {
        "source": source, "split": held if source != "fraction" else None,
        "train_split": train_split, "fraction": fraction if source == "fraction" else None,
        "early_stop_patience": patience or 0,
        "prompts": DEFAULT_PROMPTS if prompts is None else prompts,
        "max_new_tokens": DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None
        else max_new_tokens}
    if source == "fraction":
        cfg.kubetune.holdout = {"fraction": fraction}
    return notes
