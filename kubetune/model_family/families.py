"""Model families as data: one row per family the config-driven decoder builds
(``kubetune.trainer.models.decoder``), saying what its ``config.json`` does not.

A dense decoder differs from Llama's core by a handful of features. Most of them a
``config.json`` states itself (biases, sliding-window layers, RoPE per layer type, q/k
norms' presence, soft-caps, multipliers), and ``features.py`` reads those the same way for
every family. What a config leaves to the modelling code is a family's row here: the norm's
kind and placement, whether and how q/k are normalised, how embeddings are scaled, the MLP's
shape and its Hugging Face names, and the defaults transformers assumes for keys a config
omits. A family transformers adds that uses only these features needs a row, nothing else;
``register`` adds one from outside the package (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FamilyRow:
    model_type: str
    # "rms": x * rsqrt(mean(x^2)) * w (Llama); "rms_one_plus": ... * (1 + w) (Gemma);
    # "layer": LayerNorm with a bias (StarCoder 2).
    norm: str = "rms"
    # "pre": norm before attention and MLP (Llama); "post": after each, none before (OLMo 2);
    # "sandwich": both (Gemma 2 and 3).
    placement: str = "pre"
    # "": none; "head": one norm of head_dim shared by every head (Qwen3, Gemma 3);
    # "projection": one norm over the whole q (and k) projection (OLMo 2).
    qk_norm: str = ""
    # "": none; "sqrt_hidden": embeddings x sqrt(hidden_size) in the model's dtype (Gemma);
    # "embedding_multiplier": config.json's value (Granite).
    embed_scale: str = ""
    # "gated": down(act(gate(x)) * up(x)); "plain": down(act(up(x))) (StarCoder 2).
    mlp: str = "gated"
    # Hugging Face's MLP module names: (gate, down, up) for gated, (up, down) for plain.
    mlp_names: tuple[str, ...] = ("gate_proj", "down_proj", "up_proj")
    # Biases: a config key to read (its default after the colon), or a fixed value.
    qkv_bias: str | bool = "attention_bias:false"
    o_bias: str | bool = "attention_bias:false"
    mlp_bias: str | bool = "mlp_bias:false"
    norm_eps_key: str = "rms_norm_eps"
    norm_eps_default: float = 1e-6
    activation_default: str = "silu"
    tied_default: bool = False
    rope_theta_default: float = 10_000.0
    sliding_rope_theta_default: float | None = None  # a config without per-type RoPE
    # Which layers slide where config.json has no ``layer_types`` (configs written before
    # transformers named them): "all" where a sliding_window is set (Mistral, StarCoder 2),
    # "pattern" every layer but each sliding_window_pattern-th (Gemma 3; Gemma 2 every other),
    # "qwen" where use_sliding_window is true, from max_window_layers on.
    sliding_default: str = "all"
    sliding_pattern_default: int = 2
    # q is scaled by query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5 (Gemma).
    query_pre_attn_scalar: bool = False
    # Granite's scalars: attention_multiplier, residual_multiplier, logits_scaling.
    granite_scalars: bool = False
    # Layers without RoPE listed in no_rope_layers (1 = RoPE), as SmolLM3 writes them.
    no_rope_layers: bool = False
    # Hugging Face's per-layer norm names, by the slot torchtune's layer gives them.
    norm_names: dict = field(default_factory=dict)
    aliases: tuple[str, ...] = ()


_LLAMA_NORMS = {"sa_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_SANDWICH_NORMS = {"sa_norm": "input_layernorm", "sa_scale": "post_attention_layernorm",
                   "mlp_norm": "pre_feedforward_layernorm",
                   "mlp_scale": "post_feedforward_layernorm"}
_POST_NORMS = {"sa_scale": "post_attention_layernorm", "mlp_scale": "post_feedforward_layernorm"}

_ROWS: dict[str, FamilyRow] = {}


def register(row: FamilyRow) -> FamilyRow:
    """Add (or replace) a family's row: the one step a family of only known features needs.
    Its ``norm_names`` default to Llama's for a pre-norm family."""
    if not row.norm_names:
        names = {"pre": _LLAMA_NORMS, "post": _POST_NORMS, "sandwich": _SANDWICH_NORMS}
        row = FamilyRow(**{**row.__dict__, "norm_names": names[row.placement]})
    for name in (row.model_type, *row.aliases):
        _ROWS[name] = row
    return row


# Rows from installed packages: an entry point in this group names a FamilyRow or a list
# of them (docs/extending.md#a-model-family-of-your-own), loaded at the first look-up.
ENTRY_POINT_GROUP = "kubetune.model_families"
_plugins_loaded = False


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    from kubetune.errors import BadInputError

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found = ep.load()
        except Exception as exc:  # a broken plugin is the installer's to fix, named
            raise BadInputError(f"model family plugin {ep.name} ({ep.value}) failed to "
                                f"import: {type(exc).__name__}: {exc}") from None
        for row in (found if isinstance(found, (list, tuple)) else [found]):
            if not isinstance(row, FamilyRow):
                raise BadInputError(f"model family plugin {ep.name} ({ep.value}) gives "
                                    f"{type(row).__name__}, not a kubetune FamilyRow")
            register(row)


def row_of(model_type: str) -> FamilyRow | None:
    _load_plugins()
    return _ROWS.get(model_type)


def model_types() -> tuple[str, ...]:
    _load_plugins()
    return tuple(sorted(_ROWS))


_GEMMA = dict(norm="rms_one_plus", embed_scale="sqrt_hidden", activation_default="gelu_pytorch_tanh",
              tied_default=True, query_pre_attn_scalar=True)

register(FamilyRow("qwen3", qk_norm="head", rope_theta_default=1_000_000.0,
                   sliding_default="qwen"))
register(FamilyRow("gemma2", placement="sandwich", sliding_default="pattern",
                   sliding_pattern_default=2, **_GEMMA))
register(FamilyRow("gemma3_text", placement="sandwich", qk_norm="head",
                   sliding_default="pattern", sliding_pattern_default=6,
                   rope_theta_default=1_000_000.0, sliding_rope_theta_default=10_000.0, **_GEMMA))
register(FamilyRow("olmo2", placement="post", qk_norm="projection", norm_eps_default=1e-5,
                   sliding_default="none"))
register(FamilyRow("olmo3", placement="post", qk_norm="projection", norm_eps_default=1e-5,
                   sliding_default="pattern", sliding_pattern_default=4,
                   sliding_rope_theta_default=None))
register(FamilyRow("granite", granite_scalars=True, norm_eps_default=1e-6,
                   sliding_default="none"))
register(FamilyRow("smollm3", no_rope_layers=True, rope_theta_default=2_000_000.0,
                   sliding_default="none"))
register(FamilyRow("starcoder2", norm="layer", mlp="plain", mlp_names=("c_fc", "c_proj"),
                   qkv_bias="use_bias:true", o_bias="use_bias:true", mlp_bias="use_bias:true",
                   norm_eps_key="norm_epsilon", norm_eps_default=1e-5,
                   activation_default="gelu_pytorch_tanh", tied_default=True))
register(FamilyRow("ministral", qkv_bias=False, o_bias=False, mlp_bias=False))
# Dense decoders of Llama's core and only the features above.
register(FamilyRow("seed_oss", qkv_bias="attention_bias:true",
                   o_bias="attention_out_bias:false", sliding_default="none"))
