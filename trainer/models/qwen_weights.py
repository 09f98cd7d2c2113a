"""Qwen2 checkpoints in the Hugging Face layout: torchtune's own QWEN2 builders and
conversion, with the one place its QWEN2 path is wrong corrected. (Qwen3 is a row of
``kubetune.model_family.families``, built by ``kubetune.trainer.models.decoder``.)

torchtune keeps Qwen's RoPE in HF's rotate-half layout (``Qwen2RotaryPositionalEmbeddings``),
so no weight is permuted. The PEFT adapter is wrong:
``tune_to_peft_adapter_weights`` permutes LoRA B of q/k from the interleaved RoPE layout
of Llama-style models into HF's, but these rows were never interleaved. The checkpointer
undoes that permutation on the adapter it writes, so ``adapter_model.safetensors`` is what
PEFT applies to the HF base (DoRA magnitudes are not permuted by torchtune, so they are
already in HF row order).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torchtune.models import convert_weights
from torchtune.training.checkpointing._checkpointer import FullModelHFCheckpointer

from kubetune.model_family.scoped import patched


def unpermute_lora_b(adapter: dict[str, torch.Tensor], num_heads: int, num_kv_heads: int,
                     head_dim: int) -> dict[str, torch.Tensor]:
    """Undo ``tune_to_peft_adapter_weights``' q/k LoRA-B row permutation (PEFT keys)."""

    def to_rotate_half(t: torch.Tensor, n_heads: int) -> torch.Tensor:
        rank = t.shape[-1]
        return (t.view(n_heads, 2, head_dim // 2, rank).transpose(1, 2)
                .reshape(n_heads * head_dim, rank))

    out = {}
    for key, value in adapter.items():
        if key.endswith(".q_proj.lora_B.weight"):
            value = to_rotate_half(value, num_heads)
        elif key.endswith(".k_proj.lora_B.weight"):
            value = to_rotate_half(value, num_kv_heads)
        out[key] = value
    return out


@contextlib.contextmanager
def rotate_half_adapter(head_dim: int) -> Iterator[None]:
    """For one save: torchtune's PEFT adapter conversion, q/k LoRA B left in the
    rotate-half row order the model (and HF) use."""
    original = convert_weights.tune_to_peft_adapter_weights

    def adapter_weights(state, num_heads=32, num_kv_heads=32, dim=4096, **_):
        converted = original(state, num_heads=num_heads, num_kv_heads=num_kv_heads,
                             dim=dim, head_dim=head_dim)
        return unpermute_lora_b(converted, num_heads, num_kv_heads, head_dim)

    with patched(convert_weights, attribute="tune_to_peft_adapter_weights",
                 value=adapter_weights):
        yield


def _head_dim(config: dict) -> int:
    return int(config.get("head_dim")
               or int(config["hidden_size"]) // int(config["num_attention_heads"]))


class Qwen2HFCheckpointer(FullModelHFCheckpointer):
    """torchtune's ``FullModelHFCheckpointer`` for QWEN2, its PEFT adapter in HF rows."""

    def save_checkpoint(self, *args, **kwargs) -> None:
        with rotate_half_adapter(_head_dim(self._config)):
            return super().save_checkpoint(*args, **kwargs)
