"""Run inside the serving venv (transformers, no kubetune): what transformers' own
``apply_chat_template`` makes of conversations with a tokenizer directory's template.

Usage: python chat_template_ids.py TOKENIZER_DIR REQUEST_JSON
REQUEST_JSON: {"conversations": [[{"role", "content"}, ...], ...], "chat_templates": [...]
(each used instead of the directory's; null: the directory's own)}. Prints one JSON object:
"results", per template, per conversation: "whole" (text and ids of the whole
conversation) and "prompt" (of all but its last message, with the generation prompt); and
"eos_token_id" from the directory's generation config.
"""

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer, GenerationConfig


def rendered(tokenizer, messages: list[dict], template: str | None) -> dict:
    given = {"chat_template": template} if template else {}
    row = {}
    for name, shown, generation in (("whole", messages, False), ("prompt", messages[:-1], True)):
        row[name] = {
            "text": tokenizer.apply_chat_template(shown, tokenize=False,
                                                  add_generation_prompt=generation, **given),
            "ids": tokenizer.apply_chat_template(shown, tokenize=True, return_dict=False,
                                                 add_generation_prompt=generation, **given)}
    return row


def main(tokenizer_dir: Path, request_path: Path) -> None:
    request = json.loads(request_path.read_text())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    results = [[rendered(tokenizer, messages, template) for messages in request["conversations"]]
               for template in request.get("chat_templates") or [None]]
    eos = None
    if (tokenizer_dir / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(tokenizer_dir).eos_token_id
    print(json.dumps({"results": results, "eos_token_id": eos}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
