"""Datasets shaped like users' own: chat in OpenAI's and ShareGPT's shapes with a system
prompt and several turns, plain text, JSON Lines with a broken line, a hub dataset's
directory with its README and LICENSE beside the data. Small, and generated here."""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM_PROMPT = "You are a careful calculator. Answer with the number only."


def conversations(rows: int, seed: int = 0) -> list[list[tuple[str, str]]]:
    """``rows`` conversations of (speaker, text): a system prompt, then three user and
    three assistant turns (sums, then sums of the previous answer)."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        turns = [("system", SYSTEM_PROMPT), ("user", f"What is {a} plus {b}?"),
                 ("assistant", f"It is {a + b}.")]
        total = a + b
        for _ in range(2):
            c = rng.randint(1, 9)
            total += c
            turns += [("user", f"Now add {c} to that."), ("assistant", f"That makes {total}.")]
        out.append(turns)
    return out


_SHAREGPT_SPEAKER = {"system": "system", "user": "human", "assistant": "gpt"}


def chat_rows(style: str, rows: int, seed: int = 0) -> list[dict]:
    """Rows as the style writes them: OpenAI ``messages`` of {role, content}, ShareGPT
    ``conversations`` of {from, value} (with an ``id`` column, as ShareGPT dumps have)."""
    out = []
    for number, turns in enumerate(conversations(rows, seed)):
        if style == "openai":
            out.append({"messages": [{"role": r, "content": t} for r, t in turns]})
        else:
            out.append({"id": f"conv-{number}", "conversations": [
                {"from": _SHAREGPT_SPEAKER[r], "value": t} for r, t in turns]})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_chat(dataset_dir: Path, style: str, rows: int = 40) -> Path:
    write_jsonl(dataset_dir / "train.jsonl", chat_rows(style, rows))
    return dataset_dir


def write_text(dataset_dir: Path, rows: int = 40) -> Path:
    rng = random.Random(0)
    write_jsonl(dataset_dir / "train.jsonl", [
        {"text": f"The sum of {a} and {b} is {a + b}."}
        for a, b in ((rng.randint(10, 99), rng.randint(10, 99)) for _ in range(rows))])
    return dataset_dir


def write_broken_jsonl(dataset_dir: Path, rows: int = 40, broken_line: int = 18) -> Path:
    """Alpaca rows, one a line, the ``broken_line``-th cut short (as a file copied while
    it was written)."""
    lines = [json.dumps({"instruction": "Add the two numbers.", "input": f"{i}+{i}",
                         "output": str(2 * i)}) for i in range(rows)]
    lines[broken_line - 1] = lines[broken_line - 1][:30]
    path = dataset_dir / "train.jsonl"
    dataset_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return dataset_dir


HUB_README = """---
license: mit
task_categories:
- text-generation
configs:
- config_name: default
  data_files: elsewhere/*.parquet
---
# Sums

Two-digit sums, as prompt and answer.
"""


def write_hub_like(dataset_dir: Path, rows: int = 64) -> Path:
    """A dataset repository as `hf download` leaves it: the data file at the top beside
    README.md (with a dataset card header), LICENSE and .gitattributes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kubetune.tools.demo.tiny_dataset import tiny_rows

    dataset_dir.mkdir(parents=True, exist_ok=True)
    records = tiny_rows(rows)
    pq.write_table(pa.table({"input": [r["input"] for r in records],
                             "output": [r["output"] for r in records]}),
                   dataset_dir / "sums.parquet")
    (dataset_dir / "README.md").write_text(HUB_README)
    (dataset_dir / "LICENSE").write_text("MIT License\n\nCopyright (c) the authors\n")
    (dataset_dir / ".gitattributes").write_text("*.parquet filter=lfs diff=lfs merge=lfs -text\n")
    return dataset_dir
