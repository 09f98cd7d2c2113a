"""Count the samples the tokenizer cuts to ``tokenizer.max_seq_len`` when the launcher,
not the user, chose that limit (the model's context, or the packing length).

Without a limit torchtune's tokenizers keep every token and a sample longer than the
model's context crashes the recipe mid-run (``seq_len (1452) of input tensor should be
smaller than max_seq_len (512)``); with one they cut silently. The plan sets the limit;
this says, once, how many samples it cut. It runs in the recipe process, where the
tokenized dataset exists: the tokenizer's own ``tokenize_messages`` is wrapped (its
result is unchanged), and every sample is tokenized once before training.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from kubetune.trainer.request import passed_env


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


def wrap_setup_data(original: Callable) -> Callable:
    """A recipe's ``_setup_data``, counting what its dataset's tokenizer cuts."""

    @functools.wraps(original)
    def setup_data(self, *args, **kwargs):
        tokenizer = getattr(self, "_tokenizer", None)
        if tokenizer is None or not getattr(tokenizer, "max_seq_len", None) \
                or not hasattr(tokenizer, "tokenize_messages") or not passed_env.is_primary():
            return original(self, *args, **kwargs)
        counter = CutCounter(tokenizer)
        try:
            result = original(self, *args, **kwargs)
            loader = result[-1] if isinstance(result, tuple) else result
            dataset = getattr(loader, "dataset", None)
            if dataset is not None and counter.seen == 0:
                # Not packed: samples are tokenized lazily, as batches are drawn.
                for index in range(len(dataset)):
                    dataset[index]
        finally:
            counter.remove()
        if counter.seen == 0:
            return result  # a builder that does not tokenize messages (text completion)
        print(report(counter.cut, counter.seen, counter.limit), file=sys.stdout, flush=True)
        return result

    return setup_data
