"""Rows held out by their content: the same rows on every rank, every resume and every
re-run, whatever the order of the files or the sampler's shuffle.

A row's position in [0, 1) is a hash of its canonical JSON; with a held-out fraction f,
rows below f are the validation set and every other row is trained on. Nothing is stored:
the recipe process recomputes the positions from the rows it loads (identical rows share
a position, so a duplicated row never lands on both sides).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

SIDES = ("train", "val")
_BATCH = 1024


def row_position(row: Mapping) -> float:
    """``row``'s place in [0, 1): the first 8 bytes of the blake2b of its canonical JSON."""
    text = json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)
    digest = hashlib.blake2b(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def held_out(row: Mapping, fraction: float) -> bool:
    return row_position(row) < fraction


def _rows(hf_dataset: Any) -> Iterable[Mapping]:
    """The dataset's rows as dicts; a Hugging Face dataset read a batch of columns at a
    time (row by row it decodes each row on its own, several times slower)."""
    iter_batches = getattr(hf_dataset, "iter", None)
    if callable(iter_batches):
        for batch in iter_batches(batch_size=_BATCH):
            names = list(batch)
            yield from (dict(zip(names, values)) for values in zip(*batch.values()))
        return
    yield from hf_dataset


def keep_indices(hf_dataset: Any, fraction: float, side: str) -> list[int]:
    """The indices of the rows ``side`` keeps: "train" those at or above ``fraction``,
    "val" those below it."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side!r}")
    val = side == "val"
    return [i for i, row in enumerate(_rows(hf_dataset)) if held_out(row, fraction) == val]
