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

from kubetune.atomic_write import atomic_path
from kubetune.tools.demo.decoder_weights import DecoderSpec
from kubetune.tools.demo.tiny_tokenizer import (NUM_BYTES, _byte_to_unicode,
                                                added_tokens_decoder, tokenizer_json)

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
class TinyQwen2Spec(DecoderSpec):
    # Qwen2's own defaults where they differ from Llama's; its embeddings are tied.
    intermediate_size: int = 160
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    repo_id: str = "kubetune/tiny-qwen2"

    def config_json(self) -> dict:
        ids = special_token_ids()
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            **self.shape_json(),
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
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    written = tokenizer_json(
        ids, normalizer={"type": "NFC"}, split_pattern=SPLIT_PATTERN, trim_offsets=False,
        post_processor=byte_level, decoder=byte_level,
        model={
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": [],
        },
    )
    (model_dir / "tokenizer.json").write_text(json.dumps(written, indent=1))
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
    with atomic_path(model_dir / "model.safetensors") as tmp:  # the umask's mode, not 0600
        save_file(spec.random_weights(vocab_size(), qkv_bias=True), str(tmp),
                  metadata={"format": "pt"})
    return model_dir
