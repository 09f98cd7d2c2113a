"""Record a few training samples as the recipe's own tokenizer turns them into token ids
(``kubetune.workspace.training_samples``), for the exporter's chat-template check.

The recipe's tokenizer instance is wrapped while its ``_setup_data`` runs (its results
unchanged): a packed dataset is tokenized there; an unpacked one lazily, so its first
samples are drawn once more here. A dataset the token cache serves was tokenized by
worker processes, or not at all where the entry was mapped: its first samples are drawn
from the rows it was tokenized from (its ``tokenized_from``: the same tokenizer, the same
tokens the cache holds). Only whole conversations are kept: one cut to
``tokenizer.max_seq_len`` no longer shows how a conversation ends. Rank 0 writes.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Callable

from kubetune.atomic_write import write_atomic
from kubetune.redact import redact
from kubetune.trainer.data.token_cache.dropped import reason_of
from kubetune.trainer.request import passed_env
from kubetune.workspace import TRAINING_SAMPLES_NAME
from kubetune.workspace.training_samples import TrainingSample, TrainingSamples

log = logging.getLogger("trainer")

WANTED = 4  # a few conversations: enough to cover system prompts and several turns
# Unpacked datasets are drawn at most this far to find them (rows that are cut are skipped).
DRAWN_AT_MOST = 32


def _as_chat(messages: Any) -> list[dict[str, str]] | None:
    """torchtune's Messages as a chat template receives them; None for what a plain chat
    template does not express (images, tool calls, messages that do not end a turn) and
    for a conversation holding a secret (a URL's credentials in a system prompt), which
    is never written."""
    chat = []
    for message in messages:
        if getattr(message, "ipython", False) or not getattr(message, "eot", True):
            return None
        parts = getattr(message, "content", None)
        if not isinstance(parts, list) or any(p.get("type") != "text" for p in parts):
            return None
        # A tool result: torchtune's role for it (ipython) is "tool" to a chat template.
        role = "tool" if message.role == "ipython" else str(message.role)
        chat.append({"role": role, "content": "".join(str(p["content"]) for p in parts)})
    if any(redact(m["content"]) != m["content"] for m in chat):
        return None
    return chat or None


class Recorder:
    """Wraps one tokenizer instance's ``tokenize_messages``; ``samples`` holds what it kept."""

    def __init__(self, tokenizer: Any, wanted: int = WANTED) -> None:
        self.tokenizer, self.wanted = tokenizer, wanted
        self.samples: list[TrainingSample] = []
        self._original = tokenizer.tokenize_messages
        tokenizer.tokenize_messages = self._tokenize_messages
        self.chat_template: str | None = None  # the base's, where the builder trains in it
        # Imported here: chat_dataset imports torchtune, which the bootstrap imports only
        # after recipe_noise has quieted it.
        from kubetune.trainer.data import chat_dataset

        chat_dataset.OBSERVERS.append(self._observe)

    def _observe(self, chat: list[dict[str, str]], tokens: list[int], template: str) -> None:
        """A conversation our chat builder tokenized in the base model's template."""
        limit = getattr(self.tokenizer, "max_seq_len", None)
        if len(self.samples) < self.wanted and (not limit or len(tokens) < limit) \
                and all(s.messages != chat for s in self.samples) \
                and all(redact(m["content"]) == m["content"] for m in chat):
            self.chat_template = template
            self.samples.append(TrainingSample(messages=chat, tokens=[int(t) for t in tokens]))

    def _tokenize_messages(self, messages, *args, **kwargs):
        tokens, mask = self._original(messages, *args, **kwargs)
        # Read at each call: the cut counter tokenizes with the limit lifted first.
        limit = getattr(self.tokenizer, "max_seq_len", None)
        # Training tokenizes with end tokens; a call without them is not what was fed.
        ended = kwargs.get("add_end_tokens", True) and kwargs.get("add_eos", True)
        if len(self.samples) < self.wanted and ended and (not limit or len(tokens) < limit):
            chat = _as_chat(messages)
            if chat is not None and all(s.messages != chat for s in self.samples):
                self.samples.append(TrainingSample(messages=chat, tokens=[int(t) for t in tokens]))
        return tokens, mask

    @property
    def done(self) -> bool:
        return len(self.samples) >= self.wanted

    def remove(self) -> None:
        self.tokenizer.tokenize_messages = self._original
        from kubetune.trainer.data import chat_dataset

        if self._observe in chat_dataset.OBSERVERS:
            chat_dataset.OBSERVERS.remove(self._observe)


def _token_name(tokenizer: Any, token_id: int | None) -> str | None:
    for name, value in (getattr(tokenizer, "special_tokens", None) or {}).items():
        if value == token_id:
            return name
    return None


def _describe(tokenizer: Any, fingerprint: str, samples: list[TrainingSample],
              chat_template: str | None = None) -> TrainingSamples:
    template = getattr(tokenizer, "prompt_template", None)
    kind = type(tokenizer)
    stops = {}
    for token_id in getattr(tokenizer, "stop_tokens", None) or [getattr(tokenizer, "eos_id", None)]:
        name = _token_name(tokenizer, token_id)
        if name is not None:
            stops[name] = int(token_id)
    return TrainingSamples(
        fingerprint=fingerprint, tokenizer=f"{kind.__module__}.{kind.__qualname__}",
        prompt_template=(None if template is None
                         else f"{type(template).__module__}.{type(template).__qualname__}"),
        bos_token=_token_name(tokenizer, getattr(tokenizer, "bos_id", None)),
        eos_token=_token_name(tokenizer, getattr(tokenizer, "eos_id", None)),
        stop_tokens=stops, samples=samples, chat_template=chat_template)


def _draw(result: Any, recorder: Recorder) -> None:
    """Tokenize the first samples of an unpacked dataset (tokenized lazily, per batch)."""
    loader = result[-1] if isinstance(result, tuple) else result
    dataset = getattr(loader, "dataset", None)
    if getattr(dataset, "tokenized_from", None) is not None:
        dataset = dataset.tokenized_from
    try:
        count = min(len(dataset), DRAWN_AT_MOST)
    except TypeError:
        return
    for index in range(count):
        if recorder.done:
            return
        try:
            dataset[index]
        except Exception as exc:  # a row the token cache drops and counts
            if reason_of(exc) is None:
                raise


def wrap_setup_data(original: Callable, output_dir: str, fingerprint: str) -> Callable:
    """A recipe's ``_setup_data`` that leaves ``kubetune-samples.json`` in ``output_dir``."""

    @functools.wraps(original)
    def setup_data(self, *args, **kwargs):
        tokenizer = getattr(self, "_tokenizer", None)
        if tokenizer is None or not hasattr(tokenizer, "tokenize_messages") \
                or not passed_env.is_primary():
            return original(self, *args, **kwargs)
        recorder = Recorder(tokenizer)
        try:
            result = original(self, *args, **kwargs)
            if not recorder.done:
                _draw(result, recorder)
        finally:
            recorder.remove()
        if recorder.samples:  # none: a text-completion dataset, which has no chat format
            write_atomic(Path(output_dir) / TRAINING_SAMPLES_NAME,
                         _describe(tokenizer, fingerprint, recorder.samples,
                                   recorder.chat_template).encode())
        return result

    return setup_data
