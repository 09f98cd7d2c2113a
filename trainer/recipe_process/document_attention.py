"""Packed batches on CPU: each document attends within itself, not over the whole pack.

Where flex attention is unavailable (always on CPU) torchtune gives a packed batch a dense
block-causal mask (batch x seq x seq) and hands it to SDPA with every pack whole. SDPA
then scores every pair of positions in the pack, converts the mask to a float copy and
keeps both for the backward: at 4 x 2048 positions that was 130-300 MB more at the first
step and 1.2-1.8x the step time on the models of bench/cpu_packing.py, growing with the
pack's length squared whatever the documents' lengths.

The same mask says exactly which positions may attend to which: position ``i`` starts a
new document where it may not see ``i - 1``. Once a mask is known to be block-causal,
each document is one causal SDPA call over its own positions, the same function as the
masked one (within float rounding), costing the sum of the documents' squared lengths.
Any other mask (another shape, a cache's rectangular one, a mask that is not
block-causal) and any tensor off the CPU take torchtune's call unchanged. The model's
attention modules choose their call when they are built, so ``install`` runs before the
recipe builds its model.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable

import torch
import torch.nn.functional as F

Spans = list[list[tuple[int, int]]]
# Positions per attention call, at least, for short documents; a document this long or
# longer has a call of its own (see ``groups``).
GROUP_TOKENS = 256
ALONE_TOKENS = 64


class _LastMask:
    """The attention calls of the mask seen last, per sequence (``groups`` of its
    ``document_spans``; None: not block-causal): every layer of a step gets the same mask
    object, so it is read once a step, not once a layer."""

    def __init__(self) -> None:
        self.ref: Callable[[], torch.Tensor | None] = lambda: None
        self.version = -1
        self.calls: list[list[tuple[int, int, bool]]] | None = None

    def calls_of(self, mask: torch.Tensor) -> list[list[tuple[int, int, bool]]] | None:
        if self.ref() is not mask or self.version != mask._version:
            spans = document_spans(mask)
            self.calls = None if spans is None else [groups(documents) for documents in spans]
            self.ref, self.version = weakref.ref(mask), mask._version
        return self.calls


def document_spans(mask: torch.Tensor) -> Spans | None:
    """Each sequence's documents as ``(start, end)`` position ranges, when ``mask`` (batch x
    seq x seq, True: may attend) is exactly block-causal; None for any other mask."""
    if mask.dtype != torch.bool or mask.dim() != 3 or mask.shape[1] != mask.shape[2]:
        return None
    batch, seq, _ = mask.shape
    starts = torch.ones(batch, seq, dtype=torch.bool)
    starts[:, 1:] = ~mask.diagonal(offset=-1, dim1=1, dim2=2)
    document = starts.cumsum(dim=1)
    block_causal = (document[:, :, None] == document[:, None, :]).tril_()
    if not torch.equal(block_causal, mask):
        return None
    spans = []
    for row in starts:
        edges = [*row.nonzero().flatten().tolist(), seq]
        spans.append(list(zip(edges[:-1], edges[1:])))
    return spans


def groups(documents: list[tuple[int, int]], least: int = GROUP_TOKENS,
           alone: int = ALONE_TOKENS) -> list[tuple[int, int, bool]]:
    """Each document of at least ``alone`` positions on its own, and runs of shorter ones
    joined until a group spans at least ``least``: ``(start, end, several)``. A call per
    document costs more than its attention below a few hundred positions on CPU, so short
    documents share a call (and a small block of the mask, which SDPA keeps as floats)."""
    joined: list[tuple[int, int, bool]] = []
    group_start, count = documents[0][0], 0
    for start, end in documents:
        if end - start >= alone:
            if count:
                joined.append((group_start, start, count > 1))
            joined.append((start, end, False))
            group_start, count = end, 0
            continue
        count += 1
        if end - group_start >= least:
            joined.append((group_start, end, count > 1))
            group_start, count = end, 0
    if count:
        joined.append((group_start, documents[-1][1], count > 1))
    return joined


def per_document(attention_call: Callable, last: _LastMask | None = None) -> Callable:
    """Wrap one of torchtune's attention calls (``q, k, v, mask, dropout_p, is_causal``;
    q, k and v as batch x heads x seq x head_dim). ``last``: the mask cache, shared by
    every layer's call."""
    last = last or _LastMask()

    @torch.compiler.disable  # Python over the spans: a graph break, never a recompile each batch
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               dropout_p: float) -> torch.Tensor | None:
        calls = last.calls_of(mask)
        if calls is None:
            return None
        sequences = []
        for index, sequence_calls in enumerate(calls):
            parts = []
            for start, end, several in sequence_calls:
                # A group of several short documents keeps their block of the mask.
                parts.append(F.scaled_dot_product_attention(
                    q[index:index + 1, :, start:end], k[index:index + 1, :, start:end],
                    v[index:index + 1, :, start:end],
                    attn_mask=mask[index, start:end, start:end] if several else None,
                    dropout_p=dropout_p, is_causal=not several))
            sequences.append(torch.cat(parts, dim=2) if len(parts) > 1 else parts[0])
        return torch.cat(sequences, dim=0) if len(sequences) > 1 else sequences[0]

    @functools.wraps(attention_call)
    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, dropout_p: float,
             is_causal: bool) -> torch.Tensor:
        if (isinstance(mask, torch.Tensor) and q.device.type == "cpu"
                and q.shape[2] == k.shape[2] == mask.shape[-1]):
            output = attend(q, k, v, mask, dropout_p)
            if output is not None:
                return output
        return attention_call(q, k, v, mask, dropout_p, is_causal)

    return call


def install() -> bool:
    """Make the attention modules built from now on take packed batches per document on
    CPU; False where this torchtune has no such hook."""
    from torchtune.modules import attention

    choose = getattr(attention, "_sdpa_or_flex_attention", None)
    if choose is None or getattr(choose, "_kubetune_per_document", False):
        return choose is not None

    last = _LastMask()  # every layer gets a step's same mask: read it once a step

    @functools.wraps(choose)
    def choose_per_document() -> Callable:
        return per_document(choose(), last)

    choose_per_document._kubetune_per_document = True
    attention._sdpa_or_flex_attention = choose_per_document
    return True
