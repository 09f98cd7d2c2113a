"""A model family from its Hugging Face ``config.json``: which torchtune component builder
(``llama3``, ``lora_qwen2`` ...) runs it with which dimensions, the checkpointer and its
``model_type``, and how torchtune lays out its weights. The trainer builds the run from
it; the exporter rebuilds the model to check an adapter and fixes adapter rows by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kubetune.errors import BadInputError
from kubetune.model_family import families, features, weight_names

LORA_KEYS = ("lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output", "lora_rank",
             "lora_alpha", "lora_dropout", "use_dora", "quantize_base")


HF_CHECKPOINTER = "torchtune.training.FullModelHFCheckpointer"


@dataclass
class Architecture:
    family: str  # torchtune models subpackage, e.g. "llama3_2"
    builder: str  # full-model builder name in that package
    model_type: str  # FullModelHFCheckpointer model_type
    dims: dict = field(default_factory=dict)
    # Where the builders live: torchtune's package for the family, or ours
    # (trainer/models) for a family torchtune 0.6.1 lacks.
    package: str = ""
    checkpointer: str = HF_CHECKPOINTER

    @property
    def lora_keys(self) -> tuple[str, ...]:
        if self.shape.get("tie_word_embeddings"):
            # The output is the embedding: every LoRA builder refuses an output LoRA
            # (Gemma's take no such argument at all).
            return tuple(k for k in LORA_KEYS if k != "apply_lora_to_output")
        return LORA_KEYS

    @property
    def shape(self) -> dict:
        """``dims`` as parameter counts and memory plans read them: Gemma's builders take
        no ``tie_word_embeddings`` but always tie the output to the embeddings (counted
        once: Gemma 2 2B's 256k x 2304 table is a fifth of the model)."""
        if self.family in ("gemma", "gemma2"):
            return {**self.dims, "tie_word_embeddings": True}
        return self.dims

    @property
    def summary(self) -> str:
        """The checkpoint's shape as a run's log line names it, with what sets the
        builder apart: RoPE scaling (Llama 3.1+) and a tied output."""
        d = self.dims
        parts = [f"layers={d['num_layers']}", f"dim={d['embed_dim']}", f"vocab={d['vocab_size']}"]
        if d.get("scale_factor", 1) > 1:
            parts.append(f"RoPE scaled x{d['scale_factor']}")
        if self.shape.get("tie_word_embeddings"):
            parts.append("tied output")
        if d.get("sliding_window"):
            parts.append(f"sliding window {d['sliding_window']} on "
                         f"{sum(d['sliding_layers'])} of {d['num_layers']} layers")
        if d.get("qk_norm"):
            parts.append("q/k norms")
        return ", ".join(parts)

    @property
    def permutes_qk(self) -> bool:
        """Whether torchtune holds q/k rows in the interleaved RoPE layout (converting
        from HF permutes them); Qwen2, Phi-3 and the config-built decoder keep HF's
        rotate-half rows as they are."""
        return self.family in ("llama3", "llama3_1", "llama3_2", "mistral", "gemma")

    def component(self, lora: bool) -> str:
        name = f"lora_{self.builder}" if lora else self.builder
        return f"{self.package or 'torchtune.models.' + self.family}.{name}"


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
    # transformers 5 writes rope_parameters.rope_theta; hub configs mostly rope_theta.
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None:
        dims["rope_base"] = theta
    return dims


def _rope_scaling(cfg: dict) -> dict:
    """RoPE scaling as config.json holds it: ``rope_scaling`` (transformers 4), or
    ``rope_parameters`` (transformers 5, which also moves ``rope_theta`` into it)."""
    return cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}


def _rope_type(cfg: dict) -> str:
    scaling = _rope_scaling(cfg)
    return str(scaling.get("rope_type") or scaling.get("type") or "default")


def _refuse(family: str, what: str, fix: str) -> BadInputError:
    return BadInputError(f"{family} checkpoint: {what}, which torchtune's {family} builder "
                         f"cannot run; {fix}")


def model_type_of(cfg: dict) -> str | None:
    """config.json's ``model_type``; without one (configs written before transformers
    named it), the one its ``architectures`` class names: ``Phi3ForCausalLM`` -> phi3."""
    if cfg.get("model_type"):
        return str(cfg["model_type"])
    for name in cfg.get("architectures") or []:
        if isinstance(name, str) and name.endswith("ForCausalLM"):
            return name.removesuffix("ForCausalLM").lower()
    return None


def architecture_of(cfg: dict) -> Architecture:
    model_type = model_type_of(cfg)
    _check_supported(cfg, model_type)  # before the dimensions another family may lack
    if model_type not in TORCHTUNE_TYPES:
        return _config_decoder(cfg)
    dims = _common_dims(cfg)
    if model_type == "llama":
        return _llama(cfg, dims)
    if model_type == "qwen2":
        dims["rope_base"] = float(dims.get("rope_base", 1_000_000.0))
        dims["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
        return Architecture("qwen2", "qwen2", "QWEN2", dims,
                            checkpointer="kubetune.trainer.models.qwen_weights.Qwen2HFCheckpointer")
    if model_type == "mistral":
        dims["rope_base"] = float(dims.get("rope_base", 10_000.0))
        return Architecture("mistral", "mistral", "MISTRAL", dims)
    if model_type == "gemma":
        dims["rope_base"] = float(dims.get("rope_base", 10_000.0))
        dims["head_dim"] = int(cfg.get("head_dim") or dims["embed_dim"] // dims["num_heads"])
        dims["norm_eps"] = float(cfg.get("rms_norm_eps", 1e-6))
        return Architecture("gemma", "gemma", "GEMMA", dims)
    if model_type == "phi3":
        return _phi3(cfg, dims)
    raise AssertionError(model_type)  # _check_supported listed it


# Families torchtune's own builders and checkpointers run (drop-in configs name them);
# every other supported type is a row of kubetune.model_family.families, built from its
# config.json by kubetune.trainer.models.decoder.
TORCHTUNE_TYPES = ("llama", "qwen2", "mistral", "gemma", "phi3")
DECODER_PACKAGE = "kubetune.trainer.models.decoder"
DECODER_CHECKPOINTER = "kubetune.trainer.models.decoder_weights.DecoderHFCheckpointer"


def supported_types() -> tuple[str, ...]:
    return tuple(sorted({*TORCHTUNE_TYPES, *families.model_types()}))


def supported_line() -> str:
    return ", ".join(supported_types()) + " (phi3: Phi-3 4k, Phi-4)"


def decoder_family(cfg: dict) -> tuple[families.FamilyRow, dict, dict]:
    """A config-built family's row, its builder arguments and its HF -> torchtune keys."""
    row = families.row_of(model_type_of(cfg) or "")
    if row is None:
        raise BadInputError(f"model_type {model_type_of(cfg)!r} has no row in "
                            f"{features.WHERE_ROWS}")
    spec = features.decoder_spec(cfg, row)
    return row, spec, weight_names.hf_to_tune_keys(spec, row)


def _config_decoder(cfg: dict) -> Architecture:
    row, spec, _ = decoder_family(cfg)
    return Architecture(row.model_type, "decoder", "CONFIG_DECODER", spec,
                        package=DECODER_PACKAGE, checkpointer=DECODER_CHECKPOINTER)


def _check_supported(cfg: dict, model_type: str | None) -> None:
    if model_type is None:
        raise BadInputError("config.json names no model_type and no *ForCausalLM "
                            f"architecture: is it a causal LM's? supported: {supported_line()}")
    blocking = features.blocking_feature(cfg)
    named = "" if cfg.get("model_type") else \
        f" (from config.json's architectures {cfg.get('architectures')!r})"
    where = named or " in config.json"
    if blocking is not None:
        raise BadInputError(f"model_type {model_type!r}{where}: {blocking}")
    if model_type in TORCHTUNE_TYPES or families.row_of(model_type) is not None:
        return
    raise BadInputError(f"model_type {model_type!r}{where} is not supported: its features "
                        "may all be known, but no family row names it; add one in "
                        f"{features.WHERE_ROWS}; supported: {supported_line()}")


# torchtune's Llama3ScaledRoPE fixes these; Llama 3.1, 3.2 and 3.3 all ship them.
LLAMA3_ROPE_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}


def _llama(cfg: dict, dims: dict) -> Architecture:
    """Llama 3 (plain RoPE), 3.1 / 3.3 (llama3 RoPE scaling), 3.2 (scaling and a tied
    output); any other llama-typed checkpoint whose RoPE one of their builders runs."""
    dims["rope_base"] = int(dims.get("rope_base", 500_000))
    rope = _rope_type(cfg)
    if rope not in ("default", "llama3"):
        raise _refuse("llama", f"rope type {rope!r}", "torchtune's Llama builders run plain "
                      "RoPE or Llama 3.1's llama3 scaling")
    if rope == "llama3":
        scaling = _rope_scaling(cfg)
        for key, fixed in LLAMA3_ROPE_FIXED.items():
            if float(scaling.get(key, fixed)) != fixed:
                raise _refuse("llama", f"llama3 RoPE {key} {scaling[key]}",
                              f"its llama3 scaling fixes {key} at {fixed:g}, as Llama 3.1-3.3 "
                              "ship it")
        factor = float(scaling.get("factor", 8))
        if factor != int(factor):
            raise _refuse("llama", f"llama3 RoPE factor {factor:g}", "it takes whole factors")
        dims["scale_factor"] = int(factor)
    if cfg.get("tie_word_embeddings", False):
        # torchtune's tied builder (Llama 3.2's) always scales RoPE: without scaling in
        # config.json, factor 1 leaves every frequency as plain RoPE has it.
        dims.setdefault("scale_factor", 1)
        return Architecture("llama3_2", "llama3_2", "LLAMA3_2",
                            {**dims, "tie_word_embeddings": True})
    if rope == "llama3":
        return Architecture("llama3_1", "llama3_1", "LLAMA3", dims)
    return Architecture("llama3", "llama3", "LLAMA3", dims)


def _phi3(cfg: dict, dims: dict) -> Architecture:
    """Phi-3 (4k) and Phi-4 (``model_type: phi3``, as Phi-3.5, refused for its long-context
    RoPE); the tokenizer tells them apart."""
    rope_params = cfg.get("rope_parameters") or {}
    partial = cfg.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0))
    if _rope_type(cfg) != "default":
        raise _refuse("phi3", f"rope type {_rope_type(cfg)!r} (long-context RoPE, as in "
                      "Phi-3-128k, Phi-3.5 and Phi-4-mini)", "use a 4k-context Phi-3 or Phi-4")
    if float(partial or 1.0) != 1.0:
        raise _refuse("phi3", f"partial_rotary_factor {partial}", "use Phi-3 or Phi-4")
    head_dim = cfg.get("head_dim")
    if head_dim and int(head_dim) != dims["embed_dim"] // dims["num_heads"]:
        raise _refuse("phi3", f"head_dim {head_dim} is not hidden_size / num_attention_heads",
                      "use Phi-3 or Phi-4")
    if cfg.get("tie_word_embeddings"):
        raise _refuse("phi3", "tied word embeddings", "use Phi-3 or Phi-4")
    dims["rope_base"] = float(dims.get("rope_base", 10_000.0))
    return Architecture("phi3", "phi3", "PHI3_MINI", dims,
                        checkpointer="kubetune.trainer.models.phi3_weights.Phi3HFCheckpointer")
