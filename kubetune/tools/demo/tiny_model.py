"""A tiny Llama-3-architecture causal LM in Hugging Face layout, random weights, seeded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kubetune.atomic_write import atomic_path
from kubetune.tools.demo import tiny_tokenizer
from kubetune.tools.demo.decoder_weights import DecoderSpec


@dataclass(frozen=True)
class TinyModelSpec(DecoderSpec):
    repo_id: str = "kubetune/tiny-llama3"
    # Larger shapes (benchmarks): an embedding bigger than the byte tokenizer needs,
    # Llama-3.2's tied output (tie_word_embeddings), and bf16 weights to halve the file.
    vocab_size: int | None = None
    torch_dtype: str = "float32"

    @property
    def vocab(self) -> int:
        return self.vocab_size or tiny_tokenizer.vocab_size()

    def config_json(self) -> dict:
        ids = tiny_tokenizer.special_token_ids()
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **self.shape_json(),
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}
                             if self.tie_word_embeddings else None),
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "vocab_size": self.vocab,
            "bos_token_id": ids["<|begin_of_text|>"],
            "eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"]],
            "pad_token_id": ids["<|finetune_right_pad_id|>"],
            "torch_dtype": self.torch_dtype,
            "initializer_range": 0.02,
            "pretraining_tp": 1,
            "use_cache": True,
        }


def _random_state_dict(spec: TinyModelSpec, device: str = "cpu") -> dict:
    import torch

    tensors = spec.random_weights(spec.vocab, device=device)
    dtype = torch.bfloat16 if spec.torch_dtype == "bfloat16" else torch.float32
    # Converted (and moved off a GPU) one tensor at a time, each fp32 draw freed as it goes:
    # an 8B-shaped model never holds a second full copy.
    return {name: tensors.pop(name).to(dtype).cpu() for name in list(tensors)}


def write_tiny_model(model_dir: Path, spec: TinyModelSpec = TinyModelSpec(),
                     device: str = "cpu") -> Path:
    """Write the tiny model to ``model_dir`` (created) and return it; ``device`` draws the
    weights there (``decoder_weights``)."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(spec.config_json(), indent=2))
    config = spec.config_json()
    (model_dir / "generation_config.json").write_text(json.dumps({
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "do_sample": False,
    }, indent=2))
    tiny_tokenizer.write_tokenizer(model_dir, max_length=spec.max_position_embeddings)
    # Through atomic_path: safetensors alone writes 0600, and an engine's container user
    # (or a pod's) must read the demo's weights as any other file of the model.
    with atomic_path(model_dir / "model.safetensors") as tmp:
        save_file(_random_state_dict(spec, device), str(tmp), metadata={"format": "pt"})
    return model_dir
