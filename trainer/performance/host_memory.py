"""Host memory for loading the checkpoint. torchtune 0.6.1's recipes read the whole
checkpoint into each process's CPU memory before moving it to the GPU (the distributed
recipes on every rank, then shard it), so a node needs about processes x checkpoint
bytes at start. A pod's memory limit is the runtime's or the TrainJob's, sized for the
model someone had in mind; the model actually trained may be larger, and the kernel
would kill the pod (OOMKilled) with no line of ours. One note says so before the start.
"""

from __future__ import annotations

import math
from pathlib import Path

# cgroup v2, then v1: the container's own limit, as the container sees it.
CGROUP_LIMIT_FILES = (Path("/sys/fs/cgroup/memory.max"),
                      Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
# The rest of the limit: the Python/torch processes themselves, the tokenizer, the
# dataset, CUDA's host allocations.
HEADROOM = 0.8
_NO_LIMIT_V1 = 2 ** 60  # cgroup v1 reports "unlimited" as a page-rounded 2^63 - 1


def container_memory_bytes(files: tuple[Path, ...] = CGROUP_LIMIT_FILES) -> int | None:
    """This container's memory limit (None: none set, or no cgroup to read)."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if not text.isdigit():  # v2's "max"
            return None
        value = int(text)
        return value if value < _NO_LIMIT_V1 else None
    return None


def checkpoint_bytes(model_dir: Path, weight_files: list[str]) -> int:
    return sum((Path(model_dir) / name).stat().st_size for name in weight_files)


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


def required_bytes(processes: int, checkpoint: int) -> int:
    """The memory limit a node needs for ``processes`` each loading ``checkpoint`` bytes,
    with this module's headroom (`kubetune size` asks for it)."""
    return math.ceil(processes * checkpoint / HEADROOM)


def note(processes: int, checkpoint: int, limit: int | None) -> str | None:
    """The line for a node whose ``processes`` each load ``checkpoint`` bytes under a
    ``limit`` they do not fit with headroom; None where they fit or nothing limits them."""
    need = processes * checkpoint
    if limit is None or required_bytes(processes, checkpoint) <= limit:
        return None
    each = "each load" if processes > 1 else "loads"
    return (f"memory: {processes} process(es) on this node {each} the whole checkpoint "
            f"({_gib(checkpoint)}) into host memory before the GPU: about {_gib(need)} "
            f"against this container's {_gib(limit)} limit, so it may be killed (OOMKilled) "
            "at start: raise the trainer's memory (resources_per_node / the runtime's "
            "limits) or run fewer processes per node")
