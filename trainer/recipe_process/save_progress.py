"""A checkpoint save's progress line: torchtune's save is one call that reports nothing
while it writes (a merged model, an adapter, the optimizer's state), for minutes on a large
model or a slow volume. The bytes that arrived in the checkpoint's directory are the
measure, the model's own state the estimate of the whole (its optimizer state and the
format's headers make the real total differ; the line says "finishing" past it)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

from kubetune.phase_progress import PhaseProgress, directory_bytes

log = logging.getLogger("trainer")
_MB = 1e6


def model_bytes(model: Any) -> int:
    """Bytes of the model's parameters in their own dtype: what a save of it writes,
    about. Read from the parameters, never ``state_dict()``: only rank 0 asks, and a
    sharded model's state dict hooks may gather."""
    if model is None:
        return 0
    return sum(p.numel() * p.element_size() for p in model.parameters())


@contextlib.contextmanager
def reporting(checkpointer: Any, model: Any, epoch: int, rank: int) -> Iterator[None]:
    """Progress lines (rank 0) while the save inside writes under the checkpointer's
    output directory."""
    where = getattr(checkpointer, "_output_dir", None)
    if rank != 0 or where is None:
        yield
        return
    where = Path(where)
    before = directory_bytes(where)
    expected = max(1.0, model_bytes(model) / _MB)
    with PhaseProgress(f"saving the epoch {epoch} checkpoint", round(expected), "MB written",
                       log.info, measure=lambda: (directory_bytes(where) - before) / _MB):
        yield
