"""torchtune's greedy packing (``torchtune.datasets.PackedDataset``), computed from the
rows' lengths alone, and each pack made on demand from the cached token arrays.

PackedDataset walks the rows in order, appends each to the current pack, and closes the
pack when it overflows ``max_seq_len``: at the last row boundary (a row never splits), or,
with ``split_across_pack``, at exactly ``max_seq_len`` tokens (the rest of the row opens
the next pack); ``max_packs`` stops it early. Either way every pack is one contiguous range
of the rows' concatenated tokens, so the whole packing is the ranges' boundaries:
``pack_bounds`` finds them (a few integers per pack, not the packs' tensors), and
``PackMaker`` cuts pack ``i`` out of the arrays when the loader asks for it, as
PackedDataset would have stored it: tokens padded with ``padding_idx``, labels with the
ignore index, each token's position in its row (modulo ``max_seq_len``, as torchtune
numbers a split row's continuation), the padding's positions counting on from the last
(clamped to ``max_seq_len - 1``), and ``seq_lens``: the rows' parts in the pack, then the
padding as one more "row".
"""

from __future__ import annotations

import numpy as np
from torchtune.data import CROSS_ENTROPY_IGNORE_IDX  # what PackedDataset pads labels with


class RowTooLong(ValueError):
    """torchtune's PackedDataset refuses a row longer than a pack when rows may not split."""


def _too_long(length: int, max_seq_len: int) -> RowTooLong:
    # torchtune's own words for it (its ValueError), so a user's search finds its advice.
    return RowTooLong(f"Dataset sample is too long ({length} > {max_seq_len}). "
                      "Please set `split_across_pack=True` or increase `max_seq_len`.")


def pack_bounds(offsets: np.ndarray, max_seq_len: int, split_across_pack: bool = False,
                max_packs: int | None = None) -> np.ndarray:
    """Token offsets where each pack starts, plus the end of the last: ``n_packs + 1``
    int64 values. ``offsets``: where each row starts in the concatenated tokens, plus the
    total (``n_rows + 1`` values)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    rows, total = len(offsets) - 1, int(offsets[-1])
    if rows == 0 or (max_packs is not None and max_packs <= 0):
        if rows and not split_across_pack and offsets[1] - offsets[0] > max_seq_len:
            raise _too_long(int(offsets[1] - offsets[0]), max_seq_len)  # it read row 0
        return np.zeros(1, dtype=np.int64)
    if split_across_pack:
        # Every pack but the last is exactly max_seq_len tokens of the stream.
        starts = np.arange(0, total, max_seq_len, dtype=np.int64)
        if max_packs is not None:
            starts = starts[:max_packs]
        return np.append(starts, min(total, int(starts[-1]) + max_seq_len))
    return _row_bounds(offsets, rows, max_seq_len, max_packs)


def _row_bounds(offsets: np.ndarray, rows: int, max_seq_len: int,
                max_packs: int | None) -> np.ndarray:
    """Packs of whole rows: each takes as many rows as fit, one pack at a time."""
    bounds = [0]
    first = 0
    while first < rows and (max_packs is None or len(bounds) - 1 < max_packs):
        start = offsets[first]
        # The last row boundary within max_seq_len of the pack's start.
        end = int(np.searchsorted(offsets, start + max_seq_len, side="right")) - 1
        if end < rows and offsets[end + 1] - offsets[end] > max_seq_len:
            # torchtune reads that row (to find this pack full) and refuses it.
            raise _too_long(int(offsets[end + 1] - offsets[end]), max_seq_len)
        bounds.append(int(offsets[end]))
        first = end
    return np.asarray(bounds, dtype=np.int64)


class PackMaker:
    """Makes pack ``i`` (PackedDataset's dict of int64 tensors) from the rows' arrays."""

    def __init__(self, tokens: np.ndarray, labels: np.ndarray, offsets: np.ndarray,
                 bounds: np.ndarray, max_seq_len: int, padding_idx: int) -> None:
        self.tokens, self.labels = tokens, labels
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.bounds = bounds
        self.max_seq_len = max_seq_len
        self.padding_idx = padding_idx

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, index: int) -> dict:
        import torch

        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"pack {index} of {len(self)}")
        start, end = int(self.bounds[index]), int(self.bounds[index + 1])
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        last = int(np.searchsorted(self.offsets, end - 1, side="right")) - 1
        # The rows' parts inside [start, end): where each begins, and how long it is.
        row_starts = self.offsets[first:last + 1]
        part_starts = np.maximum(row_starts, start)
        part_ends = np.minimum(self.offsets[first + 1:last + 2], end)
        parts = part_ends - part_starts
        positions = (np.arange(start, end, dtype=np.int64)
                     - np.repeat(row_starts, parts)) % self.max_seq_len
        padding = self.max_seq_len - (end - start)
        seq_lens = parts if padding == 0 else np.append(parts, padding)
        if padding:
            after = np.arange(positions[-1] + 1, positions[-1] + 1 + padding, dtype=np.int64)
            positions = np.concatenate([positions, np.minimum(after, self.max_seq_len - 1)])
        tokens = np.full(self.max_seq_len, self.padding_idx, dtype=np.int64)
        labels = np.full(self.max_seq_len, CROSS_ENTROPY_IGNORE_IDX, dtype=np.int64)
        tokens[:end - start] = self.tokens[start:end]
        labels[:end - start] = self.labels[start:end]
        return {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
                "input_pos": torch.from_numpy(positions),
                "seq_lens": torch.from_numpy(np.asarray(seq_lens, dtype=np.int64))}
