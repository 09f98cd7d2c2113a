"""Run inside the serving venv (transformers + peft, no kubetune): load an export onto its
base model the way a user's serving code does, check every tensor an adapter export holds
is the one PEFT loaded, and measure its effect.

Usage: python load_adapter.py BASE_MODEL_DIR ADAPTER_DIR
Prints one JSON object: tensors (and how many PEFT loaded equal), missing / unexpected
adapter keys, finite, adapter_effect. ``report`` (an adapter or merged export; with kind and
moved: how far the export's logits are from the base's) is what the support matrix's
serving process (tests/support/serving_requests.py) asks of each export.
"""

import copy
import functools
import json
import sys
from pathlib import Path

import torch
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def _ids(vocab: int) -> torch.Tensor:
    # Random ids: a sentencepiece-only tokenizer does not load here (no sentencepiece).
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))


@functools.lru_cache(maxsize=None)
def _base(base_dir: Path):
    """A base model loaded once for all its exports (each gets a copy to adapt)."""
    return AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()


@functools.lru_cache(maxsize=None)
def _base_logits(base_dir: Path) -> torch.Tensor:
    with torch.no_grad():
        return _base(base_dir)(input_ids=_ids(_base(base_dir).config.vocab_size)).logits


def adapter_report(base_dir: Path, adapter_dir: Path) -> dict:
    base = copy.deepcopy(_base(base_dir))
    vocab = base.config.vocab_size
    model = PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    loaded = get_peft_model_state_dict(model)
    equal = sum(1 for k, v in saved.items() if k in loaded and torch.equal(loaded[k].float(),
                                                                            v.float()))
    ids = _ids(vocab)
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    effect = float((adapted - plain).abs().max())
    return {"kind": "adapter", "tensors": len(saved), "equal": equal,
            # Adapter tensors PEFT made but the export lacks (PEFT also
            # lists an adapted lm_head's base weight, which no adapter holds).
            "missing": sorted(k for k in set(loaded) - set(saved) if "lora_" in k),
            "unexpected": sorted(set(saved) - set(loaded)),
            "finite": bool(torch.isfinite(adapted).all()),
            "adapter_effect": effect, "moved": effect}


def merged_report(base_dir: Path, merged_dir: Path) -> dict:
    """Merged weights as transformers loads them, against the base's logits."""
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        got = merged(input_ids=_ids(merged.config.vocab_size)).logits
    return {"kind": "merged", "finite": bool(torch.isfinite(got).all()),
            "moved": float((got - _base_logits(base_dir)).abs().max())}


def report(base_dir: Path, export_dir: Path) -> dict:
    if (export_dir / "adapter_config.json").is_file():
        return adapter_report(base_dir, export_dir)
    return merged_report(base_dir, export_dir)


if __name__ == "__main__":
    print(json.dumps(adapter_report(Path(sys.argv[1]), Path(sys.argv[2]))))
