"""Qwen checkpoints in the Hugging Face layout: Qwen3 weights to ``kubetune.trainer.models.qwen3``
and back, and the checkpointers that read and write Qwen2 and Qwen3 in that layout.

A Qwen3 state dict is a Qwen2 one without q/k/v biases plus one norm per q and k head.
torchtune keeps Qwen's RoPE in HF's rotate-half layout (``Qwen2RotaryPositionalEmbeddings``),
so no weight is permuted, and its QWEN2 conversion (tied output, sharding, index) is right
for Qwen3 once it knows the two norm keys (``kubetune.model_family.convert.QWEN3_KEYS``,
shared with the exporter's conversion). ``Qwen3HFCheckpointer`` is torchtune's
``FullModelHFCheckpointer`` run as QWEN2 with those keys added for the call, so loading,
shard layout, index and copied files stay torchtune's.

The PEFT adapter is the one place torchtune's QWEN2 path is wrong (for Qwen2 as for Qwen3):
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
from torchtune.models.qwen2 import _convert_weights as qwen2_convert
from torchtune.training.checkpointing._checkpointer import FullModelHFCheckpointer

from kubetune.model_family.convert import QWEN3_KEYS
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


class Qwen3HFCheckpointer(FullModelHFCheckpointer):
    """``FullModelHFCheckpointer`` for Qwen3 checkpoints (``model_type: QWEN3``): torchtune's
    QWEN2 path, knowing Qwen3's norm keys, its PEFT adapter in HF rows."""

    def __init__(self, *args, model_type: str = "QWEN3", **kwargs) -> None:
        if model_type != "QWEN3":
            raise ValueError(f"Qwen3HFCheckpointer reads QWEN3 checkpoints, not {model_type}")
        super().__init__(*args, model_type="QWEN2", **kwargs)
        self._config.setdefault("tie_word_embeddings", False)
        self._config.setdefault("num_key_value_heads", self._config["num_attention_heads"])

    def load_checkpoint(self):
        with patched(qwen2_convert, "_FROM_HF", updates=QWEN3_KEYS):
            return super().load_checkpoint()

    def save_checkpoint(self, *args, **kwargs) -> None:
        with patched(qwen2_convert, "_FROM_HF", updates=QWEN3_KEYS), \
                rotate_half_adapter(_head_dim(self._config)):
            return super().save_checkpoint(*args, **kwargs)
