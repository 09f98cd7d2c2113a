"""`kubetune size`: the nodes, GPUs and memory a fine-tuning run needs, before a TrainJob
asks for them (kubeflow/trainer #3328), from the memory plan the trainer runs
(`kubetune.trainer.performance.sizing`).

Only the click surface and the printing; it needs no torch stack, so it runs in every
image, the initializer's included.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from kubetune import env, quantity
from kubetune.errors import BadInputError
from kubetune.entrypoints.options import method_option, objective_option
from kubetune.entrypoints.step import step_command

if TYPE_CHECKING:
    from kubetune.trainer.objectives.objective import Objective
    from kubetune.trainer.performance import sizing
    from kubetune.trainer.performance.sized_model import SizedModel

OUTPUTS = ("text", "json", "yaml")


class MemorySize(click.ParamType):
    """A GPU's memory: ``80Gi``, ``80GiB``, ``80GB`` (10^9 bytes), ``24Gi``..."""

    name = "size"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        n_bytes = quantity.memory_bytes(value)
        if n_bytes is None:
            self.fail(f"{value!r} is not a memory size (e.g. 80Gi, 80GiB, 80GB, 24Gi)", param,
                      ctx)
        return n_bytes


def answer(fit: "sizing.Fit", model: "SizedModel", request: "sizing.Request") -> dict:
    """The answer as `--output json|yaml` print it (and the keys the text shows)."""
    from kubetune.trainer.performance import memory_plan, sizing

    gib = 2 ** 30
    plan = fit.plan
    host = fit.host_memory_bytes
    return {
        "model": request.label, "method": request.method, "max_seq_len": request.seq_len,
        "batch_size": request.batch_size,
        "nodes": fit.nodes, "gpus_per_node": fit.gpus_per_node,
        "gpu_memory_gib_per_device": round(fit.need_bytes / gib, 1),
        "host_memory_gib": round(host / gib, 1) if host is not None else None,
        "resourcesPerNode": sizing.resources_per_node(fit),
        "plan": {"gpu_memory_gib": round(fit.gpu_memory_bytes / gib, 1),
                 "micro_batch": plan.batch_size,
                 "gradient_accumulation_steps": plan.gradient_accumulation_steps,
                 "activation_checkpointing": plan.activation_checkpointing,
                 "estimate_gib": round(plan.estimate_bytes / gib, 1),
                 "budget_gib": round(plan.budget_bytes / gib, 1),
                 "headroom": memory_plan.HEADROOM},
        "checkpoint_gib": round(model.checkpoint_bytes / gib, 1),
        "checkpoint_from": "weight files" if model.checkpoint_measured else
                           "parameter count x config.json dtype",
        "parameters": model.parameters,
    }


def _text(result: dict, line: str) -> str:
    import yaml

    trainer = {"numNodes": result["nodes"], "resourcesPerNode": result["resourcesPerNode"]}
    block = yaml.safe_dump({"trainer": trainer}, sort_keys=False, default_flow_style=False)
    return "\n".join([
        f"{line}",
        f"nodes: {result['nodes']}, GPUs per node: {result['gpus_per_node']}, GPU memory "
        f"per device: {result['gpu_memory_gib_per_device']} GiB, host memory per node: "
        f"{result['host_memory_gib']} GiB",
        "",
        "For the TrainJob's spec (merged over the runtime's node resources, whose cpu stays; "
        "pass the same batch_size and max_seq_len in its args):",
        block.rstrip(),
    ])


def _parameters(count: int) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"


def _teacher(objective: "Objective", method: str, teacher: str | None):
    """The teacher a distillation run holds beside the student (None otherwise); refused where
    the objective and the teacher do not go together, or the method has no KD recipe."""
    from kubetune.trainer.performance import sized_model

    if not objective.needs_teacher:
        if teacher:
            raise BadInputError("--teacher is for --objective distill")
        return None
    objective.check_method(method)
    if not teacher:
        raise BadInputError(f"--objective {objective.name} counts the teacher: --teacher "
                            f"MODEL (or {env.TEACHER_URI})")
    return sized_model.read(teacher)


@click.command("size")
@click.option("--model", envvar=env.SIZE_MODEL, required=True, show_envvar=True,
              help="A model directory, its config.json, or hf://org/name (only config.json "
                   "is fetched).")
@method_option("Fine-tuning method.")
@objective_option("dpo (or rso): each row a pair of answers through the model, and full "
                  "DPO's frozen reference copy counted; distill: --teacher's weights and "
                  "logits counted.")
@click.option("--teacher", envvar=env.TEACHER_URI, default=None, show_envvar=True,
              help="The teacher (--objective distill): a model directory, its config.json "
                   "or hf://org/name.")
@click.option("--max-seq-len", envvar=env.MAX_SEQ_LEN, type=click.IntRange(min=1),
              show_envvar=True,
              help="Tokens per sequence (default: the trainer's, the model's context up to "
                   "2048).")
@click.option("--batch-size", envvar=env.BATCH_SIZE, type=click.IntRange(min=1), default=4,
              show_default=True, show_envvar=True,
              help="The trainer's batch_size (per device, before gradient accumulation).")
@click.option("--gpu-memory", envvar=env.GPU_MEMORY, type=MemorySize(), default="80Gi",
              show_default=True, show_envvar=True,
              help="Memory of each GPU: 80Gi, 80GB (10^9 bytes), 24Gi... (nvidia-smi shows "
                   "an 80GB H100 as 79.6 GiB).")
@click.option("--gpus-per-node", envvar=env.GPUS_PER_NODE, type=click.IntRange(min=1),
              default=8, show_default=True, show_envvar=True,
              help="GPUs a node offers: one node uses the fewest that fit, several nodes all.")
@click.option("--max-nodes", envvar=env.MAX_NODES, type=click.IntRange(min=1),
              show_envvar=True, help="Most nodes the run may take (default: no limit).")
@click.option("--output", "output", envvar=env.SIZE_OUTPUT, type=click.Choice(OUTPUTS),
              default="text", show_default=True, show_envvar=True,
              help="text (the plan line and a TrainJob block), json or yaml.")
@step_command("size")
def size(model: str, method: str, objective: str, teacher: str | None, max_seq_len: int | None, batch_size: int,
         gpu_memory: int, gpus_per_node: int, max_nodes: int | None, output: str) -> None:
    """The nodes, GPUs per node, GPU memory per device and host memory per node a
    fine-tuning run needs, from the memory plan the trainer runs, with the
    resourcesPerNode block for the TrainJob."""
    from kubetune.trainer.objectives import registry
    from kubetune.trainer.performance import sized_model, sizing

    sized = sized_model.read(model)
    arch = sized.architecture
    chosen = registry.get(objective)
    teacher_sized = _teacher(chosen, method, teacher)
    teacher_dims = teacher_sized.architecture.shape if teacher_sized else None
    # Each process loads the teacher's checkpoint beside the student's.
    checkpoint_bytes = sized.checkpoint_bytes
    if teacher_sized and checkpoint_bytes is not None:
        checkpoint_bytes += teacher_sized.checkpoint_bytes or 0
    # The shape behind the estimate (layers, width, vocabulary, a tied output, windows):
    # with a 262k vocabulary the output alone can outweigh the layers (Gemma 3 270M).
    label = (f"{sized.label} ({arch.family}, {_parameters(sized.parameters)} parameters: "
             f"{arch.summary})")
    request = sizing.Request(
        label=label, dims=arch.shape, method=method,
        seq_len=max_seq_len or min(int(arch.dims.get("max_seq_len", 2048)), 2048),
        batch_size=batch_size, gpu_memory_bytes=gpu_memory, gpus_per_node=gpus_per_node,
        checkpoint_bytes=checkpoint_bytes, max_nodes=max_nodes,
        load=chosen.memory_load(method, teacher_dims),
        fewest_gpus=chosen.fewest_processes(method))
    fit = sizing.smallest(request)
    result = answer(fit, sized, request)
    if output == "json":
        click.echo(json.dumps(result, indent=2))
    elif output == "yaml":
        import yaml

        click.echo(yaml.safe_dump(result, sort_keys=False).rstrip())
    else:
        click.echo(f"model: {label}, checkpoint {result['checkpoint_gib']} GiB "
                   f"({result['checkpoint_from']})")
        click.echo(_text(result, sizing.describe(fit)))
