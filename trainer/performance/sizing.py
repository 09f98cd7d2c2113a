"""What a run needs before it is admitted (kubeflow/trainer #3328): nodes, GPUs per node,
GPU memory per device and host memory per node, from the memory plan the trainer itself
runs on the GPU (``memory_plan``) and the host memory it checks (``host_memory``).

``fit`` plans one topology exactly as the trainer's speed defaults do on CUDA, and
``describe`` is the one ``memory plan:`` line both the trainer and `kubetune size` print
for it. ``smallest`` searches topologies for a request (`kubetune size`): one node with the
fewest GPUs that fit, else the fewest nodes with every GPU of each, each topology with the
recipe and base config the trainer picks for it (``kubetune.trainer.request.methods``) and the
values of that config the plan reads (``BASE_CONFIG_PLAN``, checked against torchtune's
configs by the tests: this module must not need torchtune, the initializer image runs it).

Counted (per device): the model state, sharded by FSDP over every GPU of every node (the
weights, and for full fine-tuning the gradients and AdamW's two moments; LoRA/DoRA
adapters with theirs; QLoRA's NF4 base), the activations of one micro-batch (with or
without activation checkpointing) and the logits; 25% of the card stays free (CUDA
context, workspaces, fragmentation). Per node: each process loads the whole checkpoint
into host memory at start, with 20% headroom. Not counted: optimizer or activation
offloading to the CPU, torch.compile's own workspace beyond that 25%, a memory-backed
/dev/shm (its pages count against the pod's memory limit), the dataset in host memory,
and other dtypes than bf16 (a GPU below compute capability 8.0 trains in fp32: about
twice the state).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubetune import quantity
from kubetune.errors import BadInputError
from kubetune.trainer.performance import host_memory, memory_plan
from kubetune.trainer.performance.model_shape import adapter_count
from kubetune.trainer.request import methods
from kubetune.trainer.request.topology import Topology

# The LoRA every run of `kubetune train` and of our runtimes starts from: torchtune's
# llama3_2/1B_lora(_single_device) configs, which ``methods`` bases every method on.
BASE_LORA = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"],
             "apply_lora_to_mlp": True, "lora_rank": 64}
# What the plan reads from each base config ``methods.recipe_for`` can pick:
# (gradient_accumulation_steps, optimizer_in_bwd).
BASE_CONFIG_PLAN = {
    "llama3_2/1B_lora_single_device": (8, False),
    "llama3_2/1B_qlora_single_device": (8, False),
    "llama3_2/1B_full_single_device": (1, True),
    "llama3_2/1B_lora": (8, False),
    "llama3_2/1B_full": (8, False),
    "llama3_3/70B_full_multinode": (1, False),
}
DTYPE = "bf16"
GPU_RESOURCE = "nvidia.com/gpu"
# Past this many nodes the search stops: a plan that needs more does not fit at all.
NODE_CEILING = 2 ** 20


@dataclass(frozen=True)
class Fit:
    """One topology's memory plan: what the trainer picks there and what it needs."""

    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int  # each GPU's
    need_bytes: int  # per GPU: the least the plan can use, with the card's free 25% on top
    plan: memory_plan.MemoryPlan  # what the trainer picks on this card
    checkpoint_bytes: int | None  # None where the checkpoint's size is unknown
    seq_len: int

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def host_memory_bytes(self) -> int | None:
        """Per node: each process loads the whole checkpoint at start."""
        if self.checkpoint_bytes is None:
            return None
        return host_memory.required_bytes(self.gpus_per_node, self.checkpoint_bytes)


def fit(workload: memory_plan.Workload, gpu_memory_bytes: int, batch_size: int,
        accumulation: int, checkpointing: bool | None, split_fixed: bool, nodes: int,
        checkpoint_bytes: int | None) -> Fit:
    """The trainer's plan for ``workload`` on ``nodes`` nodes of ``workload.world_size /
    nodes`` GPUs (``memory_plan.choose``'s arguments, as its caller gives them)."""
    plan = memory_plan.choose(workload, gpu_memory_bytes, batch_size, accumulation,
                              checkpointing, split_fixed)
    least = memory_plan.least_estimate(workload, batch_size, checkpointing, split_fixed)
    return Fit(nodes=nodes, gpus_per_node=max(1, workload.world_size // max(1, nodes)),
               gpu_memory_bytes=gpu_memory_bytes,
               need_bytes=int(least / memory_plan.HEADROOM), plan=plan,
               checkpoint_bytes=checkpoint_bytes, seq_len=workload.seq_len)


def describe(f: Fit) -> str:
    """The ``memory plan:`` line: the trainer logs it, `kubetune size` prints it."""
    gib = memory_plan.gib
    line = (f"memory plan: {f.nodes} node(s) x {f.gpus_per_node} GPU(s) of "
            f"{gib(f.gpu_memory_bytes)}, {f.seq_len}-token sequences: each GPU needs "
            f"{gib(f.need_bytes)} (the least plan, with "
            f"{1 - memory_plan.HEADROOM:.0%} of the card free); on this card "
            f"{memory_plan.describe(f.plan)}")
    if f.host_memory_bytes is not None:
        line += (f"; host memory {gib(f.host_memory_bytes)} per node ({f.gpus_per_node} "
                 f"process(es) each loading the {gib(f.checkpoint_bytes)} checkpoint)")
    return line


def resources_per_node(f: Fit) -> dict:
    """The TrainJob's ``spec.trainer.resourcesPerNode`` for ``f``: requests and limits
    alike (a GPU's request must equal its limit), both merged key by key over the
    runtime's node resources, whose cpu stays."""
    values: dict = {GPU_RESOURCE: f.gpus_per_node}
    if f.host_memory_bytes is not None:
        values["memory"] = quantity.gibibytes(f.host_memory_bytes)
    return {"requests": dict(values), "limits": dict(values)}


# -- `kubetune size`: the smallest topology that fits ---------------------------------------

@dataclass(frozen=True)
class Request:
    label: str  # the model, as messages name it
    dims: dict  # architecture dims, as the trainer reads them (Architecture.shape)
    method: str
    seq_len: int
    batch_size: int
    gpu_memory_bytes: int
    gpus_per_node: int
    checkpoint_bytes: int | None
    max_nodes: int | None = None
    # What the objective adds (pairs per row, a reference copy, a teacher): its
    # ``Objective.memory_load``.
    load: memory_plan.ObjectiveLoad = memory_plan.ObjectiveLoad()
    # The fewest processes the objective's recipe for the method runs on.
    fewest_gpus: int = 1


def trainer_fit(r: Request, nodes: int, gpus: int) -> Fit:
    """The plan the trainer makes for ``r`` on ``nodes`` x ``gpus``: its recipe's base
    config, the base LoRA, the user's batch_size and sequence length."""
    _, config, _ = methods.recipe_for(r.method, Topology(nodes, gpus, 0, None))
    accumulation, in_backward = BASE_CONFIG_PLAN[config]
    workload = memory_plan.Workload(
        dims=r.dims, method=r.method, dtype=DTYPE, seq_len=r.seq_len,
        world_size=nodes * gpus, n_adapter=adapter_count(r.dims, BASE_LORA, r.method),
        optimizer_in_bwd=in_backward, load=r.load)
    return fit(workload, r.gpu_memory_bytes, r.batch_size, accumulation, None, in_backward,
               nodes, r.checkpoint_bytes)


def _node_words(r: Request) -> str:
    return f"{r.gpus_per_node} x {memory_plan.gib(r.gpu_memory_bytes)} GPUs"


def _nodes_needed(r: Request) -> int | None:
    """The fewest nodes of every GPU that fit (two or more), or None: none do."""
    g = r.gpus_per_node
    if not trainer_fit(r, NODE_CEILING, g).fits:
        return None
    high = 2
    while not trainer_fit(r, high, g).fits:
        high *= 2
    low = high // 2 + 1 if high > 2 else 2
    while low < high:  # the fewest; more nodes only shard the state thinner
        middle = (low + high) // 2
        if trainer_fit(r, middle, g).fits:
            high = middle
        else:
            low = middle + 1
    return high


def smallest(r: Request) -> Fit:
    """One node with the fewest GPUs that fit; else the fewest nodes with all of theirs.
    A request that fits nowhere, or only on more nodes than ``max_nodes``, or a QLoRA run
    that needs more than one node, is one line saying what would fit."""
    for gpus in range(r.fewest_gpus, r.gpus_per_node + 1):
        one = trainer_fit(r, 1, gpus)
        if one.fits:
            return one
    if r.method == "qlora":
        lora = _nodes_needed(Request(**{**r.__dict__, "method": "lora"}))
        instead = f"lora on {lora} node(s)" if lora else "GPUs with more memory"
        raise BadInputError(f"{r.label}, qlora: does not fit one node of {_node_words(r)}, "
                            "and QLoRA runs on one node only (torchtune shards NF4 weights "
                            f"within a node): use {instead}, or a shorter --max-seq-len")
    nodes = _nodes_needed(r)
    if nodes is None:
        thinnest = trainer_fit(r, NODE_CEILING, r.gpus_per_node)
        raise BadInputError(
            f"{r.label}, {r.method}: does not fit {memory_plan.gib(r.gpu_memory_bytes)} GPUs "
            f"on any number of nodes: with the model state sharded to nothing, one "
            f"{r.seq_len}-token sequence still needs {memory_plan.gib(thinnest.need_bytes)} "
            "per GPU (its activations, checkpointed, and logits, with 25% of the card "
            "free): a shorter --max-seq-len or GPUs with more memory")
    if r.max_nodes is not None and nodes > r.max_nodes:
        raise BadInputError(
            f"{r.label}, {r.method}: needs {nodes} nodes of {_node_words(r)} (FSDP shards "
            f"the weights, gradients and optimizer state over all {nodes * r.gpus_per_node} "
            f"GPUs), more than --max-nodes {r.max_nodes}: allow more nodes, use "
            "lora or qlora, or GPUs with more memory")
    return trainer_fit(r, nodes, r.gpus_per_node)
