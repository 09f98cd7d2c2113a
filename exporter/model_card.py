"""A short model card (README.md): what this is, what it came from, how to load it."""

from __future__ import annotations

import json


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def render(fmt: str, base: dict, dataset: dict, metrics: dict, adapter_dir: str | None,
           merged_dir: str | None) -> str:
    name = base.get("name") or "the base model"
    revision = base.get("revision")
    lines = [
        "---",
        "library_name: " + ("peft" if adapter_dir is not None else "transformers"),
        *([f"base_model: {json.dumps(name)}"] if name and "/" in name
          and not name.startswith("/") else []),
        "tags: [kubetune, torchtune]",
        "---",
        "",
        f"# Fine-tuned {name}",
        "",
        f"Exported by kubetune ({fmt}) from a torchtune run on Kubeflow Trainer.",
        "",
        f"- base model: `{name}`" + (f" at revision `{revision}`" if revision else ""),
        f"- base model source: `{base.get('source')}`",
        f"- dataset: `{dataset.get('source')}`"
        + (f" at revision `{dataset['revision']}`" if dataset.get("revision") else ""),
    ]
    for key in ("steps", "first_loss", "last_loss"):
        if metrics.get(key) is not None:
            lines.append(f"- {key.replace('_', ' ')}: {_fmt(metrics[key])}")
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
    return "\n".join(lines)
