"""Batches padded to a whole number of the chunked loss's output chunks.

torchtune's ``CEWithChunkedOutputLoss`` has the model apply its output projection to
``seq_len.chunk(8)``, which yields fewer than 8 chunks for many lengths (9 tokens: 5
chunks of 2). Where FSDP shards the output apart from the rest of the model
(``custom_sharded_layers: [..., 'output']``), every call gathers its weight: two processes
whose batches pad to lengths that chunk differently run different numbers of collectives,
and the run dies ("distributed collective mismatch") or, worse, pairs the wrong ones.
Padded to a multiple of 8, every batch splits into exactly 8 chunks on every process;
the padding is masked out of the loss like any other.
"""

from __future__ import annotations

import torch.nn.functional as F
from torchtune.data import padded_collate_sft
from torchtune.modules.loss import CEWithChunkedOutputLoss

OUTPUT_CHUNKS = CEWithChunkedOutputLoss().num_output_chunks


def padded_collate_sft_whole_chunks(batch: list[dict], padding_idx: int = 0,
                                    ignore_idx: int = -100) -> dict:
    """torchtune's ``padded_collate_sft``, then padded on to a multiple of the chunks."""
    collated = padded_collate_sft(batch, padding_idx=padding_idx, ignore_idx=ignore_idx)
    short = -collated["tokens"].shape[1] % OUTPUT_CHUNKS
    if short:
        collated["tokens"] = F.pad(collated["tokens"], (0, short), value=padding_idx)
        collated["labels"] = F.pad(collated["labels"], (0, short), value=ignore_idx)
    return collated
