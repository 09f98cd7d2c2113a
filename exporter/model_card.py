"""The export's model card (README.md), built with huggingface_hub's ModelCard and
ModelCardData, so the hub (and anything reading the card) finds base model, datasets,
library, licence and tags in its metadata; then what was trained, how, how it ended, the
loss curve, and how to load it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from huggingface_hub import ModelCard, ModelCardData

from kubetune import env

# The run's settings a reader compares runs by (keys of the merged torchtune config).
HYPERPARAMETERS = (
    ("epochs", "epochs"), ("max_steps_per_epoch", "max steps per epoch"),
    ("batch_size", "batch size"), ("gradient_accumulation_steps", "gradient accumulation"),
    ("optimizer.lr", "learning rate"), ("optimizer._component_", "optimizer"),
    ("lr_scheduler.num_warmup_steps", "warmup steps"), ("model.lora_rank", "LoRA rank"),
    ("model.lora_alpha", "LoRA alpha"), ("model.lora_dropout", "LoRA dropout"),
    ("model.lora_attn_modules", "LoRA attention modules"),
    ("model.apply_lora_to_mlp", "LoRA on MLP"), ("model.use_dora", "DoRA"),
    ("model.quantize_base", "QLoRA (NF4 base)"), ("tokenizer.max_seq_len", "max sequence length"),
    ("dataset.packed", "packed"), ("dtype", "dtype"), ("seed", "seed"),
)


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def hub_id(name: str | None) -> str | None:
    """A name the hub resolves (org/name), or None for a path or a URI."""
    if not name or name.startswith(("/", ".")) or "://" in name:
        return None
    parts = name.split("/")
    return name if len(parts) == 2 and all(parts) else None


def dataset_hub_id(source: str | None) -> str | None:
    if not source or not source.startswith("hf://"):
        return None
    return hub_id("/".join(source[len("hf://"):].split("/")[:2]))


def base_license(model_dir: Path | None) -> str | None:
    """The licence the base model's own card declares, if the initializer fetched it."""
    card = Path(model_dir) / "README.md" if model_dir else None
    if card is None or not card.is_file():
        return None
    try:
        return ModelCard.load(card).data.license
    except Exception:  # a card without metadata, or malformed: say nothing rather than guess
        return None


def _select(config: Mapping, dotted: str):
    value = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def on_kubeflow(environ: Mapping[str, str]) -> bool:
    """In a pod of a cluster, and not a `kubetune local` run."""
    return bool(environ.get(env.KUBERNETES_SERVICE_HOST)) and not environ.get(env.LOCAL_RUN)


def card_data(fmt: str, base: dict, dataset: dict, adapter_dir: str | None, method: str,
              model_dir: Path | None) -> ModelCardData:
    """``method``: the trainer's (full, lora, dora, qlora), from its completion marker."""
    tag = "full-fine-tune" if method == "full" else method
    tags = ["kubetune", "torchtune", tag]
    return ModelCardData(
        base_model=hub_id(base.get("name")),
        datasets=[d] if (d := dataset_hub_id(dataset.get("source"))) else None,
        library_name="peft" if adapter_dir is not None else "transformers",
        license=base_license(model_dir),
        pipeline_tag="text-generation",
        tags=tags,
    )


def render(fmt: str, base: dict, dataset: dict, metrics: dict, adapter_dir: str | None,
           merged_dir: str | None, method: str, config: Mapping | None = None,
           model_dir: Path | None = None, curves: str | None = None,
           report: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    config = config or {}
    # Where the card says it ran: Kubernetes' variable and `kubetune local`'s (on_kubeflow).
    environ = os.environ if environ is None else environ
    name = base.get("name") or "the base model"
    revision = base.get("revision")
    where = " on Kubeflow Trainer" if on_kubeflow(environ) else ""
    lines = [
        f"# Fine-tuned {name}", "",
        f"Exported by kubetune ({fmt}) from a torchtune run{where}.", "",
        f"- base model: `{name}`" + (f" at revision `{revision}`" if revision else ""),
        f"- base model source: `{base.get('source')}`",
        f"- dataset: `{dataset.get('source')}`"
        + (f" at revision `{dataset['revision']}`" if dataset.get("revision") else ""),
    ]
    for key, label in (("steps", "steps"), ("first_loss", "first loss"),
                       ("last_loss", "final loss")):
        if metrics.get(key) is not None:
            lines.append(f"- {label}: {_fmt(metrics[key])}")
    if metrics.get("tokens_per_second"):
        device = metrics.get("gpu") or metrics.get("device")
        lines.append(f"- speed: {metrics['tokens_per_second']:.0f} tokens/s on {device} x "
                     f"{metrics.get('world_size')}")
    rows = [(label, _select(config, key)) for key, label in HYPERPARAMETERS]
    rows = [(label, value) for label, value in rows if value is not None]
    if rows:
        lines += ["", "## Training hyperparameters", "", "| setting | value |", "|---|---|"]
        lines += [f"| {label} | `{value}` |" for label, value in rows]
    if curves:
        lines += ["", "## Training curves", "", f"![loss and learning rate by step]({curves})"]
    if report:
        lines += ["", f"The run's own report: [{report}]({report})."]
    lines += ["", "`manifest.json` lists the sha256 of every file and the full training "
              "config.", "", "## Load it", "", "```python"]
    if adapter_dir is not None:
        sub = f', subfolder="{adapter_dir}"' if adapter_dir else ""
        lines += ["from peft import PeftModel",
                  "from transformers import AutoModelForCausalLM",
                  f"base = AutoModelForCausalLM.from_pretrained({json.dumps(name)})",
                  f'model = PeftModel.from_pretrained(base, "<this export>"{sub})']
    else:
        sub = f', subfolder="{merged_dir}"' if merged_dir else ""
        lines += ["from transformers import AutoModelForCausalLM",
                  f'model = AutoModelForCausalLM.from_pretrained("<this export>"{sub})']
    lines += ["```", ""]
    data = card_data(fmt, base, dataset, adapter_dir, method, model_dir)
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))
