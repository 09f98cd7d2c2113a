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
