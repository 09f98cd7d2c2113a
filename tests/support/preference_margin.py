"""Run inside the serving venv (transformers, no kubetune): how much more a model prefers
the chosen answers of preference pairs over the rejected ones, as serving code scores
them: the prompt rendered with the model's own chat template, each answer's summed token
log-probability after it.

Usage: python preference_margin.py ADAPTER_DIR PAIRS.json   ([{"prompt", "chosen",
"rejected"}, ...] strings)
The adapter export is loaded with PEFT onto the base its adapter_config.json names, as in
serving; the base is the same model with the adapter disabled.
Prints one JSON object: tuned and base (each the mean over the pairs of
log p(chosen) - log p(rejected)), pairs.
"""

import json
import sys
from pathlib import Path

import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer


def answer_log_prob(model, tokenizer, prompt: str, answer: str) -> float:
    messages = [{"role": "user", "content": prompt}]
    head = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=False)
    whole = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": answer}],
                                          tokenize=True, return_dict=False)
    assert whole[:len(head)] == head, "the chat template renders the prompt differently"
    ids = torch.tensor([whole])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    log_probs = torch.log_softmax(logits[0, :-1], dim=-1)
    targets = ids[0, 1:]
    picked = log_probs.gather(-1, targets[:, None])[:, 0]
    return float(picked[len(head) - 1:].sum())


def margin(model, tokenizer, pairs: list[dict]) -> float:
    margins = [answer_log_prob(model, tokenizer, p["prompt"], p["chosen"])
               - answer_log_prob(model, tokenizer, p["prompt"], p["rejected"]) for p in pairs]
    return sum(margins) / len(margins)


def main(adapter_dir: Path, pairs_file: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir)
    model = AutoPeftModelForCausalLM.from_pretrained(adapter_dir, dtype=torch.float32).eval()
    pairs = json.loads(pairs_file.read_text())
    tuned = margin(model, tokenizer, pairs)
    with model.disable_adapter():
        base = margin(model, tokenizer, pairs)
    print(json.dumps({"tuned": tuned, "base": base, "pairs": len(pairs)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
