"""Speed defaults a practitioner would pick, applied only where the user said nothing;
each one is a note (logged, and shown by ``--kubetune-dry-run``) naming its off switch.

- packing (CUDA): short samples waste most of each padded batch; packing them into
  ``max_seq_len`` sequences trains the same tokens in fewer steps. Only when the data is
  large enough to fill many packs (on a tiny set packing would leave a handful of steps);
  the row count covers every shard (``kubetune.trainer.data.dataset_check``). Not on CPU,
  where a pack's attention is dense (a note says so where packing would otherwise apply).
- chunked cross-entropy: never materializes the full fp32 logits (vocab x sequence).
- fused AdamW on CUDA (one kernel per step, not one per tensor); not on CPU.
- torch.compile (model and loss) on CUDA; off on CPU, where inductor's compile time
  dwarfs a short run. summary.json reports the compile/warm-up time apart.
- on CUDA, the micro-batch and activation checkpointing that fit the GPU
  (``kubetune.trainer.performance.memory_plan``), keeping the effective batch through gradient accumulation.
- on CPU, a packed batch runs one pack per forward and backward, its packs' gradients
  accumulated into the same optimizer step (the effective batch kept, whoever set it).

Neither compile nor the memory plan's micro-batch can fail a run: inside the recipe
process ``kubetune.trainer.recipe_process.fallbacks`` falls back to eager, or splits a
micro-batch that runs out of memory at the first step.
"""

from __future__ import annotations

import importlib.util

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.config.builder_settings import builder_takes
from kubetune.trainer.performance import memory_plan, sizing
from kubetune.trainer.performance.model_shape import adapter_count

CHUNKED_CE = "torchtune.modules.loss.CEWithChunkedOutputLoss"
_PLAIN_CE = ("torch.nn.CrossEntropyLoss", "torch.nn.modules.loss.CrossEntropyLoss")
# Mean characters per token of English under Llama/Qwen BPE: rough, and only decides
# whether samples are short.
CHARS_PER_TOKEN = 4.0
# Pack only if samples are this many times shorter than a pack...
SHORT_FACTOR = 4
# ...and the data fills at least this many optimizer steps' worth of packs.
MIN_PACKED_STEPS = 20
# Why not on CPU: torchtune 0.6.1 keeps a pack's documents apart with flex attention only
# on CUDA; elsewhere its dense mask made every pack attend over all its positions (0.50x
# the tokens per CPU second of unpacked batches on the tiny Llama-3, 0.74x at dim 512).
# Packed batches now attend per document on CPU (recipe_process.document_attention) and
# run one pack per forward (_one_pack_per_forward): on alpaca-like lengths that trains
# 1.38-1.61x padded batches' tokens per second (bench/cpu_packing.py), but how much
# packing pays depends on how widely the rows' lengths spread (per-document packs of
# lengths drawn uniformly from 100-500 tokens, a whole batch per forward, measured
# 0.94x): not packed by default (yet), the user told how.
_CPU_PACKS = "packs pay there only where row lengths spread widely"


def batch_sizes(cfg: DictConfig) -> tuple[int, int]:
    """(batch_size, gradient_accumulation_steps), 1 where unset."""
    return int(cfg.get("batch_size") or 1), int(cfg.get("gradient_accumulation_steps") or 1)


def _user_set(user_keys: set[str], key: str) -> bool:
    return any(k == key or k.startswith(key + ".") for k in user_keys)


def apply(cfg: DictConfig, user_keys: set[str], device: str, world_size: int,
          mean_chars: float | None, rows: int | None, max_seq_len: int, *,
          method: str = "lora", dims: dict | None = None,
          gpu_memory_bytes: int | None = None, nodes: int = 1,
          checkpoint_bytes: int | None = None,
          load: memory_plan.ObjectiveLoad = memory_plan.ObjectiveLoad(),
          may_pack: bool = True) -> list[str]:
    """Set the speed defaults in ``cfg``; ``dims`` (config.json's) and
    ``gpu_memory_bytes`` (the smallest GPU's) let the memory plan run on CUDA, over
    ``world_size`` processes on ``nodes`` nodes, each loading ``checkpoint_bytes``;
    ``load`` and ``may_pack``: what the run's objective adds to memory, and whether its
    rows may be packed (``Objective.memory_load``, ``Objective.packs``)."""
    notes: list[str] = []
    loss = cfg.get("loss")
    if isinstance(loss, DictConfig) and loss.get("_component_") in _PLAIN_CE \
            and not _user_set(user_keys, "loss"):
        cfg.loss = OmegaConf.create({"_component_": CHUNKED_CE})
        notes.append("speed: chunked cross-entropy (CEWithChunkedOutputLoss; "
                     "loss._component_=torch.nn.CrossEntropyLoss to turn off)")
    notes += _optimizer(cfg, user_keys, device)

    if not _user_set(user_keys, "compile"):
        if device == "cpu" and cfg.get("compile"):
            cfg.compile = False
            notes.append("speed: compile off on CPU (compile=True to force)")
        elif device.startswith("cuda") and not cfg.get("compile"):
            cfg.compile = True
            notes.append("speed: torch.compile of model and loss; its compile time is "
                         "summary.json's warmup_s, apart from steady-state tokens/s "
                         "(compile=False to turn off)")

    dataset = cfg.get("dataset")
    if (may_pack and isinstance(dataset, DictConfig) and not _user_set(user_keys, "dataset.packed")
            and not dataset.get("packed") and mean_chars and rows
            and builder_takes(dataset, "packed")):
        tokens_per_sample = mean_chars / CHARS_PER_TOKEN
        packs = rows * tokens_per_sample / max_seq_len
        steps = packs / max(1, int(cfg.get("batch_size") or 1) * world_size)
        if tokens_per_sample * SHORT_FACTOR <= max_seq_len and steps >= MIN_PACKED_STEPS:
            if device.startswith("cuda"):
                dataset.packed = True
                notes.append(f"speed: packing {rows} samples (~{tokens_per_sample:.0f} "
                             f"tokens each) into {max_seq_len}-token sequences "
                             "(dataset.packed=False to turn off)")
            else:
                notes.append(f"speed: not packing {rows} samples (~{tokens_per_sample:.0f} "
                             f"tokens each) on {device}: {_CPU_PACKS} "
                             "(dataset.packed=True to force)")
    if isinstance(dataset, DictConfig) and dataset.get("packed") \
            and cfg.tokenizer.get("max_seq_len") is None:
        cfg.tokenizer.max_seq_len = max_seq_len  # packing needs a pack length

    if device == "cpu" and isinstance(dataset, DictConfig) and dataset.get("packed"):
        notes += _one_pack_per_forward(cfg)
    if device.startswith("cuda") and dims and gpu_memory_bytes:
        notes += _fit_memory(cfg, user_keys, world_size, max_seq_len, method, dims,
                             gpu_memory_bytes, nodes, checkpoint_bytes, load)
    return notes


def _optimizer(cfg: DictConfig, user_keys: set[str], device: str) -> list[str]:
    """AdamW where the config's optimizer cannot run here; fused AdamW on CUDA."""
    notes = []
    optimizer = cfg.get("optimizer")
    component = str(optimizer.get("_component_", "")) if isinstance(optimizer, DictConfig) else ""
    if component.startswith("bitsandbytes.") and (
            device == "cpu" or importlib.util.find_spec("bitsandbytes") is None) \
            and not {"optimizer", "optimizer._component_"} & user_keys:
        # torchtune's full single-device configs pick 8-bit paged AdamW: CUDA-only, and
        # bitsandbytes is not in our images.
        cfg.optimizer = OmegaConf.create({"_component_": "torch.optim.AdamW",
                                          "lr": optimizer.get("lr", 2e-5),
                                          "weight_decay": optimizer.get("weight_decay", 0.01)})
        optimizer = cfg.optimizer
        notes.append(f"optimizer {component} is unavailable here: using torch.optim.AdamW")
    if isinstance(optimizer, DictConfig) and "Adam" in str(optimizer.get("_component_", "")):
        if device.startswith("cuda"):
            if not _user_set(user_keys, "optimizer.fused") and not optimizer.get("fused"):
                optimizer.fused = True
                notes.append("speed: fused AdamW (optimizer.fused=False to turn off)")
        elif optimizer.get("fused"):
            optimizer.fused = False  # a CUDA kernel
    return notes


def _one_pack_per_forward(cfg: DictConfig) -> list[str]:
    """On CPU, ``batch_size`` packs become that many micro-batches of one pack. Packs are
    ``max_seq_len`` positions each, so a micro-batch of one is already a large matrix:
    bench/cpu_packing.py measured one pack per forward at 1.15-1.30x the tokens per second
    of the whole batch in one forward (the smaller working set stays in the CPU's caches),
    and a step then holds one pack's activations, not ``batch_size`` packs' (a packed
    run's peak memory stays near an unpacked one's: bench/data_scale.py). torchtune sums
    token losses over an accumulation and divides by their count, so each optimizer step
    trains the same packs to the same gradients, up to float rounding. Applied even where
    the user set both sizes (unlike the CUDA memory plan): it changes how a step runs,
    not what it trains. Not with ``optimizer_in_bwd``, which cannot accumulate."""
    batch, accumulation = batch_sizes(cfg)
    if batch <= 1 or cfg.get("optimizer_in_bwd"):
        return []
    cfg.batch_size = 1
    cfg.gradient_accumulation_steps = batch * accumulation
    return [f"speed: one pack per forward on cpu: batch_size={batch} "
            f"gradient_accumulation_steps={accumulation} runs as 1 x {batch * accumulation}, "
            f"the same packs in each optimizer step (faster per pack on CPU, and a step "
            f"holds one pack's activations, not {batch})"]


def _fit_memory(cfg: DictConfig, user_keys: set[str], world_size: int, max_seq_len: int,
                method: str, dims: dict, gpu_memory_bytes: int, nodes: int,
                checkpoint_bytes: int | None,
                load: memory_plan.ObjectiveLoad) -> list[str]:
    """Micro-batch and activation checkpointing for this GPU
    (``kubetune.trainer.performance.memory_plan``), and the ``memory plan:`` line
    `kubetune size` answers with for the same model, method, length and batch."""
    sizes_set = {"batch_size", "gradient_accumulation_steps"} <= user_keys
    checkpointing_set = _user_set(user_keys, "enable_activation_checkpointing")
    model_cfg = cfg.get("model")
    model_cfg = OmegaConf.to_container(model_cfg) if isinstance(model_cfg, DictConfig) else {}
    in_backward = bool(cfg.get("optimizer_in_bwd"))
    workload = memory_plan.Workload(
        dims=dims, method=method, dtype=str(cfg.get("dtype") or "bf16"),
        # Unpacked batches pad to their longest sample: plan for a full-length one (the
        # tokenizer's max_seq_len; without one, the pack length the plan defaults to).
        seq_len=int(cfg.tokenizer.get("max_seq_len") or max_seq_len), world_size=world_size,
        n_adapter=adapter_count(dims, model_cfg, method), optimizer_in_bwd=in_backward,
        load=load)
    batch, accumulation = batch_sizes(cfg)
    fit = sizing.fit(
        workload, gpu_memory_bytes, batch, accumulation,
        bool(cfg.get("enable_activation_checkpointing")) if checkpointing_set else None,
        sizes_set or in_backward, nodes, checkpoint_bytes)
    plan = fit.plan
    if not plan.fits:
        return [f"memory: even {memory_plan.describe(plan)}: this run may run out of GPU "
                "memory (a shorter tokenizer.max_seq_len, method qlora or more GPUs use less)",
                sizing.describe(fit)]
    if sizes_set and checkpointing_set:
        return [sizing.describe(fit)]  # the user's own plan: stated, not changed
    cfg.batch_size = plan.batch_size
    cfg.gradient_accumulation_steps = plan.gradient_accumulation_steps
    cfg.enable_activation_checkpointing = plan.activation_checkpointing
    return [f"speed: {memory_plan.describe(plan)}; effective batch {batch * accumulation} "
            "kept (set batch_size and gradient_accumulation_steps, and "
            "enable_activation_checkpointing, to choose yourself)", sizing.describe(fit)]
