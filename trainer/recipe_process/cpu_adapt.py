"""Make torchtune's recipes run where they assume CUDA: on CPU, with gloo.

The distributed recipes open ``cuda:nccl,cpu:gloo`` process groups and read CUDA memory
statistics and empty the CUDA cache unconditionally; on a machine without CUDA both fail before the first step.
We patch those library entry points (never the recipe code): the process group
falls back to gloo, and memory statistics report the process's peak resident memory.

One more is a silent one: to save a merged checkpoint, the LoRA recipes copy the model's
state with ``{k: v.cpu() ...}`` and fold each adapter into that copy in place. On CPU
``.cpu()`` returns the very tensor, so every epoch's save folds the adapter into the live
base weights, and training after the first epoch runs on a corrupted base (the exported
adapter then no longer reproduces the merged model). The merge is made to work on a copy.

And one that costs memory and time: without flex attention torchtune attends over a whole
pack through a dense mask; ``document_attention`` attends per document instead. And
its chunked output projection copies the whole output weight per sequence and chunk on
CPU; ``chunked_output`` projects each chunk as one matrix instead.
"""

from __future__ import annotations

import functools
import resource

_GIB = 1024 ** 3


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _gloo_backend(backend):
    if backend is None or (isinstance(backend, str) and "nccl" in backend):
        return "gloo"
    return backend


def apply() -> list[str]:
    """Install the CPU adaptations when CUDA is absent; return what was adapted."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        return []
    adapted = []
    original_init = dist.init_process_group

    @functools.wraps(original_init)
    def init_process_group(backend=None, *args, **kwargs):
        return original_init(_gloo_backend(backend), *args, **kwargs)

    dist.init_process_group = init_process_group
    adapted.append("process groups use gloo (no CUDA)")

    from torchtune import training
    from torchtune.training import memory

    original_stats = memory.get_memory_stats

    @functools.wraps(original_stats)
    def get_memory_stats(device, reset_stats: bool = True) -> dict:
        if getattr(device, "type", str(device)) != "cpu":
            return original_stats(device, reset_stats=reset_stats)
        peak = peak_rss_bytes() / _GIB
        return {"peak_memory_active": peak, "peak_memory_alloc": peak,
                "peak_memory_reserved": peak}

    memory.get_memory_stats = get_memory_stats
    training.get_memory_stats = get_memory_stats
    adapted.append("memory statistics read the process's peak RSS (no CUDA)")

    def cleanup_before_training() -> None:
        # torchtune's empties the device cache, which torch.cpu does not have.
        import gc

        gc.collect()

    memory.cleanup_before_training = cleanup_before_training
    training.cleanup_before_training = cleanup_before_training

    from torchtune.modules import peft

    peft.get_merged_lora_ckpt = merge_on_a_copy(peft.get_merged_lora_ckpt)
    adapted.append("LoRA merges for checkpoints work on a copy of the base weights")

    from kubetune.trainer.recipe_process import document_attention

    if document_attention.install():
        adapted.append("packed batches attend per document, not over the whole pack")
    from kubetune.trainer.recipe_process import chunked_output

    if chunked_output.install():
        adapted.append("chunked output projections run as matrix products, not batched "
                       "copies of the output weight")
    return adapted


def merge_on_a_copy(merge):
    """Wrap torchtune's ``get_merged_lora_ckpt`` so it cannot modify the weights it is given."""

    @functools.wraps(merge)
    def merged(state_dict: dict, *args, **kwargs) -> dict:
        suffix = ".lora_a.weight"
        copy = dict(state_dict)
        for key in state_dict:
            if key.endswith(suffix):
                base = key[: -len(suffix)] + ".weight"
                if base in copy:
                    copy[base] = copy[base].clone()
        return merge(copy, *args, **kwargs)

    return merged
