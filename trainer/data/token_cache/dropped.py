"""Rows the trainer leaves out, counted by reason with their first row numbers, and the
one line that says so ("train: dropped 2 of 40 rows with an assistant turn before any
user turn (rows 3, 17)").

A row is left out when no token of it would be trained on (every label masked, or a
prompt that fills the context after truncation), or when the dataset's transform cannot
make it a training sample: the chat builder's ``RowDropped`` says why in the user's
terms, and the errors torchtune's own transforms raise on one row (a turn out of order,
a null where text belongs) are named as well. Row numbers count from 1 in the dataset's
order (a single JSON Lines file: its rows without the blank lines).
"""

from __future__ import annotations

import re
from typing import Any

from kubetune import env

FIRST_ROWS = 5  # row numbers kept per reason
NO_TOKEN = "no token to train on"

# torchtune's per-row errors (validate_messages, Message, the transforms' str calls),
# in the drop line's words.
_KNOWN = ((re.compile(r"Assistant message before expected user message"),
           "an assistant turn not after a user turn"),
          (re.compile(r"Two consecutive user messages"), "two user turns in a row"),
          (re.compile(r"System message at index \d+"), "a system turn after the first turn"),
          (re.compile(r"Messages must be at least length 2"), "fewer than two turns"),
          (re.compile(r"content must be of type|NoneType|got None"),
           "a null or non-text value where text belongs"),
          (re.compile(r"Unsupported message content type"), "content that is not text"),
          # torchtune's MistralChatTemplate (mistral_tokenizer's default prompt template).
          (re.compile(r"System prompts are not supported in MistralChatTemplate"),
           "a system prompt, which torchtune's Mistral format has no place for "
           f"({env.CHAT_TEMPLATE}=base trains in the base model's template)"))


def reason_of(exc: BaseException, dropped_type: type | None = None) -> str | None:
    """Why a row whose transform raised ``exc`` is left out; None: not the row's fault
    (memory, files), which stops the run as before."""
    if isinstance(exc, (MemoryError, OSError, RecursionError)) \
            or not isinstance(exc, Exception):
        return None
    if dropped_type is not None and isinstance(exc, dropped_type):
        return str(exc)
    text = str(exc).splitlines()[0] if str(exc) else ""
    for pattern, reason in _KNOWN:
        if pattern.search(text):
            return reason
    # Numbers vary row by row (an index, a length): one reason for all of them.
    shown = re.sub(r"\d+", "N", text)[:80]
    return f"an error in the dataset's transform ({type(exc).__name__}: {shown})"


class Drops:
    """Reason -> [count, first row indices]; picklable across the build's workers."""

    def __init__(self) -> None:
        self.by_reason: dict[str, list[Any]] = {}

    def add(self, reason: str, index: int) -> None:
        entry = self.by_reason.setdefault(reason, [0, []])
        entry[0] += 1
        if len(entry[1]) < FIRST_ROWS:
            entry[1].append(index)

    def merge(self, other: "Drops") -> None:
        for reason, (count, rows) in other.by_reason.items():
            entry = self.by_reason.setdefault(reason, [0, []])
            entry[0] += count
            entry[1] = sorted(entry[1] + rows)[:FIRST_ROWS]

    def meta(self) -> dict[str, dict]:
        """For the entry's record: reason -> {count, rows (numbered from 1)}."""
        return {reason: {"count": count, "rows": [i + 1 for i in rows]}
                for reason, (count, rows) in self.by_reason.items()}


def _no_token_reason(limit: int | None) -> str:
    if limit:
        return (f"{NO_TOKEN} after truncation to tokenizer.max_seq_len={limit} (a prompt "
                "that fills it leaves no answer")
    return f"{NO_TOKEN} (every label after the first is masked"


def _rows(count: int, rows: list[int]) -> str:
    if not rows:
        return ""  # an entry built before rows were numbered
    shown = ", ".join(str(r) for r in rows) + (", ..." if count > len(rows) else "")
    return f"row{'s' if count > 1 else ''} {shown}"


def _parts(by_reason: dict[str, dict], limit: int | None) -> list[str]:
    """Each reason with its count and first rows, largest first."""
    parts = []
    for reason, entry in sorted(by_reason.items(), key=lambda kv: -kv[1]["count"]):
        rows = _rows(entry["count"], entry.get("rows") or [])
        if reason == NO_TOKEN:
            text = _no_token_reason(limit) + (f"; {rows})" if rows else ")")
        else:
            text = reason + (f" ({rows})" if rows else "")
        parts.append((entry["count"], text))
    return [f"{count} with {text}" if len(parts) > 1 else f"with {text}"
            for count, text in parts]


_ADVICE = "raise tokenizer.max_seq_len or set dataset.train_on_input=True to keep them"


def dropped_line(dropped: int, read: int, limit: int | None,
                 by_reason: dict[str, dict] | None = None, side: str = "train") -> str:
    """``side``: "train", or "val" for the held-out rows (nothing to measure there, and
    train_on_input would not change what the loss measures)."""
    by_reason = by_reason or {NO_TOKEN: {"count": dropped, "rows": []}}
    parts = _parts(by_reason, limit)
    head = (f"validation: dropped {dropped} of {read} held-out rows" if side == "val"
            else f"train: dropped {dropped} of {read} rows")
    line = f"{head} {parts[0]}" if len(parts) == 1 else f"{head}: {'; '.join(parts)}"
    if NO_TOKEN not in by_reason:
        return line
    return f"{line}: {'raise tokenizer.max_seq_len to keep them' if side == 'val' else _ADVICE}"


def nothing_left_line(read: int, limit: int | None,
                      by_reason: dict[str, dict] | None = None) -> str:
    if by_reason and set(by_reason) != {NO_TOKEN}:
        return (f"none of the {read} rows trains: "
                f"{'; '.join(_parts(by_reason, limit))}: fix the rows, or name the dataset's "
                "shape (dataset.conversation_style, KUBETUNE_COLUMN_MAP)")
    cause = (f"after truncation to tokenizer.max_seq_len={limit}: every prompt fills it, "
             "leaving no answer" if limit else ": every label after the first is masked")
    return (f"none of the {read} rows has a token to train on {cause}; raise "
            "tokenizer.max_seq_len or set dataset.train_on_input=True")
