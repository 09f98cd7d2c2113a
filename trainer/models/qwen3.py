"""Qwen3 (dense) on torchtune's public modules: ``qwen3`` and ``lora_qwen3`` (LoRA, DoRA,
QLoRA through ``quantize_base``), sized entirely by the checkpoint's config.json.

Qwen3 differs from Qwen2 where a builder must know: ``head_dim`` is its own setting (not
``hidden_size / heads``), q/k/v have no bias, and each head's query and key are
RMS-normalised (``q_norm`` / ``k_norm``) *before* RoPE. torchtune's ``MultiHeadAttention``
applies its ``q_norm`` after RoPE, which is a different function (the norm's weight does
not commute with the rotation), so the per-head norm runs at the end of the q/k
projection instead: the projection module stays the LoRA/DoRA/linear module torchtune
knows (its parameters keep their names, so LoRA validation, merging and FSDP see nothing
new) and gains one child, ``norm``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torchtune.models.qwen2._component_builders import qwen2_mlp
from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
from torchtune.modules import (FeedForward, MultiHeadAttention, RMSNorm, TiedLinear,
                               TransformerDecoder, TransformerSelfAttentionLayer)
from torchtune.modules.common_utils import reparametrize_as_dtype_state_dict_post_hook
from torchtune.modules.peft import DoRALinear, LoRALinear

LORA_ATTN = ("q_proj", "k_proj", "v_proj", "output_proj")


class _HeadNormed:
    """Mixin: the projection's output, per head of ``norm``'s size, RMS-normalised."""

    norm: RMSNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        head_dim = self.norm.normalized_shape[0]
        return self.norm(out.unflatten(-1, (-1, head_dim))).flatten(-2)


class HeadNormedLinear(_HeadNormed, nn.Linear):
    pass


class HeadNormedLoRALinear(_HeadNormed, LoRALinear):
    pass


class HeadNormedDoRALinear(_HeadNormed, DoRALinear):
    pass


_NORMED = {nn.Linear: HeadNormedLinear, LoRALinear: HeadNormedLoRALinear,
           DoRALinear: HeadNormedDoRALinear}


def head_normed(proj: nn.Module, head_dim: int, eps: float) -> nn.Module:
    """``proj`` (built as torchtune builds it) with Qwen3's per-head RMSNorm after it."""
    proj.__class__ = _NORMED[type(proj)]
    proj.norm = RMSNorm(dim=head_dim, eps=eps)
    return proj


def _projection(in_dim: int, out_dim: int, adapter: type | None, lora: dict) -> nn.Module:
    if adapter is None:
        return nn.Linear(in_dim, out_dim, bias=False)
    return adapter(in_dim, out_dim, **lora)


def _attention(*, embed_dim: int, num_heads: int, num_kv_heads: int, head_dim: int,
               max_seq_len: int, attn_dropout: float, rope_base: float, norm_eps: float,
               lora_modules: tuple[str, ...] = (), adapter: type | None = None,
               lora: dict | None = None) -> MultiHeadAttention:
    def proj(name: str, in_dim: int, out_dim: int) -> nn.Module:
        return _projection(in_dim, out_dim, adapter if name in lora_modules else None,
                           lora or {})

    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    return MultiHeadAttention(
        embed_dim=embed_dim, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        q_proj=head_normed(proj("q_proj", embed_dim, q_dim), head_dim, norm_eps),
        k_proj=head_normed(proj("k_proj", embed_dim, kv_dim), head_dim, norm_eps),
        v_proj=proj("v_proj", embed_dim, kv_dim),
        output_proj=proj("output_proj", q_dim, embed_dim),
        pos_embeddings=Qwen2RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len,
                                                       base=rope_base),
        kv_cache=None, max_seq_len=max_seq_len, attn_dropout=attn_dropout,
    )


def _mlp(embed_dim: int, intermediate_dim: int, adapter: type | None,
         lora: dict) -> FeedForward:
    if adapter is None:
        return qwen2_mlp(dim=embed_dim, hidden_dim=intermediate_dim)
    return FeedForward(gate_proj=adapter(embed_dim, intermediate_dim, **lora),
                       down_proj=adapter(intermediate_dim, embed_dim, **lora),
                       up_proj=adapter(embed_dim, intermediate_dim, **lora))


def _decoder(*, vocab_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
             embed_dim: int, intermediate_dim: int, max_seq_len: int, head_dim: int | None,
             attn_dropout: float, norm_eps: float, rope_base: float,
             tie_word_embeddings: bool, lora_modules: tuple[str, ...] = (),
             lora_mlp: bool = False, lora_output: bool = False,
             adapter: type | None = None, lora: dict | None = None) -> TransformerDecoder:
    head_dim = head_dim or embed_dim // num_heads
    num_kv_heads = num_kv_heads or num_heads
    lora = lora or {}
    layers = nn.ModuleList()
    for _ in range(num_layers):
        attn = _attention(embed_dim=embed_dim, num_heads=num_heads, num_kv_heads=num_kv_heads,
                          head_dim=head_dim, max_seq_len=max_seq_len,
                          attn_dropout=attn_dropout, rope_base=rope_base, norm_eps=norm_eps,
                          lora_modules=lora_modules, adapter=adapter, lora=lora)
        mlp = _mlp(embed_dim, intermediate_dim, adapter if lora_mlp else None, lora)
        layers.append(TransformerSelfAttentionLayer(
            attn=attn, mlp=mlp, sa_norm=RMSNorm(dim=embed_dim, eps=norm_eps),
            mlp_norm=RMSNorm(dim=embed_dim, eps=norm_eps)))
    tok_embeddings = nn.Embedding(vocab_size, embed_dim)
    if tie_word_embeddings:
        if lora_output:
            raise ValueError("apply_lora_to_output is incompatible with tie_word_embeddings: "
                             "the output is the embedding")
        output = TiedLinear(tok_embeddings)
    elif lora_output:
        # As torchtune's own builders: the output projection is never quantized.
        output = adapter(embed_dim, vocab_size, **{**lora, "quantize_base": False})
    else:
        output = nn.Linear(embed_dim, vocab_size, bias=False)
    return TransformerDecoder(tok_embeddings=tok_embeddings, layers=layers,
                              max_seq_len=max_seq_len, num_heads=num_heads, head_dim=head_dim,
                              norm=RMSNorm(embed_dim, eps=norm_eps), output=output)


def qwen3(vocab_size: int, num_layers: int, num_heads: int, num_kv_heads: int, embed_dim: int,
          intermediate_dim: int, max_seq_len: int, head_dim: int | None = None,
          attn_dropout: float = 0.0, norm_eps: float = 1e-6, rope_base: float = 1_000_000.0,
          tie_word_embeddings: bool = False) -> TransformerDecoder:
    """A Qwen3 dense decoder of any size."""
    return _decoder(vocab_size=vocab_size, num_layers=num_layers, num_heads=num_heads,
                    num_kv_heads=num_kv_heads, embed_dim=embed_dim,
                    intermediate_dim=intermediate_dim, max_seq_len=max_seq_len,
                    head_dim=head_dim, attn_dropout=attn_dropout, norm_eps=norm_eps,
                    rope_base=rope_base, tie_word_embeddings=tie_word_embeddings)


def lora_qwen3(lora_attn_modules: list[str], apply_lora_to_mlp: bool = False,
               apply_lora_to_output: bool = False, *, vocab_size: int, num_layers: int,
               num_heads: int, num_kv_heads: int, embed_dim: int, intermediate_dim: int,
               max_seq_len: int, head_dim: int | None = None, attn_dropout: float = 0.0,
               norm_eps: float = 1e-6, rope_base: float = 1_000_000.0,
               tie_word_embeddings: bool = False, lora_rank: int, lora_alpha: float,
               lora_dropout: float = 0.0, use_dora: bool = False,
               quantize_base: bool = False) -> TransformerDecoder:
    """Qwen3 with LoRA (DoRA: ``use_dora``; QLoRA: ``quantize_base``) on the chosen
    projections, as torchtune's ``lora_qwen2`` takes them."""
    unknown = set(lora_attn_modules) - set(LORA_ATTN)
    if not lora_attn_modules or unknown:
        raise ValueError(f"lora_attn_modules must be a non-empty subset of {LORA_ATTN}")
    adapter = DoRALinear if use_dora else LoRALinear
    lora = {"rank": lora_rank, "alpha": lora_alpha, "dropout": lora_dropout,
            "quantize_base": quantize_base}
    model = _decoder(vocab_size=vocab_size, num_layers=num_layers, num_heads=num_heads,
                     num_kv_heads=num_kv_heads, embed_dim=embed_dim,
                     intermediate_dim=intermediate_dim, max_seq_len=max_seq_len,
                     head_dim=head_dim, attn_dropout=attn_dropout, norm_eps=norm_eps,
                     rope_base=rope_base, tie_word_embeddings=tie_word_embeddings,
                     lora_modules=tuple(lora_attn_modules), lora_mlp=apply_lora_to_mlp,
                     lora_output=apply_lora_to_output, adapter=adapter, lora=lora)
    if quantize_base:
        # As torchtune's LoRA builders: NF4 weights are saved in the model's own dtype.
        model._register_state_dict_hook(partial(
            reparametrize_as_dtype_state_dict_post_hook,
            dtype=model.tok_embeddings.weight.dtype, offload_to_cpu=True))
    return model
