"""``summary.json``: what a program reads after a run (steps, tokens, time, speed, memory,
MFU on GPU, why it ended).

Speed is steady-state: the mean of the steps' tokens/s (all devices) without the leading
warm-up steps (the first step, which pays for torch.compile's compilation, allocation
and lazy init; with compile also any following step still over twice the median step
time, a recompile), which are reported apart as ``warmup_steps`` / ``warmup_s``. A
step's time is its tokens over the recipe's per-device tokens/s.

MFU (model FLOPs utilization) = steady tokens/s x FLOPs per token / (devices x peak dense
bf16 FLOP/s), with the FLOPs per token of the method (``kubetune.trainer.performance.model_shape``: 6N for
full fine-tuning, 4N + 6N_adapter for LoRA/QLoRA/DoRA, plus attention), stated in
``mfu_convention``.

With a held-out set, ``validation``: the base model's (step 0), best and last validation
loss, the best step and the saved checkpoint with the lowest loss, from the validation
record (``validation_numbers``); ``train_data``: the split and rows trained on.
"""

from __future__ import annotations

import resource
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kubetune.trainer.performance import model_shape
from kubetune.trainer.metric_logging.metric_logger import read_metrics
from kubetune.trainer.objectives import registry
from kubetune.trainer.objectives.objective import LoggedPart
from kubetune.trainer.metric_logging.validation_numbers import (row_summary, train_data,
                                                                 validation_summary)
from kubetune.trainer.performance.model_shape import parameter_count  # noqa: F401 (part of this module's API)

# Dense bf16 peak FLOP/s by device name fragment (vendor datasheets, without sparsity).
PEAK_BF16_FLOPS = {
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "GH200": 989e12, "B200": 2250e12,
    "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12, "A10G": 70e12,
    "A10": 125e12, "L4": 121e12, "V100": 125e12,
}


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


def _durations(steps: list[dict], world_size: int) -> list[float | None]:
    out = []
    for s in steps:
        tps, tokens = s.get("tokens_per_second"), s.get("tokens")
        out.append(tokens / (tps * world_size) if tps and tokens else None)
    return out


def warmup_count(durations: list[float | None], compiled: bool) -> int:
    """Leading steps to leave out of the steady state: the first (when there are more
    than two steps); with torch.compile also any following step over twice the median of
    the rest (a recompile), at most half of them."""
    if len(durations) <= 2:
        return 0
    if not compiled:
        return 1
    rest = sorted(d for d in durations[1:] if d is not None)
    if not rest:
        return 1
    median = rest[len(rest) // 2]
    n = 1
    while n < len(durations) // 2 and durations[n] is not None and durations[n] > 2 * median:
        n += 1
    return n


def _attention_tokens(cfg: DictConfig | None, tokens: int, steps: int,
                      world_size: int) -> float:
    """T of the attention FLOPs: the pack length when packed, else the mean trained
    tokens per sample."""
    if cfg is None:
        return 0.0
    if OmegaConf.select(cfg, "dataset.packed") and OmegaConf.select(cfg, "tokenizer.max_seq_len"):
        return float(OmegaConf.select(cfg, "tokenizer.max_seq_len"))
    samples = steps * int(cfg.get("batch_size") or 1) \
        * int(cfg.get("gradient_accumulation_steps") or 1) * world_size
    return tokens / samples if samples else 0.0


def parts_summary(steps: list[dict], parts: tuple[LoggedPart, ...]) -> dict | None:
    """An objective's logged parts (a DPO run's reward accuracy and margin, a distillation
    run's cross-entropy and KD), first and last step: ``first_<status>``,
    ``last_<status>``; None where no step logged them (another objective's run)."""
    logged = [s for s in steps if any(p.key in s for p in parts)]
    if not logged:
        return None
    first, last = logged[0], logged[-1]
    return {f"{when}_{p.status}": record.get(p.key) for p in parts
            for when, record in (("first", first), ("last", last))}


def summarize(output_dir: Path, wall_time_s: float, exit_reason: str, dims: dict,
              device: str, world_size: int, checkpoint: str | None, method: str = "full",
              cfg: DictConfig | None = None) -> dict:
    by_step: dict[int, dict] = {}
    for record in read_metrics(output_dir):
        if "loss" in record:
            by_step[record["step"]] = record  # a resumed run may repeat a step: keep the last
    steps = [by_step[s] for s in sorted(by_step)]
    durations = _durations(steps, world_size)
    compiled = bool(cfg.get("compile")) if cfg is not None else False
    warm = warmup_count(durations, compiled)
    speeds = [s["tokens_per_second"] * world_size for s in steps[warm:]
              if "tokens_per_second" in s]
    tokens_per_second = sum(speeds) / len(speeds) if speeds else None
    warmup_s = sum(d or 0.0 for d in durations[:warm])
    warmup_tokens = sum(s.get("tokens", 0) for s in steps[:warm])
    peak = max([s.get("peak_memory_bytes", 0) for s in steps]
               + [resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024])
    tokens = sum(s.get("tokens", 0) for s in steps)
    model_cfg = OmegaConf.to_container(cfg.model) if cfg is not None and \
        isinstance(cfg.get("model"), DictConfig) else {}
    n_adapter = model_shape.adapter_count(dims, model_cfg, method)
    attention_tokens = _attention_tokens(cfg, tokens, len(steps), world_size)
    flops_per_token = model_shape.flops_per_token(dims, method, n_adapter, attention_tokens)
    summary = {
        "steps": len(steps),
        "last_step": steps[-1]["step"] if steps else 0,
        "epochs": (steps[-1].get("epoch", 0) + 1) if steps else 0,
        "tokens": tokens,
        "first_loss": steps[0]["loss"] if steps else None,
        "last_loss": steps[-1]["loss"] if steps else None,
        "wall_time_s": round(wall_time_s, 3),
        "tokens_per_second": tokens_per_second,
        "tokens_per_second_note": "steady state: all devices, warm-up steps left out",
        "compile": compiled,
        "warmup_steps": warm,
        "warmup_s": round(warmup_s, 3),
        # What warm-up cost beyond running those steps at steady speed: mostly
        # torch.compile's compilation when compile is on.
        "warmup_excess_s": round(max(0.0, warmup_s - warmup_tokens / tokens_per_second), 3)
        if tokens_per_second and warm else 0.0,
        "peak_memory_bytes": peak,
        "peak_memory_note": ("CUDA peak reserved, rank 0" if device.startswith("cuda")
                             else "peak resident memory of the largest process"),
        "device": device,
        "world_size": world_size,
        "method": method,
        "mfu": None,
        "mfu_formula": "tokens_per_second * mfu_flops_per_token / "
                       "(world_size * peak dense bf16 FLOP/s)",
        "mfu_flops_per_token": flops_per_token,
        "mfu_convention": model_shape.convention(method),
        "mfu_attention_tokens": round(attention_tokens, 1),
        "n_params": parameter_count(dims),
        "n_adapter_params": n_adapter,
        "exit_reason": exit_reason,
        "checkpoint": checkpoint,
        "train_data": train_data(output_dir, cfg),
        "rows": row_summary(output_dir),
        "validation": validation_summary(output_dir),
        **{section: parts_summary(steps, parts)
           for section, parts in registry.summary_sections().items()},
    }
    name = gpu_name() if device.startswith("cuda") else None
    flops = peak_flops(name) if name else None
    if flops and tokens_per_second:
        summary["mfu"] = round(tokens_per_second * flops_per_token / (world_size * flops), 4)
        summary["gpu"] = name
    return summary
