"""The preference builder ``kubetune.trainer.objectives.preference_data.preference_dataset``:
torchtune's ``PreferenceDataset`` with a message transform that reads every shape
``preference_rows`` knows, and rows DPO cannot learn from (an empty answer, chosen equal
to rejected) dropped and counted before the recipe samples them.

It takes the arguments of torchtune's ``preference_dataset`` (``column_map`` maps
``prompt``, ``chosen`` and ``rejected``), so a config written for that builder runs
with this one unchanged.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from kubetune.errors import BadInputError
from kubetune.trainer.data import row_counts, row_origin
from kubetune.trainer.data.row_counts import COUNTS_ATTRIBUTE
from kubetune.trainer.objectives import preference_rows

log = logging.getLogger("trainer")
# What the pairs' tokens depend on besides this file: part of the token cache's key.
TOKENS_DEPEND_ON = ("kubetune.trainer.objectives.preference_rows",)


class NoPreferencePairsError(BadInputError):
    """No row of the data is a pair DPO can learn from (exit 65: the recipe process's
    failure record reports a BadInputError as the user's line)."""


class PreferenceToMessages:
    """A row -> torchtune's ``{"chosen": [Message], "rejected": [Message]}``: the shared
    prompt masked (unless ``train_on_input``), the answers trained on where the assistant
    speaks."""

    def __init__(self, column_map: Mapping[str, str] | None = None,
                 train_on_input: bool = False, new_system_prompt: str | None = None) -> None:
        self.column_map = dict(column_map or {})
        self.train_on_input = train_on_input
        self.new_system_prompt = new_system_prompt

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        pair = preference_rows.pair_of(dict(sample), self.column_map)
        return {"chosen": self._messages(pair.prompt, pair.chosen),
                "rejected": self._messages(pair.prompt, pair.rejected)}

    def _messages(self, prompt: list, answer: list) -> list:
        from torchtune.data import Message

        messages = []
        if self.new_system_prompt is not None:
            messages.append(Message("system", self.new_system_prompt, masked=True))
        for turn, shared in [(t, True) for t in prompt] + [(t, False) for t in answer]:
            if turn.role == "system" and self.new_system_prompt is not None:
                continue
            masked = not self.train_on_input and (shared or turn.role != "assistant")
            messages.append(Message(turn.role, turn.content, masked=masked))
        return messages


def preference_dataset(tokenizer: Any, *, source: str,
                       column_map: dict[str, str] | None = None, train_on_input: bool = False,
                       new_system_prompt: str | None = None,
                       filter_fn: Callable | None = None, split: str = "train",
                       **load_dataset_kwargs: Any) -> Any:
    """torchtune's ``PreferenceDataset`` over the user's rows in any shape
    ``preference_rows`` reads, bad pairs dropped and counted."""
    from torchtune.datasets import PreferenceDataset

    transform = PreferenceToMessages(column_map, train_on_input, new_system_prompt)
    dataset = PreferenceDataset(source=source, message_transform=transform,
                                tokenizer=tokenizer, filter_fn=filter_fn, split=split,
                                **load_dataset_kwargs)
    _drop_bad_pairs(dataset, transform.column_map, load_dataset_kwargs, split)
    return dataset


def _drop_bad_pairs(dataset: Any, column_map: dict[str, str],
                    load_kwargs: dict[str, Any], split: str) -> None:
    """Drop the pairs DPO cannot learn from, each named by file and row; the counts go on
    the dataset (``COUNTS_ATTRIBUTE``) for the run's row counts."""
    # PreferenceDataset keeps its rows in `_data` (a Hugging Face dataset) and offers no
    # other way to drop rows once it has loaded them.
    data = dataset._data
    name = row_origin.namer(load_kwargs.get("data_files"), split, len(data))
    drops = row_counts.Drops()
    keep = []
    for index, row in enumerate(data):
        try:
            why = preference_rows.row_problem(row, column_map)
        except ValueError as exc:
            raise NoPreferencePairsError(f"preference pair {name(index)}: {exc}") from None
        if why is None:
            keep.append(index)
        else:
            drops.add(why, name(index))
    if not keep:
        raise NoPreferencePairsError(f"no preference pair to train on: all {len(data)} rows "
                                     f"dropped ({drops.text()})")
    if drops.count:
        dataset._data = data.select(keep)
        log.info("dataset: %d of %d preference pairs dropped (%s); %d left", drops.count,
                 len(data), drops.text(), len(keep))
    setattr(dataset, COUNTS_ATTRIBUTE, row_counts.SideCounts(
        "preference pairs", read=len(data), drops=drops, kept=len(keep)))
