"""Packed batches on CPU attend per document (trainer/recipe_process/document_attention.py):
the same outputs and gradients as torchtune's whole-pack masked attention, without any
attention call over a whole pack; any other mask takes torchtune's call unchanged."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torchtune.data import padded_collate_packed
from torchtune.models.llama3 import lora_llama3
from torchtune.modules import attention as torchtune_attention

from kubetune.trainer.recipe_process import document_attention

SEQ = 512
VOCAB = 300


def packed_batch(document_lengths: list[list[int]]) -> dict:
    """A batch as torchtune's packed collate makes it: each pack's documents, then
    padding as one more document (what PackedDataset and our token cache both do)."""
    generator = torch.Generator().manual_seed(0)
    packs = []
    for lengths in document_lengths:
        lengths = [*lengths, SEQ - sum(lengths)] if sum(lengths) < SEQ else lengths
        packs.append({"tokens": torch.randint(0, VOCAB, (SEQ,), generator=generator),
                      "labels": torch.randint(0, VOCAB, (SEQ,), generator=generator),
                      "input_pos": torch.tensor([p for n in lengths for p in range(n)]),
                      "seq_lens": torch.tensor(lengths)})
    return padded_collate_packed(packs)


def lengths(rng: random.Random, low: int, high: int) -> list[int]:
    drawn: list[int] = []
    while sum(drawn) < SEQ - high:
        drawn.append(rng.randint(low, high))
    return drawn


SHAPES = {
    "realistic": lambda rng: [lengths(rng, 60, 200) for _ in range(3)],
    "short": lambda rng: [lengths(rng, 5, 12) for _ in range(3)],
    "one document a pack": lambda rng: [[SEQ], [SEQ]],
    "mixed": lambda rng: [[SEQ - 300, 200], lengths(rng, 5, 40), [7] * 40],
}


def build_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = lora_llama3(lora_attn_modules=["q_proj", "k_proj", "v_proj", "output_proj"],
                        vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2,
                        embed_dim=64, max_seq_len=SEQ, intermediate_dim=128, lora_rank=4,
                        lora_alpha=8)
    # LoRA's B starts at zero: give the adapters weights so their gradients mean something.
    for name, parameter in model.named_parameters():
        if "lora_b" in name:
            torch.nn.init.normal_(parameter, std=0.02)
    return model


def forward_backward(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    logits = model(batch["tokens"], mask=batch["mask"], input_pos=batch["input_pos"])
    F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1)).backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()
                             if p.grad is not None}


@pytest.fixture
def widest_masked_attention(monkeypatch) -> list[int]:
    """The longest query any SDPA call gets with a mask (a whole pack's, if attention is
    not split by document)."""
    seen = [0]
    original = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        if kwargs.get("attn_mask", args[0] if args else None) is not None:
            seen[0] = max(seen[0], q.shape[-2])
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


@pytest.fixture
def per_document_models(monkeypatch) -> tuple[torch.nn.Module, torch.nn.Module]:
    """torchtune's model as it comes, and the same weights built after ``install``."""
    whole_pack = build_model()
    monkeypatch.setattr(torchtune_attention, "_sdpa_or_flex_attention",
                        torchtune_attention._sdpa_or_flex_attention)
    assert document_attention.install()
    per_document = build_model()
    per_document.load_state_dict(whole_pack.state_dict())
    return whole_pack, per_document


@pytest.mark.parametrize("shape", SHAPES)
def test_per_document_attention_matches_the_whole_pack(shape, per_document_models,
                                                       widest_masked_attention):
    whole_pack, per_document = per_document_models
    batch = packed_batch(SHAPES[shape](random.Random(shape)))
    expected_logits, expected_grads = forward_backward(whole_pack, batch)
    assert widest_masked_attention[0] == SEQ  # torchtune attends over whole packs
    widest_masked_attention[0] = 0

    logits, grads = forward_backward(per_document, batch)

    assert widest_masked_attention[0] < SEQ, "a whole pack's mask still reached SDPA"
    torch.testing.assert_close(logits, expected_logits, atol=2e-5, rtol=1e-4)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=2e-5, rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_documents_are_read_from_the_mask():
    batch = packed_batch([[100, 50, 7], [SEQ]])
    assert document_attention.document_spans(batch["mask"]) == [
        [(0, 100), (100, 150), (150, 157), (157, SEQ)], [(0, SEQ)]]
    documents = [(0, 100), (100, 150), (150, 157), (157, 300), (300, 310), (310, 320),
                 (320, 330), (330, 900), (900, 910)]
    assert document_attention.groups(documents, least=40, alone=64) == [
        (0, 100, False), (100, 150, False), (150, 157, False), (157, 300, False),
        (300, 330, True), (330, 900, False), (900, 910, False)]


@pytest.mark.parametrize("other", ["not block-causal", "a document sees a later one",
                                   "float", "rectangular"])
def test_any_other_mask_takes_torchtunes_call(other):
    mask = packed_batch([[100, 50, 7]])["mask"]
    if other == "not block-causal":
        mask[0, 120, 10] = True  # a later document sees an earlier one's position
    elif other == "a document sees a later one":
        mask[0, 10, 20] = True
    elif other == "float":
        mask = torch.zeros(1, SEQ, SEQ).masked_fill(~mask, float("-inf"))
    else:
        mask = mask[:, :64, :]
    assert document_attention.document_spans(mask) is None

    calls = []

    def torchtune_call(q, k, v, mask, dropout_p, is_causal):
        calls.append(mask)
        return q

    q = torch.randn(1, 4, mask.shape[1], 16)
    k = v = torch.randn(1, 4, mask.shape[-1], 16)
    document_attention.per_document(torchtune_call)(q, k, v, mask, 0.0, False)
    assert calls and calls[0] is mask


def test_a_mask_changed_in_place_is_read_again():
    call = document_attention.per_document(lambda *args: pytest.fail("not block-causal"))
    mask = packed_batch([[SEQ]])["mask"]
    q = k = v = torch.randn(1, 2, SEQ, 8)
    one_document = call(q, k, v, mask, 0.0, False)
    mask.copy_(packed_batch([[200, SEQ - 200]])["mask"])
    two_documents = call(q, k, v, mask, 0.0, False)
    expected = torch.cat([F.scaled_dot_product_attention(q[..., :200, :], k[..., :200, :],
                                                         v[..., :200, :], is_causal=True),
                          F.scaled_dot_product_attention(q[..., 200:, :], k[..., 200:, :],
                                                         v[..., 200:, :], is_causal=True)],
                         dim=2)
    torch.testing.assert_close(two_documents, expected)
    assert not torch.allclose(one_document, two_documents)


def test_a_steps_mask_is_read_once_for_every_layer(per_document_models, monkeypatch):
    _, per_document = per_document_models
    reads = []
    read = document_attention.document_spans
    monkeypatch.setattr(document_attention, "document_spans",
                        lambda mask: reads.append(mask) or read(mask))
    batch = packed_batch(SHAPES["realistic"](random.Random(0)))
    forward_backward(per_document, batch)
    forward_backward(per_document, packed_batch(SHAPES["short"](random.Random(0))))
    assert len(per_document.layers) == 2 and len(reads) == 2
