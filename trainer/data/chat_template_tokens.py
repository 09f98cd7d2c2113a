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
        text = chat[k]["content"].strip()
        at = whole.find(text, start) if text else start
        if at < 0:
            raise RowDropped("a conversation whose answers the chat template rewrites")
        end = at + len(text)
        if chat[k]["role"] != "assistant":
            return end  # a prompt trained with train_on_input: its text
        closes = [(whole.find(t, end), t) for t in self.special + ["<|im_end|>", "<|eot_id|>",
                                                                   "<end_of_turn>", "<|end|>"]]
        found = [(i, t) for i, t in closes if i >= 0]
        if found:
            i, t = min(found)
            end = i + len(t)
        return end

    def spans(self, whole: str, chat: list[dict], trained: list[bool]) -> list[tuple[int, int]]:
        """Character spans of ``whole`` that train: each trained message's own text, with
        what closes its turn. A message starts where the conversation before it ends;
        where a template renders earlier turns otherwise (Mistral's system prompt in the
        last user turn), at its text, found after the message before it."""
        out, cursor = [], 0
        for k, message in enumerate(chat):
            if message["role"] == "system" and (not trained[k] or message["content"].strip()
                                                not in self._render(chat[:k + 1], False)):
                continue  # where the template puts it (Mistral: in the last user turn)
            text = message["content"].strip()
            before = self._render(chat[:k], message["role"] == "assistant") if k else ""
            if whole.startswith(before) and len(before) >= cursor:
                start = len(before)
            elif message["role"] == "system":
                continue  # placed where the template places it; never an answer
            else:
                start = whole.find(text, cursor)
                if start < 0:
                    raise RowDropped("a conversation whose turns the chat template rewrites "
                                     "(turn boundaries not found)")
            if trained[k]:
                cursor = self._answer_end(whole, chat, k, start)
                out.append((start, cursor))
            else:
                at = whole.find(text, start) if text else -1
                cursor = at + len(text) if at >= 0 else start
        return out

    def training_text(self, chat: list[dict]) -> str:
        """The conversation as rendered, its final answer after exactly the prompt the
        template gives it with ``add_generation_prompt``: a template that renders a complete
        conversation otherwise (Mistral's drops the system prompt, which it puts in the last
        user turn) trains on what the model is prompted with."""
        whole = self._render(chat, False)
        if len(chat) < 2 or chat[-1]["role"] != "assistant":
            return whole
        prompt = self._render(chat[:-1], True)
        if whole.startswith(prompt):
            return whole
        asked = chat[-2]["content"].strip()
        ends = whole.rfind(asked) + len(asked), prompt.rfind(asked) + len(asked)
        header = prompt[ends[1]:]
        if not asked or min(ends) < len(asked) or whole[ends[0]:ends[0] + len(header)] != header:
            raise RowDropped("a conversation the chat template prompts otherwise than it "
                             "renders it (its final answer's prompt not found)")
        return prompt + whole[ends[0] + len(header):]

    def tokenize(self, messages: list) -> tuple[list[int], list[bool]]:
        """torchtune Messages -> ids and mask (True: not trained), as torchtune returns them."""
        chat = [as_chat(m) for m in messages]
        whole = self.training_text(chat)
        spans = self.spans(whole, chat, [not m.masked for m in messages])
        encoding = self.encoder.encoding(whole)
        tokens, mask = list(encoding.ids), []
        for begin, end in encoding.offsets:
            mask.append(not any(a <= begin < b or (begin == end and a <= begin < b)
                                for a, b in spans))
        if self.max_seq_len is not None and len(tokens) > self.max_seq_len:
            tokens, mask = tokens[:self.max_seq_len], mask[:self.max_seq_len]
        return tokens, mask
