"""Choose the micro-batch and activation checkpointing that fit one GPU's memory with
headroom, keeping the effective batch (batch_size x gradient_accumulation_steps).

The estimate, per device, in bytes (b = 2 for bf16, 4 for fp32; W = devices, over which
the distributed recipes shard parameters, gradients and optimizer state with FSDP;
N = parameters, A = adapter parameters, Q = the layers' projection parameters):

  model state
    full:        N b (weights) + N b (gradients; with ``optimizer_in_bwd`` only the
                 largest one) + 2 N b (AdamW's two moments, kept in the weights' dtype)
    LoRA / DoRA: N b (frozen weights) + 4 A b (adapter weights, gradients, 2 moments)
    QLoRA:       Q x 0.5625 (NF4: 4 bits + per-block scales) + (N - Q) b + 4 A b
    all divided by W.
  activations, per token of the micro-batch (S = micro_batch x T tokens)
    a layer keeps b (4d + 3 d_attn + 3 d_kv + 4 d_ff): its two norms' inputs and outputs,
    q and k before and after RoPE, v, the attention output, and the SwiGLU's
    w1 / w3 / silu / product;
    without checkpointing every layer keeps it (L layers); with checkpointing each layer
    keeps only its input (b d) and one layer's full set lives during its recompute;
    LoRA's rank-sized intermediates are left out (rank << d).
  logits, per token: V (2b + 1): the output in the compute dtype and its gradient, and
    one of torchtune's 8 cross-entropy chunks upcast to fp32 with its gradient.

Plan: estimate <= HEADROOM x the card's memory. The rest (25%) is for the CUDA context,
cuBLAS/compile workspaces, allocator fragmentation and this estimate's error, so the
peak stays under 90% of the card.

Prefer no checkpointing (it recomputes the forward: +33% FLOPs for full, +50% for LoRA)
when the largest micro-batch that fits without it holds at least
``MIN_TOKENS_PER_MICRO_BATCH`` tokens (enough to keep an H100's matmuls busy) or the
whole effective batch; otherwise checkpoint, if that fits a larger micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubetune.trainer.performance.model_shape import linear_shapes, parameter_count, quantizable_count

HEADROOM = 0.75
MIN_TOKENS_PER_MICRO_BATCH = 4096
NF4_BYTES_PER_PARAM = 0.5625
_CE_CHUNKS = 8


@dataclass(frozen=True)
class ObjectiveLoad:
    """What a training objective adds to a run's memory, as its ``Objective`` says
    (``kubetune.trainer.objectives``): the planner itself knows no objective."""

    # Sequences each micro-batch row runs through the model: a preference pair's chosen
    # and rejected answers run together (2).
    sequences_per_row: int = 1
    # A frozen copy of the policy's weights besides it (full DPO's reference).
    reference_copy: bool = False
    # A frozen teacher's shape (Architecture.shape): its weights, sharded as the
    # student's are, and the logits it holds for the micro-batch during the student's
    # forward.
    teacher_dims: dict | None = None


@dataclass(frozen=True)
class Workload:
    dims: dict
    method: str  # full, lora, qlora, dora
    dtype: str  # bf16, fp32
    seq_len: int  # tokens per sequence: the pack length, else the longest a batch pads to
    world_size: int = 1
    n_adapter: int = 0
    optimizer_in_bwd: bool = False
    load: ObjectiveLoad = ObjectiveLoad()


@dataclass(frozen=True)
class MemoryPlan:
    batch_size: int
    gradient_accumulation_steps: int
    activation_checkpointing: bool
    estimate_bytes: int
    budget_bytes: int
    fits: bool


def _bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def state_bytes(w: Workload) -> float:
    b, n = _bytes(w.dtype), parameter_count(w.dims)
    if w.method == "full":
        largest = max(i * o for i, o in linear_shapes(w.dims).values())
        grads = largest * b if w.optimizer_in_bwd else n * b
        total = n * b + grads + 2 * n * b
    elif w.method == "qlora":
        q = quantizable_count(w.dims)
        total = q * NF4_BYTES_PER_PARAM + (n - q) * b + 4 * w.n_adapter * b
    else:
        total = n * b + 4 * w.n_adapter * b
    if w.load.reference_copy:
        total += n * b
    if w.load.teacher_dims:
        total += parameter_count(w.load.teacher_dims) * b
    return total / max(1, w.world_size)


def layer_activation_bytes_per_token(w: Workload) -> float:
    d, ff = w.dims["embed_dim"], w.dims["intermediate_dim"]
    shapes = linear_shapes(w.dims)
    d_attn, d_kv = shapes["q_proj"][1], shapes["k_proj"][1]
    return _bytes(w.dtype) * (4 * d + 3 * d_attn + 3 * d_kv + 4 * ff)


def activation_bytes(w: Workload, micro_batch: int, checkpointing: bool) -> float:
    tokens = micro_batch * w.seq_len * w.load.sequences_per_row
    layer = layer_activation_bytes_per_token(w)
    layers = w.dims["num_layers"]
    if checkpointing:
        per_token = layers * _bytes(w.dtype) * w.dims["embed_dim"] + layer
    else:
        per_token = layers * layer
    logits = w.dims["vocab_size"] * (2 * _bytes(w.dtype) + 4 * 2 / _CE_CHUNKS)
    if w.load.teacher_dims:  # the teacher's logits, kept for the KD loss
        logits += w.load.teacher_dims["vocab_size"] * _bytes(w.dtype)
    return tokens * (per_token + logits)


def estimate_bytes(w: Workload, micro_batch: int, checkpointing: bool) -> int:
    return int(state_bytes(w) + activation_bytes(w, micro_batch, checkpointing))


def _divisors(n: int) -> list[int]:
    return [m for m in range(n, 0, -1) if n % m == 0]


def choose(w: Workload, gpu_memory_bytes: int, batch_size: int, accumulation: int,
           checkpointing: bool | None, split_fixed: bool) -> MemoryPlan:
    """The largest micro-batch dividing the effective batch that fits, and whether to
    checkpoint. ``checkpointing`` None: ours to choose; ``split_fixed``: keep the
    micro-batch as given (the user set both sizes, or ``optimizer_in_bwd`` forbids
    accumulation)."""
    budget = int(HEADROOM * gpu_memory_bytes)
    effective = batch_size * accumulation
    sizes = [batch_size] if split_fixed else _divisors(effective)

    def largest(ac: bool) -> int | None:
        return next((m for m in sizes if estimate_bytes(w, m, ac) <= budget), None)

    def plan(m: int, ac: bool, fits: bool = True) -> MemoryPlan:
        return MemoryPlan(m, effective // m, ac, estimate_bytes(w, m, ac), budget, fits)

    if checkpointing is not None:
        m = largest(checkpointing)
        return plan(m, checkpointing) if m else plan(min(sizes), checkpointing, False)
    plain = largest(False)
    if plain and (plain * w.seq_len >= MIN_TOKENS_PER_MICRO_BATCH or plain == effective):
        return plan(plain, False)
    checkpointed = largest(True)
    if checkpointed and (plain is None or checkpointed > plain):
        return plan(checkpointed, True)
    if plain:
        return plan(plain, False)
    return plan(min(sizes), True, False)


def least_estimate(w: Workload, batch_size: int, checkpointing: bool | None,
                   split_fixed: bool) -> int:
    """The smallest estimate ``choose`` can pick from: the smallest micro-batch it may use
    (1, or ``batch_size`` where the split is fixed), checkpointed unless the user said
    otherwise. What a device must hold, whatever the card."""
    return estimate_bytes(w, batch_size if split_fixed else 1,
                          True if checkpointing is None else checkpointing)


def gib(n: float) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


def describe(p: MemoryPlan) -> str:
    return (f"micro-batch {p.batch_size} x {p.gradient_accumulation_steps} accumulation "
            f"step(s), activation checkpointing {'on' if p.activation_checkpointing else 'off'}"
            f": estimated {gib(p.estimate_bytes)} of a {gib(p.budget_bytes)} budget "
            f"({HEADROOM:.0%} of the GPU)")

