"""The output projection of a chunked loss, on CPU: each chunk projected as one matrix.

With ``CEWithChunkedOutputLoss`` (our default loss) torchtune's decoder projects the final
hidden states to the vocabulary chunk by chunk: ``self.output(chunk)`` for each
``h.chunk(n, dim=1)``. A chunk along the sequence of a ``[batch, seq, dim]`` tensor is not
contiguous in its leading dimensions, so ``torch.matmul`` cannot fold it into one matrix
product; where the weight needs no gradient (LoRA's frozen output or a tied embedding) it
broadcasts the weight over the batch and calls ``bmm``, which on CPU copies the whole
``vocab x dim`` weight once per sequence in the batch, per chunk, forward and backward.
At SmolLM2-135M's 49,152 x 576 output and 4 x 144 tokens, the projection and its loss,
forward and backward, took 11.5 s against 0.7 s projected as matrices in bf16, and 4.2 s
against 2.4 s in fp32 (one thread; bench/real_model.py measures whole training steps).

Here each chunk is flattened to ``[rows, dim]`` first (a copy of ``rows x dim`` hidden
values, tiny beside the weight), projected by one matrix product, and viewed back as
``[batch, rows_per_sequence, vocab]``: the same chunks, the same function, the same memory
profile as torchtune's (one chunk's logits at a time in the loss), in a product that never
copies the weight. Any output module works (``nn.Linear``, ``TiedLinear``, LoRA/DoRA
linears): all of them project the last dimension whatever the leading ones.

Not on CUDA: there ``bmm`` takes the broadcast weight as a stride-0 batch (cuBLAS's strided
batched GEMM), so nothing is copied and the FLOPs are those of one product; torchtune's
method runs unchanged for tensors off the CPU.
"""

from __future__ import annotations

import functools

import torch


def install() -> bool:
    """Make every torchtune decoder project its output chunks as matrices on CPU; False
    where this torchtune's decoder has no ``chunked_output``."""
    from torchtune.modules import transformer

    decoder = transformer.TransformerDecoder
    original = getattr(decoder, "chunked_output", None)
    if original is None or getattr(original, "_kubetune_matrix_chunks", False):
        return original is not None

    @torch.compiler.disable  # as torchtune's: the loss compiles per chunk, not this loop
    @functools.wraps(original)
    def chunked_output(self, last_hidden_state: torch.Tensor) -> list[torch.Tensor]:
        if last_hidden_state.device.type != "cpu":
            return original(self, last_hidden_state)
        return project_chunks(self.output, last_hidden_state, self.num_output_chunks)

    chunked_output._kubetune_matrix_chunks = True
    decoder.chunked_output = chunked_output
    return True


def project_chunks(output, hidden: torch.Tensor, chunks: int) -> list[torch.Tensor]:
    """``output`` applied to each of ``chunks`` chunks of ``hidden`` (``[batch, seq,
    dim]``) along the sequence, as torchtune's ``chunked_output`` returns them."""
    projected = []
    for chunk in hidden.chunk(chunks, dim=1):
        batch, rows, dim = chunk.shape
        logits = output(chunk.reshape(batch * rows, dim))
        projected.append(logits.view(batch, rows, logits.shape[-1]))
    return projected
