"""The chunked output projection on CPU (trainer/recipe_process/chunked_output.py): the same
losses and gradients as torchtune's own ``chunked_output`` (fp32), tied and untied output,
LoRA on the output or not; and no product that broadcasts the output weight over the batch
(torchtune's ``bmm``, which copies the whole vocab x dim weight per sequence on CPU)."""

from __future__ import annotations

import pytest
import torch
from torchtune.models.llama3 import lora_llama3
from torchtune.models.llama3_2 import llama3_2, lora_llama3_2
from torchtune.modules import TransformerDecoder
from torchtune.modules.loss import CEWithChunkedOutputLoss
from torchtune.modules.tied_linear import TiedLinear

from kubetune.trainer.recipe_process import chunked_output

TORCHTUNES = TransformerDecoder.chunked_output
assert not getattr(TORCHTUNES, "_kubetune_matrix_chunks", False)
VOCAB, DIM, BATCH, SEQ = 320, 64, 3, 40
SHAPE = dict(vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=DIM,
             max_seq_len=SEQ, intermediate_dim=128)
LORA = dict(lora_rank=4, lora_alpha=8)


def tied_lora() -> TransformerDecoder:
    return lora_llama3_2(lora_attn_modules=["q_proj", "v_proj"], **SHAPE, **LORA)


def untied_lora_output() -> TransformerDecoder:
    return lora_llama3(lora_attn_modules=["q_proj", "v_proj"], apply_lora_to_output=True,
                       **SHAPE, **LORA)


def tied_full() -> TransformerDecoder:
    return llama3_2(**SHAPE)


MODELS = {"tied embeddings, LoRA": tied_lora, "untied, LoRA on the output": untied_lora_output,
          "tied embeddings, full": tied_full}


def built(make, dtype: torch.dtype) -> TransformerDecoder:
    torch.manual_seed(0)
    model = make().to(dtype)
    lora = any("lora_" in name for name, _ in model.named_parameters())
    for name, parameter in model.named_parameters():
        if "lora_b" in name:  # B starts at zero: give the adapters an effect
            torch.nn.init.normal_(parameter, std=0.02)
        parameter.requires_grad_("lora_" in name or not lora)
    return model


def loss_and_grads(model: TransformerDecoder) -> tuple[torch.Tensor, dict, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels[0, :7] = -100  # masked prompt positions, as the recipes feed them
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    model.zero_grad()
    loss = loss_fn(model(tokens), labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, loss


@pytest.mark.parametrize("make", MODELS.values(), ids=MODELS.keys())
def test_losses_and_gradients_are_torchtunes(make, monkeypatch):
    monkeypatch.setattr(TransformerDecoder, "chunked_output", TORCHTUNES)  # restored after
    model = built(make, torch.float32)
    expected_loss, expected_grads, _ = loss_and_grads(model)
    assert chunked_output.install()
    installed = TransformerDecoder.chunked_output
    assert chunked_output.install() and TransformerDecoder.chunked_output is installed  # once
    loss, grads, _ = loss_and_grads(model)
    if make is tied_lora:
        assert isinstance(model.output, TiedLinear)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)
    assert grads.keys() == expected_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def backward_ops(loss: torch.Tensor) -> set[str]:
    seen, ops, stack = set(), set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        ops.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return ops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("make", [tied_lora, untied_lora_output], ids=["tied", "untied"])
def test_the_frozen_output_weight_is_never_broadcast_over_the_batch(make, dtype, monkeypatch):
    monkeypatch.setattr(TransformerDecoder, "chunked_output", TORCHTUNES)  # restored after
    model = built(make, dtype)
    *_, unpatched = loss_and_grads(model)
    # torchtune's chunks are strided views: matmul broadcasts the frozen weight and bmm's it.
    assert "BmmBackward0" in backward_ops(unpatched)
    assert chunked_output.install()
    *_, patched = loss_and_grads(model)
    assert "BmmBackward0" not in backward_ops(patched)
    assert "MmBackward0" in backward_ops(patched)
