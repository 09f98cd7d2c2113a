"""Run inside the serving venv (transformers, no kubetune): a checkpoint's fp32 logits as
transformers computes them, for the rows of token ids given as JSON, saved with torch.

Usage: python hf_logits.py MODEL_DIR TOKENS_JSON OUT.pt
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main(model_dir: str, tokens: str, out: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.save(model(torch.tensor(json.loads(tokens))).logits, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
