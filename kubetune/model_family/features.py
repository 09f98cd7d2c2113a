"""A dense decoder's features read from its ``config.json`` by its family's row: the plain
values ``kubetune.trainer.models.decoder`` is built from (they travel as a config's
``model:`` section, so every one is a number, a string, a bool or a list of them).

What stops a model is found here too, by the feature in its config.json that no row can
express (mixture of experts, linear-attention or Mamba layers, latent attention, an
encoder-decoder), so a refusal names that feature rather than only the ``model_type``.
"""

from __future__ import annotations

import math

from kubetune.errors import BadInputError
from kubetune.model_family.families import FamilyRow

# Activations by config.json's names, as torch computes them (the builder maps them).
ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu", "gelu_new", "relu")
ROPE_TYPES = ("default", "linear")
WHERE_ROWS = "kubetune/model_family/families.py (docs/extending.md#a-model-family-of-your-own)"


def blocking_feature(cfg: dict) -> str | None:
    """The feature in ``cfg`` that no family row can express, as one clause; None where
    every feature is one the decoder builder knows."""
    if cfg.get("vision_config") or cfg.get("audio_config"):
        return ("vision_config: multimodal checkpoints are not supported; their text model "
                "alone (e.g. model_type gemma3_text) is")
    if cfg.get("is_encoder_decoder"):
        return "is_encoder_decoder: encoder-decoder models are not supported"
    for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        if cfg.get(key):
            return f"{key}: mixture-of-experts layers are not supported"
    if cfg.get("kv_lora_rank") or cfg.get("q_lora_rank"):
        return "kv_lora_rank: latent attention (MLA) is not supported"
    kinds = set(cfg.get("layer_types") or []) - {"sliding_attention", "full_attention"}
    if kinds:
        return (f"layer_types {sorted(kinds)}: linear-attention, convolution or Mamba layers "
                "are not supported")
    for key in ("linear_num_value_heads", "conv_L_cache", "mamba_d_state", "ssm_state_size",
                "full_attn_idxs", "attn_layer_indices", "mamba_expand"):
        if key in cfg:
            return f"{key}: linear-attention, convolution or Mamba layers are not supported"
    if cfg.get("use_parallel_residual") or cfg.get("parallel_attn"):
        return "parallel attention and MLP blocks are not supported"
    if cfg.get("use_bidirectional_attention"):
        return "use_bidirectional_attention: bidirectional (embedding) models are not supported"
    return None


def _refuse(model_type: str, what: str) -> BadInputError:
    return BadInputError(f"{model_type} checkpoint: {what}")


def _flag(cfg: dict, rule: str | bool) -> bool:
    if isinstance(rule, bool):
        return rule
    key, default = rule.split(":")
    value = cfg.get(key)
    return (default == "true") if value is None else bool(value)


def _rope_sections(cfg: dict) -> tuple[dict, dict | None]:
    """RoPE of full and of sliding layers: transformers 5 writes ``rope_parameters``, per
    layer type for families whose types differ; older configs ``rope_theta``,
    ``rope_local_base_freq`` and ``rope_scaling``."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        return dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    full = {**params, **(cfg.get("rope_scaling") or {})}
    if cfg.get("rope_theta") is not None:
        full.setdefault("rope_theta", cfg["rope_theta"])
    sliding = None
    if cfg.get("rope_local_base_freq") is not None:
        sliding = {"rope_type": "default", "rope_theta": cfg["rope_local_base_freq"]}
    return full, sliding


def _rope(model_type: str, section: dict, theta_default: float, where: str) -> tuple[float, float]:
    kind = str(section.get("rope_type") or section.get("type") or "default")
    if kind not in ROPE_TYPES:
        raise _refuse(model_type, f"rope type {kind!r}{where} is not supported (supported: "
                      f"{', '.join(ROPE_TYPES)}); remove rope_scaling from config.json to train "
                      "at the native length")
    factor = float(section.get("factor") or 1.0) if kind == "linear" else 1.0
    return float(section.get("rope_theta") or theta_default), factor


def _sliding_layers(cfg: dict, row: FamilyRow, layers: int) -> list[int]:
    """1 for each layer that attends within ``sliding_window``, 0 for a full layer."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types:
        if len(types) != layers:
            raise _refuse(row.model_type, f"layer_types lists {len(types)} layers, "
                          f"num_hidden_layers is {layers}")
        slides = [int(t == "sliding_attention") for t in types]
        if row.model_type in ("qwen3", "qwen2") and not cfg.get("use_sliding_window"):
            slides = [0] * layers  # the attention reads the window only with this flag on
    elif not window or row.sliding_default == "none":
        slides = [0] * layers
    elif row.sliding_default == "all":
        slides = [1] * layers
    elif row.sliding_default == "qwen":
        start = int(cfg.get("max_window_layers") or layers)
        slides = [int(bool(cfg.get("use_sliding_window")) and i >= start) for i in range(layers)]
    else:  # pattern
        every = int(cfg.get("sliding_window_pattern") or row.sliding_pattern_default)
        slides = [int((i + 1) % every != 0) for i in range(layers)]
    if any(slides) and not window:
        raise _refuse(row.model_type, "layer_types names sliding_attention layers but "
                      "sliding_window is null")
    return slides


def decoder_spec(cfg: dict, row: FamilyRow) -> dict:
    """The builder's arguments for ``cfg`` (a config.json) of ``row``'s family."""
    mt = row.model_type
    try:
        embed_dim = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        layers = int(cfg["num_hidden_layers"])
        spec = {
            "vocab_size": int(cfg["vocab_size"]),
            "num_layers": layers,
            "num_heads": heads,
            "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
            "embed_dim": embed_dim,
            "intermediate_dim": int(cfg["intermediate_size"]),
            "max_seq_len": int(cfg.get("max_position_embeddings") or 2048),
        }
    except KeyError as exc:
        raise BadInputError(f"config.json lacks {exc.args[0]!r}, which every causal LM "
                            "config has: is this a complete model directory?") from None
    head_dim = int(cfg.get("head_dim") or embed_dim // heads)
    activation = str(cfg.get("hidden_activation") or cfg.get("hidden_act")
                     or row.activation_default)
    if activation not in ACTIVATIONS:
        raise _refuse(mt, f"activation {activation!r} is not supported (supported: "
                      f"{', '.join(ACTIVATIONS)})")
    partial = float(cfg.get("partial_rotary_factor")
                    or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0)
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2:
        raise _refuse(mt, f"partial_rotary_factor {partial} leaves an odd rotary dimension")
    full, sliding = _rope_sections(cfg)
    rope_base, rope_factor = _rope(mt, full, row.rope_theta_default, "")
    if sliding is None:
        sliding = {"rope_theta": row.sliding_rope_theta_default or rope_base}
    sliding_base, sliding_factor = _rope(mt, sliding, rope_base, " (sliding layers)")
    if cfg.get("lm_head_bias") or cfg.get("bias") is True:
        raise _refuse(mt, "an output (lm_head) bias is not supported")
    spec.update({
        "head_dim": head_dim,
        "norm": row.norm,
        "norm_eps": float(cfg.get(row.norm_eps_key) or row.norm_eps_default),
        "placement": row.placement,
        "qk_norm": row.qk_norm,
        "mlp": row.mlp,
        "activation": activation,
        "qkv_bias": _flag(cfg, row.qkv_bias),
        "o_bias": _flag(cfg, row.o_bias),
        "mlp_bias": _flag(cfg, row.mlp_bias),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", row.tied_default)),
        "rotary_dim": rotary_dim,
        "rope_base": rope_base,
        "rope_factor": rope_factor,
        "sliding_rope_base": sliding_base,
        "sliding_rope_factor": sliding_factor,
        "sliding_window": int(cfg.get("sliding_window") or 0),
        "sliding_layers": _sliding_layers(cfg, row, layers),
        "rope_layers": [1] * layers,
        "embed_scale": 1.0,
        "attn_scale": head_dim ** -0.5,
        "residual_multiplier": 1.0,
        "logit_scale": 1.0,
        "attn_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
    })
    if not any(spec["sliding_layers"]):
        spec["sliding_window"] = 0
    if row.embed_scale == "sqrt_hidden":
        spec["embed_scale"] = math.sqrt(embed_dim)
    if row.query_pre_attn_scalar and cfg.get("query_pre_attn_scalar"):
        spec["attn_scale"] = float(cfg["query_pre_attn_scalar"]) ** -0.5
    if row.granite_scalars:
        spec["embed_scale"] = float(cfg.get("embedding_multiplier") or 1.0)
        spec["attn_scale"] = float(cfg.get("attention_multiplier") or head_dim ** -0.5)
        spec["residual_multiplier"] = float(cfg.get("residual_multiplier") or 1.0)
        spec["logit_scale"] = 1.0 / float(cfg.get("logits_scaling") or 1.0)
    if row.no_rope_layers and cfg.get("no_rope_layers") is not None:
        listed = [int(bool(v)) for v in cfg["no_rope_layers"]]
        if len(listed) != layers:
            raise _refuse(mt, f"no_rope_layers lists {len(listed)} layers, num_hidden_layers "
                          f"is {layers}")
        spec["rope_layers"] = listed
    return spec
