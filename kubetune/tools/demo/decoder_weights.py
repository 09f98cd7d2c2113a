"""Random weights, in Hugging Face names, for a Llama-style decoder (Llama, Qwen2).

The draw order is part of the contract: the same arguments give the same bytes, so the
tiny models are reproducible across runs and machines.
"""

from __future__ import annotations


def random_decoder(*, seed: int, vocab: int, hidden: int, intermediate: int, layers: int,
                   heads: int, kv_heads: int, head_dim: int, tied: bool,
                   qkv_bias: bool = False) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> "torch.Tensor":
        return torch.randn(*shape, generator=generator) * 0.02

    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    tensors = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            tensors[p + f"self_attn.{name}.weight"] = normal(out, hidden)
            if qkv_bias:
                tensors[p + f"self_attn.{name}.bias"] = normal(out)
        tensors.update({
            p + "self_attn.o_proj.weight": normal(hidden, q_out),
            p + "mlp.gate_proj.weight": normal(intermediate, hidden),
            p + "mlp.up_proj.weight": normal(intermediate, hidden),
            p + "mlp.down_proj.weight": normal(hidden, intermediate),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })
    tensors["model.norm.weight"] = torch.ones(hidden)
    if not tied:
        tensors["lm_head.weight"] = normal(vocab, hidden)
    return tensors
