"""Dataset builders of the kinds users write, named by ``dataset._component_`` in tests
(importable in the recipe process too: it runs from the checkout)."""

from __future__ import annotations

from typing import Any


def capped_packs(tokenizer, max_packs: int, packed: bool = True, **kwargs) -> Any:
    """A builder of the kind a user writes: torchtune's instruct rows, packed with its own
    choices (split rows, at most ``max_packs`` packs, the tokenizer's pad id)."""
    from torchtune.datasets import PackedDataset, instruct_dataset

    return PackedDataset(instruct_dataset(tokenizer, **kwargs), max_seq_len=tokenizer.max_seq_len,
                         padding_idx=tokenizer.pad_id, max_packs=max_packs,
                         split_across_pack=True)


class _Tagged:
    """Each row of ``rows`` with its index added (a key the token cache does not keep)."""

    def __init__(self, rows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return {**self.rows[index], "row": index}


def tagged_rows(tokenizer, **kwargs) -> Any:
    """A builder whose rows carry more than tokens and labels."""
    from torchtune.datasets import instruct_dataset

    return _Tagged(instruct_dataset(tokenizer, **kwargs))
