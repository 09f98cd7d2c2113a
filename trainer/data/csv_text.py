"""A CSV's columns read as text.

A CSV cannot say that a column of numbers is text: ``datasets`` reads ``2`` and ``4`` in an
answer column as integers, which torchtune's transforms cannot put in a message. Every
column of a CSV dataset is read as a string, through ``datasets``' own ``features``
(``{"column": {"dtype": "string", "_type": "Value"}}``, which ``load_dataset`` takes as a
dict), unless the user set ``dataset.features`` themselves.
"""

from __future__ import annotations

from omegaconf import DictConfig

from kubetune.trainer.data.dataset_check import DatasetSample

_AS_TEXT = {"dtype": "string", "_type": "Value"}


def read_as_text(dataset_cfg: DictConfig, found: DatasetSample) -> None:
    """Set ``dataset.features`` so that every column of a CSV dataset reads as text."""
    if "features" in dataset_cfg or not found.files or not found.columns:
        return
    if any(path.suffix.lower() != ".csv" for path in found.files):
        return
    dataset_cfg.features = {column: dict(_AS_TEXT) for column in found.columns}
