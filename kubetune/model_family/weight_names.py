"""Weight names of a config-built decoder, Hugging Face <-> torchtune, from its features
and its family's row: one table the checkpointer (both ways), the exporter's logits check
and the PEFT adapter conversion all read. Layer numbers are ``{}``, as torchtune's own
tables write them (``torchtune.models.convert_weights.get_mapped_key``)."""

from __future__ import annotations

from kubetune.model_family.families import FamilyRow

HF_LAYER = "model.layers.{}."
TUNE_LAYER = "layers.{}."


def _norm_keys(hf: str, tune: str, kind: str) -> dict[str, str]:
    if kind == "layer":  # nn.LayerNorm: weight and bias under their own names
        return {f"{hf}.weight": f"{tune}.weight", f"{hf}.bias": f"{tune}.bias"}
    return {f"{hf}.weight": f"{tune}.scale"}


def _linear_keys(hf: str, tune: str, bias: bool) -> dict[str, str]:
    keys = {f"{hf}.weight": f"{tune}.weight"}
    if bias:
        keys[f"{hf}.bias"] = f"{tune}.bias"
    return keys


def module_names(spec: dict, row: FamilyRow) -> dict[str, str]:
    """torchtune module (in a layer, or top level) -> Hugging Face module, for the
    projections an adapter can sit on."""
    names = {"attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj",
             "attn.v_proj": "self_attn.v_proj", "attn.output_proj": "self_attn.o_proj"}
    tune_mlp = ("w1", "w2", "w3") if spec["mlp"] == "gated" else ("w1", "w2")
    names.update({f"mlp.{t}": f"mlp.{h}" for t, h in zip(tune_mlp, row.mlp_names)})
    return names


def hf_to_tune_keys(spec: dict, row: FamilyRow) -> dict[str, str]:
    keys = {"model.embed_tokens.weight": "tok_embeddings.weight"}
    for tune, hf in module_names(spec, row).items():
        bias = spec["mlp_bias"] if tune.startswith("mlp.") else (
            spec["o_bias"] if tune == "attn.output_proj" else spec["qkv_bias"])
        keys.update(_linear_keys(HF_LAYER + hf, TUNE_LAYER + tune, bias))
    if spec["qk_norm"]:
        for p in ("q", "k"):
            keys.update(_norm_keys(f"{HF_LAYER}self_attn.{p}_norm",
                                   f"{TUNE_LAYER}attn.{p}_proj.norm", spec["norm"]))
    for slot, hf in row.norm_names.items():
        keys.update(_norm_keys(HF_LAYER + hf, TUNE_LAYER + slot, spec["norm"]))
    keys.update(_norm_keys("model.norm", "norm", spec["norm"]))
    if not spec["tie_word_embeddings"]:
        keys["lm_head.weight"] = "output.weight"
    return keys


def tune_to_hf_targets(spec: dict, row: FamilyRow) -> dict[str, str]:
    """torchtune's LoRA target names (``q_proj``, ``w1``, ``output`` ...) -> PEFT's."""
    targets = {tune.split(".")[-1]: hf.split(".")[-1]
               for tune, hf in module_names(spec, row).items()}
    targets["output"] = "lm_head"
    return targets
