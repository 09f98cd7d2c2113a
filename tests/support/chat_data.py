"""Chat data shaped like users': OpenAI-style ``messages`` JSONL with system prompts (some
rows without one), several turns, and the whitespace and punctuation real text has."""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM_PROMPTS = ("You add numbers.", "Answer with digits only. ",
                  "You are a careful calculator;\nshow no working.")
# The arguments that train torchtune's chat_dataset on it (`kubetune local --dataset`).
CHAT_ARGS = ["dataset=torchtune.datasets.chat_dataset", "dataset.conversation_column=messages",
             "dataset.conversation_style=openai", "dataset.split=train"]


def conversations(count: int = 16, seed: int = 0) -> list[list[dict[str, str]]]:
    rnd = random.Random(seed)
    rows = []
    for i in range(count):
        a, b, c = rnd.randint(1, 99), rnd.randint(1, 99), rnd.randint(1, 9)
        messages = []
        if i % 4 != 3:  # a quarter with no system prompt
            messages.append({"role": "system", "content": SYSTEM_PROMPTS[i % 3]})
        messages += [{"role": "user", "content": f"What is {a}+{b}?"},
                     {"role": "assistant", "content": str(a + b)}]
        if i % 2 == 0:  # half with a second turn, text around the edges
            messages += [{"role": "user", "content": f" And plus {c}?\nBe brief. "},
                         {"role": "assistant", "content": f"{a + b} + {c} = {a + b + c}.\n"}]
        rows.append(messages)
    return rows


def write_chat_dataset(dataset_dir: Path, rows: list[list[dict[str, str]]] | None = None
                       ) -> Path:
    """``train.jsonl`` in ``dataset_dir`` (created), one ``{"messages": [...]}`` a line."""
    dataset_dir = Path(dataset_dir)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    rows = conversations() if rows is None else rows
    (dataset_dir / "train.jsonl").write_text(
        "".join(json.dumps({"messages": m}) + "\n" for m in rows))
    return dataset_dir
