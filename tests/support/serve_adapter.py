"""Run inside the serving venv (transformers + peft, no kubetune, no torchao): load an
export the way a user's serving code does and compare adapter and merged logits.

Usage: python serve_adapter.py EXPORT_DIR [--token-ids]   (an EXPORT_FORMAT=both export;
--token-ids: fixed random token ids instead of the prompts, for a checkpoint whose
tokenizer transformers cannot load here, e.g. a sentencepiece-only one)
Prints one JSON object: max_abs_diff, logit_scale, adapter_effect, tokens, base_model.
"""

import json
import sys
from pathlib import Path

import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["12+34=", "99+1=", "The sum of 57 and 68 is"]


def main(export_dir: Path, token_ids: bool = False) -> None:
    adapter_dir, merged_dir = export_dir / "adapter", export_dir / "merged"
    if token_ids:
        vocab = json.loads((merged_dir / "config.json").read_text())["vocab_size"]
        ids = torch.randint(0, vocab, (3, 16), generator=torch.Generator().manual_seed(0))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    else:
        tokenizer = AutoTokenizer.from_pretrained(merged_dir)
        batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    # The base comes from adapter_config.json's base_model_name_or_path, as in serving.
    adapted = AutoPeftModelForCausalLM.from_pretrained(adapter_dir, dtype=torch.float32)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    with torch.no_grad():
        got = adapted(**batch).logits
        want = merged(**batch).logits
        with adapted.disable_adapter():
            base = adapted(**batch).logits
    mask = batch["attention_mask"].bool()
    print(json.dumps({
        "max_abs_diff": float((got - want)[mask].abs().max()),
        "logit_scale": float(want[mask].abs().max()),
        # How far fine-tuning moved the logits: an adapter PEFT silently ignored would
        # also "match" a merged model that barely differs from the base.
        "adapter_effect": float((base - want)[mask].abs().max()),
        "tokens": int(mask.sum()),
        "base_model": adapted.peft_config["default"].base_model_name_or_path,
    }))


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--token-ids" in sys.argv[2:])
