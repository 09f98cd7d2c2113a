"""A Hugging Face state dict in torchtune's keys, for any family ``architecture_of``
resolves: the conversion the family's checkpointer applies on load, for code that holds
weights outside a checkpointer (the exporter's logits check). A config-built family's keys
come from its row (``weight_names``), the table its checkpointer reads too."""

from __future__ import annotations

TIED_KEY = "lm_head.weight"


def hf_to_tune(arch, config: dict, state: dict) -> dict:
    from kubetune.model_family.architecture import DECODER_PACKAGE, decoder_family

    if arch.package == DECODER_PACKAGE:
        from torchtune.models.convert_weights import get_mapped_key

        _, spec, keys = decoder_family(config)
        return {get_mapped_key(key, keys): value for key, value in state.items()
                if "rotary_emb.inv_freq" not in key
                and not (spec["tie_word_embeddings"] and key == TIED_KEY)}
    dims = arch.dims
    heads, kv_heads = dims["num_heads"], dims["num_kv_heads"]
    head_dim = int(config.get("head_dim") or dims["embed_dim"] // heads)
    args = dict(num_heads=heads, num_kv_heads=kv_heads, dim=dims["embed_dim"],
                head_dim=head_dim)
    if arch.family == "qwen2":
        from torchtune.models.qwen2._convert_weights import qwen2_hf_to_tune

        return qwen2_hf_to_tune(state, tie_word_embeddings=dims["tie_word_embeddings"], **args)
    if arch.family == "phi3":
        from torchtune.models.phi3 import phi3_hf_to_tune

        if heads == kv_heads:  # as torchtune's checkpointer calls it
            return phi3_hf_to_tune(state)
        return phi3_hf_to_tune(state, num_heads=heads, num_kv_heads=kv_heads,
                               dim=dims["embed_dim"])
    from torchtune.models.convert_weights import hf_to_tune as llama_style

    return llama_style(state, **args)
