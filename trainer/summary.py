"""``summary.json``: what a program reads after a run (steps, tokens, time, speed, memory,
MFU on GPU, why it ended).

MFU (model FLOPs utilization) = tokens/s x 6 x N / (devices x peak bf16 FLOP/s), with N
the model's parameter count from config.json: the 6N FLOPs per token of a forward and
backward pass that published fine-tuning MFU figures use (attention FLOPs left out, and
for LoRA the skipped weight gradients not subtracted, as in those figures).
"""

from __future__ import annotations

import resource
from pathlib import Path

from trainer.metric_logger import read_metrics

# Dense bf16 peak FLOP/s by device name fragment (vendor datasheets, without sparsity).
PEAK_BF16_FLOPS = {
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "GH200": 989e12, "B200": 2250e12,
    "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12, "A10G": 70e12,
    "A10": 125e12, "L4": 121e12, "V100": 125e12,
}


def parameter_count(dims: dict) -> int:
    d, layers, vocab = dims["embed_dim"], dims["num_layers"], dims["vocab_size"]
    heads, kv, ff = dims["num_heads"], dims["num_kv_heads"], dims["intermediate_dim"]
    head_dim = dims.get("head_dim") or d // heads
    attention = d * heads * head_dim * 2 + d * kv * head_dim * 2
    per_layer = attention + 3 * d * ff + 2 * d
    embeddings = vocab * d * (1 if dims.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + d


def peak_flops(device_name: str) -> float | None:
    for fragment, flops in PEAK_BF16_FLOPS.items():
        if fragment in device_name:
            return flops
    return None


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def summarize(output_dir: Path, wall_time_s: float, exit_reason: str, dims: dict,
              device: str, world_size: int, checkpoint: str | None) -> dict:
    by_step: dict[int, dict] = {}
    for record in read_metrics(output_dir):
        if "loss" in record:
            by_step[record["step"]] = record  # a resumed run may repeat a step: keep the last
    steps = [by_step[s] for s in sorted(by_step)]
    # The first step pays for warm-up (allocation, lazy init): leave it out of the speed.
    timed = steps[1:] if len(steps) > 2 else steps
    speeds = [s["tokens_per_second"] * world_size for s in timed if "tokens_per_second" in s]
    tokens_per_second = sum(speeds) / len(speeds) if speeds else None
    peak = max([s.get("peak_memory_bytes", 0) for s in steps]
               + [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024])
    summary = {
        "steps": len(steps),
        "last_step": steps[-1]["step"] if steps else 0,
        "epochs": (steps[-1].get("epoch", 0) + 1) if steps else 0,
        "tokens": sum(s.get("tokens", 0) for s in steps),
        "first_loss": steps[0]["loss"] if steps else None,
        "last_loss": steps[-1]["loss"] if steps else None,
        "wall_time_s": round(wall_time_s, 3),
        "tokens_per_second": tokens_per_second,
        "peak_memory_bytes": peak,
        "peak_memory_note": ("CUDA peak reserved, rank 0" if device.startswith("cuda")
                             else "peak resident memory of the largest process"),
        "device": device,
        "world_size": world_size,
        "mfu": None,
        "mfu_formula": "tokens_per_second * 6 * n_params / (world_size * peak_bf16_flops)",
        "n_params": parameter_count(dims),
        "exit_reason": exit_reason,
        "checkpoint": checkpoint,
    }
    name = gpu_name() if device.startswith("cuda") else None
    flops = peak_flops(name) if name else None
    if flops and tokens_per_second:
        summary["mfu"] = round(tokens_per_second * 6 * summary["n_params"]
                               / (world_size * flops), 4)
        summary["gpu"] = name
    return summary
