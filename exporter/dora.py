"""Put a DoRA adapter's magnitude vectors in Hugging Face row order.

torchtune 0.6.1 converts LoRA B of q_proj/k_proj from its RoPE row layout to Hugging
Face's (a per-head interleave permutation) when it writes the PEFT adapter, but leaves
the DoRA magnitude vectors, one value per output row, in torchtune's order. PEFT then
scales the wrong rows of q and k. Applying the same row permutation to those vectors
fixes it; the exporter's logits check proves the result against the merged model.
"""

from __future__ import annotations

import re
from pathlib import Path

from kubetune.atomic_write import atomic_path

_QK_MAGNITUDE = re.compile(r"\.self_attn\.(?P<proj>[qk])_proj\.lora_magnitude_vector(\.weight)?$")


def _to_hf_rows(vector, n_heads: int, head_dim: int):
    return vector.view(n_heads, head_dim // 2, 2).transpose(1, 2).reshape(n_heads * head_dim)


def needs_fix(adapter_file: Path) -> bool:
    from safetensors import safe_open

    with safe_open(str(adapter_file), "pt") as f:
        return any(_QK_MAGNITUDE.search(k) for k in f.keys())


def write_fixed(adapter_file: Path, dest: Path, model_config: dict) -> int:
    """Write ``adapter_file`` to ``dest`` with q/k magnitudes permuted; return how many."""
    from safetensors.torch import load_file, save_file

    heads = int(model_config["num_attention_heads"])
    kv_heads = int(model_config.get("num_key_value_heads") or heads)
    head_dim = int(model_config.get("head_dim") or model_config["hidden_size"] // heads)
    weights = load_file(str(adapter_file))
    fixed = 0
    for key, value in weights.items():
        match = _QK_MAGNITUDE.search(key)
        if match:
            n = heads if match["proj"] == "q" else kv_heads
            weights[key] = _to_hf_rows(value, n, head_dim).contiguous()
            fixed += 1
    with atomic_path(dest) as tmp:  # not safetensors' own 0600: a serving pod reads it
        save_file(weights, str(tmp), metadata={"format": "pt"})
    return fixed
