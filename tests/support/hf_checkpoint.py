"""Run inside the serving venv (transformers, no kubetune): write a tiny checkpoint of a
model family with transformers itself, or print a checkpoint's logits on given tokens.

Usage:
  python hf_checkpoint.py write FAMILY DIR VOCAB_SIZE   (random weights, seeded; fp32)
  python hf_checkpoint.py logits DIR TOKENS.json        (prints the logits as JSON)
"""

import json
import sys
from pathlib import Path

import torch
import transformers

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
# Each family's own config fields, the ones a loader can get wrong.
FAMILIES = {
    # head_dim 24 != 64 / 4; untied output; q/k norms come with the architecture.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              {"head_dim": 24, "tie_word_embeddings": False, "rope_theta": 1_000_000.0,
               "rms_norm_eps": 1e-6}),
    "qwen3-tied": ("Qwen3Config", "Qwen3ForCausalLM",
                   {"head_dim": 32, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}),
    # head_dim 32 != 64 / 4 as in Gemma 2 (256 vs 2304/8); softcaps; alternating window.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"head_dim": 32, "query_pre_attn_scalar": 32, "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0, "sliding_window": 256,
                "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": 0,
                "bos_token_id": 2, "eos_token_id": 1}),
    # Phi-3 / Phi-4: fused qkv_proj and gate_up_proj in HF, split in torchtune.
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             {"rope_theta": 10_000.0, "pad_token_id": 0, "bos_token_id": 1,
              "eos_token_id": 2, "sliding_window": None}),
}


def write(family: str, out: Path, vocab_size: int) -> None:
    config_cls, model_cls, fields = FAMILIES[family]
    config = getattr(transformers, config_cls)(vocab_size=vocab_size, **SMALL, **fields)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(torch.float32)
    with torch.no_grad():  # norms start at 1 (0 for Gemma's 1+w): make them count
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(out, safe_serialization=True)


def logits(model_dir: Path, tokens_file: Path) -> None:
    tokens = torch.tensor(json.loads(tokens_file.read_text()))
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        print(json.dumps(model(tokens).logits.tolist()))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
    else:
        logits(Path(sys.argv[2]), Path(sys.argv[3]))
