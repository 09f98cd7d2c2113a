"""Rows written the way real exports come out: OpenAI chat with a null system prompt, a
tool exchange, content given as a list of parts (mixed with string contents in one file),
rows out of order; TRL's standard and conversational shapes; alpaca with a null input;
a CSV whose answers are numbers. Each special row is one among ordinary ones."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.support.user_data import chat_rows

WEATHER_CALL = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
TOOL_RESULT = "{\"temperature\": 21, \"sky\": \"clear\"}"
TOOL_ANSWER = "It is 21 degrees and clear in Paris."
PARTS_ANSWER = "Part one. Part two."


def null_system() -> dict:
    return {"messages": [{"role": "system", "content": None},
                         {"role": "user", "content": "What is 2 plus 2?"},
                         {"role": "assistant", "content": "It is 4."}]}


def tool_exchange() -> dict:
    return {"messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What is the weather in Paris?", "name": "ana"},
        {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": TOOL_RESULT},
        {"role": "assistant", "content": TOOL_ANSWER}]}


def content_parts() -> dict:
    return {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Say two parts."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Part one. "},
                                          {"type": "text", "text": "Part two."}]}]}


def assistant_first() -> dict:
    return {"messages": [{"role": "assistant", "content": "I speak first."},
                         {"role": "user", "content": "Hello?"},
                         {"role": "assistant", "content": "Hi."}]}


SPECIAL = {"null_system": null_system, "tool_exchange": tool_exchange,
           "content_parts": content_parts}


def openai_rows(rows: int = 40, special: dict[int, dict] | None = None) -> list[dict]:
    """Ordinary OpenAI rows, with ``special`` {row number from 1: row} put in place."""
    out = chat_rows("openai", rows)
    for number, row in (special or {}).items():
        out[number - 1] = row
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def trl_conversational(rows: int = 40) -> list[dict]:
    """TRL's conversational prompt-completion rows: the prompt holds a system turn and a
    user turn, the completion the assistant's answer."""
    out = []
    for i in range(rows):
        out.append({"prompt": [{"role": "system", "content": "Add."},
                               {"role": "user", "content": f"What is {i} plus {i}?"}],
                    "completion": [{"role": "assistant", "content": f"It is {2 * i}."}]})
    return out


def trl_standard(rows: int = 40) -> list[dict]:
    return [{"prompt": f"What is {i} plus {i}?", "completion": f" It is {2 * i}."}
            for i in range(rows)]


def alpaca_null_input(rows: int = 40) -> list[dict]:
    return [{"instruction": f"Add {i} and {i}.", "input": None if i % 2 else f"{i}+{i}",
             "output": str(2 * i)} for i in range(rows)]


def write_numbers_csv(path: Path, rows: int = 40) -> Path:
    """An alpaca CSV whose answers are all numbers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["instruction", "input", "output"])
        for i in range(rows):
            writer.writerow([f"Add {i} and {i}.", "", 2 * i])
    return path


def as_client_sends(messages: list[dict]) -> list[dict]:
    """The conversation as a client passes it to a chat template: each tool call's
    arguments as a dict (transformers' convention), not OpenAI's JSON string."""
    client = json.loads(json.dumps(messages))
    for message in client:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return client
