"""Conversations rendered with the base model's own chat template and tokenized with its
``tokenizer.json``, as transformers' ``apply_chat_template`` makes them, with a mask that
leaves every token outside the trained assistant turns untrained.

The boundaries come from the template itself: a turn's answer begins where the
conversation before it, rendered with ``add_generation_prompt``, ends; it ends where the
conversation up to it ends (or, in a template that renders earlier answers otherwise
than the last, such as Qwen3's thinking block, after its text and the special token that
closes it). A conversation the template refuses (``raise_exception``: a system turn on
Gemma's, roles out of order) or renders with a prompt that the whole does not begin with
is a dropped row, counted by reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetune.chat_template import render as rendering
from kubetune.trainer.data.chat_messages import RowDropped


def as_chat(message: Any) -> dict[str, str]:
    """A torchtune Message as a chat template receives it (ipython: OpenAI's tool role)."""
    role = "tool" if message.role == "ipython" else str(message.role)
    return {"role": role, "content": message.text_content}


class TemplateTokenizer:
    """``tokenize(messages)`` -> (tokens, mask) in a base model directory's template."""

    def __init__(self, template: str, model_dir: str | Path, max_seq_len: int | None) -> None:
        self.template, self.max_seq_len = template, max_seq_len
        self.named = rendering.named_tokens(Path(model_dir))
        self.encoder = rendering.TextTokenizer(Path(model_dir))
        self.special = sorted({t for t in self.named.values() if t}, key=len, reverse=True)

    def _render(self, chat: list[dict], generation: bool) -> str:
        import jinja2

        try:
            return rendering.render(self.template, chat, generation, self.named)
        except jinja2.TemplateError as exc:
            raise RowDropped(f"a conversation the base model's chat template refuses "
                             f"({str(exc).splitlines()[0][:80]})") from None

    def _answer_end(self, whole: str, chat: list[dict], k: int, start: int) -> int:
        upto = self._render(chat[:k + 1], False)
        if whole.startswith(upto):
            return len(upto)
        text = chat[k]["content"]
        at = whole.find(text, start) if text else start
        if at < 0:
            raise RowDropped("a conversation whose answers the chat template rewrites")
        end = at + len(text)
        closes = [(whole.find(t, end), t) for t in self.special + ["<|im_end|>", "<|eot_id|>",
                                                                   "<end_of_turn>", "<|end|>"]]
        found = [(i, t) for i, t in closes if i >= 0]
        if found:
            i, t = min(found)
            end = i + len(t)
        return end

    def spans(self, whole: str, chat: list[dict], trained: list[bool]) -> list[tuple[int, int]]:
        """Character spans of ``whole`` that train: each trained message's own text."""
        out = []
        for k, message in enumerate(chat):
            if not trained[k]:
                continue
            before = self._render(chat[:k], message["role"] == "assistant") if k else ""
            if not whole.startswith(before):
                raise RowDropped("a conversation the chat template renders otherwise than "
                                 "its own prompts (turn boundaries not found)")
            out.append((len(before), self._answer_end(whole, chat, k, len(before))))
        return out

    def tokenize(self, messages: list) -> tuple[list[int], list[bool]]:
        """torchtune Messages -> ids and mask (True: not trained), as torchtune returns them."""
        chat = [as_chat(m) for m in messages]
        whole = self._render(chat, False)
        spans = self.spans(whole, chat, [not m.masked for m in messages])
        encoding = self.encoder.encoding(whole)
        tokens, mask = list(encoding.ids), []
        for begin, end in encoding.offsets:
            mask.append(not any(a <= begin < b or (begin == end and a <= begin < b)
                                for a, b in spans))
        if self.max_seq_len is not None and len(tokens) > self.max_seq_len:
            tokens, mask = tokens[:self.max_seq_len], mask[:self.max_seq_len]
        return tokens, mask
