"""A Hugging Face state dict in torchtune's keys, for any family ``architecture_of``
resolves: the conversion the family's checkpointer applies on load, for code that holds
weights outside a checkpointer (the exporter's logits check)."""

from __future__ import annotations


def hf_to_tune(arch, config: dict, state: dict) -> dict:
    dims = arch.dims
    heads, kv_heads = dims["num_heads"], dims["num_kv_heads"]
    head_dim = int(config.get("head_dim") or dims["embed_dim"] // heads)
    args = dict(num_heads=heads, num_kv_heads=kv_heads, dim=dims["embed_dim"],
                head_dim=head_dim)
    if arch.family == "qwen3":
        from kubetune.trainer.models.qwen_weights import qwen3_hf_to_tune

        return qwen3_hf_to_tune(state, tie_word_embeddings=dims["tie_word_embeddings"])
    if arch.family == "qwen2":
        from torchtune.models.qwen2._convert_weights import qwen2_hf_to_tune

        return qwen2_hf_to_tune(state, tie_word_embeddings=dims["tie_word_embeddings"], **args)
    if arch.family == "gemma2":
        from torchtune.models.gemma2 import _convert_weights as gemma2_convert

        from kubetune.trainer.models.gemma2 import FEED_FORWARD_NORMS
        from kubetune.trainer.models.scoped import patched

        with patched(gemma2_convert, "_GEMMA2_FROM_HF", updates=FEED_FORWARD_NORMS):
            return gemma2_convert.gemma2_hf_to_tune(state, **args)
    if arch.family == "phi3":
        from torchtune.models.phi3 import phi3_hf_to_tune

        if heads == kv_heads:  # as torchtune's checkpointer calls it
            return phi3_hf_to_tune(state)
        return phi3_hf_to_tune(state, num_heads=heads, num_kv_heads=kv_heads,
                               dim=dims["embed_dim"])
    from torchtune.models.convert_weights import hf_to_tune as llama_style

    return llama_style(state, **args)
