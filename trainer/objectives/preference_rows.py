"""Preference rows in the shapes users have, read as two conversations (chosen and
rejected) that share a prompt; no torch, so the plan checks rows with it before launch.

=====================================  ==============================================
shape                                  a row
=====================================  ==============================================
TRL standard                           ``prompt``, ``chosen``, ``rejected``: strings
TRL conversational                     the same three as lists of messages
TRL implicit prompt                    ``chosen``, ``rejected``: whole conversations
torchtune                              ``chosen``, ``rejected``: lists of messages
HH-RLHF                                ``chosen``, ``rejected``: "\\n\\nHuman: ...
                                       \\n\\nAssistant: ..." strings sharing a prefix
=====================================  ==============================================

Messages are OpenAI's ``{role, content}`` or ShareGPT's ``{from, value}``. Where the two
conversations share leading messages (an implicit prompt), those are the prompt, as TRL
reads them: the loss covers only what follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kubetune.trainer.data import conversations

COLUMNS = ("prompt", "chosen", "rejected")
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
# HH-RLHF's turns: "\n\nHuman: ..." and "\n\nAssistant: ...".
_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):[ ]?")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


@dataclass(frozen=True)
class Turn:
    role: str
    content: str


@dataclass(frozen=True)
class Pair:
    prompt: list[Turn]  # shared by both: never trained on
    chosen: list[Turn]
    rejected: list[Turn]


def is_hh(text: str) -> bool:
    return "\n\nAssistant:" in text and ("\n\nHuman:" in text or text.startswith("Human:"))


def turns(value: object, default_role: str) -> list[Turn]:
    """One column's value as messages: a string is one ``default_role`` message (an
    HH-RLHF string its turns), a list of messages each of its messages."""
    if value is None or (isinstance(value, list) and not value):
        return []  # an empty answer: a pair dropped and counted
    if isinstance(value, str):
        if is_hh(value):
            parts = _HH_TURN.split(value)
            return [Turn(_HH_ROLES[parts[i]], parts[i + 1].strip())
                    for i in range(1, len(parts) - 1, 2)]
        return [Turn(default_role, value)] if value.strip() else []
    style = conversations.style_of(value)
    if style is None:
        raise ValueError(f"{str(value)[:60]!r} is neither text nor a list of messages")
    speaker, text = conversations.MESSAGE_KEYS[style]
    out = []
    for message in value:
        role = str(message[speaker])
        out.append(Turn(_SHAREGPT_ROLES.get(role, role) if style == "sharegpt" else role,
                        str(message[text] or "")))
    return out


def pair_of(row: dict, columns: dict[str, str] | None = None) -> Pair:
    """``row`` as a prompt and two answers; ``columns``: role -> the row's column."""
    columns = {**{c: c for c in COLUMNS}, **(columns or {})}
    prompt = turns(row.get(columns["prompt"]), "user")
    chosen = turns(row.get(columns["chosen"]), "assistant")
    rejected = turns(row.get(columns["rejected"]), "assistant")
    shared = 0
    while (shared < min(len(chosen), len(rejected)) - 1
           and chosen[shared] == rejected[shared]):
        shared += 1
    return Pair(prompt + chosen[:shared], chosen[shared:], rejected[shared:])


def problem(pair: Pair) -> str | None:
    """Why DPO cannot learn from ``pair`` (the row is dropped and counted), or None."""
    for side, answer in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        if not any(t.content.strip() for t in answer):
            return f"empty {side}"
    if pair.chosen == pair.rejected:
        return "chosen == rejected"
    return None


def row_problem(row: dict, columns: dict[str, str] | None = None) -> str | None:
    """``problem`` of a row as read, a column the row lacks (absent or null: "missing
    chosen") told apart from one it holds empty ("empty chosen")."""
    columns = {**{c: c for c in COLUMNS}, **(columns or {})}
    for side in ("chosen", "rejected"):
        if row.get(columns[side]) is None:
            return f"missing {side}"
    return problem(pair_of(row, columns))


def shape_name(row: dict, columns: dict[str, str] | None = None) -> str | None:
    """The shape of one sampled row, or None where it is not preference data."""
    columns = {**{c: c for c in COLUMNS}, **(columns or {})}
    chosen, rejected = row.get(columns["chosen"]), row.get(columns["rejected"])
    if chosen is None or rejected is None:
        return None
    has_prompt = row.get(columns["prompt"]) is not None
    if isinstance(chosen, str):
        if has_prompt:
            return "TRL standard (prompt, chosen, rejected text)"
        return "HH-RLHF (chosen, rejected conversations as text)" if is_hh(chosen) else \
            "chosen, rejected text"
    if conversations.style_of(chosen) is None:
        return None
    if has_prompt:
        return "TRL conversational (prompt, chosen, rejected messages)"
    return "chosen, rejected conversations (torchtune / TRL implicit prompt)"
