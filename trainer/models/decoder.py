"""One decoder builder for every family a row in ``kubetune.model_family.families``
describes, driven by the features ``kubetune.model_family.features`` reads from its
``config.json``, on torchtune's own modules: ``TransformerDecoder``,
``TransformerSelfAttentionLayer``, ``MultiHeadAttention``, ``FeedForward``, ``RMSNorm``
(and Gemma's (1+w) ``GemmaRMSNorm``), ``TiedLinear`` and the LoRA/DoRA linears. What
torchtune lacks is in ``decoder_parts``.

The modules keep torchtune's names (``attn.q_proj``, ``mlp.w1``, ``sa_norm`` ...), so its
LoRA utilities, FSDP wrapping, activation checkpointing, merging and our exporter work on
it as on its own models; the Hugging Face names come from the row
(``kubetune.model_family.weight_names``). RoPE stays in Hugging Face's rotate-half layout,
so no q/k row is permuted, loading or saving.

``decoder(**spec)`` builds the full model, ``lora_decoder(lora_attn_modules, ...,
**spec)`` the LoRA/DoRA/QLoRA one, taking torchtune's LoRA builder arguments.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torchtune.models.gemma.rms_norm import GemmaRMSNorm
from torchtune.modules import (FeedForward, MultiHeadAttention, RMSNorm, TiedLinear,
                               TransformerDecoder, TransformerSelfAttentionLayer)
from torchtune.modules.common_utils import reparametrize_as_dtype_state_dict_post_hook
from torchtune.modules.peft import DoRALinear, LoRALinear

from kubetune.trainer.models.decoder_parts import (AttentionCall, Multiplier, RotaryEmbedding,
                                                   ScaledEmbedding, post_logits, post_projected)

LORA_ATTN = ("q_proj", "k_proj", "v_proj", "output_proj")
ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU,
               "gelu_pytorch_tanh": partial(nn.GELU, approximate="tanh"),
               "gelu_new": partial(nn.GELU, approximate="tanh")}


def _norm(kind: str, dim: int, eps: float) -> nn.Module:
    if kind == "rms_one_plus":
        return GemmaRMSNorm(dim, eps=eps)
    if kind == "layer":
        return nn.LayerNorm(dim, eps=eps)
    return RMSNorm(dim, eps=eps)


class _Projections:
    """Makes each projection: an adapter where the method puts one, else ``nn.Linear``."""

    def __init__(self, adapter: type | None, lora: dict, targets: set[str]) -> None:
        self.adapter, self.lora, self.targets = adapter, lora, targets

    def __call__(self, name: str, in_dim: int, out_dim: int, bias: bool) -> nn.Module:
        if self.adapter is None or name not in self.targets:
            return nn.Linear(in_dim, out_dim, bias=bias)
        return self.adapter(in_dim, out_dim, use_bias=bias, **self.lora)


def _attention(spec: dict, layer: int, proj: _Projections) -> MultiHeadAttention:
    d, heads, kv, hd = spec["embed_dim"], spec["num_heads"], spec["num_kv_heads"], spec["head_dim"]
    sliding = bool(spec["sliding_layers"][layer])
    qk_norm = spec["qk_norm"]

    def norm(count: int) -> nn.Module | None:
        if not qk_norm:
            return None
        return _norm(spec["norm"], hd if qk_norm == "head" else count * hd, spec["norm_eps"])

    # SDPA scales by head_dim ** -0.5: another attention scale is folded into q.
    q_multiplier = spec["attn_scale"] * hd ** 0.5
    rope = None
    if spec["rope_layers"][layer]:
        base, factor = ((spec["sliding_rope_base"], spec["sliding_rope_factor"]) if sliding
                        else (spec["rope_base"], spec["rope_factor"]))
        rope = RotaryEmbedding(hd, spec["rotary_dim"], base, spec["max_seq_len"], factor)
    attn = MultiHeadAttention(
        embed_dim=d, num_heads=heads, num_kv_heads=kv, head_dim=hd,
        q_proj=post_projected(proj("q_proj", d, heads * hd, spec["qkv_bias"]), norm(heads),
                              q_multiplier if abs(q_multiplier - 1.0) > 1e-12 else 1.0),
        k_proj=post_projected(proj("k_proj", d, kv * hd, spec["qkv_bias"]), norm(kv), 1.0),
        v_proj=proj("v_proj", d, kv * hd, spec["qkv_bias"]),
        output_proj=proj("output_proj", heads * hd, d, spec["o_bias"]),
        pos_embeddings=rope, kv_cache=None, max_seq_len=spec["max_seq_len"],
        attn_dropout=spec.get("attn_dropout", 0.0))
    window = spec["sliding_window"] if sliding else 0
    if window or spec["attn_softcap"]:
        attn._attention_call = AttentionCall(attn._attention_call, window, spec["attn_softcap"])
    return attn


def _mlp(spec: dict, proj: _Projections) -> FeedForward:
    d, ff, bias = spec["embed_dim"], spec["intermediate_dim"], spec["mlp_bias"]
    up = proj("w3", d, ff, bias) if spec["mlp"] == "gated" else None
    return FeedForward(gate_proj=proj("w1", d, ff, bias), down_proj=proj("w2", ff, d, bias),
                       up_proj=up, activation=ACTIVATIONS[spec["activation"]]())


def _layer(spec: dict, layer: int, proj: _Projections) -> TransformerSelfAttentionLayer:
    def norm() -> nn.Module:
        return _norm(spec["norm"], spec["embed_dim"], spec["norm_eps"])

    placement, multiplier = spec["placement"], spec["residual_multiplier"]
    if placement != "pre" and multiplier != 1.0:
        raise ValueError("a residual multiplier with post-norms is not supported")
    pre = placement in ("pre", "sandwich")
    post = placement in ("post", "sandwich")

    def scale() -> nn.Module:
        if post:
            return norm()
        return Multiplier(multiplier) if multiplier != 1.0 else nn.Identity()

    return TransformerSelfAttentionLayer(
        attn=_attention(spec, layer, proj), mlp=_mlp(spec, proj),
        sa_norm=norm() if pre else nn.Identity(), mlp_norm=norm() if pre else nn.Identity(),
        sa_scale=scale(), mlp_scale=scale())


def _build(spec: dict, proj: _Projections, lora_output: bool) -> TransformerDecoder:
    spec = {k: (list(v) if not isinstance(v, (str, bytes, int, float, bool)) else v)
            for k, v in spec.items()}  # lists from a config arrive as ListConfig
    d, vocab = spec["embed_dim"], spec["vocab_size"]
    if spec["embed_scale"] != 1.0:
        tok_embeddings = ScaledEmbedding(vocab, d, spec["embed_scale"])
    else:
        tok_embeddings = nn.Embedding(vocab, d)
    if spec["tie_word_embeddings"]:
        if lora_output:
            raise ValueError("apply_lora_to_output is incompatible with tie_word_embeddings: "
                             "the output is the embedding")
        output = TiedLinear(tok_embeddings)
    elif lora_output:
        # As torchtune's own builders: the output projection is never quantized.
        output = proj.adapter(d, vocab, **{**proj.lora, "quantize_base": False})
    else:
        output = nn.Linear(d, vocab, bias=False)
    layers = nn.ModuleList(_layer(spec, i, proj) for i in range(spec["num_layers"]))
    return TransformerDecoder(
        tok_embeddings=tok_embeddings, layers=layers, max_seq_len=spec["max_seq_len"],
        num_heads=spec["num_heads"], head_dim=spec["head_dim"],
        norm=_norm(spec["norm"], d, spec["norm_eps"]),
        output=post_logits(output, spec["logit_scale"], spec["final_softcap"]))


def decoder(**spec) -> TransformerDecoder:
    """The full model of ``spec`` (``kubetune.model_family.features.decoder_spec``)."""
    return _build(spec, _Projections(None, {}, set()), lora_output=False)


def lora_decoder(lora_attn_modules: list[str], apply_lora_to_mlp: bool = False,
                 apply_lora_to_output: bool = False, *, lora_rank: int, lora_alpha: float,
                 lora_dropout: float = 0.0, use_dora: bool = False,
                 quantize_base: bool = False, **spec) -> TransformerDecoder:
    """``spec``'s model with LoRA (DoRA: ``use_dora``; QLoRA: ``quantize_base``) on the
    chosen projections, taking the arguments torchtune's LoRA builders take."""
    unknown = set(lora_attn_modules) - set(LORA_ATTN)
    if not lora_attn_modules or unknown:
        raise ValueError(f"lora_attn_modules must be a non-empty subset of {LORA_ATTN}")
    targets = set(lora_attn_modules) | ({"w1", "w2", "w3"} if apply_lora_to_mlp else set())
    lora = {"rank": lora_rank, "alpha": lora_alpha, "dropout": lora_dropout,
            "quantize_base": quantize_base}
    adapter = DoRALinear if use_dora else LoRALinear
    model = _build(spec, _Projections(adapter, lora, targets), lora_output=apply_lora_to_output)
    if quantize_base:
        # As torchtune's LoRA builders: NF4 weights are saved in the model's own dtype.
        model._register_state_dict_hook(partial(
            reparametrize_as_dtype_state_dict_post_hook,
            dtype=model.tok_embeddings.weight.dtype, offload_to_cpu=True))
    return model
