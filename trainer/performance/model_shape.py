"""Sizes and FLOPs of a decoder from its dimensions (``CheckpointModel.architecture.dims``):
what the memory planner and summary.json's MFU both count, so they count the same.

FLOPs per trained token (a multiply-add is 2 FLOPs; N = all parameters):
- full fine-tuning: 6N (forward 2N, activation gradients 2N, weight gradients 2N);
- LoRA / QLoRA / DoRA: 4N + 6 N_adapter -- the frozen base runs forward (2N) and passes
  activation gradients back (2N) but computes no weight gradients; the adapters train
  in full (6 N_adapter). QLoRA's NF4 dequantization and DoRA's norm are not counted;
- attention, any method: 12 L d_attn T (PaLM's convention: QK^T and AV, 4 L d_attn T
  forward, twice that backward, over a sequence of T tokens without discounting the
  causal mask), with d_attn = heads x head_dim.
"""

from __future__ import annotations

LORA_METHODS = ("lora", "qlora", "dora")


def head_dim(dims: dict) -> int:
    return int(dims.get("head_dim") or dims["embed_dim"] // dims["num_heads"])


def parameter_count(dims: dict) -> int:
    d, layers, vocab = dims["embed_dim"], dims["num_layers"], dims["vocab_size"]
    heads, kv, ff = dims["num_heads"], dims["num_kv_heads"], dims["intermediate_dim"]
    hd = head_dim(dims)
    attention = d * heads * hd * 2 + d * kv * hd * 2
    # A plain MLP (StarCoder 2's up and down) has two matrices, a gated one three.
    mlp = (2 if dims.get("mlp") == "plain" else 3) * d * ff
    per_layer = attention + mlp + 2 * d
    embeddings = vocab * d * (1 if dims.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + d


def linear_shapes(dims: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one layer, and of the output head."""
    d, heads, kv, ff = (dims["embed_dim"], dims["num_heads"], dims["num_kv_heads"],
                        dims["intermediate_dim"])
    hd = head_dim(dims)
    shapes = {"q_proj": (d, heads * hd), "k_proj": (d, kv * hd), "v_proj": (d, kv * hd),
              "output_proj": (heads * hd, d), "w1": (d, ff), "w3": (d, ff), "w2": (ff, d),
              "output": (d, dims["vocab_size"])}
    if dims.get("mlp") == "plain":
        del shapes["w3"]
    return shapes


def quantizable_count(dims: dict) -> int:
    """Parameters in the layers' projections: what QLoRA stores in NF4."""
    shapes = linear_shapes(dims)
    per_layer = sum(i * o for name, (i, o) in shapes.items() if name != "output")
    return dims["num_layers"] * per_layer


def adapter_count(dims: dict, model_cfg: dict, method: str) -> int:
    """Trainable LoRA/DoRA parameters: rank x (in + out) per adapted projection, plus
    DoRA's magnitude vector (out) each."""
    if method not in LORA_METHODS:
        return 0
    rank = int(model_cfg.get("lora_rank") or 8)
    shapes = linear_shapes(dims)
    per_layer = list(model_cfg.get("lora_attn_modules") or ["q_proj", "v_proj"])
    if model_cfg.get("apply_lora_to_mlp"):
        per_layer += ["w1", "w2", "w3"]
    extra = 1 if method == "dora" else 0

    def one(name: str) -> int:
        i, o = shapes[name]
        return rank * (i + o) + extra * o

    total = dims["num_layers"] * sum(one(n) for n in per_layer if n in shapes)
    if model_cfg.get("apply_lora_to_output") and not dims.get("tie_word_embeddings"):
        total += one("output")
    return total


def attention_flops_per_token(dims: dict, seq_len: float) -> float:
    return 12 * dims["num_layers"] * dims["num_heads"] * head_dim(dims) * seq_len


def flops_per_token(dims: dict, method: str, n_adapter: int, seq_len: float) -> float:
    n = parameter_count(dims)
    dense = 6 * n if method not in LORA_METHODS else 4 * n + 6 * n_adapter
    return dense + attention_flops_per_token(dims, seq_len)


def convention(method: str) -> str:
    if method in LORA_METHODS:
        return ("4N + 6N_adapter + 12*L*d_attn*T per trained token (frozen base: forward and "
                "activation gradients, no weight gradients; attention over T tokens)")
    return "6N + 12*L*d_attn*T per trained token (attention over T tokens)"
