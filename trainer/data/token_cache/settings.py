"""What the token cache needs from the recipe process's configuration (torch-free: the
bootstrap reads it before torchtune is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheSettings:
    root: Path | None  # the cache directory (None: tokenize in memory)
    tokenizer_cfg: dict  # the recipe's tokenizer section, resolved
    report_cuts: bool  # the launcher chose max_seq_len: say how many rows it cut
    primary: bool  # this process reports
    cores: int  # this node's usable cores
    local_processes: int  # this run's processes on this node
    # Tests only: the point of a build at which its builder SIGKILLs itself
    # (``store.KILL_POINTS``; the recipe process's KUBETUNE_TEST_KILL_TOKEN_CACHE_AT).
    test_kill_at: str | None = None
    # The fraction of the training split held out by content (``kubetune.holdout``);
    # None: the held-out set, if any, is a split or a dataset of its own.
    holdout_fraction: float | None = None
    # Which side the datasets built now are: "train", or "val" (the held-out set's).
    side: str = "train"
