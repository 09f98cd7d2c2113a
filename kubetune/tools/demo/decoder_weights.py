"""A Llama-style decoder's shape (Llama, Qwen2) and random weights in Hugging Face names.

The draw order is part of the contract: the same arguments give the same bytes, so the
tiny models are reproducible across runs and machines. ``device`` draws on another device
(a GPU draws a bench's 8B-shaped weights in seconds, not a minute); its own generator
gives other, equally reproducible, values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderSpec:
    """The shape every tiny decoder has; a family's spec changes its defaults and adds
    its own fields."""
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def shape_json(self) -> dict:
        """config.json's size keys, as every family spells them."""
        return {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
        }

    def random_weights(self, vocab: int, qkv_bias: bool = False, device: str = "cpu") -> dict:
        return random_decoder(
            seed=self.seed, vocab=vocab, hidden=self.hidden_size,
            intermediate=self.intermediate_size, layers=self.num_hidden_layers,
            heads=self.num_attention_heads, kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim, tied=self.tie_word_embeddings, qkv_bias=qkv_bias,
            device=device)


def random_decoder(*, seed: int, vocab: int, hidden: int, intermediate: int, layers: int,
                   heads: int, kv_heads: int, head_dim: int, tied: bool,
                   qkv_bias: bool = False, device: str = "cpu") -> dict:
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape: int) -> "torch.Tensor":
        return torch.randn(*shape, generator=generator, device=device) * 0.02

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
            p + "input_layernorm.weight": torch.ones(hidden, device=device),
            p + "post_attention_layernorm.weight": torch.ones(hidden, device=device),
        })
    tensors["model.norm.weight"] = torch.ones(hidden, device=device)
    if not tied:
        tensors["lm_head.weight"] = normal(vocab, hidden)
    return tensors
