"""Tokenizer files for the tiny test checkpoints of each family, in the layout the real
checkpoints ship: byte-level BPE (vocab.json + merges.txt + tokenizer.json) for Qwen2, Qwen3
and Phi-4, a sentencepiece tokenizer.model for Mistral, Gemma and Phi-3, tiktoken for Llama 3."""

from __future__ import annotations

import io
import json
from pathlib import Path

from kubetune.tools.demo.tiny_qwen2 import write_bpe_tokenizer
from kubetune.tools.demo.tiny_tokenizer import NUM_BYTES, added_tokens

# The special tokens torchtune's tokenizers look up, at small ids after the 256 bytes.
QWEN3_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                 "<think>", "</think>")
PHI4_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|dummy_85|>")
PHI3_SPECIAL = ("<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>")
SPM_VOCAB = 300  # 256 byte pieces, 4 control pieces, a few merges
# Gemma's control ids: pad 0, eos 1, bos 2, unk 3.
SPM_IDS = {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3}


def write_bpe(model_dir: Path, special: tuple[str, ...]) -> int:
    """Returns the tokenizer's vocabulary size."""
    ids = {token: NUM_BYTES + i for i, token in enumerate(special)}
    write_bpe_tokenizer(Path(model_dir), 512, ids)
    return NUM_BYTES + len(special)


def write_spm(model_dir: Path, special: tuple[str, ...] = ()) -> int:
    """A sentencepiece BPE model (byte fallback) trained on arithmetic text; ``special``
    tokens follow its vocabulary, listed in a tokenizer.json's added_tokens as Phi-3's.
    Returns the vocabulary size, special tokens included."""
    import sentencepiece as spm

    lines = [f"{a} + {b} = {a + b}. What is {a} plus {b}?" for a in range(30) for b in range(9)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=SPM_VOCAB,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, **SPM_IDS,
        minloglevel=2)
    (Path(model_dir) / "tokenizer.model").write_bytes(model.getvalue())
    if special:
        ids = {token: SPM_VOCAB + i for i, token in enumerate(special)}
        (Path(model_dir) / "tokenizer.json").write_text(
            json.dumps({"version": "1.0", "added_tokens": added_tokens(ids)}, indent=1))
    return SPM_VOCAB + len(special)


QWEN2_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_llama3(model_dir: Path) -> int:
    """Llama-3's tiktoken original/tokenizer.model and tokenizer.json (the demo's)."""
    from kubetune.tools.demo import tiny_tokenizer

    tiny_tokenizer.write_tokenizer(Path(model_dir), max_length=512)
    return tiny_tokenizer.vocab_size()


# SmolLM2's template (ChatML, a default system turn), over the tiny Llama-3 tokens.
CHATML = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
          "<|start_header_id|>system\nYou are a helpful assistant.<|eot_id|>\n{% endif %}"
          "<|start_header_id|>{{ m['role'] }}\n{{ m['content'] }}<|eot_id|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant\n{% endif %}")


def write_json_only(model_dir: Path) -> int:
    """A Llama-architecture checkpoint of another house (SmolLM2, TinyLlama): only
    ``tokenizer.json`` and its config, with a chat template of its own; no original/."""
    import shutil

    vocab = write_llama3(model_dir)
    shutil.rmtree(Path(model_dir) / "original")
    (Path(model_dir) / "chat_template.jinja").write_text(CHATML)
    config = Path(model_dir) / "tokenizer_config.json"
    # An instruct checkpoint's EOS is its turn's end (SmolLM2's <|im_end|>).
    config.write_text(json.dumps({**json.loads(config.read_text()), "eos_token": "<|eot_id|>"},
                                 indent=1))
    return vocab


def write_json_sharded(model_dir: Path) -> int:
    """``write_json_only``, the weights in two safetensors shards with their index, and a
    generation_config.json that stops at more EOS ids than the tokenizer's EOS."""
    from safetensors.torch import load_file, save_file

    vocab = write_json_only(model_dir)
    model_dir = Path(model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, model_dir / shard, metadata={"format": "pt"})
    (model_dir / "model.safetensors").unlink()
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in tensors.values())},
             "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    generation = model_dir / "generation_config.json"
    config = json.loads(generation.read_text()) if generation.is_file() else {}
    ids = {t["content"]: t["id"] for t in
           json.loads((model_dir / "tokenizer.json").read_text())["added_tokens"]}
    config["eos_token_id"] = [ids["<|eot_id|>"], ids["<|end_of_text|>"], ids["<|eom_id|>"]]
    generation.write_text(json.dumps(config, indent=1))
    return vocab


# Each family's tokenizer files, as its checkpoints ship them; and the shapes other
# houses' checkpoints of a supported architecture come in (issue 52).
TOKENIZERS = {
    "json-only": write_json_only,
    "json-sharded": write_json_sharded,
    "spm-only": write_spm,  # Llama 2's layout: a sentencepiece tokenizer.model alone
    "llama3": write_llama3,
    "spm": write_spm,  # Mistral, Gemma, Gemma 2: sentencepiece, no added tokens
    "qwen2": lambda d: write_bpe(d, QWEN2_SPECIAL),
    "qwen3": lambda d: write_bpe(d, QWEN3_SPECIAL),
    "phi3": lambda d: write_spm(d, PHI3_SPECIAL),
    "phi4": lambda d: write_bpe(d, PHI4_SPECIAL),
}


# The turn tokens each sentencepiece family's tokenizer.json adds after its vocabulary.
SPM_TURN_TOKENS = {"mistral": ("[INST]", "[/INST]"),
                   "gemma": ("<start_of_turn>", "<end_of_turn>"),
                   "gemma2": ("<start_of_turn>", "<end_of_turn>"),
                   "phi3": PHI3_SPECIAL}


def write_spm_tokenizer_json(model_dir: Path, family: str) -> None:
    """``tokenizer.json`` for the tiny sentencepiece model, as transformers' converter
    writes it for the family (Llama-style: a "▁" before the first piece; Gemma's: none),
    so transformers and the trainer both encode the rendered chat template with it."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(Path(model_dir) / "tokenizer.model"))
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    merges = sorted(((piece[:k], piece[k:], rank) for piece, rank in vocab.items()
                     for k in range(1, len(piece))
                     if piece[:k] in vocab and piece[k:] in vocab and len(piece) > 1),
                    key=lambda m: (m[2], vocab[m[0]], vocab[m[1]]))
    special = {processor.id_to_piece(i): i for i in range(4)}
    if family.startswith("gemma"):  # Gemma names its control pieces so
        special = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
        vocab.update(special)
        for piece in ("</s>", "<s>"):
            vocab.pop(piece, None)
    special.update({t: SPM_VOCAB + i for i, t in enumerate(SPM_TURN_TOKENS.get(family, ()))})
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    gemma = family.startswith("gemma")
    decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    written = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added_tokens(special),
        "normalizer": replace if gemma else None,
        "pre_tokenizer": None if gemma else {"type": "Metaspace", "replacement": "\u2581",
                                              "prepend_scheme": "first", "split": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders if gemma else [
            *decoders, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b, _ in merges]}}
    (Path(model_dir) / "tokenizer.json").write_text(json.dumps(written, indent=1))
