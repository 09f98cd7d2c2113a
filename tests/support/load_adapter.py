"""Run inside the serving venv (transformers + peft, no kubetune): load an adapter-only
export onto its base model the way a user's serving code does (`PeftModel.from_pretrained`),
check every tensor the export holds is the one PEFT loaded, and measure its effect.

Usage: python load_adapter.py BASE_MODEL_DIR ADAPTER_DIR
Prints one JSON object: tensors (and how many PEFT loaded equal), missing / unexpected
adapter keys, finite, adapter_effect.
"""

import json
import sys
from pathlib import Path

import torch
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main(base_dir: Path, adapter_dir: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    vocab = base.config.vocab_size
    model = PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    saved = load_file(str(adapter_dir / "adapter_model.safetensors"))
    loaded = get_peft_model_state_dict(model)
    equal = sum(1 for k, v in saved.items() if k in loaded and torch.equal(loaded[k].float(),
                                                                            v.float()))
    # Random ids: a sentencepiece-only tokenizer does not load here (no sentencepiece).
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    print(json.dumps({"tensors": len(saved), "equal": equal,
                      # Adapter tensors PEFT made but the export lacks (PEFT also
                      # lists an adapted lm_head's base weight, which no adapter holds).
                      "missing": sorted(k for k in set(loaded) - set(saved) if "lora_" in k),
                      "unexpected": sorted(set(saved) - set(loaded)),
                      "finite": bool(torch.isfinite(adapted).all()),
                      "adapter_effect": float((adapted - plain).abs().max())}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
