"""Choose device and dtype for the machine the trainer actually runs on."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Hardware:
    device: str
    dtype: str
    notes: list[str]


def cpu_supports_bf16() -> bool:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def choose(requested_device: str | None, requested_dtype: str | None) -> Hardware:
    """Keep what was asked where the machine can do it; otherwise say what changed."""
    import torch

    notes: list[str] = []
    dtype = requested_dtype or "bf16"
    device = requested_device or "cuda"
    if device.startswith("cuda") and not torch.cuda.is_available():
        notes.append(f"no CUDA device: running on cpu instead of {device}")
        device = "cpu"
    if device == "cpu" and dtype == "bf16" and not cpu_supports_bf16():
        notes.append("this CPU has no native bf16: using fp32 instead of bf16")
        dtype = "fp32"
    return Hardware(device=device, dtype=dtype, notes=notes)
