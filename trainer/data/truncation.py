"""Count the samples the tokenizer cuts to ``tokenizer.max_seq_len`` when the launcher,
not the user, chose that limit (the model's context, or the packing length).

Without a limit torchtune's tokenizers keep every token and a sample longer than the
model's context crashes the recipe mid-run (``seq_len (1452) of input tensor should be
smaller than max_seq_len (512)``); with one they cut silently. The plan sets the limit;
this says, once, how many samples it cut. The count is taken while the token cache
tokenizes the rows (``token_cache.build``, in each of its workers): the tokenizer's own
``tokenize_messages`` is wrapped there (its result is unchanged), and the count is kept in
the cache entry, so a run that maps the entry says the same.
"""

from __future__ import annotations

from typing import Any


class CutCounter:
    """Wraps one tokenizer instance; ``cut`` / ``seen`` count the samples it tokenized."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.limit = tokenizer.max_seq_len
        self.cut = self.seen = 0
        self._original = tokenizer.tokenize_messages
        tokenizer.tokenize_messages = self._tokenize_messages

    def _tokenize_messages(self, messages, *args, **kwargs):
        self.seen += 1
        tokenizer = self.tokenizer
        tokenizer.max_seq_len = None  # the full length first: was it longer than the limit?
        try:
            tokens, mask = self._original(messages, *args, **kwargs)
        finally:
            tokenizer.max_seq_len = self.limit
        if len(tokens) <= self.limit:
            return tokens, mask
        self.cut += 1
        return self._original(messages, *args, **kwargs)  # torchtune's own truncation

    def remove(self) -> None:
        self.tokenizer.tokenize_messages = self._original


def report(cut: int, seen: int, limit: int) -> str:
    return (f"train: {cut} of {seen} samples are longer than tokenizer.max_seq_len={limit} "
            "(the model's context or the packing length) and were cut to it; set "
            "tokenizer.max_seq_len to choose the limit yourself")

