"""A byte-level BPE tokenizer with Llama-3's special tokens at small ids.

Written in both forms a Llama-3 checkpoint ships: ``original/tokenizer.model`` (tiktoken
ranks, what torchtune's ``llama3_tokenizer`` reads) and ``tokenizer.json`` (what Hugging
Face loads; its ``added_tokens`` are what torchtune's ``special_tokens_path`` reads). The
vocabulary is the 256 bytes, with no merges: small, exact in both libraries, and enough
for a model whose job is to show the pipeline learns.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

# The tokens torchtune's Llama3Tokenizer requires, in Llama-3's order.
SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
    "<|video|>",
)
# Llama-3's pre-tokenizer split, the same regex torchtune passes to tiktoken.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_BYTES = 256


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(NUM_BYTES):
        if b not in printable:
            printable.append(b)
            chars.append(NUM_BYTES + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def added_tokens(ids: dict[str, int]) -> list[dict]:
    """``tokenizer.json``'s ``added_tokens``: what HF and torchtune read special ids from."""
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for t, i in ids.items()]


def added_tokens_decoder(ids: dict[str, int]) -> dict[str, dict]:
    """``tokenizer_config.json``'s view of the same special tokens."""
    return {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True} for t, i in ids.items()}


def tokenizer_json(ids: dict[str, int], *, normalizer: dict | None, split_pattern: str,
                   trim_offsets: bool, post_processor: dict, decoder: dict,
                   model: dict) -> dict:
    """``tokenizer.json`` of a byte-level tokenizer: split by ``split_pattern``, then each
    byte its own character; the sections in the order Hugging Face writes them."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens(ids),
        "normalizer": normalizer,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": split_pattern},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets,
                 "use_regex": False},
            ],
        },
        "post_processor": post_processor,
        "decoder": decoder,
        "model": model,
    }


def special_token_ids() -> dict[str, int]:
    return {token: NUM_BYTES + i for i, token in enumerate(SPECIAL_TOKENS)}


def vocab_size() -> int:
    return NUM_BYTES + len(SPECIAL_TOKENS)


def write_tokenizer(model_dir: Path, max_length: int) -> None:
    ids = special_token_ids()
    byte_chars = _byte_to_unicode()

    original = model_dir / "original"
    original.mkdir(parents=True, exist_ok=True)
    # tiktoken format: base64 of the token's bytes, then its rank.
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(NUM_BYTES)]
    (original / "tokenizer.model").write_text("\n".join(lines) + "\n")

    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    written = tokenizer_json(
        ids, normalizer=None, split_pattern=SPLIT_PATTERN, trim_offsets=True,
        post_processor={
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [ids[bos]], "tokens": [bos]}},
        },
        decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                 "use_regex": True},
        model={
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
            "vocab": {byte_chars[b]: b for b in range(NUM_BYTES)},
            "merges": [],
        },
    )
    (model_dir / "tokenizer.json").write_text(json.dumps(written, indent=1))

    tokenizer_config = {
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": "<|finetune_right_pad_id|>",
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens_decoder(ids),
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (model_dir / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": bos, "eos_token": eos,
                    "pad_token": "<|finetune_right_pad_id|>"}, indent=1)
    )
