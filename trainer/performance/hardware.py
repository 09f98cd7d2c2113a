"""Choose device and dtype for the machine the trainer actually runs on, and say how
much memory its GPUs have (for ``kubetune.trainer.performance.memory_plan``).

Probed without importing torch: the launcher's start-up is added to every run, and
importing torch costs seconds that the recipe process pays again anyway. The probe reads
the torch build (``torch/version.py``), the NVIDIA driver's device list (compute
capability and memory per GPU) and the CPU flags; the recipe process re-checks with torch
(``kubetune.trainer.recipe_process.bootstrap``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kubetune import env

log = logging.getLogger(__name__)


@dataclass
class Hardware:
    device: str
    dtype: str
    notes: list[str]


def _torch_build_has_cuda() -> bool:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    for line in text.splitlines():
        if line.startswith("cuda") and "=" in line:
            return line.split("=", 1)[1].strip() not in ("None", "")
    return False


@dataclass(frozen=True)
class Gpu:
    compute_capability: float
    memory_bytes: int


@lru_cache(maxsize=1)
def visible_gpus() -> tuple[Gpu, ...]:
    """Each GPU this process may use (empty without CUDA)."""
    # The container runtime's (or the user's) variable, for CUDA rather than for us: read
    # where the GPUs are counted, once per process (lru_cache).
    visible = os.environ.get(env.CUDA_VISIBLE_DEVICES)
    if visible is not None and visible.strip() in ("", "-1"):
        return ()
    if not _torch_build_has_cuda():
        return ()
    if not shutil.which("nvidia-smi"):
        return _gpus_from_torch()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,compute_cap,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    gpus = {}
    for line in out.stdout.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        try:
            gpus[fields[0]] = Gpu(float(fields[1]), int(float(fields[2])) * 2 ** 20)
        except (IndexError, ValueError):
            continue
    if visible is not None:
        return tuple(gpus[i.strip()] for i in visible.split(",") if i.strip() in gpus)
    return tuple(gpus.values())


def gpu_compute_capabilities() -> tuple[float, ...]:
    """Compute capability of each GPU this process may use (empty without CUDA)."""
    return tuple(g.compute_capability for g in visible_gpus())


def gpu_memory_bytes() -> int | None:
    """The smallest visible GPU's memory: what a per-device plan must fit (None: no GPU)."""
    gpus = visible_gpus()
    return min(g.memory_bytes for g in gpus) if gpus else None


def _gpus_from_torch() -> tuple[Gpu, ...]:
    # The slow path (seconds): a CUDA build of torch without nvidia-smi beside it.
    import torch

    if not torch.cuda.is_available():
        return ()
    return tuple(Gpu(float("%d.%d" % torch.cuda.get_device_capability(i)),
                     int(torch.cuda.get_device_properties(i).total_memory))
                 for i in range(torch.cuda.device_count()))


def cuda_device_count() -> int:
    return len(gpu_compute_capabilities())


def cpu_supports_bf16() -> bool:
    """What torch's mkldnn check answers: AVX-512 BW/VL/DQ, AVX512-BF16 or AMX-BF16."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
            break
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & flags) or \
        {"avx512bw", "avx512vl", "avx512dq"} <= flags


def choose(requested_device: str | None, requested_dtype: str | None) -> Hardware:
    """Keep what was asked where the machine can do it; otherwise say what changed."""
    notes: list[str] = []
    dtype = requested_dtype or "bf16"
    device = requested_device or "cuda"
    caps = gpu_compute_capabilities()
    if device.startswith("cuda") and not caps:
        notes.append(f"no CUDA device: running on cpu instead of {device}")
        device = "cpu"
    if device.startswith("cuda") and dtype == "bf16" and min(caps) < 8.0:
        notes.append("this GPU has no bf16 (compute capability < 8.0): using fp32 instead")
        dtype = "fp32"
    if device == "cpu" and dtype == "bf16" and not cpu_supports_bf16():
        notes.append("this CPU has no native bf16: using fp32 instead of bf16")
        dtype = "fp32"
    return Hardware(device=device, dtype=dtype, notes=notes)
