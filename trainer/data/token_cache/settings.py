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
