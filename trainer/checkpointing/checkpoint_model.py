"""Read what the checkpoint really is, so the checkpoint wins over a config's fixed size.

A Hugging Face model directory says its architecture in ``config.json``. From it we pick
torchtune's *component builder* (``llama3``, ``lora_qwen2`` ...) with those dimensions
(``kubetune.model_family``), the checkpointer's ``model_type``, the weight files, and the
tokenizer files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.model_family.architecture import Architecture, architecture_of
from kubetune.workspace.model_files import read_config, weight_files
from kubetune.workspace.weight_headers import check_model


@dataclass
class Tokenizer:
    component: str
    args: dict
    # Special tokens read from tokenizer_config.json when the checkpoint has no
    # tokenizer.json: written beside the merged config as one torchtune can read.
    special_tokens: dict[str, int] | None = None


SPECIAL_TOKENS_FILE = "kubetune-special-tokens.json"


def special_tokens_from_config(model_dir: Path) -> dict[str, int] | None:
    path = model_dir / "tokenizer_config.json"
    try:
        decoder = json.loads(path.read_text()).get("added_tokens_decoder") or {}
        tokens = {entry["content"]: int(token_id) for token_id, entry in decoder.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return tokens or None


@dataclass
class CheckpointModel:
    model_dir: Path
    config: dict
    architecture: Architecture
    weight_files: list[str]
    tokenizer: Tokenizer

    @property
    def max_seq_len(self) -> int:
        return int(self.architecture.dims.get("max_seq_len", 2048))


def _with_special_tokens(component: str, args: dict, model_dir: Path) -> Tokenizer:
    """``component`` reading the special tokens from ``tokenizer.json`` where the
    checkpoint ships one, else with those config.json names."""
    special = model_dir / "tokenizer.json"
    if special.is_file():
        return Tokenizer(component, {**args, "special_tokens_path": str(special)})
    return Tokenizer(component, args, special_tokens_from_config(model_dir))


HF_TOKENIZER = "kubetune.trainer.models.fast_tokenizer.fast_tokenizer"


def hf_tokenizer_of(model_dir: Path, max_seq_len: int | None) -> Tokenizer | None:
    """The checkpoint's ``tokenizer.json`` with the files transformers reads beside it
    (special tokens, generation's stop ids, the chat template); None without one."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    args: dict = {"path": str(path)}
    for key, name in (("tokenizer_config_path", "tokenizer_config.json"),
                      ("generation_config_path", "generation_config.json"),
                      ("chat_template_path", "chat_template.jinja")):
        if (model_dir / name).is_file():
            args[key] = str(model_dir / name)
    return Tokenizer(HF_TOKENIZER, {**args, "max_seq_len": max_seq_len})


def tokenizer_of(model_dir: Path, family: str, max_seq_len: int | None) -> Tokenizer:
    """The family's own tokenizer files where the checkpoint ships them, else its
    ``tokenizer.json`` (most checkpoints on the hub ship only that), else a one-line
    refusal naming both."""
    try:
        return _family_tokenizer(model_dir, family, max_seq_len)
    except BadInputError as refused:
        fallback = hf_tokenizer_of(model_dir, max_seq_len)
        if fallback is None:
            raise BadInputError(f"{refused}, or a Hugging Face tokenizer.json") from None
        return fallback


def _family_tokenizer(model_dir: Path, family: str, max_seq_len: int | None) -> Tokenizer:
    if family.startswith("llama"):
        return _llama_tokenizer(model_dir, max_seq_len)
    if family == "qwen2":
        vocab, merges = model_dir / "vocab.json", model_dir / "merges.txt"
        for f in (vocab, merges):
            if not f.is_file():
                raise BadInputError(f"tokenizer file {f} is missing: a Qwen2 checkpoint ships "
                                    "vocab.json and merges.txt")
        return _with_special_tokens(
            "torchtune.models.qwen2.qwen2_tokenizer",
            {"path": str(vocab), "merges_file": str(merges), "max_seq_len": max_seq_len},
            model_dir)
    if family == "qwen3":
        return _qwen3_tokenizer(model_dir, max_seq_len)
    if family == "phi3":
        return _phi3_tokenizer(model_dir, max_seq_len)
    if family == "gemma2":  # Gemma 2 keeps Gemma's sentencepiece tokenizer
        family = "gemma"
    if family in ("mistral", "gemma"):
        path = model_dir / "tokenizer.model"
        if not path.is_file():
            raise BadInputError(f"tokenizer {path} is missing: a {family} checkpoint ships a "
                                "sentencepiece tokenizer.model")
        return Tokenizer(f"torchtune.models.{family}.{family}_tokenizer",
                         {"path": str(path), "max_seq_len": max_seq_len})
    raise BadInputError(f"no tokenizer known for model family {family}")


def _llama_tokenizer(model_dir: Path, max_seq_len: int | None) -> Tokenizer:
    """Llama 3's tiktoken ``original/tokenizer.model``; else (a Llama-architecture model
    of another house: TinyLlama, SmolLM, Llama 2) its tokenizer.json, and only then a
    sentencepiece ``tokenizer.model`` at the top (Llama 2's)."""
    path = model_dir / "original" / "tokenizer.model"
    if path.is_file():
        # Without the file's ids torchtune assumes Llama-3's fixed ones (128000+).
        return _with_special_tokens("torchtune.models.llama3.llama3_tokenizer",
                                    {"path": str(path), "max_seq_len": max_seq_len}, model_dir)
    found = hf_tokenizer_of(model_dir, max_seq_len)
    if found is not None:
        return found
    sentencepiece = model_dir / "tokenizer.model"
    if sentencepiece.is_file():
        return Tokenizer("torchtune.models.llama2.llama2_tokenizer",
                         {"path": str(sentencepiece), "max_seq_len": max_seq_len})
    raise BadInputError(f"tokenizer {path} is missing: a Llama-3 checkpoint ships "
                        "original/tokenizer.model (do not ignore original/*), another "
                        "Llama-architecture checkpoint a sentencepiece tokenizer.model")


def _qwen3_tokenizer(model_dir: Path, max_seq_len: int | None) -> Tokenizer:
    """Qwen3 ships Qwen2.5's byte-level BPE files; its tokenizer.json adds the special
    tokens Qwen3 introduced (<think>, ...) to Qwen2.5's, at the ids it gives them."""
    files = [model_dir / "vocab.json", model_dir / "merges.txt", model_dir / "tokenizer.json"]
    for f in files:
        if not f.is_file():
            raise BadInputError(f"tokenizer file {f} is missing: a Qwen3 checkpoint ships "
                                "vocab.json, merges.txt and tokenizer.json")
    return Tokenizer("torchtune.models.qwen2_5.qwen2_5_tokenizer",
                     {"path": str(files[0]), "merges_file": str(files[1]),
                      "special_tokens_path": str(files[2]), "max_seq_len": max_seq_len})


def _phi3_tokenizer(model_dir: Path, max_seq_len: int | None) -> Tokenizer:
    """Phi-3/3.5 ship a sentencepiece tokenizer.model; Phi-4 a byte-level BPE
    (vocab.json + merges.txt). Both read their special tokens from tokenizer.json."""
    special = model_dir / "tokenizer.json"
    extra = {"special_tokens_path": str(special)} if special.is_file() else {}
    if (model_dir / "tokenizer.model").is_file():
        return Tokenizer("torchtune.models.phi3.phi3_mini_tokenizer",
                         {"path": str(model_dir / "tokenizer.model"), **extra,
                          "max_seq_len": max_seq_len})
    vocab, merges = model_dir / "vocab.json", model_dir / "merges.txt"
    if vocab.is_file() and merges.is_file():
        return Tokenizer("torchtune.models.phi4.phi4_tokenizer",
                         {"vocab_path": str(vocab), "merges_path": str(merges), **extra,
                          "max_seq_len": max_seq_len})
    raise BadInputError(f"{model_dir} has no Phi tokenizer: Phi-3 ships tokenizer.model, "
                        "Phi-4 vocab.json and merges.txt")


def read_checkpoint_model(model_dir: Path) -> CheckpointModel:
    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    arch = architecture_of(cfg)
    files = weight_files(model_dir)
    # A directory no initializer checked (--model-dir): a truncated file or another
    # model's config.json would fail inside the recipe, as a traceback.
    check_model(model_dir, cfg, [model_dir / name for name in files])
    return CheckpointModel(
        model_dir=model_dir,
        config=cfg,
        architecture=arch,
        weight_files=files,
        tokenizer=tokenizer_of(model_dir, arch.family, None),
    )
