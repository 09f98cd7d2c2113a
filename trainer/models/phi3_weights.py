"""The PEFT adapter of a Phi-3 / Phi-4 LoRA or DoRA run, which torchtune 0.6.1 does not
write ("PEFT integration for Phi is not supported").

Hugging Face's Phi-3 fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``;
torchtune splits them and trains one LoRA pair per part. A fused module's adapter that
is exactly the parts' adapters side by side: ``lora_A`` the parts' A stacked (rank
k x r for k adapted parts), ``lora_B`` block-diagonal (each part's B in its own rows and
rank columns, zeros elsewhere). PEFT is told that rank through ``rank_pattern`` and an
``alpha_pattern`` of k x alpha, so its scaling alpha / r is the parts' own. DoRA's
magnitude is one value per output row, so the fused one is the parts' concatenated; a
part without an adapter gets its rows' weight norms, which leaves those rows unchanged.
torchtune keeps Phi's RoPE in HF's row order, so nothing is permuted.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch
from torchtune import training
from torchtune.training.checkpointing._checkpointer import FullModelHFCheckpointer

from kubetune.atomic_write import atomic_path

log = logging.getLogger("trainer")

# torchtune module (in a layer) -> (HF fused module, its parts in HF row order)
FUSED = {"attn": ("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
         "mlp": ("mlp.gate_up_proj", ("w1", "w3"))}
SINGLE = {"attn.output_proj": "self_attn.o_proj", "mlp.w2": "mlp.down_proj"}
TARGETS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
           "output_proj": "o_proj", "w1": "gate_up_proj", "w3": "gate_up_proj",
           "w2": "down_proj", "output": "lm_head"}
PREFIX = "base_model.model."
_LAYER = re.compile(r"^layers\.(\d+)\.")


def _part_rows(config: dict) -> dict[str, int]:
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config["hidden_size"]) // heads
    inter = int(config["intermediate_size"])
    return {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim,
            "v_proj": kv_heads * head_dim, "w1": inter, "w3": inter}


def peft_adapter(adapter: dict[str, torch.Tensor], config: dict, rank: int,
                 base: dict[str, torch.Tensor] | None) -> tuple[dict, dict[str, int]]:
    """(PEFT state dict, rank of each fused module) from torchtune's adapter state.
    ``base``: the model's weights in torchtune keys (for DoRA on part of a fused module)."""
    rows = _part_rows(config)
    layers = sorted({int(m[1]) for k in adapter if (m := _LAYER.match(k))})
    out: dict[str, torch.Tensor] = {}
    ranks: dict[str, int] = {}
    for i in layers:
        tune, hf = f"layers.{i}.", f"{PREFIX}model.layers.{i}."
        for group, (fused, parts) in FUSED.items():
            adapted = [p for p in parts if f"{tune}{group}.{p}.lora_a.weight" in adapter]
            if not adapted:
                continue
            a = torch.cat([adapter[f"{tune}{group}.{p}.lora_a.weight"] for p in adapted])
            b = a.new_zeros(sum(rows[p] for p in parts), rank * len(adapted))
            magnitudes, offset = [], 0
            for p in parts:
                if p in adapted:
                    j = adapted.index(p)
                    b[offset:offset + rows[p], j * rank:(j + 1) * rank] = \
                        adapter[f"{tune}{group}.{p}.lora_b.weight"]
                magnitude = adapter.get(f"{tune}{group}.{p}.magnitude")
                if magnitude is None and f"{tune}{group}.{adapted[0]}.magnitude" in adapter:
                    if base is None:
                        raise ValueError("DoRA on part of a fused module needs the base weights")
                    magnitude = base[f"{tune}{group}.{p}.weight"].float().norm(p=2, dim=1)
                magnitudes.append(magnitude)
                offset += rows[p]
            out[f"{hf}{fused}.lora_A.weight"] = a
            out[f"{hf}{fused}.lora_B.weight"] = b
            if magnitudes[0] is not None:
                out[f"{hf}{fused}.lora_magnitude_vector"] = torch.cat(
                    [m.to(a.dtype) for m in magnitudes])
            ranks[fused.rsplit(".", 1)[1]] = rank * len(adapted)
        for module, fused in SINGLE.items():
            _copy(adapter, out, f"{tune}{module}", f"{hf}{fused}")
    _copy(adapter, out, "output", f"{PREFIX}lm_head")
    return out, ranks


def _copy(adapter: dict, out: dict, tune: str, hf: str) -> None:
    if f"{tune}.lora_a.weight" in adapter:
        out[f"{hf}.lora_A.weight"] = adapter[f"{tune}.lora_a.weight"]
        out[f"{hf}.lora_B.weight"] = adapter[f"{tune}.lora_b.weight"]
        if f"{tune}.magnitude" in adapter:
            out[f"{hf}.lora_magnitude_vector"] = adapter[f"{tune}.magnitude"]


def peft_config(tune_config: dict, ranks: dict[str, int], base_model: str | None) -> dict:
    rank, alpha = int(tune_config["r"]), float(tune_config["lora_alpha"])
    targets = sorted({TARGETS[m] for m in tune_config["target_modules"]})
    config = {**tune_config, "target_modules": targets, "peft_type": "LORA",
              "rank_pattern": {m: r for m, r in ranks.items() if r != rank},
              "alpha_pattern": {m: alpha * r / rank for m, r in ranks.items() if r != rank}}
    if base_model:
        config["base_model_name_or_path"] = base_model
    return config


class Phi3HFCheckpointer(FullModelHFCheckpointer):
    """torchtune's ``FullModelHFCheckpointer`` for PHI3_MINI / PHI4, writing the PEFT
    adapter (``adapter_model.safetensors`` + ``adapter_config.json``) beside its own."""

    def load_checkpoint(self) -> dict:
        state = super().load_checkpoint()
        # torchtune splits the fused qkv_proj / gate_up_proj into views of one tensor;
        # FSDP's sharded load of an NF4 weight (QLoRA on several processes) cannot take
        # a view into a larger storage ("aten.as_strided(NF4Tensor) only support original
        # storage offset"): each part gets its own.
        model = state[training.MODEL_KEY]
        state[training.MODEL_KEY] = {
            k: v.clone() if v.untyped_storage().nbytes() > v.numel() * v.element_size()
            else v for k, v in model.items()}
        return state

    def save_checkpoint(self, state_dict: dict, epoch: int, *args, **kwargs) -> None:
        adapter = state_dict.get(training.ADAPTER_KEY)
        tune_config = dict(state_dict.get(training.ADAPTER_CONFIG) or {})
        base = state_dict.get(training.MODEL_KEY)
        peft = None
        if adapter is not None and tune_config:
            # Before torchtune converts the model weights to HF keys in place.
            try:
                peft = peft_adapter(adapter, self._config, int(tune_config["r"]), base)
            except ValueError as exc:  # the exporter says what is missing
                log.warning("no PEFT adapter written: %s", exc)
        super().save_checkpoint(state_dict, epoch, *args, **kwargs)
        if peft is None:
            return
        from safetensors.torch import save_file

        weights, ranks = peft
        epoch_dir = Path(self._output_dir) / f"epoch_{epoch}"
        config = peft_config(tune_config, ranks, self.repo_id)
        (epoch_dir / "adapter_config.json").write_text(json.dumps(config))
        with atomic_path(epoch_dir / "adapter_model.safetensors") as tmp:  # the umask's mode
            save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp),
                      metadata={"format": "pt"})
        log.info("PEFT adapter written for the fused Phi-3 modules: %s", sorted(ranks))
