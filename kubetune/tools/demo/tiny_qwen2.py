"""A tiny Qwen2-architecture causal LM in Hugging Face layout, random weights, seeded.

Its tokenizer is byte-level BPE in the files a Qwen2 checkpoint ships: ``vocab.json`` +
``merges.txt`` (what torchtune's ``qwen2_tokenizer`` reads) and ``tokenizer.json`` (whose
``added_tokens`` give the special-token ids, here small ones, not Qwen's 151643+).
Qwen2 differs from Llama where it matters to a loader: biases on q/k/v, tied embeddings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kubetune.tools.demo.decoder_weights import random_decoder
from kubetune.tools.demo.tiny_tokenizer import (NUM_BYTES, _byte_to_unicode, added_tokens,
                                           added_tokens_decoder)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2's pre-tokenizer split (digits one at a time).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)


def special_token_ids() -> dict[str, int]:
    return {token: NUM_BYTES + i for i, token in enumerate(SPECIAL_TOKENS)}


def vocab_size() -> int:
    return NUM_BYTES + len(SPECIAL_TOKENS)


@dataclass(frozen=True)
class TinyQwen2Spec:
    hidden_size: int = 64
    intermediate_size: int = 160
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    seed: int = 0
    repo_id: str = "kubetune/tiny-qwen2"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def config_json(self) -> dict:
        ids = special_token_ids()
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "sliding_window": None,
            "use_sliding_window": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "vocab_size": vocab_size(),
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "torch_dtype": "float32",
            "initializer_range": 0.02,
            "attention_dropout": 0.0,
            "use_cache": True,
        }


def _random_state_dict(spec: TinyQwen2Spec) -> dict:
    return random_decoder(
        seed=spec.seed, vocab=vocab_size(), hidden=spec.hidden_size,
        intermediate=spec.intermediate_size, layers=spec.num_hidden_layers,
        heads=spec.num_attention_heads, kv_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim, tied=spec.tie_word_embeddings, qkv_bias=True)


def _write_tokenizer(model_dir: Path, max_length: int) -> None:
    write_bpe_tokenizer(model_dir, max_length, special_token_ids())


def write_bpe_tokenizer(model_dir: Path, max_length: int, ids: dict[str, int]) -> None:
    """The byte-level BPE files of a Qwen-style checkpoint, with ``ids`` as its special
    tokens (the Qwen2 demo's; other families' tiny test models pass their own)."""
    byte_chars = _byte_to_unicode()
    vocab = {byte_chars[b]: b for b in range(NUM_BYTES)}
    (model_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    # No merges: every byte is its own token, exact in torchtune and in `tokenizers`.
    (model_dir / "merges.txt").write_text("#version: 0.2\n")
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens(ids),
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": False},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False,
                           "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": [],
        },
    }
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer_json, indent=1))
    tokenizer_config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": max_length,
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added_tokens_decoder(ids),
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))


def write_tiny_qwen2(model_dir: Path, spec: TinyQwen2Spec = TinyQwen2Spec()) -> Path:
    """Write the tiny Qwen2 model to ``model_dir`` (created) and return it."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(spec.config_json(), indent=2))
    _write_tokenizer(model_dir, spec.max_position_embeddings)
    save_file(_random_state_dict(spec), str(model_dir / "model.safetensors"),
              metadata={"format": "pt"})
    return model_dir
