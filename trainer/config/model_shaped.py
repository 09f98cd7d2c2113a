"""The settings a torchtune config wrote for the model it was named for, fitted to the
checkpoint actually trained: how FSDP shards it (``custom_sharded_layers``, and the
batches an output sharded apart needs), whether FSDP offloads it to host memory
(``fsdp_cpu_offload``), tensor parallelism's plan, and QLoRA's NF4 shards per process.

``plan`` rebuilds the model, tokenizer and checkpointer sections from the checkpoint; these
settings live outside those sections, so a config written for Llama-3.3-70B
(``llama3_3/70B_full``: the embeddings and output sharded on their own, parameters
offloaded to the CPU) would otherwise apply them to a 1B model with a tied output, where
they cannot run or only slow it down. A value the config brought is changed with one line
saying why; the same value given as an override is the user's choice, and one that cannot
run on this checkpoint is refused before launch.
"""

from __future__ import annotations

from omegaconf import DictConfig

from kubetune.errors import BadInputError
from kubetune.trainer.checkpointing.checkpoint_model import CheckpointModel
from kubetune.trainer.config.validate import check_nf4
from kubetune.trainer.performance import memory_plan

# The top-level modules a tied output shares a weight with: sharded apart from the root,
# the embedding's weight is gathered only inside its own forward, and the output's
# matmul then meets a sharded DTensor ("aten.mm.default got mixed torch.Tensor and
# DTensor").
TIED_MODULES = ("tok_embeddings", "output")
DEFAULT_COLLATE = "torchtune.data.padded_collate_sft"
WHOLE_CHUNKS_COLLATE = "kubetune.trainer.data.whole_chunks.padded_collate_sft_whole_chunks"
# CEWithChunkedOutputLoss's default (torchtune's configs keep it); read here without torch.
OUTPUT_CHUNKS = 8
GIB = 2 ** 30


def fit(cfg: DictConfig, checkpoint: CheckpointModel, method: str, config_name: str,
        user_keys: set[str], world_size: int, gpu_memory_bytes: int | None) -> list[str]:
    """Fit ``cfg``'s model-shaped distributed settings to ``checkpoint``; return the lines
    saying what changed. ``gpu_memory_bytes``: the smallest GPU's (None without CUDA)."""
    notes = _sharded_layers(cfg, checkpoint, config_name, user_keys)
    notes += _whole_output_chunks(cfg, config_name, user_keys, world_size)
    notes += _cpu_offload(cfg, checkpoint, method, config_name, user_keys, world_size,
                          gpu_memory_bytes)
    _tensor_parallel(cfg, checkpoint)
    if method == "qlora" and world_size > 1:
        check_nf4(checkpoint.architecture.dims, world_size)
    return notes


def _tied(checkpoint: CheckpointModel) -> bool:
    return bool(checkpoint.architecture.shape.get("tie_word_embeddings"))


def _sharded_layers(cfg: DictConfig, checkpoint: CheckpointModel, config_name: str,
                    user_keys: set[str]) -> list[str]:
    names = list(cfg.get("custom_sharded_layers") or [])
    apart = [n for n in names if n in TIED_MODULES]
    if not apart or not _tied(checkpoint):
        return []
    family = checkpoint.architecture.family
    if "custom_sharded_layers" in user_keys:
        raise BadInputError(
            f"custom_sharded_layers={names}: this {family} checkpoint ties its output to its "
            f"embeddings, and FSDP cannot shard {' and '.join(apart)} apart from the model "
            "that uses them both; leave them out of custom_sharded_layers")
    kept = [n for n in names if n not in TIED_MODULES]
    cfg.custom_sharded_layers = kept or None
    return [f"custom_sharded_layers: config {config_name} shards {apart} on their own, for a "
            f"model with an output weight of its own; this {family} checkpoint ties its output "
            f"to the embeddings, which stay with the rest of the model "
            f"({'sharded apart: ' + str(kept) if kept else 'none sharded apart'})"]


def _whole_output_chunks(cfg: DictConfig, config_name: str, user_keys: set[str],
                         world_size: int) -> list[str]:
    """An output sharded apart gathers its weight once per output chunk: every process
    must split its batch into as many chunks (``kubetune.trainer.data.whole_chunks``)."""
    if world_size < 2 or "output" not in list(cfg.get("custom_sharded_layers") or []):
        return []
    if "collate_fn" in user_keys or cfg.get("collate_fn") not in (None, DEFAULT_COLLATE):
        return []
    cfg.collate_fn = WHOLE_CHUNKS_COLLATE
    return [f"collate_fn: config {config_name} shards the output apart, which gathers its "
            "weight for each output chunk of the loss: batches are padded to a multiple of "
            f"{OUTPUT_CHUNKS} tokens, so every process splits its batch into as many chunks"]


def _cpu_offload(cfg: DictConfig, checkpoint: CheckpointModel, method: str, config_name: str,
                 user_keys: set[str], world_size: int,
                 gpu_memory_bytes: int | None) -> list[str]:
    if not cfg.get("fsdp_cpu_offload"):
        return []
    chosen = "fsdp_cpu_offload" in user_keys
    if str(cfg.get("device")) == "cpu":
        # torch's backend string for offloading adds cpu:gloo to a cpu:gloo group, which
        # init_process_group refuses: nothing to offload to where everything already is.
        if chosen:
            raise BadInputError("fsdp_cpu_offload=True offloads parameters from the GPU to "
                                "host memory, and this run trains on the CPU: leave it out")
        cfg.fsdp_cpu_offload = False
        return [f"fsdp_cpu_offload: config {config_name} offloads parameters to host memory; "
                "this run trains on the CPU, where they already are: off"]
    if chosen or gpu_memory_bytes is None:
        return []
    workload = memory_plan.Workload(dims=checkpoint.architecture.shape, method=method,
                                    dtype=str(cfg.get("dtype") or "bf16"), seq_len=1,
                                    world_size=max(1, world_size))
    state = memory_plan.state_bytes(workload)
    budget = memory_plan.HEADROOM * gpu_memory_bytes
    if state > budget:
        return []  # what offloading is for
    cfg.fsdp_cpu_offload = False
    return [f"fsdp_cpu_offload: config {config_name} offloads parameters to host memory; "
            f"this checkpoint's weights, gradients and optimizer state take "
            f"{state / GIB:.1f} GiB per GPU over {world_size} process(es), within "
            f"{budget / GIB:.1f} GiB of its {gpu_memory_bytes / GIB:.0f} GiB: off, which "
            "saves a host round trip per step (fsdp_cpu_offload=True to keep it)"]


def _tensor_parallel(cfg: DictConfig, checkpoint: CheckpointModel) -> None:
    """torchtune's tensor-parallel plans split the output projection by columns: a tied
    output has no module of its own to split."""
    if int(cfg.get("tensor_parallel_dim") or 1) > 1 and _tied(checkpoint):
        raise BadInputError(f"tensor_parallel_dim={cfg.tensor_parallel_dim}: this "
                            f"{checkpoint.architecture.family} checkpoint ties its output to "
                            "its embeddings, which torchtune's tensor-parallel plan cannot "
                            "split; use tensor_parallel_dim=1 (FSDP alone)")
