"""Run inside the serving venv (transformers + peft, no kubetune): an export (an adapter,
loaded by PEFT onto the base its config names, or a merged model) answers chat questions
through the export's own chat template, as a user's serving code prompts it.

Usage: python serve_chat.py EXPORT_DIR MAX_NEW_TOKENS QUESTION...
Prints one JSON object: {"answers": [...], "template": bool}.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(model_dir: Path, max_new_tokens: int, questions: list[str]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if (model_dir / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    answers = []
    for question in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                            add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
        answers.append(tokenizer.decode(out[0, ids["input_ids"].shape[1]:],
                                        skip_special_tokens=True))
    print(json.dumps({"answers": answers, "template": bool(tokenizer.chat_template)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
