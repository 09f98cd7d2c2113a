"""Read what the checkpoint really is, so the checkpoint wins over a config's fixed size.

A Hugging Face model directory says its architecture in ``config.json``. From it we pick
torchtune's *component builder* (``llama3``, ``lora_qwen2`` ...) with those dimensions,
the checkpointer's ``model_type``, the weight files, and the tokenizer files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kubetune.errors import BadInputError

LORA_KEYS = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank",
             "lora_alpha", "lora_dropout", "use_dora", "quantize_base")


@dataclass
class Architecture:
    family: str  # torchtune models subpackage, e.g. "llama3_2"
    builder: str  # full-model builder name in that package
    model_type: str  # FullModelHFCheckpointer model_type
    dims: dict = field(default_factory=dict)

    @property
    def lora_keys(self) -> tuple[str, ...]:
        if self.family == "gemma":  # its LoRA builder ties the output: no output LoRA
            return tuple(k for k in LORA_KEYS if k != "apply_lora_to_output")
        return LORA_KEYS

    def component(self, lora: bool) -> str:
        name = f"lora_{self.builder}" if lora else self.builder
        return f"torchtune.models.{self.family}.{name}"


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


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise BadInputError(f"model directory {model_dir} does not exist: run the model "
                            "initializer first or set --model-dir / KUBETUNE_MODEL_DIR")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInputError(f"{path} is missing: {model_dir} is not a Hugging Face model "
                            "directory") from None
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{path} is unreadable: {exc}") from None


def _common_dims(cfg: dict) -> dict:
    try:
        dims = {
            "vocab_size": int(cfg["vocab_size"]),
            "num_layers": int(cfg["num_hidden_layers"]),
            "num_heads": int(cfg["num_attention_heads"]),
            "num_kv_heads": int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            "embed_dim": int(cfg["hidden_size"]),
            "intermediate_dim": int(cfg["intermediate_size"]),
            "max_seq_len": int(cfg.get("max_position_embeddings", 2048)),
            "norm_eps": float(cfg.get("rms_norm_eps", 1e-5)),
        }
    except KeyError as exc:
        raise BadInputError(f"config.json lacks {exc.args[0]!r}, which every causal LM "
                            "config has: is this a complete model directory?") from None
    if cfg.get("rope_theta") is not None:
        dims["rope_base"] = cfg["rope_theta"]
    return dims


def architecture_of(cfg: dict) -> Architecture:
    model_type = cfg.get("model_type")
    dims = _common_dims(cfg)
    if model_type == "llama":
        dims["rope_base"] = int(dims.get("rope_base", 500_000))
        scaling = cfg.get("rope_scaling") or {}
        tied = bool(cfg.get("tie_word_embeddings", False))
        if scaling.get("rope_type") == "llama3" or tied:
            # Llama-3.1 / 3.2 use scaled RoPE; 3.2 also ties the output to the embeddings.
            dims["scale_factor"] = int(scaling.get("factor", 32 if tied else 8))
            if tied:
                return Architecture("llama3_2", "llama3_2", "LLAMA3_2",
                                    {**dims, "tie_word_embeddings": True})
            return Architecture("llama3_1", "llama3_1", "LLAMA3", dims)
        return Architecture("llama3", "llama3", "LLAMA3", dims)
    if model_type == "qwen2":
        dims["rope_base"] = float(dims.get("rope_base", 1_000_000.0))
        dims["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
        return Architecture("qwen2", "qwen2", "QWEN2", dims)
    if model_type == "mistral":
        dims["rope_base"] = float(dims.get("rope_base", 10_000.0))
        return Architecture("mistral", "mistral", "MISTRAL", dims)
    if model_type == "gemma":
        dims["rope_base"] = float(dims.get("rope_base", 10_000.0))
        dims["head_dim"] = int(cfg.get("head_dim") or dims["embed_dim"] // dims["num_heads"])
        dims["norm_eps"] = float(cfg.get("rms_norm_eps", 1e-6))
        return Architecture("gemma", "gemma", "GEMMA", dims)
    raise BadInputError(
        f"model_type {model_type!r} in config.json is not supported; supported: llama, qwen2, "
        "mistral, gemma"
    )


def weight_files(model_dir: Path) -> list[str]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise BadInputError(f"{index} is unreadable: {exc}") from None
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise BadInputError(f"{model_dir}: shards named in the index are missing: "
                                f"{', '.join(missing[:3])}")
        return names
    single = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not single:
        raise BadInputError(f"{model_dir} has no *.safetensors weights")
    return single


def tokenizer_of(model_dir: Path, family: str, max_seq_len: int | None) -> Tokenizer:
    special = model_dir / "tokenizer.json"
    if family.startswith("llama"):
        path = model_dir / "original" / "tokenizer.model"
        if not path.is_file():
            raise BadInputError(f"tokenizer {path} is missing: a Llama-3 checkpoint ships "
                                "original/tokenizer.model (do not ignore original/*)")
        args = {"path": str(path), "max_seq_len": max_seq_len}
        if special.is_file():
            # torchtune otherwise assumes Llama-3's fixed ids (128000+).
            args["special_tokens_path"] = str(special)
            return Tokenizer("torchtune.models.llama3.llama3_tokenizer", args)
        return Tokenizer("torchtune.models.llama3.llama3_tokenizer", args,
                         special_tokens_from_config(model_dir))
    if family == "qwen2":
        vocab, merges = model_dir / "vocab.json", model_dir / "merges.txt"
        for f in (vocab, merges):
            if not f.is_file():
                raise BadInputError(f"tokenizer file {f} is missing: a Qwen2 checkpoint ships "
                                    "vocab.json and merges.txt")
        args = {"path": str(vocab), "merges_file": str(merges), "max_seq_len": max_seq_len}
        if special.is_file():
            args["special_tokens_path"] = str(special)
            return Tokenizer("torchtune.models.qwen2.qwen2_tokenizer", args)
        return Tokenizer("torchtune.models.qwen2.qwen2_tokenizer", args,
                         special_tokens_from_config(model_dir))
    if family in ("mistral", "gemma"):
        path = model_dir / "tokenizer.model"
        if not path.is_file():
            raise BadInputError(f"tokenizer {path} is missing: a {family} checkpoint ships a "
                                "sentencepiece tokenizer.model")
        return Tokenizer(f"torchtune.models.{family}.{family}_tokenizer",
                         {"path": str(path), "max_seq_len": max_seq_len})
    raise BadInputError(f"no tokenizer known for model family {family}")


def read_checkpoint_model(model_dir: Path) -> CheckpointModel:
    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    arch = architecture_of(cfg)
    return CheckpointModel(
        model_dir=model_dir,
        config=cfg,
        architecture=arch,
        weight_files=weight_files(model_dir),
        tokenizer=tokenizer_of(model_dir, arch.family, None),
    )
