"""How many held-out rows each evaluation measures, so that validation at its default
frequency costs about 5% of the run.

An evaluation is a forward pass over the held-out tokens; a training step is a forward and
a backward (about three forwards' work) over its tokens. With ``evaluations`` of the whole
held-out set, validation costs about ``evaluations x heldout_tokens / (3 x train_tokens x
epochs)`` of the run. A test split is often a tenth of the data or more: measured whole ten
times a run, it would cost a third of the training. So each evaluation measures the first
rows of the held-out set (always the same ones: every evaluation is comparable with the
base's) up to a token budget of 5% of the run, and never fewer than ``MIN_ROWS`` rows (a
loss over a handful of rows says little), or all of them where the set is smaller.
"""

from __future__ import annotations

import math
from typing import Any

SHARE = 0.05  # of the run's compute
FORWARD_PER_STEP = 3.0  # a training step's work, in forwards of the same tokens
MIN_ROWS = 100


def _tokens(dataset: Any) -> int | None:
    """The tokens of a cached dataset (its entry's record), else None."""
    rows = getattr(dataset, "rows", None)
    meta = getattr(rows, "meta", None)
    tokens = meta.get("tokens") if isinstance(meta, dict) else None
    return int(tokens) if isinstance(tokens, (int, float)) and tokens > 0 else None


def rows_per_evaluation(heldout: Any, train: Any, epochs: int, evaluations: int) -> int:
    """The held-out rows each evaluation measures (the first ones)."""
    rows = len(heldout)
    if rows <= MIN_ROWS:
        return rows
    heldout_tokens, train_tokens = _tokens(heldout), _tokens(train)
    if heldout_tokens is None or train_tokens is None:
        # Not from the cache: rows stand in for tokens (same lengths on both sides).
        heldout_tokens, train_tokens = rows, max(1, len(train))
    budget = SHARE * FORWARD_PER_STEP * train_tokens * max(1, epochs) / max(1, evaluations)
    per_row = heldout_tokens / rows
    return max(MIN_ROWS, min(rows, math.floor(budget / per_row)))


# Held-out answers (``answers``): greedy decoding without a KV cache, one forward of
# ``prompts x (longest prompt + new tokens)`` positions per new token. On a real model on
# CPU the defaults (3 prompts, 64 new tokens) cost more than a short run's training (the
# base's answers took 11.5 minutes before a 4-step run), so the two sets together (base and
# tuned) are bounded to this share of the run too: fewer prompts first, then fewer new
# tokens, never below one prompt of ``MIN_NEW_TOKENS`` (a format is seen in that many).
ANSWER_SHARE = SHARE
MIN_NEW_TOKENS = 16


def answer_forward_tokens(train: Any, epochs: int, fraction: float = 1.0) -> float | None:
    """Forward positions each set of answers may cost: half of ``ANSWER_SHARE`` of the
    run's work, the run being ``fraction`` of each of ``epochs`` epochs of ``train``
    (``max_steps_per_epoch``); None where the training tokens are unknown (not cached)."""
    tokens = _tokens(train)
    if tokens is None:
        return None
    return ANSWER_SHARE * FORWARD_PER_STEP * tokens * fraction * max(1, epochs) / 2


def answer_cost(prompt_lengths: list[int], new_tokens: int, context: int) -> int:
    """Forward positions of answering these prompts together with ``new_tokens`` each."""
    if not prompt_lengths:
        return 0
    return new_tokens * len(prompt_lengths) * min(context, max(prompt_lengths) + new_tokens)


def fit_answers(prompt_lengths: list[int], new_tokens: int, context: int,
                allowed: float | None) -> tuple[int, int]:
    """(prompts, new tokens) within ``allowed`` forward positions: the first prompts kept."""
    prompts = len(prompt_lengths)
    if allowed is None:
        return prompts, new_tokens
    while prompts > 1 and answer_cost(prompt_lengths[:prompts], new_tokens, context) > allowed:
        prompts -= 1
    floor = min(new_tokens, MIN_NEW_TOKENS)
    while new_tokens > floor and \
            answer_cost(prompt_lengths[:prompts], new_tokens, context) > allowed:
        new_tokens -= 1
    return prompts, new_tokens
