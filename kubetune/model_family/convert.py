"""A Hugging Face state dict in torchtune's keys, for any family ``architecture_of``
resolves: the conversion the family's checkpointer applies on load, for code that holds
weights outside a checkpointer (the exporter's logits check). The key tables where our
families depart from torchtune's live here too; their checkpointers
(``kubetune.trainer.models``) apply the same tables."""

from __future__ import annotations

# Qwen3 is Qwen2 plus one norm per q and k head (torchtune 0.6.1 has no Qwen3 table).
QWEN3_KEYS = {
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attn.q_proj.norm.scale",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attn.k_proj.norm.scale",
}
# torchtune 0.6.1's Gemma 2 table swaps these two (see kubetune.trainer.models.gemma2).
GEMMA2_FEED_FORWARD_NORMS = {
    "model.layers.{}.pre_feedforward_layernorm.weight": "layers.{}.mlp_norm.scale",
    "model.layers.{}.post_feedforward_layernorm.weight": "layers.{}.mlp_scale.scale",
}
TIED_KEY = "lm_head.weight"


def qwen3_hf_to_tune(state: dict, tie_word_embeddings: bool = False) -> dict:
    from torchtune.models.convert_weights import get_mapped_key
    from torchtune.models.qwen2 import _convert_weights as qwen2_convert

    from_hf = {**qwen2_convert._FROM_HF, **QWEN3_KEYS}
    return {get_mapped_key(key, from_hf): value for key, value in state.items()
            if "rotary_emb.inv_freq" not in key
            and not (tie_word_embeddings and key == TIED_KEY)}


def hf_to_tune(arch, config: dict, state: dict) -> dict:
    dims = arch.dims
    heads, kv_heads = dims["num_heads"], dims["num_kv_heads"]
    head_dim = int(config.get("head_dim") or dims["embed_dim"] // heads)
    args = dict(num_heads=heads, num_kv_heads=kv_heads, dim=dims["embed_dim"],
                head_dim=head_dim)
    if arch.family == "qwen3":
        return qwen3_hf_to_tune(state, tie_word_embeddings=dims["tie_word_embeddings"])
    if arch.family == "qwen2":
        from torchtune.models.qwen2._convert_weights import qwen2_hf_to_tune

        return qwen2_hf_to_tune(state, tie_word_embeddings=dims["tie_word_embeddings"], **args)
    if arch.family == "gemma2":
        from torchtune.models.gemma2 import _convert_weights as gemma2_convert

        from kubetune.model_family.scoped import patched

        with patched(gemma2_convert, "_GEMMA2_FROM_HF", updates=GEMMA2_FEED_FORWARD_NORMS):
            return gemma2_convert.gemma2_hf_to_tune(state, **args)
    if arch.family == "phi3":
        from torchtune.models.phi3 import phi3_hf_to_tune

        if heads == kv_heads:  # as torchtune's checkpointer calls it
            return phi3_hf_to_tune(state)
        return phi3_hf_to_tune(state, num_heads=heads, num_kv_heads=kv_heads,
                               dim=dims["embed_dim"])
    from torchtune.models.convert_weights import hf_to_tune as llama_style

    return llama_style(state, **args)
