"""The dataset's column map (role -> the user's column): read from the config, checked
against the data's columns, and written back the way the user wrote it.

A runtime user sets ``KUBETUNE_COLUMN_MAP=input=question,output=answer`` (or `kubetune
train --column-map`), which reaches the config as ``dataset.column_map``; a hint telling
them to "set dataset.column_map={...}" names a key they never wrote: each hint here is
written in the syntax of the setting the map came from (``Spelling``).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kubetune.errors import BadInputError
from kubetune.suggest import closest
from kubetune.trainer.request.spelling import Spelling

KEY = "dataset.column_map"
BY_KEY = Spelling(KEY)


def write(spelling: Spelling, mapping: dict[str, str]) -> str:
    """Setting the column map to ``mapping`` as the user would write it: pairs for an
    option or variable (``input=question,output=answer``), a dict for the key."""
    if spelling.is_key:
        return spelling.assign("{" + ", ".join(f"'{k}': '{v}'" for k, v in mapping.items())
                               + "}")
    return spelling.assign(",".join(f"{k}={v}" for k, v in mapping.items()))


def nearest(column: str, columns: list[str]) -> str | None:
    """The existing column a missing one is a typo of (a case slip first)."""
    same_case = [c for c in columns if c.lower() == column.lower()]
    return same_case[0] if same_case else closest(column, set(columns))


def read(dataset_cfg: DictConfig) -> dict[str, str]:
    """The map the dataset section holds ({} for none)."""
    column_map = dataset_cfg.get("column_map")
    column_map = OmegaConf.to_container(column_map) if isinstance(column_map, DictConfig) \
        else (column_map or {})
    if not isinstance(column_map, dict):
        raise BadInputError(f"{KEY} must map a role to a column, e.g. "
                            f"{{'input': 'question', 'output': 'answer'}}; got {column_map!r}")
    return column_map


def check_columns_exist(mapping: dict[str, str], columns: list[str], file_name: str,
                        spelling: Spelling = BY_KEY) -> None:
    """Every column the map names is one of ``columns``: a missing one is named, with the
    existing column it is closest to, in the syntax the map was given in."""
    for role, column in mapping.items():
        if not isinstance(column, str) or column in columns:
            continue
        guess = nearest(column, columns)
        fixed = {**mapping, role: guess or "<column>"}
        raise BadInputError(
            f"dataset {file_name} has no column {column!r} ({spelling.name} maps {role} to "
            f"it{f'; did you mean {guess!r}?' if guess else ''}); its columns are "
            f"{', '.join(columns)}: set {write(spelling, fixed)}")
