"""The checkpointer of a config-built decoder (``kubetune.trainer.models.decoder``):
torchtune's ``FullModelHFCheckpointer`` on its QWEN2 path, which maps keys by one table and
permutes nothing (our RoPE keeps Hugging Face's rows), with that table replaced for the
call by the one the family's row and config.json give (``weight_names``). Loading, shard
layout, the index, copied files and the recipe state stay torchtune's.

The PEFT adapter and its config are written by the same table: torchtune's conversion
knows Llama's module names and permutes q/k LoRA B rows, so both are replaced for the call
(``adapter_model.safetensors`` is what PEFT applies to the Hugging Face base; StarCoder 2's
``c_fc`` is its own target name, not ``gate_proj``).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

import torch
from torchtune.models import convert_weights
from torchtune.models.qwen2 import _convert_weights as qwen2_convert
from torchtune.training.checkpointing._checkpointer import FullModelHFCheckpointer

from kubetune.model_family.architecture import decoder_family
from kubetune.model_family.scoped import patched
from kubetune.model_family.weight_names import module_names, tune_to_hf_targets

MODEL_TYPE = "CONFIG_DECODER"
TUNE_TARGETS = ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3", "output")
PEFT_PREFIX = "base_model.model."
_ADAPTER_KEY = re.compile(r"^(?:layers\.(\d+)\.)?(.+)\.(lora_a\.weight|lora_b\.weight|magnitude)$")
_PEFT_NAMES = {"lora_a.weight": "lora_A.weight", "lora_b.weight": "lora_B.weight",
               "magnitude": "lora_magnitude_vector"}


def peft_adapter_weights(state: dict[str, torch.Tensor], spec: dict, row) -> dict[str, torch.Tensor]:
    """torchtune adapter keys -> PEFT's, module names from the family's table."""
    names = module_names(spec, row)
    out = {}
    for key, value in state.items():
        match = _ADAPTER_KEY.match(key)
        if match is None:
            raise ValueError(f"adapter key {key!r} is not a LoRA/DoRA parameter")
        layer, module, part = match.groups()
        if layer is None:  # the output projection
            hf_module = "lm_head" if module == "output" else module
        else:
            hf_module = f"model.layers.{layer}.{names[module]}"
        out[f"{PEFT_PREFIX}{hf_module}.{_PEFT_NAMES[part]}"] = value
    return out


def peft_adapter_config(adapter_config: dict[str, Any], spec: dict, row,
                        base_model_name_or_path: str | None = None) -> dict[str, Any]:
    targets = tune_to_hf_targets(spec, row)
    unknown = [t for t in adapter_config["target_modules"] if t not in TUNE_TARGETS]
    if unknown:
        raise ValueError(f"unknown LoRA target modules {unknown}")
    # torchtune's recipes name w1, w2 and w3 for "the MLP" whatever its shape: a plain MLP
    # (StarCoder 2's c_fc, c_proj) has no w3, so no adapter sits there.
    adapter_config["target_modules"] = [targets[t] for t in adapter_config["target_modules"]
                                        if t in targets]
    if base_model_name_or_path:
        adapter_config["base_model_name_or_path"] = base_model_name_or_path
    return adapter_config


class DecoderHFCheckpointer(FullModelHFCheckpointer):
    """``FullModelHFCheckpointer`` for a family of ``kubetune.model_family.families``."""

    def __init__(self, *args, model_type: str = MODEL_TYPE, **kwargs) -> None:
        if model_type != MODEL_TYPE:
            raise ValueError(f"DecoderHFCheckpointer reads {MODEL_TYPE} checkpoints, not "
                             f"{model_type}")
        super().__init__(*args, model_type="QWEN2", **kwargs)
        self._row, self._spec, self._keys = decoder_family(self._config)
        # The QWEN2 path reads these; a config.json may leave them to their defaults.
        self._config["tie_word_embeddings"] = self._spec["tie_word_embeddings"]
        self._config.setdefault("num_key_value_heads", self._spec["num_kv_heads"])

    @contextlib.contextmanager
    def _family_tables(self) -> Iterator[None]:
        spec, row = self._spec, self._row

        def adapter_weights(state, **_):
            return peft_adapter_weights(state, spec, row)

        def adapter_config(adapter_config, base_model_name_or_path=None):
            return peft_adapter_config(adapter_config, spec, row, base_model_name_or_path)

        with patched(qwen2_convert, "_FROM_HF", updates=self._keys, replace=True), \
                patched(convert_weights, attribute="tune_to_peft_adapter_weights",
                        value=adapter_weights), \
                patched(convert_weights, attribute="tune_to_peft_adapter_config",
                        value=adapter_config):
            yield

    def load_checkpoint(self):
        with self._family_tables():
            return super().load_checkpoint()

    def save_checkpoint(self, *args, **kwargs) -> None:
        with self._family_tables():
            return super().save_checkpoint(*args, **kwargs)
