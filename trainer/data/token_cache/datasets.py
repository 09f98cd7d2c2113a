"""The datasets the recipe gets instead of the ones its builder made: the same rows (or
packs), read from the cached arrays when the loader asks for them.

``CachedRows`` returns a row as torchtune's SFT datasets do: ``tokens`` and ``labels`` as
lists of ints (``mask`` too, where the builder's rows had one), for the recipe's padding
collate; ``CachedPairs`` a preference pair as torchtune's PreferenceDataset does. ``CachedPacks`` is a ``torchtune.datasets.PackedDataset`` (the recipes and
``ConcatDataset`` recognise packing by that type, and its ``__len__``/``__getitem__``
serve ``packs``) whose ``packs`` are made on demand (``packs.PackMaker``) instead of held.
"""

from __future__ import annotations

from torch.utils.data import Dataset
from torchtune.data import CROSS_ENTROPY_IGNORE_IDX
from torchtune.datasets import PackedDataset

from kubetune.trainer.data.token_cache.packs import PackMaker
from kubetune.trainer.data.token_cache.rows import TokenRows


class CachedRows(Dataset):
    """``tokenized_from``: the builder's dataset the rows were tokenized from (its rows
    with nothing to train on included), for what must see the tokenizer at work on a few
    of them (the exporter's training samples)."""

    def __init__(self, rows: TokenRows, tokenized_from: Dataset | None = None) -> None:
        self.rows = rows
        self.tokenized_from = tokenized_from
        self._with_mask = "mask" in rows.meta.get("row_keys", [])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        tokens, labels = self.rows.row(index)
        sample = {"tokens": tokens.tolist(), "labels": labels.tolist()}
        if self._with_mask:
            sample["mask"] = (labels == CROSS_ENTROPY_IGNORE_IDX).tolist()
        return sample


class CachedPairs(Dataset):
    """Preference pairs as torchtune's PreferenceDataset returns them (for
    ``padded_collate_dpo``), each stored as two rows: chosen, then rejected."""

    def __init__(self, rows: TokenRows, tokenized_from: Dataset | None = None) -> None:
        self.rows = rows
        self.tokenized_from = tokenized_from

    def __len__(self) -> int:
        return len(self.rows) // 2

    def __getitem__(self, index: int) -> dict:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"pair {index} of {len(self)}")
        sample = {}
        for offset, side in enumerate(("chosen", "rejected")):
            tokens, labels = self.rows.row(2 * index + offset)
            sample[f"{side}_input_ids"] = tokens.tolist()
            sample[f"{side}_labels"] = labels.tolist()
        return sample


class CachedPacks(PackedDataset):
    """PackedDataset's attributes, with its packs made from ``rows`` on demand."""

    def __init__(self, rows: TokenRows, max_seq_len: int, padding_idx: int,
                 max_packs: int | None, split_across_pack: bool,
                 tokenized_from: Dataset | None = None) -> None:
        # Not PackedDataset.__init__: that packs the whole dataset into memory up front.
        self.rows = rows
        self.ds = CachedRows(rows, tokenized_from)
        self.tokenized_from = tokenized_from
        self.max_seq_len = max_seq_len
        self.padding_idx = padding_idx
        self.max_packs = max_packs
        self.split_across_pack = split_across_pack
        self.previous_sample_boundary = 0
        self.packs = PackMaker(rows.tokens, rows.labels, rows.offsets, rows.packs,
                               max_seq_len, padding_idx)
