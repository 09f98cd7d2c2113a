"""Does the exported adapter, applied to the base model, give the merged model's logits?

The adapter is merged into the base weights in Hugging Face key space with PEFT's own
rule (W + alpha/r * B @ A; DoRA rescales by the magnitude vector), independently of
torchtune's merge code, so the check vouches for the adapter as PEFT will apply it,
including the q/k row permutation torchtune applies when it converts LoRA B to HF
layout. Both weight sets then run through one forward pass built with torchtune's
component builders from config.json (the builders the trainer used; a hand-written
decoder would be a second model implementation to keep in step with them). Logits are
compared in float32 on a few fixed token sequences. A QLoRA run trained its adapter on
NF4-rounded projections and saved its merged model from them: the base is rounded the
same way before the adapter is applied (``_qlora_adapted``).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

from kubetune.errors import BadInputError
from kubetune.exporter.adapter_merge import PREFIX, adapted_modules, scaling
from kubetune.model_family.architecture import architecture_of
from kubetune.model_family.convert import hf_to_tune

log = logging.getLogger("exporter")

SEQUENCES, SEQ_LEN, SEED = 3, 24, 0
# max |Δlogit| allowed, relative to max(1, max |logit|) of the merged model. float32
# weights agree to ~1e-6 on the tiny model; 16-bit shards round every merged weight once
# more in torchtune's merge than in ours, which moves logits by up to a few 1e-3.
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}


@dataclass
class LogitsReport:
    max_abs_diff: float
    scale: float
    tolerance: float
    sequences: int
    seq_len: int
    dtype: str

    def as_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "logit_scale": self.scale,
                "tolerance": self.tolerance, "sequences": self.sequences,
                "seq_len": self.seq_len, "dtype": self.dtype}


def weights_bytes(files: list[Path]) -> int:
    return sum(p.stat().st_size for p in files)


def _load(files: list[Path]) -> dict:
    from safetensors.torch import load_file

    state: dict = {}
    for path in files:
        state.update(load_file(str(path)))
    return state


def _apply_adapter(base: dict, adapter: dict, config: dict, dtype) -> dict:
    factor = scaling(config)
    merged = dict(base)
    for module, a, b in adapted_modules(adapter):
        weight = base[f"{module}.weight"].float() + factor * (b.float() @ a.float())
        magnitude = adapter.get(f"{PREFIX}{module}.lora_magnitude_vector",
                                adapter.get(f"{PREFIX}{module}.lora_magnitude_vector.weight"))
        if magnitude is not None:
            norm = weight.norm(p=2, dim=1)
            weight = weight * (magnitude.float() / norm).unsqueeze(1)
        merged[f"{module}.weight"] = weight.to(dtype)
    return merged


# The weights torchtune's QLoRA builders hold in NF4 (every attention and MLP projection;
# not the output, see torchtune's lora_llama3), in torchtune's keys.
_NF4_WEIGHT = re.compile(r"^layers\.\d+\.(attn\.(q|k|v|output)_proj|mlp\.w[123])\.weight$")


def _qlora_adapted(arch, config: dict, base: dict, adapter: dict, adapter_config: dict,
                   merged: dict) -> dict:
    """What a QLoRA run's merged model is, in torchtune's keys: each projection the run
    held in NF4, dequantized as the run saved it, plus the adapter. Applied to the
    original weights instead, the adapter misses that rounding (the tiny model's logits
    move by ~0.2) and would be refused as not what training produced. Rounded in
    torchtune's layout, as the run rounded it: NF4's scale groups span rows that
    converting from Hugging Face's layout permutes. The merged weight's dtype is the one
    the builder's state-dict hook dequantized to (Llama's: bf16; the others': the
    model's), which the merge then kept."""
    from torchao.dtypes.nf4tensor import to_nf4

    factor = scaling(adapter_config)
    deltas = hf_to_tune(arch, config, {f"{module}.weight": factor * (b.float() @ a.float())
                                       for module, a, b in adapted_modules(adapter)})
    train_dtype = merged["tok_embeddings.weight"].dtype  # the run's: never quantized
    adapted = hf_to_tune(arch, config, {k: v.float() for k, v in base.items()})
    for key, weight in adapted.items():
        dtype = merged[key].dtype
        if _NF4_WEIGHT.match(key):
            weight = to_nf4(weight.to(train_dtype)).get_original_weight().to(dtype)
        if key in deltas:
            weight = weight.float() + deltas[key]
        adapted[key] = weight.to(dtype)
    return adapted


def _model(config: dict):
    from torchtune.config._utils import _get_component_from_path

    arch = architecture_of(config)
    return arch, _get_component_from_path(arch.component(lora=False))(**arch.dims)


def _logits(model, state: dict, tokens):
    """``state``: torchtune's keys."""
    import torch

    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    with torch.no_grad():
        out = model(tokens)
    return (torch.cat(out, dim=1) if isinstance(out, list) else out).float()


def check(base_config: Path, base_files: list[Path], adapter_file: Path, adapter_config: dict,
          merged_files: list[Path], tolerance: float | None = None,
          quantized_base: bool = False) -> LogitsReport:
    """Refuse (BadInputError) when base + adapter does not reproduce the merged logits.
    ``quantized_base``: a QLoRA run's (its base held in NF4)."""
    import torch
    from safetensors.torch import load_file

    config = json.loads(Path(base_config).read_text())
    arch, model = _model(config)
    merged = hf_to_tune(arch, config, _load(merged_files))
    dtype = next(iter(merged.values())).dtype
    dtype_name = str(dtype).removeprefix("torch.")
    tol = tolerance if tolerance is not None else TOLERANCE.get(dtype_name, 3e-2)
    model.eval()
    generator = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, int(config["vocab_size"]), (SEQUENCES, SEQ_LEN), generator=generator)
    want = _logits(model, merged, tokens)
    adapter = load_file(str(adapter_file))
    if quantized_base:
        adapted = _qlora_adapted(arch, config, _load(base_files), adapter, adapter_config,
                                 merged)
    else:
        adapted = hf_to_tune(arch, config, _apply_adapter(_load(base_files), adapter,
                                                          adapter_config, dtype))
    del merged
    got = _logits(model, adapted, tokens)
    diff = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    report = LogitsReport(diff, scale, tol, SEQUENCES, SEQ_LEN, dtype_name)
    if not math.isfinite(diff) or diff > tol * scale:
        # Known cause: torchtune 0.6.1 merges LoRA into the live base weights at every
        # epoch's checkpoint when training on CPU, so later adapters miss earlier epochs.
        raise BadInputError(f"the adapter applied to the base model does not reproduce the "
                            f"merged model (max |logit difference| {diff:.3g} > {tol:g} x "
                            f"{scale:.3g}), so it is not what training produced; export refused. "
                            "A multi-epoch LoRA run on CPU causes this (torchtune 0.6.1 folds "
                            "each epoch into the base weights): export EXPORT_FORMAT=merged or "
                            "train one epoch")
    log.info("logits: base + adapter matches the merged model on %d sequences of %d tokens "
             "(max |diff| %.3g, tolerance %g x %.3g)", SEQUENCES, SEQ_LEN, diff, tol, scale)
    return report
