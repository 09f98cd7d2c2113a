"""Preference pairs in the shapes users have, generated (a sum against a refusal: a
preference a tiny model learns in a few steps), and written as a dataset directory."""

from __future__ import annotations

import json
from pathlib import Path

REFUSAL = "I cannot answer that."


def _question(a: int, b: int) -> str:
    return f"What is {a}+{b}?"


def trl_standard(a: int, b: int) -> dict:
    return {"prompt": _question(a, b), "chosen": str(a + b), "rejected": REFUSAL}


def trl_conversational(a: int, b: int) -> dict:
    return {"prompt": [{"role": "user", "content": _question(a, b)}],
            "chosen": [{"role": "assistant", "content": str(a + b)}],
            "rejected": [{"role": "assistant", "content": REFUSAL}]}


def whole_conversations(a: int, b: int) -> dict:
    # torchtune's preference_dataset shape, and TRL's conversational with an implicit prompt.
    user = {"role": "user", "content": _question(a, b)}
    return {"chosen": [user, {"role": "assistant", "content": str(a + b)}],
            "rejected": [user, {"role": "assistant", "content": REFUSAL}]}


def hh_rlhf(a: int, b: int) -> dict:
    head = f"\n\nHuman: {_question(a, b)}\n\nAssistant:"
    return {"chosen": f"{head} {a + b}", "rejected": f"{head} {REFUSAL}"}


SHAPES = {"trl_standard": trl_standard, "trl_conversational": trl_conversational,
          "whole_conversations": whole_conversations, "hh_rlhf": hh_rlhf}


def pairs(shape, n: int = 32) -> list[dict]:
    return [shape(a, b) for a in range(8) for b in range(8)][:n]


def write_rows(directory: Path, rows: list[dict]) -> Path:
    """``directory``/train.jsonl holding ``rows``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return directory
